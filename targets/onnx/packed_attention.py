"""A decoder layer's projection rows, rotary embedding and attention as one
``GroupQueryAttention`` node with packed Q/K/V and the rotary inside (``do_rotary``), as
ONNX Runtime GenAI's decoders run it.

    before: q, k, v = Split(qkv)                         (the merged projection's rows)
            GroupQueryAttention(Reshape..(RotaryEmbedding(q)), ..(RotaryEmbedding(k)),
                                ..(v), past_k, past_v, seqlens_k, total)
            new-row outputs: Transpose(Reshape(RotaryEmbedding(k))), Transpose(Reshape(v))
    after:  GroupQueryAttention(qkv, -, -, past_k, past_v, seqlens_k, total, cos, sin,
                                do_rotary=1)
            new-row outputs: present_k[:, :, start:start + T], present_v[...]

A 300M LLaMA's int4 step had 27 ONNX nodes a layer, ONNX Runtime GenAI's 11: the two
RotaryEmbeddings, the Split and the reshapes and transposes around the attention's inputs
(the new rows leave the step as [1, heads, T, head] outputs and reach the attention as
[1, T, heads * head] rows) are what this removes.

The rotary tables: ``RotaryEmbedding`` here takes the call's own angles (targets/onnx/
rotary.py, position ids 0..T-1), GroupQueryAttention indexes its tables by absolute
position and wants one row per cache slot. The rows are this model's own angle computation
(the subgraph from the step's positions input to the angles) evaluated by ONNX Runtime
at build time over positions 0..slots-1, so any rope whose angles depend on the position
alone (default, linear, llama3 scaling...) gives the same numbers; a subgraph reading
anything else is left as it was.

The new rows: with the past and present buffers bound as one (contrib_ops.py
``expose_in_place_cache``) the kernel has written them into the cache at slots
start..start+T-1 (a full-attention layer's slot is its position), so the step's outputs
read them back from there; the runtime's write of them is then a copy onto themselves.
Only exact matches are rewritten; anything else keeps its nodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from targets.onnx.contrib_ops import const_ints, step_bounds

log = logging.getLogger(__name__)

_MS = "com.microsoft"
_PASS_THROUGH = {"Reshape", "Identity", "Transpose"}


def pack_attention_inputs(model) -> int:
    """Rewrite every matching layer of ``model`` (an onnx_ir Model) in place; returns how
    many."""
    import onnx_ir.passes.common as common_passes

    tables: dict = {}  # (cos, sin, slots) -> initializers, shared by the layers
    packed = 0
    for node in list(model.graph):
        if (node.domain, node.op_type) != (_MS, "GroupQueryAttention"):
            continue
        match = _match(node)
        table = match and _tables(model, match, tables)
        if table is None:
            continue
        _rewrite(model, match, table)
        packed += 1
    if packed:
        model.graph.sort()
        common_passes.RemoveUnusedNodesPass()(model)
    return packed


@dataclass
class _Match:
    node: object  # the GroupQueryAttention
    split: object  # the Split of the packed rows into q, k, v
    rotary_q: object
    rotary_k: object
    head: int
    bounds: tuple  # (start, total): the new rows' slots (contrib_ops.step_bounds)


def _match(node) -> _Match | None:
    """The Split and the two RotaryEmbeddings that feed ``node``, or None."""
    if len(node.inputs) != 7:
        return _no(node, "inputs beyond the sequence lengths")
    attributes = node.attributes
    if attributes.get_int("do_rotary", 0) or attributes.get_int("local_window_size", -1) != -1:
        return _no(node, "rotary or a window already")
    q, k, v = (_source(node.inputs[i]) for i in range(3))
    if q is None or k is None or v is None:
        return _no(node, "q/k/v are not the rows as they were made")
    rotary_q, rotary_k = q.producer(), k.producer()  # (their outputs carry no shape)
    if not all(r is not None and (r.domain, r.op_type) == (_MS, "RotaryEmbedding")
               for r in (rotary_q, rotary_k)):
        return _no(node, "q/k do not come from RotaryEmbedding")
    split = rotary_q.inputs[0].producer()
    if split is None or split.op_type != "Split" or \
            list(split.outputs) != [rotary_q.inputs[0], rotary_k.inputs[0], v]:
        return _no(node, "q/k/v are not one Split's three parts")
    same = all(a is b for a, b in zip(rotary_q.inputs[1:], rotary_k.inputs[1:]))
    plain = all(r.attributes.get_int("rotary_embedding_dim", 0) == 0
                and r.attributes.get_float("scale", 1.0) == 1.0
                and r.attributes.get_int("interleaved", 0) == 0 for r in (rotary_q, rotary_k))
    if not (same and plain):
        return _no(node, "the two rotaries differ, scale or cover part of the head")
    heads, kv_heads = attributes.get_int("num_heads"), attributes.get_int("kv_num_heads")
    sizes = _split_sizes(split)
    width = node.inputs[1].shape[-1] if node.inputs[1].shape is not None else None
    if not isinstance(width, int) or width % kv_heads or \
            sizes != [heads * width // kv_heads, width, width]:
        return _no(node, f"the Split's parts {sizes} are not q/k/v of {heads}/{kv_heads} heads")
    head = width // kv_heads
    if head % 16:  # GroupQueryAttention's rotary wants a multiple of 16
        return _no(node, f"a head of {head}")
    bounds = step_bounds(node)
    if bounds is None:
        return _no(node, "its sequence lengths are not built from the step's start")
    return _Match(node, split, rotary_q, rotary_k, head, bounds)


def _split_sizes(split) -> list | None:
    """The sizes of a Split along the rows' last axis, where given as a constant."""
    rows = split.inputs[0].shape
    axis = split.attributes.get_int("axis", 0)
    if rows is None or axis not in (len(rows) - 1, -1) or len(split.inputs) < 2 \
            or split.inputs[1] is None or split.inputs[1].const_value is None:
        return None
    return [int(x) for x in split.inputs[1].const_value.numpy().reshape(-1)]


def _no(node, reason: str) -> None:
    log.debug("%s stays as it is: %s", node.name, reason)
    return None


def _source(value):
    """The value ``value`` equals once the chain of Reshape / Identity / transpose pairs
    that leads to it is undone: only when each Transpose meets its inverse right after it
    (so the rows keep their memory order) and the chain ends at [B, T, width] rows."""
    chain, start = [], value
    while value is not None and value.producer() is not None \
            and value.producer().op_type in _PASS_THROUGH and value.producer().domain == "":
        if value.producer().op_type != "Identity":
            chain.append(value.producer())
        value = value.producer().inputs[0]
    index = 0
    while index < len(chain):
        if chain[index].op_type == "Transpose":
            pair = chain[index:index + 2]
            if len(pair) < 2 or pair[1].op_type != "Transpose" or _compose(
                    *(list(n.attributes["perm"].value) for n in pair)) != [0, 1, 2, 3]:
                return None
            index += 2
        else:
            index += 1
    if value is None or start is None or start.shape is None or len(start.shape) != 3:
        return None
    return value


def _compose(first: list, second: list) -> list | None:
    return [first[i] for i in second] if len(first) == len(second) == 4 else None


def _tables(model, match: _Match, cache: dict):
    """(cos, sin) initializers [slots, head / 2] for this layer's rotary angles."""
    cos, sin = match.rotary_q.inputs[2], match.rotary_q.inputs[3]
    past = match.node.inputs[3]
    if past is None or past.shape is None or not isinstance(past.shape[2], int):
        return None
    key = (id(cos), id(sin), past.shape[2])
    if key not in cache:
        cache[key] = _evaluated_tables(model, cos, sin, past.shape[2])
    return cache[key]


def _evaluated_tables(model, cos, sin, slots: int):
    """Run the subgraph that computes ``cos`` and ``sin`` from the step's positions (its
    one integer input) with ONNX Runtime over positions 0..slots-1; initializers holding
    the result, or None."""
    import onnx
    import onnx_ir as ir
    import onnxruntime

    nodes, inputs, constants = _subgraph(model, [cos, sin])
    if nodes is None or len(inputs) != 1 or inputs[0].shape is None or \
            inputs[0].dtype not in (ir.DataType.INT64, ir.DataType.INT32) or \
            len(inputs[0].shape) not in (1, 2):
        return None
    position = inputs[0]
    graph = onnx.helper.make_graph(
        [ir.serde.serialize_node(n) for n in nodes], "rotary_tables",
        [ir.serde.serialize_value(position)],
        [onnx.helper.make_empty_tensor_value_info(v.name) for v in (cos, sin)],
        initializer=[ir.serde.serialize_tensor(v.const_value) for v in constants])
    opsets = [onnx.helper.make_opsetid(domain, version)
              for domain, version in model.opset_imports.items()]
    proto = onnx.helper.make_model(graph, opset_imports=opsets)
    dtype = np.int64 if position.dtype == ir.DataType.INT64 else np.int32

    def angles(count: int) -> list:
        feed = np.arange(count, dtype=dtype).reshape([1] * (len(position.shape) - 1) + [count])
        return session.run([cos.name, sin.name], {position.name: feed})
    try:
        session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        values = angles(slots)
        # One table holds only if a position's angles do not depend on the call: Phi-3's
        # longrope takes its long factors once the call's last position passes the
        # original context, so a step of early positions has other angles than the table's
        # rows (tokens differed from transformers past that context). Such a layer keeps
        # its own angle nodes.
        for count in {1, max(1, slots // 2)}:
            if not all(np.allclose(short.reshape(count, -1), full.reshape(slots, -1)[:count],
                                   rtol=1e-6, atol=1e-7)
                       for short, full in zip(angles(count), values)):
                log.debug("the rotary angles depend on the call's length: not tabled")
                return None
    except Exception as exc:  # noqa: BLE001 - ORT's own error types; the layer stays as is
        log.debug("the rotary angles could not run on their own: %s", exc)
        return None
    made = []
    for name, array in zip(("cos", "sin"), values):
        tensor = ir.tensor(np.ascontiguousarray(array.reshape(slots, -1)))
        value = ir.Value(name=f"gqa_{name}_cache_{slots}", const_value=tensor,
                         shape=ir.Shape(list(tensor.shape)), type=ir.TensorType(tensor.dtype))
        model.graph.register_initializer(value)
        made.append(value)
    return tuple(made)


def _subgraph(model, outputs: list):
    """The nodes computing ``outputs`` in graph order, the graph inputs and the
    initializers they read; (None, ..) where a node holds a subgraph."""
    seen, needed, inputs, constants = set(), set(), [], []
    stack = list(outputs)
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        producer = value.producer()
        if producer is None:
            if value.const_value is not None:
                constants.append(value)
            elif value.is_graph_input():
                inputs.append(value)
            continue
        if any(a.type.name in ("GRAPH", "GRAPHS") for a in producer.attributes.values()):
            return None, [], []
        needed.add(id(producer))
        stack.extend(v for v in producer.inputs if v is not None)
    return [n for n in model.graph if id(n) in needed], inputs, constants


def _rewrite(model, match: _Match, tables: tuple) -> None:
    import onnx_ir as ir

    old = match.node
    interleaved = match.rotary_q.attributes.get_int("interleaved", 0)
    attributes = [*old.attributes.values(), ir.AttrInt64("do_rotary", 1),
                  ir.AttrInt64("rotary_interleaved", interleaved)]
    new = ir.Node(_MS, "GroupQueryAttention",
                  [match.split.inputs[0], None, None, *old.inputs[3:7], *tables],
                  attributes, num_outputs=3, name=f"{old.name}_packed")
    model.graph.insert_before(old, new)
    for before, after in zip(old.outputs, new.outputs):
        after.shape, after.type = before.shape, before.type
        name, before.name = before.name, f"{before.name}_unpacked"
        after.name = name
        before.replace_all_uses_with(after)
    _read_length_from_rows(old.inputs[0], match.split.inputs[0])
    _skip_flattening_reshapes(new, match.split.inputs[0])
    start, end = match.bounds
    for present, top in ((new.outputs[1], match.rotary_k.outputs[0]),
                         (new.outputs[2], match.split.outputs[2])):
        for index, output in enumerate(list(model.graph.outputs)):
            if _is_new_rows(output, top, match):
                model.graph.outputs[index] = _slice(model, present, start, end, output, new)


def _skip_flattening_reshapes(node, rows) -> None:
    """GroupQueryAttention's output is [B, T, heads * head] already, as its packed rows'
    B and T; torch.onnx's ``view(1, -1, hidden)`` after it (one Reshape a layer, each a
    kernel call) then changes nothing, and its readers read the output itself."""
    heads, kv_heads = (node.attributes.get_int(k) for k in ("num_heads", "kv_num_heads"))
    width = rows.shape[-1] if rows.shape is not None else None
    if not isinstance(width, int) or rows.shape[0] != 1:
        return
    hidden = heads * width // (heads + 2 * kv_heads)  # q's share of the packed rows
    out = node.outputs[0]
    for use in list(out.uses()):
        reshape = use.node
        target = const_ints(reshape.inputs[1]) if reshape.op_type == "Reshape" \
            and reshape.domain == "" and len(reshape.inputs) > 1 else None
        if target is not None and len(target) == 3 and target[0] in (0, 1) \
                and target[1] in (0, -1) and target[2] == hidden \
                and not reshape.outputs[0].is_graph_output():
            reshape.outputs[0].replace_all_uses_with(out)


def _read_length_from_rows(query, rows) -> None:
    """The sequence lengths (contrib_ops.py) take T from a Shape of the query's chain;
    read it from the packed rows, which stay, so the chain can go."""
    import onnx_ir as ir

    while query is not None:
        for use in list(query.uses()):
            reader = use.node
            dims = query.shape
            if reader.op_type != "Shape" or dims is None or rows.shape is None:
                continue
            begin = reader.attributes.get_int("start", 0)
            end = reader.attributes.get_int("end", len(dims))
            if list(dims)[begin:end] == [rows.shape[1]]:
                reader.replace_input_with(0, rows)
                reader.attributes["start"] = ir.AttrInt64("start", 1)
                reader.attributes["end"] = ir.AttrInt64("end", 2)
        producer = query.producer()
        query = producer.inputs[0] if producer is not None and \
            producer.op_type in _PASS_THROUGH else None


def _is_new_rows(output, top, match: _Match) -> bool:
    """``output`` is ``Transpose(Reshape(top, [.., T, kv_heads, head]), [0, 2, 1, 3])``
    (Identities aside): the layer's new rows as the step returns them."""
    chain, value = [], output
    while value is not top and value.producer() is not None \
            and value.producer().op_type in _PASS_THROUGH:
        chain.append(value.producer())
        value = value.producer().inputs[0]
    kinds = [n.op_type for n in chain if n.op_type != "Identity"]
    shape = output.shape
    return (value is top and kinds == ["Transpose", "Reshape"]
            and list(chain[[n.op_type for n in chain].index("Transpose")]
                     .attributes["perm"].value) == [0, 2, 1, 3]
            and shape is not None and len(shape) == 4
            and shape[1] == match.node.attributes.get_int("kv_num_heads")
            and shape[3] == match.head)


def _slice(model, present, start, end, replaced, anchor):
    import onnx_ir as ir

    axes = _constant(model, "gqa_rows_axis", np.array([2], dtype=np.int64))
    made = ir.Node("", "Slice", [present, start, end, axes])
    model.graph.insert_after(anchor, made)
    out = made.outputs[0]
    out.shape, out.type = replaced.shape, replaced.type
    name, replaced.name = replaced.name, f"{replaced.name}_unpacked"
    out.name = name
    return out


def _constant(model, name: str, array: np.ndarray):
    import onnx_ir as ir

    if name in model.graph.initializers:
        return model.graph.initializers[name]
    tensor = ir.tensor(array)
    value = ir.Value(name=name, const_value=tensor, shape=ir.Shape(list(tensor.shape)),
                     type=ir.TensorType(tensor.dtype))
    model.graph.register_initializer(value)
    return value
