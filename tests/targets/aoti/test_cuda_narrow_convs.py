"""The cuda target's timed padding of narrow convolutions to 8 input channels
(targets/aoti/passes/narrow_convs.py): the padded form against eager and the rewrite of
the chosen shapes on the CPU; the timing itself on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from targets.aoti.passes.narrow_convs import NarrowConvsPaddedByTiming, padded_conv, rewritten

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("channels,kernel,stride,padding", [(3, 7, 2, 3), (3, 3, 1, 1),
                                                            (5, 1, 1, 0), (12, 3, 2, 1)])
def test_the_padded_form_computes_the_convolution(channels, kernel, stride, padding):
    torch.manual_seed(0)
    x = torch.randn(1, channels, 15, 13, dtype=torch.float64)
    weight = torch.randn(6, channels, kernel, kernel, dtype=torch.float64)
    bias = torch.randn(6, dtype=torch.float64)
    args = ([stride] * 2, [padding] * 2, [1, 1])
    torch.testing.assert_close(padded_conv(x, weight, bias, *args),
                               F.conv2d(x, weight, bias, *args))


class _Stem(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rgb = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.wide = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)

    def forward(self, x):
        return self.depthwise(self.wide(torch.relu(self.rgb(x))))


def test_only_chosen_narrow_convolutions_are_padded_with_eager_values():
    torch.manual_seed(0)
    model = _Stem().to(torch.bfloat16).eval()
    x = torch.randn(1, 3, 12, 12, dtype=torch.bfloat16)
    program = torch.export.export(model, (x,))
    seen = []

    def choose(key, sample):
        seen.append(key)
        return True
    result = rewritten(program, choose)
    assert [key[1] for key in seen] == [(16, 3, 3, 3)]  # 16 channels are aligned already
    assert result.info["narrow_convs_padded"] == 1
    pads = [n for n in result.program.graph.nodes if "pad" in str(n.target)]
    assert len(pads) == 2  # the input's and the filters'
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x).float(), model(x).float(),
                                   rtol=2e-2, atol=2e-2)


def test_without_a_gpu_nothing_is_timed_or_changed():
    model = _Stem().to(torch.bfloat16).eval()
    program = torch.export.export(model, (torch.randn(1, 3, 12, 12, dtype=torch.bfloat16),))
    timed = []
    result = NarrowConvsPaddedByTiming(timer=lambda call: timed.append(call) or 1.0)(program)
    assert not result.modified and not timed and result.info["narrow_convs"] == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_rgb_stem_keeps_eager_values_whichever_form_wins():
    torch.manual_seed(0)
    model = _Stem().half().cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)
    program = torch.export.export(model, (x,))
    result = NarrowConvsPaddedByTiming()(program)
    (times,) = result.info["narrow_convs"].values()
    assert set(times) == {"cudnn", "padded"} and min(times.values()) > 0
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x).float(), model(x).float(),
                                   rtol=2e-3, atol=2e-3)
