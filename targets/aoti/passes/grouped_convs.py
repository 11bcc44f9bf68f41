"""A grouped convolution (several channels a group, not depthwise) as one batched GEMM over
its input's windows: im2col per group, then a GEMM a group, one launch for all.

    before: y = conv2d(x, W, b, stride=s, padding=p, dilation=d, groups=G)   W: [O, Cg, kh, kw]
    after:  cols = pad(x, p) windows as [N, G, Cg*kh*kw, Ho*Wo]                (one copy)
            y = (W.reshape(G, O/G, Cg*kh*kw) @ cols).reshape(N, O, Ho, Wo) + b

cuDNN runs a RegNet's group convolutions (24 channels a group) with three layout
transforms around each, which took more GPU time than the convolutions themselves, in
torch.compile too (an H200, fp16: bench/cuda_gap.py profiles them). The windows are one
Inductor gather kernel and the GEMMs cuBLAS's; the sums stay fp32 inside the GEMM. Groups
of a power-of-two width (ResNeXt's 4-32) stay: cuDNN runs them in place, faster than the
GEMMs. Only static image sizes and half-precision constant weights (what was measured).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import replace_calls, rewrite_and_recapture
from targets.aoti.passes.conv_calls import output_size, pair, static_conv, windows


class GroupedConvsAsBatchedGemms:
    name = "grouped_convs_as_batched_gemms"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "grouped_convs_rewritten")


def grouped_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: list, padding: list, dilation: list, groups: int) -> torch.Tensor:
    """``conv2d(x, weight, bias, stride, padding, dilation, groups)`` as a batched GEMM of
    each group's filters over its windows."""
    n = x.shape[0]
    out_channels, per_group, kh, kw = weight.shape
    found = windows(x, (kh, kw), stride, padding, dilation)
    ho, wo = found.shape[2:4]
    taps = per_group * kh * kw
    # [N, G, Cg, Ho, Wo, kh, kw] -> [N, G, Cg*kh*kw, Ho*Wo]: the filters' order of taps
    cols = (found.reshape(n, groups, per_group, ho, wo, kh, kw)
            .permute(0, 1, 2, 5, 6, 3, 4).reshape(n, groups, taps, ho * wo))
    out = torch.matmul(weight.reshape(groups, out_channels // groups, taps), cols)
    out = out.reshape(n, out_channels, ho, wo)
    return out if bias is None else out + bias.reshape(1, out_channels, 1, 1)


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    def arguments(node):
        found = _grouped_args(module, node)
        return None if found is None else (found, {})
    return replace_calls(module, arguments, grouped_conv, "grouped_convs_rewritten")


def _grouped_args(module: torch.fx.GraphModule, node: torch.fx.Node) -> tuple | None:
    """(x, weight, bias, stride, padding, dilation, groups) where ``node`` is a 2-D
    convolution of several groups, each of more than one input channel and not a power of
    two of them, else None."""
    conv = static_conv(module, node, (torch.float16, torch.bfloat16))
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, groups), value, w = conv
    per_group = w.shape[1]
    if groups <= 1 or per_group <= 1 or per_group & (per_group - 1) == 0:
        return None  # not grouped, depthwise, or a width cuDNN runs without transforms
    if w.dtype != value.dtype or min(output_size(conv)) < 1:
        return None
    return x, weight, bias, pair(stride), pair(padding), pair(dilation), groups
