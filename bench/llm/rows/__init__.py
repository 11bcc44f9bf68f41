"""Our own AVX2 int8/int4 GEMV and decode attention inside ONNX Runtime, as a bench probe
(issue 52, goal 3): the onnx target's MatMulNBits nodes (8- or 4-bit symmetric blocks, no
zero points) and GroupQueryAttention nodes (packed, rotary inside) run by a custom-op
library built here from ``nbits_rows.c`` and ``rows_attention.c`` instead of ORT's own
kernels, over the same inputs; the skip-RMSNorm before a GEMV and the SwiGLU after the
gate/up GEMV run inside it.

    python -m bench.llm.rows [--threads 1] [--models build/llm/ort-int8-paths]

compares the two on ``bench.llm.ort_int8_paths``'s models (the 300M's 80 projections, one
row); ``opened_with_rows()`` rewrites every session the runtime opens inside it, which is
how ``bench.llm.engines_rows`` decodes an onnx artifact with the kernels. Not part of any
build: what it measures decides whether the onnx target should ship such a library.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "nbits_rows.c", HERE / "rows_attention.c")
DOMAIN = "edge_exporter.cpu"
CACHE = HERE.parents[2] / "build" / "llm" / "rows"
_REGISTERED: dict[int, object] = {}  # session options holding the library (kept alive)


def library() -> Path:
    """The compiled library (built once per source text, at low priority)."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in (*SOURCES, HERE / "rows_abi.h"))
                            ).hexdigest()[:12]
    path = CACHE / f"libnbits_rows-{digest}.so"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise RuntimeError("bench.llm.rows needs a C compiler (cc or gcc) on PATH")
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["nice", "-n", "19", compiler, "-O3", "-mavx2", "-mfma", "-fPIC",
                        "-shared", *map(str, SOURCES), "-o", str(scratch)], check=True)
        scratch.replace(path)
    return path


def rewrite(model) -> int:
    """Moves ``model``'s MatMulNBits nodes the library runs to its domain; how many."""
    import onnx

    moved = 0
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type == "MatMulNBits" and len(node.input) == 3
                and attrs.get("bits") in (4, 8) and attrs.get("block_size", 0) % 64 == 0):
            node.domain = DOMAIN
            moved += 1
    for node in model.graph.node:
        if _our_attention(node):
            node.domain = DOMAIN
            moved += 1
    if moved and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    _fuse_glu(model)
    _fuse_norms(model)
    return moved


def _our_attention(node) -> bool:
    """A GroupQueryAttention the library's attention runs: packed q/k/v, the rotary's
    halves inside, a plain softmax over every cached position."""
    import onnx

    if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    plain = {"do_rotary": 1, "rotary_interleaved": 0, "softcap": 0.0,
             "local_window_size": -1, "smooth_softmax": 0}
    inputs = list(node.input)
    return (all(attrs.get(k, v if k != "do_rotary" else 0) == v for k, v in plain.items())
            and len(inputs) == 9 and inputs[1:3] == ["", ""]
            and all(inputs[i] for i in (0, 3, 4, 5, 6, 7, 8)) and len(node.output) == 3)


def _fuse_glu(model) -> int:
    """Each moved MatMulNBits whose output is only split in equal halves (last axis of
    the decoder's [batch, sequence, features]) into silu(gate) * up becomes one
    MatMulNBitsGLU node: three small ops a layer fewer, and no split copy."""
    import onnx
    from onnx import numpy_helper

    nodes = list(model.graph.node)
    users: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            users.setdefault(name, []).append(node)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
              if t.name in {n.input[1] for n in nodes if n.op_type == "Split"
                            and len(n.input) > 1}}
    graph_outputs = {o.name for o in model.graph.output}

    def only(name: str, op_type: str):
        found = users.get(name, [])
        ok = len(found) == 1 and found[0].op_type == op_type and name not in graph_outputs
        return found[0] if ok else None

    gone, fused = set(), 0
    for node in nodes:
        if node.domain != DOMAIN or node.op_type != "MatMulNBits":
            continue
        n = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}["N"]
        split = only(node.output[0], "Split")
        axis = {a.name: a.i for a in split.attribute}.get("axis", 0) if split else None
        sizes = consts.get(split.input[1]) if split is not None and len(split.input) > 1 else None
        if (split is None or axis not in (-1, 2) or len(split.output) != 2 or sizes is None
                or list(sizes) != [n // 2, n // 2]):
            continue
        gate, up = split.output
        sigmoid = next((u for u in users.get(gate, []) if u.op_type == "Sigmoid"), None)
        gate_users = users.get(gate, [])
        silu = only(sigmoid.output[0], "Mul") if sigmoid else None
        if (silu is None or len(gate_users) != 2 or set(silu.input) != {gate, sigmoid.output[0]}
                or silu not in gate_users):
            continue
        product = only(silu.output[0], "Mul")
        if product is None or set(product.input) != {silu.output[0], up} or only(up, "Mul") is None:
            continue
        node.op_type, node.output[0] = "MatMulNBitsGLU", product.output[0]
        gone.update(id(x) for x in (split, sigmoid, silu, product))
        fused += 1
    keep = [x for x in nodes if id(x) not in gone]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    used = {name for x in keep for name in x.input}
    unused = [t for t in model.graph.initializer if t.name in consts and t.name not in used]
    for table in unused:  # the split sizes
        model.graph.initializer.remove(table)
    return fused


@contextlib.contextmanager
def opened_with_rows(counts: list[int] | None = None):
    """Every ``onnxruntime.InferenceSession`` opened inside runs its MatMulNBits nodes
    with the library; ``counts`` collects the nodes moved per session."""
    import onnx
    import onnxruntime as ort

    plain, lib = ort.InferenceSession, str(library())

    class WithRows(plain):
        def __init__(self, path, sess_options=None, *args, **kwargs):
            sess_options = sess_options or ort.SessionOptions()
            if id(sess_options) not in _REGISTERED:  # ORT refuses a domain twice
                sess_options.register_custom_ops_library(lib)
                _REGISTERED[id(sess_options)] = sess_options
            given = isinstance(path, bytes)  # a serialized model, or its file
            model = (onnx.load_from_string(path) if given
                     else onnx.load(str(path), load_external_data=False))
            moved = rewrite(model)
            if counts is not None:
                counts.append(moved)
            if moved and given:
                path = model.SerializeToString()
            elif moved:  # beside the original: its external data files are relative to it
                path = Path(path).with_name(Path(path).stem + ".rows.onnx")
                onnx.save(model, str(path))
            super().__init__(path if given else str(path), sess_options, *args, **kwargs)

    ort.InferenceSession = WithRows
    try:
        yield
    finally:
        ort.InferenceSession = plain


def _fuse_norms(model) -> int:
    """Each SkipSimplifiedLayerNormalization (no bias) whose normed output only feeds one
    moved node becomes that node's first step (MatMulNBitsNorm / MatMulNBitsNormGLU, at
    the norm's place: its other inputs are weights), x + skip its second output."""
    nodes = list(model.graph.node)
    users: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            users.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    fused = 0
    for norm in nodes:
        if (norm.op_type != "SkipSimplifiedLayerNormalization" or len(norm.input) != 3
                or any(name and (users.get(name) or name in graph_outputs)
                       for name in norm.output[1:3])):
            continue
        found = users.get(norm.output[0], [])
        ours = found[0] if len(found) == 1 else None
        if (ours is None or ours.domain != DOMAIN or "Norm" in ours.op_type
                or list(ours.input[:1]) != [norm.output[0]] or norm.output[0] in graph_outputs):
            continue
        total = norm.output[3] if len(norm.output) > 3 and norm.output[3] else \
            f"{norm.name or norm.output[0]}_sum"
        fusedop = type(ours)()
        fusedop.CopyFrom(ours)
        fusedop.op_type = ours.op_type.replace("MatMulNBits", "MatMulNBitsNorm")
        del fusedop.input[:], fusedop.output[:]
        fusedop.input.extend([*norm.input, *ours.input[1:]])
        fusedop.output.extend([ours.output[0], total])
        fusedop.attribute.extend(a for a in norm.attribute if a.name == "epsilon")
        norm.CopyFrom(fusedop)
        ours.op_type = ""  # dropped below
        fused += 1
    keep = [x for x in model.graph.node if x.op_type]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return fused
