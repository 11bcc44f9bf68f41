"""The cuda target's timed choice of each dense convolution's form
(targets/aoti/passes/conv_gemms.py): the GEMM form against eager convolutions and the
rewrite of the chosen shapes alone on the CPU; the timing itself on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from targets.aoti.passes.conv_gemms import (
    ConvsAsGemmsByTiming,
    conv_as_gemm,
    gemm_cost,
    rewritten,
)

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("kernel,stride,padding,dilation", [
    (3, 1, 1, 1), (1, 1, 0, 1), (3, 2, 1, 1), (3, 1, 2, 2), (7, 2, 3, 1), (2, 2, 0, 1)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_gemm_form_computes_the_convolution(kernel, stride, padding, dilation,
                                                with_bias):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 11, 9, dtype=torch.float64)
    weight = torch.randn(6, 5, kernel, kernel, dtype=torch.float64)
    bias = torch.randn(6, dtype=torch.float64) if with_bias else None
    args = ([stride] * 2, [padding] * 2, [dilation] * 2)
    want = F.conv2d(x, weight, bias, *args)
    got = conv_as_gemm(x, weight, bias, *args)
    assert got.shape == want.shape
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, want)
    channels_last = conv_as_gemm(x.to(memory_format=torch.channels_last), weight, bias, *args)
    torch.testing.assert_close(channels_last, want)


class _ThreeConvs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.c = torch.nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.d = torch.nn.Conv2d(16, 16, 1)

    def forward(self, x):
        return self.d(self.c(torch.relu(self.b(torch.relu(self.a(x))))))


def _convs(program) -> int:
    return sum(n.target is torch.ops.aten.conv2d.default for n in program.graph.nodes)


def test_only_the_chosen_shapes_of_one_group_are_rewritten_with_eager_values():
    torch.manual_seed(0)
    model = _ThreeConvs().to(torch.bfloat16).eval()
    x = torch.randn(1, 8, 10, 10, dtype=torch.bfloat16)
    program = torch.export.export(model, (x,))
    seen = []

    def choose(key, sample):
        seen.append(key)
        return key[1][1] == 16  # b's filters only; c is grouped, d a GEMM already
    result = rewritten(program, choose)
    assert len(seen) == 2 and result.info["convs_as_gemms"] == 1
    assert result.modified and _convs(result.program) == 3
    # a's input is the program's input; b's a ReLU that only b reads (its gather folds in)
    assert [key[-1] for key in seen] == [False, True]
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x).float(), model(x).float(),
                                   rtol=2e-2, atol=2e-2)


def test_a_gather_folded_into_the_kernel_making_the_input_costs_only_the_excess():
    times = {"gather": 3.0, "gemm_alone": 4.0, "pointwise": 1.25}
    assert gemm_cost(times, fusable=False) == 7.0
    assert gemm_cost(times, fusable=True) == 5.75
    assert gemm_cost({**times, "pointwise": 5.0}, fusable=True) == 4.0


def test_without_a_gpu_nothing_is_timed_or_changed():
    model = _ThreeConvs().to(torch.bfloat16).eval()
    program = torch.export.export(model, (torch.randn(1, 8, 10, 10, dtype=torch.bfloat16),))
    timed = []
    result = ConvsAsGemmsByTiming(timer=lambda call: timed.append(call) or 1.0)(program)
    assert not result.modified and not timed and result.info["convs"] == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_densenet_shaped_convolutions_keep_eager_values_whatever_form_wins():
    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.narrow = torch.nn.Conv2d(256, 128, 1, bias=False)
            self.grow = torch.nn.Conv2d(128, 32, 3, padding=1, bias=False)

        def forward(self, x):
            return self.grow(torch.relu(self.narrow(x)))

    torch.manual_seed(0)
    model = Layer().half().cuda().eval()
    x = torch.randn(1, 256, 7, 7, device="cuda", dtype=torch.half)
    program = torch.export.export(model, (x,))
    result = ConvsAsGemmsByTiming()(program)
    (times,) = result.info["convs"].values()  # the 3x3 alone: the 1x1 is a GEMM already
    assert set(times) == {"cudnn", "gather", "gemm_alone", "pointwise"}
    assert min(times.values()) > 0
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x).float(), model(x).float(),
                                   rtol=2e-3, atol=2e-3)
