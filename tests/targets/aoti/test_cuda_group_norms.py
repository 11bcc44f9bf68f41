"""The cuda target's one-group GroupNorm rewrite: statistics over equal chunks in
channels-last order, against eager GroupNorm on the CPU (no GPU needed); which norms it
leaves alone. Marked cuda with the rest of the target's own tests."""

from __future__ import annotations

import copy

import pytest
import torch

from targets.aoti.passes.group_norms import (
    CHUNK,
    OneGroupNormsInPixelOrder,
    chunk_count,
    one_group_norm,
)

pytestmark = pytest.mark.cuda


class _MetaFormer(torch.nn.Module):
    """PoolFormer's block shape: a conv stem, one-group norms (one without affine), a
    two-group norm and a small one-group norm, which stay."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.norm = torch.nn.GroupNorm(1, channels)
        self.plain = torch.nn.GroupNorm(1, channels, affine=False)
        self.pairs = torch.nn.GroupNorm(2, channels)
        self.small = torch.nn.GroupNorm(1, channels)

    def forward(self, x):
        y = self.stem(x)
        z = y + self.norm(y)
        return self.plain(z) + self.pairs(z), self.small(y[:, :, :4, :4])


def _ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def test_one_group_norms_match_eager_and_the_rest_stay():
    model = _MetaFormer(24).eval().half()
    with torch.no_grad():  # a mean far from zero: what cancellation would show
        model.stem.bias.fill_(3.0)
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-1, 1)
    image = torch.randn(1, 3, 40, 40, dtype=torch.half)  # 24 x 40 x 40 = 38,400 a group
    result = OneGroupNormsInPixelOrder()(torch.export.export(model, (image,)))
    assert result.modified and result.info["one_group_norms_rewritten"] == 2
    assert _ops(result.program).count("aten.group_norm.default") == 2  # two groups, small
    fresh = torch.randn(1, 3, 40, 40, dtype=torch.half)
    got = result.program.module()(fresh)
    with torch.no_grad():  # against eager in float32 on the same half-precision weights
        want = copy.deepcopy(model).float()(fresh.float())
    for tensor, expected in zip(got, want):
        assert tensor.dtype == torch.half
        torch.testing.assert_close(tensor.float(), expected, atol=2e-2, rtol=1e-2)


def test_statistics_are_chunks_in_channels_last_order():
    x = torch.randn(2, 8, 32, 48) * 4 + 7  # 12,288 a group: 12 chunks of 1,024
    weight, bias = torch.rand(8) + 0.5, torch.randn(8)
    got = one_group_norm(x, weight, bias, 1e-5, chunk_count(8 * 32 * 48))
    want = torch.nn.functional.group_norm(x.double(), 1, weight.double(), bias.double())
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert chunk_count(8 * 32 * 48) == 12 and chunk_count(64 * 56 * 56) == 196
    assert chunk_count(512 * 7 * 7) == 28  # 896 each: the fewest chunks of at most CHUNK
    assert chunk_count(CHUNK * CHUNK + CHUNK) is None  # more than CHUNK chunks


def test_program_without_convolutions_keeps_its_norms():
    """Inductor lays such a program out as given (NCHW), where the rewrite's order would
    be the strided one."""
    norm = torch.nn.GroupNorm(1, 32).eval().half()
    image = torch.randn(1, 32, 24, 24, dtype=torch.half)
    assert not OneGroupNormsInPixelOrder()(torch.export.export(norm, (image,))).modified


def test_float32_norms_stay():
    program = torch.export.export(_MetaFormer(24).eval(), (torch.randn(1, 3, 40, 40),))
    result = OneGroupNormsInPixelOrder()(program)
    assert not result.modified


def test_cuda_target_rewrites_norms_after_its_convolution_rewrites(tmp_path):
    """The rewrite asks whether a convolution is left for Inductor to lay out: after the
    passes that turn convolutions into other ops."""
    from targets import get_target
    from targets.base import LowerOptions
    names = [p.name for p in get_target("cuda").default_passes(LowerOptions(tmp_path))]
    assert names.index("patch_convs_as_matmuls") < names.index("depthwise_convs_as_taps") \
        < names.index("one_group_norms_in_pixel_order")
    assert names.index("grouped_convs_as_batched_gemms") < names.index(
        "one_group_norms_in_pixel_order")
