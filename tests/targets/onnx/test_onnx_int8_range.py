"""An x86 artifact's int8 weights keep to 7 bits: on an x86 CPU without VNNI (AVX2 alone)
ONNX Runtime's u8s8 kernels sum pairs of products in 16 bits with saturation, and 8-bit
weights drifted the zoo MLP's int8-dynamic output to SQNR 11.7 dB (the gate refused it).
Any x86 device may be such a CPU; an aarch64 artifact keeps the full range."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

WIDTH = 256


def _mlp(path: Path) -> np.ndarray:
    """Two MatMuls with ReLU between, saved with external data; returns x."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH), dtype=np.float32)
                                       / 16, f"w{i}") for i in range(2)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="mm0"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w1"], ["y"], name="mm1")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, WIDTH])], weights)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]),
                    str(path), save_as_external_data=True, location=path.name + ".data")
    return rng.standard_normal((8, WIDTH), dtype=np.float32) * 3


def _quantized(tmp_path: Path, platform: str):
    import torch

    from targets.onnx.quantize import quantize_model
    path = tmp_path / platform / "model.onnx"
    path.parent.mkdir()
    x = _mlp(path)
    model, report = quantize_model(path, "int8-dynamic", [], [[torch.from_numpy(x)]],
                                   platform=platform)
    return model, report, x, path


def _int8_weights(model) -> list[np.ndarray]:
    from onnx import TensorProto, numpy_helper
    return [numpy_helper.to_array(t) for t in model.graph.initializer
            if t.data_type == TensorProto.INT8 and len(t.dims) == 2]


def _sqnr_against_float(model, path: Path, x: np.ndarray) -> float:
    """dB of the quantized model's output against the float model saved at ``path``."""
    import onnx
    import onnxruntime as ort

    def run(m) -> np.ndarray:
        return ort.InferenceSession(m.SerializeToString(), providers=[
            "CPUExecutionProvider"]).run(None, {"x": x})[0]
    reference, got = run(onnx.load(str(path))), run(model)
    return 10 * np.log10((reference ** 2).sum() / ((reference - got) ** 2).sum())


def test_x86_artifact_int8_weights_keep_to_seven_bits_and_match_float(tmp_path):
    model, report, x, path = _quantized(tmp_path, "linux-x86_64")
    weights = _int8_weights(model)
    assert len(weights) == 2 and report["weight_bits"] == 7
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) <= 64

    sqnr = _sqnr_against_float(model, path, x)
    assert sqnr > 25, sqnr  # 8-bit weights on an AVX2-only CPU: about 12 dB


def test_aarch64_artifact_int8_weights_use_the_full_range(tmp_path):
    model, report, _, _ = _quantized(tmp_path, "linux-aarch64")
    assert report["weight_bits"] == 8
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in _int8_weights(model)) > 100


def test_x86_int8_weight_recipe_keeps_eight_bits_and_matches_float(tmp_path):
    """The generation recipe (MatMulNBits, 8-bit blocks) is not ORT's u8s8 GEMM: its int8
    activations are symmetric (|a| <= 127), so its AVX2 pair sums stay in 16 bits with the
    full weight range, and an x86 build keeps all 8 bits."""
    import torch
    from onnx import numpy_helper

    from targets.onnx.quantize import quantize_model
    path = tmp_path / "model.onnx"
    x = _mlp(path)
    model, report = quantize_model(path, "int8-weight", [], [[torch.from_numpy(x)]],
                                   block=32, platform="linux-x86_64")
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and all(
        next(a.i for a in n.attribute if a.name == "bits") == 8 for n in nbits)
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    codes = np.concatenate([stored[n.input[1]].ravel() for n in nbits]).astype(np.int32)
    assert codes.min() <= 8 and codes.max() >= 248  # uint8 codes around 128: the full range

    sqnr = _sqnr_against_float(model, path, x)
    assert sqnr > 30, sqnr  # saturating 8-bit u8s8 sums fall far below (about 12 dB)
