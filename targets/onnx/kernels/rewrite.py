"""The onnx target's graph rewrite onto its own kernels (targets/onnx/kernels): the
MatMulNBits nodes the library takes and the decoder's GroupQueryAttention nodes move to
its domain; a gate/up GEMV's SwiGLU and the skip-RMSNorm before a GEMV fold into the
GEMV's node. Works on the ModelProto in place."""

from __future__ import annotations

from collections import Counter

DOMAIN = "edge_exporter.cpu"  # the library's custom-op domain (RegisterCustomOps)


def rewrite(model) -> dict[str, int]:
    """Moves ``model``'s nodes the library runs to its domain, fusing what it folds in;
    {op type in the library's domain: nodes}, empty when none moved."""
    import onnx

    moved = 0
    for node in model.graph.node:
        if _our_gemv(node) or _our_attention(node):
            node.domain = DOMAIN
            moved += 1
    if moved and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    _fuse_glu(model)
    _fuse_norms(model)
    return dict(sorted(Counter(n.op_type for n in model.graph.node
                               if n.domain == DOMAIN).items()))


def _our_gemv(node) -> bool:
    """A MatMulNBits the library's GEMV runs: symmetric 8- or 4-bit blocks of 64n, no zero
    points, bias or g_idx, int8 activations (accuracy level 4, what the kernel computes)."""
    import onnx

    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return (len(node.input) == 3 and attrs.get("bits") in (4, 8)
            and attrs.get("block_size", 0) % 64 == 0 and attrs.get("accuracy_level") == 4)


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
