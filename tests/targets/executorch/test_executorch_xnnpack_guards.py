"""What XNNPACK inside ExecuTorch gets wrong, kept away from it: ops its partitioner
claims but computes otherwise than torch stay on ExecuTorch's portable kernels
(targets/executorch/xnnpack_guards.py), with the reason in placement, and stored tensors
reach it in default strides (targets/executorch/constant_layout.py); their builds
validate against eager at fp32."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("executorch")

from targets.executorch import support  # noqa: E402
from targets.executorch.lower import lower_program  # noqa: E402
from tests.models.executorch_numerics import permuted_bias, tanh_gelu_mlp  # noqa: E402

NUMERICS = "tests/models/executorch_numerics.py"


def _run_pte(buffer: bytes, *inputs: torch.Tensor) -> torch.Tensor:
    from executorch.runtime import Runtime
    method = Runtime.get().load_program(buffer).load_method("forward")
    return method.execute(list(inputs))[0]


def test_tanh_gelu_runs_on_the_portable_kernel_since_xnnpack_computes_exact_gelu():
    model, (x,) = tanh_gelu_mlp()
    program = torch.export.export(model, (x,))
    (gelu,) = [n for n in program.graph.nodes if n.target == torch.ops.aten.gelu.default]
    supported, reason = support.decide(gelu)
    assert supported and reason.startswith("portable kernel aten::gelu.out")
    assert "exact erf GELU" in reason
    lowered = lower_program(program)
    assert lowered.placement["aten.gelu.default"] == {"portable": 1}
    assert lowered.placement["aten.linear.default"] == {"XNNPACK": 2}
    with torch.no_grad():
        expected = model(x)
    # XNNPACK's erf form is 1e-3 off here; the portable kernel's tanh form is not
    torch.testing.assert_close(_run_pte(lowered.buffer, x), expected, rtol=1e-5, atol=1e-6)


def test_exact_gelu_stays_in_the_xnnpack_delegate():
    program = torch.export.export(torch.nn.GELU(), (torch.randn(2, 8),))
    (gelu,) = [n for n in program.graph.nodes if n.op == "call_function"]
    assert support.decide(gelu) == (True, "XNNPACK delegate (GeluConfig)")


def test_tanh_gelu_model_builds_for_executorch_and_matches_eager(cli_here, tmp_path):
    out = tmp_path / "tanh-gelu.artifact"
    result = cli_here("build", f"{NUMERICS}:tanh_gelu_mlp", "--target", "executorch",
                      "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True


def test_stored_tensor_with_odd_strides_of_a_size_one_dim_runs_in_the_xnnpack_delegate():
    model, (x,) = permuted_bias()
    assert model.bias.is_contiguous() and model.bias.stride() == (32, 16, 32, 1)
    lowered = lower_program(torch.export.export(model, (x,)))
    assert lowered.placement["aten.add.Tensor"] == {"XNNPACK": 1}
    with torch.no_grad():
        expected = model(x)
    # with its strides as stored, ExecuTorch's method failed at execute with error 0x1
    torch.testing.assert_close(_run_pte(lowered.buffer, x), expected, rtol=0, atol=0)


def test_model_with_a_folded_permuted_bias_builds_for_executorch_and_matches_eager(
        cli_here, tmp_path):
    out = tmp_path / "permuted-bias.artifact"
    result = cli_here("build", f"{NUMERICS}:permuted_bias", "--target", "executorch",
                      "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["validation"]["passed"] is True
