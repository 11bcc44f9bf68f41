"""A depthwise convolution (one filter per channel) as a sum of shifted, scaled copies of
its padded input: one kernel Inductor generates, instead of cuDNN's depthwise kernel.

    before: y = conv2d(x, W, b, stride=s, padding=p, dilation=d, groups=C)   W: [C, 1, kh, kw]
    after:  xp = pad(x, p)
            y = sum over (i, j) of xp[:, :, i*d : ... : s, j*d : ... : s] * W[:, 0, i, j]
                + b

A depthwise filter reads each input kh*kw times for as many multiply-adds: the work is
moving bytes, and cuDNN's depthwise kernels take several times the bytes' time at batch 1
(ConvNeXt's 7x7s: bench/cuda_gap.py profiles them). Inductor fuses the taps into one
pointwise kernel (fp32 sums for half-precision inputs), and can fuse what surrounds it.
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
    """``conv2d(x, weight, bias, stride, padding, dilation, groups=channels)`` as taps."""
    _, c, h, w = x.shape
    kh, kw = weight.shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    padded = torch.nn.functional.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    taps = weight.reshape(c, kh * kw)
    out = None
    for i in range(kh):
        for j in range(kw):
            window = padded[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                            j * dw:j * dw + sw * (wo - 1) + 1:sw]
            term = window * taps[:, i * kw + j].reshape(1, c, 1, 1)
            out = term if out is None else out + term
    return out if bias is None else out + bias.reshape(1, c, 1, 1)


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
