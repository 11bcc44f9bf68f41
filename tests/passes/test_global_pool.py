"""passes/cleanup/global_pool.py: an average pool whose one window spans its input is
rewritten to the mean it computes, and only then."""

from __future__ import annotations

import pytest
import torch

from passes.cleanup.global_pool import GlobalAveragePool


def _pools(program) -> int:
    return sum(n.target == torch.ops.aten.avg_pool2d.default for n in program.graph.nodes)


@pytest.mark.parametrize("pool, shape", [
    (torch.nn.AvgPool2d(1280, ceil_mode=True), (1, 8, 7, 7)),       # EfficientNet's head
    (torch.nn.AvgPool2d((9, 5), ceil_mode=True), (2, 3, 9, 4)),     # non-square, batch 2
    (torch.nn.AvgPool2d(7), (1, 4, 7, 7)),                          # the classic global pool
    (torch.nn.AvgPool2d(12, ceil_mode=True, count_include_pad=False), (1, 2, 5, 6)),
], ids=["efficientnet-head", "non-square", "exact-window", "count-include-pad-off"])
def test_a_pool_window_spanning_its_input_becomes_a_mean_with_the_same_values(pool, shape):
    x = torch.randn(*shape)
    result = GlobalAveragePool()(torch.export.export(pool, (x,)))
    assert result.modified and _pools(result.program) == 0
    torch.testing.assert_close(result.program.module()(x), pool(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("pool, shape", [
    (torch.nn.AvgPool2d(3, stride=2, ceil_mode=True), (1, 4, 7, 7)),
    (torch.nn.AvgPool2d(8, padding=1, ceil_mode=True), (1, 4, 7, 7)),
    (torch.nn.AvgPool2d(8, ceil_mode=True, divisor_override=3), (1, 4, 7, 7)),
    (torch.nn.AvgPool2d(6, stride=6), (1, 4, 7, 7)),                # 1x1 out, a row left out
], ids=["strided", "padded", "divisor-override", "window-short-of-the-input"])
def test_a_pool_that_is_not_the_mean_of_its_input_is_left_alone(pool, shape):
    program = torch.export.export(pool, (torch.randn(*shape),))
    result = GlobalAveragePool()(program)
    assert not result.modified and _pools(result.program) == 1
