"""Our custom ops as ONNX Runtime's contrib ops (domain ``com.microsoft``), for
torch.onnx's ``custom_translation_table`` (with aten's stable sort, see translations()).

``edge_exporter::cached_attention`` (runtime/generation/attention_op.py) becomes one
``GroupQueryAttention`` node: the kernel ONNX Runtime GenAI's decoders run. Its inputs
are the new tokens' query/key/value as [B, T, heads * D], the cache buffers, ``seqlens_k``
(total length - 1) and ``total_sequence_length``; with the past and present buffers
bound to one memory it writes the new rows in place, and otherwise copies the past into
its present output first (both give the same attention; exporter/lm/attention.py).

The ONNX package has no schemas for contrib ops, and torch.onnx's graph builder needs
one to record a node, so GroupQueryAttention's (the inputs and attributes used here) is
declared below, as ORT's contrib_defs.cc states it.
"""

from __future__ import annotations

import functools

ONNX_INT32 = 6  # TensorProto.INT32


@functools.cache
def translations() -> dict:
    """{torch op overload: its translation}; importing the op registers it. Also aten's
    stable sort, which torchlib registers only as ``aten::sort``: its translation, TopK,
    puts the lower index first among equal keys (the ONNX spec), so it is stable."""
    import torch
    from onnxscript.function_libs.torch_lib.ops.core import aten_sort
    from runtime.generation.attention_op import cached_attention
    return {cached_attention._opoverload: _cached_attention,
            torch.ops.aten.sort.stable: aten_sort}


@functools.cache
def _group_query_attention():
    from onnx.defs import OpSchema
    from onnxscript.values import Op, Opset

    param, attr = OpSchema.FormalParameter, OpSchema.Attribute
    schema = OpSchema(
        "GroupQueryAttention", "com.microsoft", 1,
        inputs=[param(name, kind) for name, kind in (
            ("query", "T"), ("key", "T"), ("value", "T"), ("past_key", "T"),
            ("past_value", "T"), ("seqlens_k", "M"), ("total_sequence_length", "M"))],
        outputs=[param(name, "T") for name in ("output", "present_key", "present_value")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                          ("M", ["tensor(int32)"], "")],
        attributes=[attr("num_heads", OpSchema.AttrType.INT, ""),
                    attr("kv_num_heads", OpSchema.AttrType.INT, ""),
                    attr("scale", OpSchema.AttrType.FLOAT, ""),
                    attr("softcap", OpSchema.AttrType.FLOAT, "")])
    return Op(Opset("com.microsoft", 1), "GroupQueryAttention", schema)


def _cached_attention(query, key, value, past_key, past_value, start, scaling: float,
                      softcap: float):
    """[1, H, T, D] query and [1, KVH, T, D] rows -> GroupQueryAttention -> [1, T, H, Dv]."""
    from onnxscript import opset18 as op

    heads, kv_heads = query.shape[1], key.shape[1]
    if not isinstance(heads, int) or not isinstance(kv_heads, int):
        raise ValueError("cached_attention needs static head counts to become "
                         "GroupQueryAttention")

    def flat(x):  # [1, heads, T, D] -> [1, T, heads * D]
        return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))

    length = op.Shape(query, start=2, end=3)  # [1] int64
    total = op.Add(op.Reshape(start, op.Constant(value_ints=[1])), length)
    seqlens = op.Cast(op.Sub(total, op.Constant(value_ints=[1])), to=ONNX_INT32)
    total_scalar = op.Cast(op.Squeeze(total, op.Constant(value_ints=[0])), to=ONNX_INT32)
    out, _, _ = _group_query_attention()(
        flat(query), flat(key), flat(value), past_key, past_value, seqlens, total_scalar,
        num_heads=heads, kv_num_heads=kv_heads, scale=scaling, softcap=softcap)
    return op.Reshape(out, op.Constant(value_ints=[0, 0, heads, -1]))


def share_sequence_lengths(model) -> int:
    """Give every GroupQueryAttention of ``model`` the first one's ``seqlens_k`` and
    ``total_sequence_length``, and drop the copies; returns how many nodes read the shared
    pair. Each translated call above computes the pair from the step's ``start`` and its
    own query's length (six nodes a layer: Shape, Reshape, Add, Sub, Squeeze, two Casts),
    which no common-subexpression pass merges because each layer's query is another
    tensor. Every layer of a step attends from the same start over the same new tokens,
    so a node whose pair comes from the same ``start`` and a query of the same symbolic
    length reads the first one's; any other keeps its own. ONNX Runtime GenAI's decoders
    compute the pair once for all layers too."""
    import onnx_ir.passes.common as common_passes
    from onnxscript.rewriter import _basic_rules

    first, shared = None, 0
    for node in list(model.graph):
        if (node.domain, node.op_type) != ("com.microsoft", "GroupQueryAttention"):
            continue
        key = _length_source(node)
        if key is None:
            continue
        if first is None:
            first = (key, node.inputs[5], node.inputs[6])
        elif key == first[0]:
            node.replace_input_with(5, first[1])
            node.replace_input_with(6, first[2])
            shared += 1
    if shared:
        common_passes.RemoveUnusedNodesPass()(model)
        # the queries' transposes back to [B, T, heads * D] now meet their one reader:
        # onnxscript's basic rules cancel those pairs and merge the reshapes between
        _basic_rules.basic_optimization_rules().apply_to_model(model)
        common_passes.RemoveUnusedNodesPass()(model)
    return shared


def step_bounds(node) -> tuple | None:
    """(start, total) as ``_cached_attention`` built ``node``'s sequence lengths from: int64
    [1] values holding the first new token's position and that plus the step's length
    (the new rows' slots are start..total-1), or None where they were built otherwise."""
    add = _lengths_add(node)
    return None if add is None else (add.inputs[0], add.outputs[0])


def _length_source(node):
    """(the ``start`` value, the query's symbolic length) that ``_cached_attention`` built
    ``node``'s sequence lengths from, or None where they were built otherwise."""
    add = _lengths_add(node)
    if add is None:
        return None
    reshape, shape = _made_by(add.inputs[0], "Reshape"), _made_by(add.inputs[1], "Shape")
    if not reshape or not shape or shape.inputs[0].shape is None:
        return None
    query = shape.inputs[0]
    dims = query.shape
    begin, end = shape.attributes.get_int("start", 0), shape.attributes.get_int("end", len(dims))
    return (id(reshape.inputs[0]), tuple(str(d) for d in list(dims)[begin:end]))


def _lengths_add(node):
    """The ``Add(Reshape(start), length)`` behind ``node``'s seqlens_k and
    total_sequence_length (through their Sub/Squeeze and Casts), or None."""
    cast_lengths = _made_by(node.inputs[5], "Cast")
    cast_total = _made_by(node.inputs[6], "Cast")
    sub = cast_lengths and _made_by(cast_lengths.inputs[0], "Sub")
    squeeze = cast_total and _made_by(cast_total.inputs[0], "Squeeze")
    add = sub and _made_by(sub.inputs[0], "Add")
    if not add or not squeeze or squeeze.inputs[0] is not add.outputs[0]:
        return None
    return add


def _made_by(value, op_type):
    producer = value.producer() if value is not None else None
    return producer if producer is not None and producer.op_type == op_type else None


def const_ints(value) -> list[int] | None:
    """The integers a constant (an initializer or a Constant node's output) holds, or None
    for a value computed at run time."""
    import onnx_ir.convenience as convenience

    tensor = convenience.get_const_tensor(value) if value is not None else None
    return None if tensor is None else [int(x) for x in tensor.numpy().reshape(-1)]


def supports(op) -> bool:
    return op in translations()


def expose_in_place_cache(model) -> dict[str, str]:
    """Make each GroupQueryAttention's present key/value a graph output named after its
    past input, and return {output: input}: the runtime binds the two onto one buffer
    (``OnnxRuntimeMeta.in_place``), so the kernel writes the new rows where the cache
    lies instead of copying the past into a present of its own each step (a 300M
    decoder's 20 layers x 2 x 256 KB a token). ``model`` is torch.onnx's onnx_ir model."""
    exposed = {}
    for node in model.graph:
        if (node.domain, node.op_type) != ("com.microsoft", "GroupQueryAttention"):
            continue
        for past, present in ((node.inputs[3], node.outputs[1]),
                              (node.inputs[4], node.outputs[2])):
            # (a present read inside the step reads the cache as the kernel left it:
            # packed_attention.py's new rows)
            if past is None or not past.is_graph_input() \
                    or present.is_graph_output() or past.name in exposed.values():
                continue
            present.name = f"{past.name}.in_place"
            present.shape, present.type = past.shape, past.type
            model.graph.outputs.append(present)
            exposed[present.name] = past.name
    return exposed
