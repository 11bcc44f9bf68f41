"""Average pools on ExecuTorch: a pool whose one window spans its input runs in the
XNNPACK delegate as a mean (passes/cleanup/global_pool.py), and a pool XNNPACK refuses
by its arguments is placed, and reported, on the portable kernel with XNNPACK's reason."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch")

from targets.executorch import support  # noqa: E402
from passes.cleanup.global_pool import GlobalAveragePool  # noqa: E402
from targets.executorch.lower import lower_program  # noqa: E402
from tests.models.executorch_numerics import ceil_mode_pooled_cnn  # noqa: E402


def _run_pte(buffer: bytes, *inputs: torch.Tensor) -> torch.Tensor:
    from executorch.runtime import Runtime
    method = Runtime.get().load_program(buffer).load_method("forward")
    return method.execute(list(inputs))[0]


def _pools(program) -> list[torch.fx.Node]:
    return [n for n in program.graph.nodes if n.target == torch.ops.aten.avg_pool2d.default]


def test_a_pool_window_wider_than_its_input_runs_in_xnnpack_as_a_mean_equal_to_eager():
    model, (x,) = ceil_mode_pooled_cnn()
    program = torch.export.export(model, (x,))
    result = GlobalAveragePool()(program)
    assert result.modified and result.info["pools"] == 1 and not _pools(result.program)
    lowered = lower_program(result.program)
    assert lowered.portable_ops == 0, lowered.placement
    assert lowered.placement["aten.mean.dim"] == {"XNNPACK": 1}
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(_run_pte(lowered.buffer, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pool", [
    torch.nn.AvgPool2d(3, stride=2, ceil_mode=True),      # windows that do not span it
    torch.nn.AvgPool2d(8, padding=1, ceil_mode=True),     # padding counts in the divisor
    torch.nn.AvgPool2d(8, ceil_mode=True, divisor_override=3),
], ids=["strided", "padded", "divisor-override"])
def test_a_ceil_mode_pool_that_is_not_a_mean_stays_a_pool_placed_where_it_runs(pool):
    x = torch.randn(1, 4, 7, 7)
    program = torch.export.export(pool, (x,))
    assert not GlobalAveragePool()(program).modified
    (node,) = _pools(program)
    supported, reason = support.decide(node)
    assert supported and reason.startswith("portable kernel aten::avg_pool2d.out")
    assert "AvgPoolingConfig refuses it: ceil mode is not supported" in reason
    lowered = lower_program(program)
    assert lowered.placement["aten.avg_pool2d.default"] == {"portable": 1}
    torch.testing.assert_close(_run_pte(lowered.buffer, x), pool(x), rtol=1e-5, atol=1e-6)


def test_a_plain_pool_is_still_placed_in_the_xnnpack_delegate():
    program = torch.export.export(torch.nn.AvgPool2d(2), (torch.randn(1, 4, 8, 8),))
    (node,) = _pools(program)
    assert support.decide(node) == (True, "XNNPACK delegate (AvgPoolingConfig)")
