"""What the onnx target rewrites before ONNX Runtime's quantizers, on small ONNX graphs
(no export): embedding tables as int8 rows (targets/onnx/quant_rewrites.py), whose
GatherBlockQuantized gives each gathered row back within half a quantization step; a
table that something else reads too, or a tiny one, stays float and says why; a tied head
untied; a Gemm (GPT-2's Conv1D) as MatMul + Add, which MatMulNBits then takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from targets.onnx.quant_rewrites import quantize_embedding_tables  # noqa: E402


def _model(table: np.ndarray, tied: bool = False):
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed", axis=0)]
    outputs = [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)]
    if tied:  # the output projection reads the same table, transposed
        nodes += [helper.make_node("Transpose", ["table"], ["table_t"], name="t"),
                  helper.make_node("MatMul", ["rows", "table_t"], ["logits"], name="head")]
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None])],
        outputs, [numpy_helper.from_array(table, "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _run(model, ids):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": ids})


@pytest.mark.parametrize("width", [256, 200, 48])  # a short last block; one short block
def test_a_table_becomes_int8_rows_within_half_a_step(width):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((1000, width)).astype(np.float32)
    model = _model(table)
    done = quantize_embedding_tables(model, block=128)
    ids = np.array([[0, 7, 999], [3, 3, 500]], dtype=np.int64)
    got = _run(model, ids)[0]
    ops = [n.op_type for n in model.graph.node]
    stored = {t.name: t.data_type for t in model.graph.initializer}
    # one scale per row block: its largest magnitude over 127; rounding errs by half a step
    blocks = [table[:, i:i + 128] for i in range(0, width, 128)]
    half_step = max(np.abs(b).max(axis=1).max() for b in blocks) / 127 / 2
    error = np.abs(got - table[ids]).max()
    assert done == {"embed": "int8"} and ops == ["GatherBlockQuantized"]
    assert stored == {"table_int8": TensorProto.UINT8, "table_scales": TensorProto.FLOAT}
    assert got.shape == (2, 3, width) and error <= half_step * 1.001


def test_a_tied_or_tiny_table_stays_float_and_says_why():
    rng = np.random.default_rng(0)
    tied = _model(rng.standard_normal((1000, 64)).astype(np.float32), tied=True)
    tiny = _model(rng.standard_normal((16, 64)).astype(np.float32))
    said = {"tied": quantize_embedding_tables(tied, block=128),
            "tiny": quantize_embedding_tables(tiny, block=128)}
    assert "also read by Transpose" in said["tied"]["embed"]
    assert "too small" in said["tiny"]["embed"]
    for model in (tied, tiny):
        assert [t.data_type for t in model.graph.initializer] == [TensorProto.FLOAT]


@pytest.mark.parametrize("recipe,ops", [
    ("int4-weight", {"GatherBlockQuantized", "MatMulNBits"}),
    ("int8-dynamic", {"Gather", "DequantizeLinear", "MatMulInteger"})])
def test_a_tied_head_is_untied_and_both_quantized(tmp_path, recipe, ops):
    """x @ table.T through a Transpose (a tied output projection, as torch.onnx writes
    it): the onnx target's quantizers take the head from its own transposed copy
    (MatMulNBits, MatMulInteger) and the table, now the Gather's alone, as int8 rows;
    the report names both, and the outputs stay near float's."""
    from targets.onnx.quantize import quantize_model

    rng = np.random.default_rng(0)
    table = rng.standard_normal((1000, 128)).astype(np.float32)
    path = tmp_path / "tied.onnx"
    onnx.save_model(_model(table, tied=True), str(path))
    ids = np.array([[0, 7, 999]], dtype=np.int64)
    want = _run(onnx.load(str(path)), ids)
    model, report = quantize_model(path, recipe, [], [[torch.from_numpy(ids)]], block=32)
    got = _run(model, ids)
    graph_ops = {n.op_type for n in model.graph.node}
    cosine = float((got[1] * want[1]).sum() / np.linalg.norm(got[1]) / np.linalg.norm(want[1]))
    assert ops <= graph_ops and not {"Transpose", "MatMul"} & graph_ops
    assert set(report["layers_quantized"]) == {"embed", "head"} and report["layers_float"] == []
    # an int4 or int8 head + int8 rows + their scales against one float table
    assert report["weight_bytes_after"] * 1.9 < report["weight_bytes_before"] == table.nbytes
    assert cosine > 0.99


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_layers_are_quantized_by_the_weight_only_recipes(tmp_path, trans_b):
    """GPT-2's Conv1D layers export as Gemm (with a bias): int4-weight left each in float
    (ORT's MatMulNBits quantizer takes MatMuls only). Now each is a MatMulNBits + Add,
    reported under the Gemm's own name, its output near float's, and the [out, in]
    original weight of a transposed Gemm is not kept beside the quantized copy."""
    from targets.onnx.quantize import quantize_model

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((256, 128) if trans_b else (128, 256)).astype(np.float32)
    bias = rng.standard_normal(256).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=trans_b)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    path = tmp_path / "gemm.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]),
                    str(path))
    x = rng.standard_normal((3, 128)).astype(np.float32)
    want = (x @ (weight.T if trans_b else weight)) + bias
    model, report = quantize_model(path, "int4-weight", [], [[torch.from_numpy(x)]])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    cosine = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    ops = sorted(n.op_type for n in model.graph.node)
    stored = sorted(t.name for t in model.graph.initializer)
    assert ops == ["Add", "MatMulNBits"] and report["layers_quantized"] == ["fc"]
    assert "w" not in stored and report["layers_float"] == [] and cosine > 0.99
