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
from passes.graph.rewrite import attribute, replace_calls, rewrite_and_recapture
from targets.aoti.passes.conv_calls import conv2d_call, pair

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
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    padded = torch.nn.functional.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    # [N, C, Ho, Wo, span_h, span_w], then every d-th row and column of each window
    windows = padded.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
    if dh > 1 or dw > 1:
        windows = windows[..., ::dh, ::dw]
    taps = weight.float().reshape(1, c, 1, 1, kh, kw)
    out = (windows.float() * taps).sum((-2, -1))
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
    convolution of one filter per channel, else None."""
    call = conv2d_call(node)
    if call is None:
        return None
    x, weight, bias, stride, padding, dilation, groups = call
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    w = attribute(module, weight)
    if value is None or value.dim() != 4 or w is None or w.dim() != 4 or isinstance(padding, str):
        return None
    if not all(isinstance(d, int) for d in value.shape) or not _plain_float(w):
        return None
    channels = value.shape[1]
    if groups != channels or w.shape[0] != channels or w.shape[1] != 1:
        return None
    if w.dtype != value.dtype or (bias is not None and attribute(module, bias) is None):
        return None
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    outputs = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s
               in zip(value.shape[2:], padding, dilation, w.shape[2:], stride)]
    if min(outputs) < 1:
        return None
    work = value.shape[0] * channels * outputs[0] * outputs[1] * w.shape[2] * w.shape[3]
    return (x, weight, bias, stride, padding, dilation) if work <= MAX_MULTIPLY_ADDS else None


def _plain_float(weight: torch.Tensor) -> bool:
    return (type(weight) in (torch.Tensor, torch.nn.Parameter)
            and weight.dtype in (torch.float16, torch.bfloat16))
