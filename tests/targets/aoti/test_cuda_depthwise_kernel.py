"""The cuda target's direct depthwise kernel (targets/aoti/kernels/depthwise_triton.py) and
the timed choice that places it (targets/aoti/passes/depthwise_kernel.py): the rewrite
of the chosen convolutions on the CPU through the op's reference math; the kernel against
torch's convolution and the timing on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from targets.aoti.kernels.depthwise_conv import depthwise_conv2d
from targets.aoti.passes.depthwise_kernel import DepthwiseConvsByTiming, rewritten

pytestmark = pytest.mark.cuda


class _Block(torch.nn.Module):
    """A 7x7 depthwise convolution, a dilated 3x3 one without bias, a dense one."""

    def __init__(self) -> None:
        super().__init__()
        self.large = torch.nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.dilated = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8, bias=False)
        self.dense = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.dense(self.dilated(torch.relu(self.large(x))))


def test_chosen_depthwise_convolutions_become_the_op_with_eager_values():
    torch.manual_seed(0)
    model = _Block().to(torch.bfloat16).eval()
    x = torch.randn(1, 8, 12, 12, dtype=torch.bfloat16)
    program = torch.export.export(model, (x,))
    seen = []

    def choose(key, sample):
        seen.append(key)
        return (16, 8, 1) if key[2][2] == 7 else None  # the 7x7 alone
    result = rewritten(program, choose)
    assert [key[2] for key in seen] == [(8, 1, 7, 7), (8, 1, 3, 3)]  # not the dense one
    assert result.info["depthwise_kernels"] == 1
    (node,) = [n for n in result.program.graph.nodes if n.target is depthwise_conv2d]
    assert list(node.args[-3:]) == [16, 8, 1]
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x).float(), model(x).float(),
                                   rtol=2e-2, atol=2e-2)


def test_without_a_gpu_nothing_is_timed_or_changed():
    model = _Block().to(torch.bfloat16).eval()
    program = torch.export.export(model, (torch.randn(1, 8, 12, 12, dtype=torch.bfloat16),))
    timed = []
    result = DepthwiseConvsByTiming(timer=lambda call: timed.append(call) or 1.0)(program)
    assert not result.modified and not timed and result.info["depthwise"] == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("kernel,stride,padding,dilation", [
    (7, 1, 3, 1), (3, 2, 1, 1), (5, 1, 4, 2), (9, 1, 4, 1)])
def test_the_kernel_computes_the_convolution(layout, kernel, stride, padding, dilation):
    from targets.aoti.kernels.depthwise_triton import launch_depthwise_conv
    torch.manual_seed(0)
    x = torch.randn(2, 40, 17, 15, device="cuda", dtype=torch.half).to(memory_format=layout)
    weight = torch.randn(40, 1, kernel, kernel, device="cuda", dtype=torch.half)
    bias = torch.randn(40, device="cuda", dtype=torch.half)
    args = ([stride] * 2, [padding] * 2, [dilation] * 2)
    want = F.conv2d(x.float(), weight.float(), bias.float(), *args, groups=40)
    for tile in ((8, 8, 1), (64, 8, 2)):
        got = launch_depthwise_conv(x, weight, bias, *args, *tile, wrap=False)
        assert got.is_contiguous(memory_format=layout)
        torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_block_keeps_eager_values_whichever_kernel_wins():
    torch.manual_seed(0)
    model = _Block().half().cuda().eval()
    x = torch.randn(1, 8, 56, 56, device="cuda", dtype=torch.half)
    program = torch.export.export(model, (x,))
    result = DepthwiseConvsByTiming()(program)
    assert len(result.info["depthwise"]) == 2
    with torch.no_grad():
        torch.testing.assert_close(result.program.module()(x).float(), model(x).float(),
                                   rtol=2e-3, atol=2e-3)
