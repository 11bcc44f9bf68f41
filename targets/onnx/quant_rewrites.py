"""What the onnx target rewrites in an exported model before ONNX Runtime's quantizers, so
that they reach every weight a decoder has:

- ``untie_output_projections`` (every recipe): a tied head, x @ table.T through a
  Transpose, gets its own transposed table, which the quantizers take (a stored B only);
- ``gemms_as_matmuls`` (weight-only recipes): a Gemm (GPT-2's Conv1D) as MatMul + Add,
  which ORT's MatMulNBits quantizer takes (MatMuls only);
- ``quantize_embedding_tables`` (weight-only recipes, after ORT): tables as
  ``GatherBlockQuantized`` (com.microsoft), uint8 rows with one scale per block, only the
  gathered rows dequantized. Our own: ORT's MatMulNBits quantizer makes a Gather int4
  only, and ONNX Runtime GenAI's builder leaves the table in float. A 32k-token
  vocabulary's float table was 49% of a 300M decoder's int4 artifact (131 of 269 MB);
  the issue asks for int8 tables, as the cpu target's recipes have them (passes/
  quantize_weight_only.py) and llama.cpp's files do;
- ``pools_counting_only_the_input`` (int8-static): an average pool that counts padding in
  ceil mode as one that counts what its windows cover, the same averages in float, which
  ONNX Runtime's int8 kernel then computes too.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from targets.onnx.initializers import values

log = logging.getLogger(__name__)

_FLOATS = {1: np.float32, 10: np.float16}  # onnx TensorProto FLOAT, FLOAT16
# A table smaller than this (64 KB of float) stays float: its bytes do not matter, and a
# token-type table of a few rows gains nothing from a second op type.
MIN_TABLE_ELEMENTS = 1 << 14


def quantize_embedding_tables(model, block: int, folder: Path | None = None) -> dict[str, str]:
    """Rewrite, in place in ``model`` (an onnx ModelProto; weights kept in files are read
    from ``folder``), every Gather whose data is a float 2-D initializer read by Gathers
    on axis 0 alone. Returns {gather node name: what was done or why it stays float}."""
    from onnx import helper

    tables = {t.name: t for t in model.graph.initializer}
    readers = _readers(model)
    done: dict[str, str] = {}
    replaced: dict[str, object] = {}  # table name -> its uint8 initializer, scales
    for index, node in enumerate(list(model.graph.node)):
        table = tables.get(node.input[0]) if node.op_type == "Gather" else None
        if table is None or len(table.dims) != 2 or table.data_type not in _FLOATS:
            continue
        why = _why_float(table, readers[table.name])
        if why:
            done[node.name] = why
            continue
        if table.name not in replaced:
            replaced[table.name] = _quantized(values(table, folder), table.name, block)
        data, scales = replaced[table.name]
        gather = helper.make_node(
            "GatherBlockQuantized", [data.name, node.input[1], scales.name], list(node.output),
            name=node.name, domain="com.microsoft", bits=8, block_size=block,
            gather_axis=0, quantize_axis=1)
        model.graph.node.remove(node)
        model.graph.node.insert(index, gather)
        done[node.name] = "int8"
    for name, (data, scales) in replaced.items():
        model.graph.initializer.remove(tables[name])
        model.graph.initializer.extend([data, scales])
    if replaced and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return done


def untie_output_projections(model, folder: Path | None = None) -> list[str]:
    """Give each MatMul that reads a float table through a Transpose (a tied output
    projection, x @ table.T, as torch.onnx writes it) the transposed table as its own
    initializer, in place. ORT's quantizers take only a stored B, so a tied head
    stayed float: a 32k x 1024 table read in fp32 every token (and ONNX Runtime's
    constant folding held a second, transposed fp32 copy). Untied, the head is quantized
    with the other layers, and the table, now the Gather's alone, becomes int8 rows
    (quantize_embedding_tables; ORT's dynamic quantizer's own Gather for int8-dynamic).
    Returns the MatMuls' names."""
    from onnx import numpy_helper

    tables = {t.name: t for t in model.graph.initializer}
    readers = _readers(model)
    outputs = {o.name for o in model.graph.output}
    untied: list[str] = []
    for node in list(model.graph.node):
        table = tables.get(node.input[0]) if node.op_type == "Transpose" else None
        if (table is None or len(table.dims) != 2 or table.data_type not in _FLOATS
                or _perm(node) not in (None, [1, 0]) or node.output[0] in outputs):
            continue
        users = readers.get(node.output[0], [])
        read_as_b = [u for u in users if u.op_type == "MatMul"
                     and list(u.input)[1:] == [node.output[0]] and u.input[0] != node.output[0]]
        if not users or len(read_as_b) != len(users):
            continue  # something else reads the transposed table: leave it
        transposed = numpy_helper.from_array(
            np.ascontiguousarray(values(table, folder).T), f"{table.name}_transposed")
        model.graph.initializer.append(transposed)
        for user in users:
            user.input[1] = transposed.name
            untied.append(user.name)
        model.graph.node.remove(node)
    return untied


def _readers(model) -> dict[str, list]:
    """{value name: the nodes that read it}."""
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _perm(node) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _why_float(table, readers: list) -> str | None:
    rows, width = table.dims
    if rows * width < MIN_TABLE_ELEMENTS:
        return f"a table of {rows}x{width} is too small to gain from int8"
    others = {n.op_type for n in readers
              if n.op_type != "Gather" or _axis(n) != 0 or n.input[0] != table.name}
    if others:  # a tied output projection (Transpose, MatMul) still reads the float table
        return f"the table is also read by {', '.join(sorted(others))}: it stays float once"
    return None


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _quantized(table: np.ndarray, name: str, block: int):
    """Symmetric int8 per block of ``block`` columns (the last block may be short), stored
    as uint8 around GatherBlockQuantized's default zero point of 128."""
    from onnx import numpy_helper

    rows, width = table.shape
    blocks = -(-width // block)
    padded = np.zeros((rows, blocks * block), dtype=np.float32)
    padded[:, :width] = table
    grouped = padded.reshape(rows, blocks, block)
    scales = np.abs(grouped).max(axis=2) / 127.0
    scales[scales == 0] = 1.0  # an all-zero block (a padding row): any scale gives zeros
    q = np.clip(np.rint(grouped / scales[:, :, None]), -127, 127).astype(np.int16) + 128
    data = q.reshape(rows, blocks * block)[:, :width].astype(np.uint8)
    return (numpy_helper.from_array(data, f"{name}_int8"),
            numpy_helper.from_array(scales.astype(table.dtype), f"{name}_scales"))


def gemms_as_matmuls(model, folder: Path | None = None) -> None:
    """Each plain Gemm (alpha = beta = 1, A not transposed) on a stored 2-D weight as
    MatMul + Add, in place, named as ORT's dynamic quantizer names its own rewrite: ORT's
    MatMulNBits quantizer takes MatMuls only, and GPT-2's Conv1D layers export as Gemm,
    so int4-weight left every one of its block layers in float."""
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    transposed = set()
    for index, node in reversed(list(enumerate(model.graph.node))):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = weights.get(node.input[1]) if node.op_type == "Gemm" else None
        if (weight is None or len(weight.dims) != 2 or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            continue
        b = node.input[1]
        if attrs.get("transB", 0):  # the weight's own copy, as [in, out]
            b = f"{node.name}_weight"
            model.graph.initializer.append(numpy_helper.from_array(
                values(weight, folder).T.copy(), b))
            transposed.add(weight.name)
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}_matmul" if bias else node.output[0]
        rewrite = [helper.make_node("MatMul", [node.input[0], b], [product],
                                    name=f"{node.name}_MatMul")]
        if bias:
            rewrite.append(helper.make_node("Add", [product, bias], [node.output[0]],
                                            name=f"{node.name}_Add"))
        model.graph.node.remove(node)
        for offset, new in enumerate(rewrite):
            model.graph.node.insert(index + offset, new)
    read = {name for node in model.graph.node for name in node.input}
    for name in transposed - read:  # nothing reads the [out, in] original any more
        model.graph.initializer.remove(weights[name])


def pools_counting_only_the_input(model) -> list[str]:
    """Each AveragePool that counts padding (count_include_pad=1) in ceil mode, with no
    padding of its own, made to count what its windows cover (count_include_pad=0), in
    place; returns their names. Without pads both divide by the part of a window inside
    the input in float, as torch does. But ONNX Runtime fuses DQ -> AveragePool -> Q into
    QLinearAveragePool, which with count_include_pad divides by the whole kernel even
    where a ceil-mode window runs past the input: transformers' EfficientNet pools its
    7x7 map with a 1280-wide kernel, averaged to 49/1638400 of the value, and every
    int8 logit was zero."""
    from onnx import helper

    rewritten = []
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute} if node.op_type == "AveragePool" else {}
        if not (_int(attrs, "count_include_pad") and _int(attrs, "ceil_mode")):
            continue
        auto_pad = helper.get_attribute_value(attrs["auto_pad"]) if "auto_pad" in attrs else b""
        if any(attrs["pads"].ints if "pads" in attrs else ()) or auto_pad.startswith(b"SAME"):
            # a padded window's count differs from what it covers: no attribute says it
            log.warning("average pool %s counts its padding in ceil mode: ONNX Runtime's "
                        "int8 kernel may average its last windows lower than float", node.name)
            continue
        attrs["count_include_pad"].i = 0
        rewritten.append(node.name)
    return rewritten


def _int(attrs: dict, name: str) -> int:
    return attrs[name].i if name in attrs else 0
