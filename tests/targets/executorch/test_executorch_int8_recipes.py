"""executorch's PT2E int8 recipes on graphs ExecuTorch's XNNPACKQuantizer mishandles:
integer maths with scalars (BERT's attention mask at sequence 128), and dynamically
quantized convolutions after a pad (Hugging Face MobileNetV2), which XNNPACK's delegate
refused at execute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime
from exporter.validation.gates import compare_quantized
from tests.models.executorch_quant import conv_head, shifted_lookup

pytest.importorskip("executorch")
QUANT = "tests/models/executorch_quant.py"


def _quantize(program, recipe, calibration=()):
    from targets import LowerOptions, get_target
    target = get_target("executorch")
    step = target.quantization.quantize_pass(
        LowerOptions(work_dir=Path("."), quantize=recipe, calibration=list(calibration)),
        target.device)
    return step(program)


@pytest.mark.parametrize("recipe", ["int8-dynamic", "int8-static"])
def test_integer_maths_with_scalars_stays_integer_through_the_xnnpack_quantizer(recipe):
    """XNNPACKQuantizer stores each scalar of an add or mul as a float32 tensor: on
    ``ids * 2 + 1`` the indices became float and calibration failed (BERT-base's
    ``arange(128) + 0`` mask index: 'tensors used as indices must be long ...')."""
    model, args = shifted_lookup()
    program = torch.export.export(model, args)
    result = _quantize(program, recipe, [args] if recipe == "int8-static" else ())
    assert "out:linear" in result.info["layers_quantized"]
    scalars = [n.args for n in result.program.graph.nodes
               if n.target in (torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor)]
    assert [args[1] for args in scalars] == [2, 1]  # still Python ints on int64 tensors
    ids = torch.randint(0, 20, (2, 6))
    with torch.no_grad():
        row = compare_quantized(result.program.module()(ids), model(ids), 20.0, 0.99)
    assert row["passed"], row


@pytest.mark.slow  # a build and a validation process: 60-90 s here
def test_integer_index_maths_builds_and_validates_at_int8_on_executorch(tmp_path, cli_here):
    out = tmp_path / "shifted-int8-static.artifact"
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, ids=np.random.default_rng(0).integers(0, 20, (2, 6)))
    result = cli_here("build", f"{QUANT}:shifted_lookup", "--target", "executorch", "--out",
                      str(out), "--json", "--quantize", "int8-static", "--calibration",
                      str(calibration))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    ids = torch.randint(0, 20, (2, 6))
    model, _ = shifted_lookup()
    with torch.no_grad():
        assert compare_quantized(runtime.load(out)(ids), model(ids), 20.0, 0.99)["passed"]


def test_int8_dynamic_keeps_convolutions_float_and_quantizes_linears():
    """XNNPACK's dynamically quantized convolution behind a pad failed at execute
    (ExecuTorch error 0x1, 'Propagating input shapes failed'): HF MobileNetV2 int8-dynamic
    built and then died in validation. The recipe annotates linears only."""
    model, args = conv_head()
    info = _quantize(torch.export.export(model, args), "int8-dynamic").info
    assert info["layers_quantized"] == ["head:linear"]
    assert [row["layer"] for row in info["layers_float"]] == ["conv:conv2d"]
    assert "convolutions stay float" in info["how"]


def test_a_padded_convolution_builds_and_runs_at_int8_dynamic_on_executorch(tmp_path, cli_here):
    out = tmp_path / "conv-head-int8-dynamic.artifact"
    result = cli_here("build", f"{QUANT}:conv_head", "--target", "executorch", "--out", str(out),
                      "--json", "--quantize", "int8-dynamic")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
    placement = runtime.read_manifest(out).partitions[0].meta["placement"]
    assert placement["aten.convolution.default"] == {"XNNPACK": 1}
    assert placement["aten.linear.default"] == {"XNNPACK": 1}
    image = torch.randn(2, 3, 9, 9)
    model, _ = conv_head()
    with torch.no_grad():
        assert compare_quantized(runtime.load(out)(image), model(image), 20.0, 0.99)["passed"]
