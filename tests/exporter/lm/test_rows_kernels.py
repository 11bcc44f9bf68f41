"""bench/llm/rows: our own int8/int4 GEMV kernels in ONNX Runtime compute what MatMulNBits
computes (the same int8 activation blocks, the same integer sums), at one row and several,
for widths that are not a multiple of the block and row counts not a multiple of four."""

from __future__ import annotations

import platform
import shutil

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not (shutil.which("cc")
                                                          or shutil.which("gcc")),
    reason="the kernels are x86-64 AVX2 C, compiled here")

K, N = 320, 202  # 320 = 2.5 blocks of 128; 202 rows = 50 groups of four and two more


def _model(path, glu: bool = False):
    """x @ w, or a LLaMA MLP's packed gate/up as the onnx target exports it: the
    product split in halves, silu(gate) * up."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(0).standard_normal((K, N)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p" if glu else "y"])]
    tables = [numpy_helper.from_array(w, "w")]
    if glu:
        nodes += [helper.make_node("Split", ["p", "halves"], ["gate", "up"], axis=2),
                  helper.make_node("Sigmoid", ["gate"], ["sig"]),
                  helper.make_node("Mul", ["gate", "sig"], ["silu"]),
                  helper.make_node("Mul", ["silu", "up"], ["y"])]
        tables.append(numpy_helper.from_array(np.array([N // 2, N // 2]), "halves"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s", N // 2 if glu else N])],
        tables)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _db(want, got) -> float:
    return float(10 * np.log10((want ** 2).sum() / max(((want - got) ** 2).sum(), 1e-30)))


@pytest.mark.parametrize("recipe,block,glu", [("int8-weight", 256, False),
                                              ("int4-weight", 128, False),
                                              ("int8-weight", 64, False),
                                              ("int4-weight", 128, True)])
def test_our_kernels_compute_what_matmulnbits_computes(tmp_path, recipe, block, glu):
    import onnx
    import onnxruntime as ort

    from bench.llm.rows import DOMAIN, opened_with_rows
    from targets.onnx.quantize import quantize_model
    _model(tmp_path / "float.onnx", glu)
    x = np.random.default_rng(1).standard_normal((1, 5, K)).astype(np.float32)
    model, _ = quantize_model(tmp_path / "float.onnx", recipe, [], [[torch.from_numpy(x)]],
                              block=block)
    path = tmp_path / "quantized.onnx"
    onnx.save(model, str(path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    theirs = ort.InferenceSession(str(path), options)
    moved: list[int] = []
    with opened_with_rows(moved):
        ours = ort.InferenceSession(str(path), options)
    rewritten = onnx.load(str(tmp_path / "quantized.rows.onnx"))
    assert moved == [1] and [(n.domain, n.op_type) for n in rewritten.graph.node] == [
        (DOMAIN, "MatMulNBitsGLU" if glu else "MatMulNBits")]
    for rows in (x[:, :1], x):  # one row (decode) and five (prefill)
        want, got = theirs.run(None, {"x": rows})[0], ours.run(None, {"x": rows})[0]
        assert got.shape == want.shape == (1, rows.shape[1], N // 2 if glu else N)
        assert _db(want, got) > 100  # float sums in another order, nothing more


def test_only_the_nodes_the_kernels_take_are_moved():
    from onnx import helper

    from bench.llm.rows import rewrite

    def node(bits, block, inputs=3):
        return helper.make_node("MatMulNBits", ["a", "b", "s", "z"][:inputs], ["y"],
                                domain="com.microsoft", K=256, N=8, bits=bits,
                                block_size=block)
    nodes = [node(8, 256), node(4, 128), node(4, 32), node(2, 64), node(8, 128, inputs=4)]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert rewrite(model) == 2
    assert [n.domain for n in model.graph.node][:2] == ["edge_exporter.cpu"] * 2
    assert {n.domain for n in model.graph.node[2:]} == {"com.microsoft"}
