"""A one-pixel convolution at batch 1 as a one-row linear (targets/aoti/passes/
pixel_convs.py, a cuda candidate), then a reduction by the target's row pass: checked
against eager on the CPU, marked cuda with the rest of the target's own tests."""

from __future__ import annotations

import pytest
import torch

from targets.aoti.passes.pixel_convs import PixelConvsAsRowLinears
from targets.aoti.passes.row_linears import SingleRowLinearsAsReductions

pytestmark = pytest.mark.cuda


class _SqueezeExcite(torch.nn.Module):
    """timm's SqueezeExcite: the pooled vector through two 1x1 convolutions; and a 1x1
    convolution over the whole image, which must stay."""

    def __init__(self) -> None:
        super().__init__()
        self.reduce = torch.nn.Conv2d(16, 4, 1)
        self.expand = torch.nn.Conv2d(4, 16, 1)
        self.project = torch.nn.Conv2d(16, 8, 1, bias=False)

    def forward(self, x):
        gate = self.expand(torch.nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True))))
        return self.project(x * gate.sigmoid())


def _targets(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("batch", [1, 2])
def test_squeeze_excite_convolutions_become_reductions_at_batch_one(batch):
    torch.manual_seed(0)
    model = _SqueezeExcite().to(torch.bfloat16).eval()
    x = torch.randn(batch, 16, 5, 5, dtype=torch.bfloat16)
    program = torch.export.export(model, (x,))
    result = PixelConvsAsRowLinears()(program)
    assert result.info["pixel_convs_rewritten"] == (2 if batch == 1 else 0)
    if batch == 1:
        convs = [t for t in _targets(result.program) if "conv" in t]
        assert len(convs) == 1  # the projection over the whole image
        reduced = SingleRowLinearsAsReductions()(result.program)
        assert reduced.info["linears_rewritten"] == 2
        with torch.no_grad():
            torch.testing.assert_close(reduced.program.module()(x).float(),
                                       model(x).float(), rtol=2e-2, atol=2e-2)
