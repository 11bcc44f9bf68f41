"""The onnx target's rewrites into ONNX Runtime's fused ops, each with the same numbers
as the nodes it replaces and only where the match is exact:
- targets/onnx/rotary.py: transformers' ``x * cos + rotate_half(x) * sin`` becomes
  RotaryEmbedding; cos and sin scaled after the fact (YaRN, LongRoPE) stay as they are;
- targets/onnx/skip_norm.py: a residual Add and the RMSNorm after it become
  SkipSimplifiedLayerNormalization; a mean over another dim stays."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from targets.onnx.rotary import fuse_rotary_embeddings  # noqa: E402

HEADS, HEAD, LENGTH = 4, 16, 3


def _rope_model(scale: float | None) -> onnx.ModelProto:
    """x [1, HEADS, T, HEAD], positions [T] -> HF's rotary embedding of x."""
    half = HEAD // 2
    inv_freq = 1.0 / (10000 ** (np.arange(0, HEAD, 2, dtype=np.float32) / HEAD))
    consts = {"inv_freq": inv_freq, "ax0": np.array([0], np.int64),
              "ax1": np.array([1], np.int64), "ax3": np.array([3], np.int64),
              "zero": np.array([0], np.int64), "half": np.array([half], np.int64),
              "end": np.array([2 ** 62], np.int64), "one": np.array([1], np.int64),
              "scale": np.array(scale or 1.0, np.float32)}
    nodes = [helper.make_node("Unsqueeze", ["positions", "ax0"], ["p2"]),
             helper.make_node("Unsqueeze", ["p2", "ax0"], ["p3"]),  # [1, 1, T]
             helper.make_node("Transpose", ["p3"], ["pt"], perm=[0, 2, 1]),  # [1, T, 1]
             helper.make_node("Cast", ["pt"], ["pf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["pf", "inv_freq"], ["freqs"]),  # [1, T, HEAD/2]
             helper.make_node("Concat", ["freqs", "freqs"], ["angles"], axis=-1),
             helper.make_node("Cos", ["angles"], ["cos0"]),
             helper.make_node("Sin", ["angles"], ["sin0"])]
    cos, sin = "cos0", "sin0"
    if scale is not None:
        nodes += [helper.make_node("Mul", ["cos0", "scale"], ["cos1"]),
                  helper.make_node("Mul", ["sin0", "scale"], ["sin1"])]
        cos, sin = "cos1", "sin1"
    nodes += [helper.make_node("Unsqueeze", [cos, "ax1"], ["cos4"]),
              helper.make_node("Unsqueeze", [sin, "ax1"], ["sin4"]),
              helper.make_node("Slice", ["x", "zero", "half", "ax3", "one"], ["x1"]),
              helper.make_node("Slice", ["x", "half", "end", "ax3", "one"], ["x2"]),
              helper.make_node("Neg", ["x2"], ["nx2"]),
              helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
              helper.make_node("Mul", ["x", "cos4"], ["a"]),
              helper.make_node("Mul", ["rot", "sin4"], ["b"]),
              helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "rope",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HEADS, "t", HEAD]),
         helper.make_tensor_value_info("positions", TensorProto.INT64, ["t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, HEADS, "t", HEAD])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _rewritten(proto: onnx.ModelProto, fuse) -> tuple[int, onnx.ModelProto, list]:
    """(rewrites made, the rewritten model, its node types) of ``fuse`` on a copy."""
    model = ir.from_proto(proto)
    count = fuse(model)
    rewritten = ir.to_proto(model)
    kinds = [node.op_type for node in rewritten.graph.node]
    return count, rewritten, kinds


@pytest.mark.parametrize("scale", [None, 2.0])
def test_rotary_embedding_becomes_one_node_only_where_exact(scale):
    proto = _rope_model(scale)
    count, rewritten, kinds = _rewritten(proto, fuse_rotary_embeddings)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, HEADS, LENGTH, HEAD))
             .astype(np.float32), "positions": np.array([7, 8, 9], np.int64)}
    np.testing.assert_allclose(_run(rewritten, feeds)[0], _run(proto, feeds)[0], atol=2e-6)
    if scale is None:
        assert count == 1 and "RotaryEmbedding" in kinds and "Neg" not in kinds
    else:
        assert count == 0 and "RotaryEmbedding" not in kinds


def _skip_norm_model(axis: int) -> onnx.ModelProto:
    """y = scale * (s / sqrt(mean(s^2) + eps)) with s = x + skip (the mean over ``axis``),
    and s itself and -s as more outputs (the residual stream, read elsewhere)."""
    width = 8
    consts = {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32),
              "axes": np.array([axis], np.int64),
              "scale": np.linspace(0.5, 1.5, width, dtype=np.float32)}
    nodes = [helper.make_node("Add", ["x", "skip"], ["s"]),
             # a reader of the sum above the norm (Mixtral's MoE residual): the fused node
             # comes where the norm ends, so the graph must be ordered again
             helper.make_node("Neg", ["s"], ["minus_s"]),
             helper.make_node("Pow", ["s", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["s", "rms"], ["normed"]),
             helper.make_node("Mul", ["scale", "normed"], ["y"])]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "t", width])
            for n in ("x", "skip", "y", "s", "minus_s")]
    graph = helper.make_graph(nodes, "norm", info[:2], info[2:],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return onnx.shape_inference.infer_shapes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))


@pytest.mark.parametrize("axis", [-1, 1])
def test_add_and_rmsnorm_become_one_node_only_over_the_features(axis):
    from targets.onnx.skip_norm import fuse_skip_rms_norms
    proto = _skip_norm_model(axis)
    count, rewritten, kinds = _rewritten(proto, fuse_skip_rms_norms)
    onnx.checker.check_model(rewritten, full_check=True)  # what the onnx target runs
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 3, 8)).astype(np.float32),
             "skip": rng.standard_normal((1, 3, 8)).astype(np.float32)}
    for got, want in zip(_run(rewritten, feeds), _run(proto, feeds)):
        np.testing.assert_allclose(got, want, atol=2e-6)
    assert (count, "SkipSimplifiedLayerNormalization" in kinds) == (
        (1, True) if axis == -1 else (0, False))
