"""Our custom ops as ONNX Runtime's contrib ops (domain ``com.microsoft``), for
torch.onnx's ``custom_translation_table``.

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
    """{torch op overload: its translation}; importing the op registers it."""
    from runtime.generation.attention_op import cached_attention
    return {cached_attention._opoverload: _cached_attention}


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
            if past is None or not past.is_graph_input() or present.uses() \
                    or present.is_graph_output() or past.name in exposed.values():
                continue
            present.name = f"{past.name}.in_place"
            present.shape, present.type = past.shape, past.type
            model.graph.outputs.append(present)
            exposed[present.name] = past.name
    return exposed
