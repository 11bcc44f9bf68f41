"""int8-static on target onnx (ONNX Runtime's QDQ quantizer, targets/onnx/quantize.py): an
EfficientNet-shaped network (conv + batch norm + SiLU blocks with a squeeze-excite, the
pooler's kernel larger than its map in ceil mode) passes the default accuracy gate, and an
average pool whose window runs past its input averages the same in int8 as in float
(quant_rewrites.pools_counting_only_the_input)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import exporter  # noqa: E402
from exporter.settings import BuildSettings  # noqa: E402
from targets.onnx.quantize import quantize_model  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

DEFAULT_SQNR_DB = BuildSettings.model_fields["quant_min_sqnr_db"].default


def test_squeeze_excite_silu_network_in_int8_static_passes_the_default_gate(tmp_path):
    built = exporter.build(f"{ROOT}/tests/models/squeeze_excite.py:factory", target="onnx",
                           quantize="int8-static", calibration="random",
                           out=tmp_path / "squeeze-excite-int8-static.artifact")
    (row,) = built.manifest.validation["outputs"]
    assert built.manifest.validation["passed"]
    assert row["sqnr_db"] >= DEFAULT_SQNR_DB


def _pool_model(path, kernel: int, channels: int = 4):
    """conv 1x1 -> AveragePool (count_include_pad=1, ceil mode) -> conv 1x1: the convs
    give the pool quantized neighbours, so ONNX Runtime runs it as its int8 kernel."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((channels, channels, 1, 1))
                                       .astype(np.float32), name) for name in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="first"),
             helper.make_node("AveragePool", ["a"], ["p"], name="pool", ceil_mode=1,
                              count_include_pad=1, kernel_shape=[kernel, kernel],
                              strides=[kernel, kernel]),
             helper.make_node("Conv", ["p", "w2"], ["y"], name="second")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))


def _sqnr_db(want: np.ndarray, got: np.ndarray) -> float:
    noise = ((want - got) ** 2).sum()
    return float("inf") if noise == 0 else float(10 * np.log10((want ** 2).sum() / noise))


@pytest.mark.parametrize("kernel", [16, 4])  # one window past the whole map; a last one past its edge
def test_a_pool_window_past_its_input_averages_alike_in_int8_and_float(tmp_path, kernel):
    path = tmp_path / "pool.onnx"
    _pool_model(path, kernel)
    generator = torch.Generator().manual_seed(0)
    calibration = [[torch.randn(1, 4, 6, 6, generator=generator)] for _ in range(4)]
    quantized, _ = quantize_model(path, "int8-static", calibration)
    x = {"x": torch.randn(1, 4, 6, 6, generator=generator).numpy()}
    # ONNX Runtime runs DQ -> AveragePool -> Q as its int8 kernel; op by op, the pool is
    # the float one between the same DQ and Q
    int8 = ort.InferenceSession(quantized.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, x)[0]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    op_by_op = ort.InferenceSession(quantized.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, x)[0]
    # the whole kernel as divisor gave 0.7 dB (kernel 16) and 3.3 dB (kernel 4)
    assert int8.shape == op_by_op.shape and _sqnr_db(op_by_op, int8) >= 30
