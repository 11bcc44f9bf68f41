"""The cuda target's GEMM rewrites: a patch convolution as a GEMM over its patches, and a
linear of unaligned width over a padded weight. Graph rewrites checked against eager on the
CPU (no GPU needed), marked cuda with the rest of the target's own tests."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.passes.aligned_linears import LinearsAlignedByPadding
from targets.aoti.passes.patch_convs import PatchConvsAsMatmuls

pytestmark = pytest.mark.cuda


class _Stems(torch.nn.Module):
    """A ViT stem on an image its patches do not tile, a bias-free patch conv after it,
    and an overlapping conv that must stay a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 32, 8, 8)
        self.merge = torch.nn.Conv2d(32, 16, (3, 2), (3, 2), bias=False)
        self.overlap = torch.nn.Conv2d(3, 8, 3, 1)

    def forward(self, x):
        return self.merge(self.patch(x)).flatten(1).sum(1) + self.overlap(x).mean()


class _TiedHead(torch.nn.Module):
    """GPT-2's shape: an odd vocabulary, the head tied to the embedding; and a biased
    classifier of 13 labels."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(101, 16)
        self.head = torch.nn.Linear(16, 101, bias=False)
        self.head.weight = self.embed.weight
        self.classes = torch.nn.Linear(16, 13)

    def forward(self, ids):
        hidden = self.embed(ids)
        return self.head(hidden), self.classes(hidden)


def _ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def test_patch_convolutions_become_gemms_with_eager_values_on_untiled_images():
    torch.manual_seed(0)
    model, x = _Stems().eval(), torch.randn(2, 3, 70, 66)
    result = PatchConvsAsMatmuls()(torch.export.export(model, (x,)))
    assert result.modified and result.info["convs_rewritten"] == 2
    assert _ops(result.program).count("aten.conv2d.default") == 1  # the overlapping one
    fresh = torch.randn(2, 3, 70, 66)
    torch.testing.assert_close(result.program.module()(fresh), model(fresh), atol=1e-4,
                               rtol=1e-4)


def test_unaligned_head_reads_one_padded_copy_shared_with_its_tied_embedding():
    torch.manual_seed(0)
    model, ids = _TiedHead().eval(), torch.randint(0, 101, (1, 7))
    result = LinearsAlignedByPadding()(torch.export.export(model, (ids,)))
    assert result.modified and result.info["linears_padded"] == 2
    shapes = sorted(tuple(t.shape) for t in result.program.state_dict.values())
    assert shapes == [(16,), (16, 16), (104, 16)]  # one table: head and embedding share it
    fresh = torch.tensor([[0, 100, 57, 3, 99, 1, 64]])  # the first and last ids too
    for got, want in zip(result.program.module()(fresh), model(fresh)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_cuda_target_rewrites_gemms_before_the_single_row_linears(tmp_path):
    from targets import get_target
    from targets.base import LowerOptions
    cuda = get_target("cuda")

    def names(**options) -> list[str]:
        return [p.name for p in cuda.default_passes(LowerOptions(tmp_path, **options))]
    assert {"patch_convs_as_matmuls", "linears_aligned_by_padding"} <= set(names())
    assert "patch_convs_as_matmuls" not in names(fuse=False)
    assert names()[-1] == "single_row_linears_as_reductions"
