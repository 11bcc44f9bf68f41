"""A depthwise convolution (one filter per channel) as one reduction over its taps: the
padded input's windows as a strided view, times the filter, summed in fp32; one kernel
Inductor generates, instead of cuDNN's depthwise kernel.

    before: y = conv2d(x, W, b, stride=s, padding=p, dilation=d, groups=C)   W: [C, 1, kh, kw]
    after:  windows = pad(x, p).unfold(2, d*(kh-1)+1, s).unfold(3, d*(kw-1)+1, s)[..., ::d, ::d]
            y = (sum over the last two dims of float(windows) * float(W)[None, :, None, None]
                 + float(b)).to(x.dtype)                  windows: [N, C, Ho, Wo, kh, kw], a view

A depthwise filter reads each input kh*kw times for as many multiply-adds: the work is
moving bytes, and cuDNN's depthwise kernels take several times the bytes' time at batch 1
(ConvNeXt's 7x7s: bench/cuda_gap.py profiles them). A handful of graph nodes a convolution
whatever its kernel size: one node a tap made a ConvNeXt's lowering minutes longer.
Only static image sizes, half-precision weights (what was measured), one filter per
channel, and convolutions of
at most ``MAX_MULTIPLY_ADDS``: past that cuDNN's kernel was the faster one (an H200, fp16:
bench/cuda_kernel_ab.py times both).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import replace_calls, rewrite_and_recapture
from targets.aoti.passes.conv_calls import output_size, pair, static_depthwise, windows

# batch x channels x output pixels x taps; a ConvNeXt-T's 14x14 and 7x7 stages are under it
MAX_MULTIPLY_ADDS = 4_000_000


class DepthwiseConvsAsTaps:
    name = "depthwise_convs_as_taps"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "depthwise_convs_rewritten")


def depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   stride: list, padding: list, dilation: list) -> torch.Tensor:
    """``conv2d(x, weight, bias, stride, padding, dilation, groups=channels)`` as one
    reduction over its taps, accumulated in fp32."""
    c = x.shape[1]
    kh, kw = weight.shape[2:]
    taps = weight.float().reshape(1, c, 1, 1, kh, kw)
    out = (windows(x, (kh, kw), stride, padding, dilation).float() * taps).sum((-2, -1))
    if bias is not None:
        out = out + bias.float().reshape(1, c, 1, 1)
    return out.to(x.dtype)


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    def arguments(node):
        found = _depthwise_args(module, node)
        return None if found is None else (found, {})
    return replace_calls(module, arguments, depthwise_conv, "depthwise_convs_rewritten")


def _depthwise_args(module: torch.fx.GraphModule, node: torch.fx.Node) -> tuple | None:
    """(x, weight, bias, stride, padding, dilation) where ``node`` is a depthwise 2-D
    convolution of one filter per channel of at most MAX_MULTIPLY_ADDS, else None."""
    conv = static_depthwise(module, node)
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, _), value, w = conv
    outputs = output_size(conv)
    work = value.shape[0] * value.shape[1] * outputs[0] * outputs[1] * w.shape[2] * w.shape[3]
    if work > MAX_MULTIPLY_ADDS:
        return None
    return x, weight, bias, pair(stride), pair(padding), pair(dilation)
