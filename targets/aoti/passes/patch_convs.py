"""A patch-embedding convolution (kernel = stride, no padding) as one GEMM over the patches.

    before: y = conv2d(x, W, b, stride=(kh, kw))                 x: [N, C, H, W]
    after:  p = x.view(N, C, H/kh, kh, W/kw, kw).permute(0, 2, 4, 1, 3, 5)
            y = linear(p.reshape(-1, C*kh*kw), W.view(O, -1), b).view(N, H/kh, W/kw, O)
                .permute(0, 3, 1, 2)

Patches that do not overlap are a reshape of the image, so the convolution is a matrix
product of (patches x C*kh*kw) by (C*kh*kw x O). cuDNN runs a ViT's 16x16/16 stem at batch
1 as an implicit-GEMM convolution with layout conversions around it, many times the
GEMM's own time (bench/cuda_gap.py profiles it); cuBLAS takes the product as a GEMM.
Rows and columns a strided convolution never reaches are sliced off first, as it skips
them. Only static image sizes, plain float weights and groups 1.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import replace_calls, rewrite_and_recapture
from targets.aoti.passes.conv_calls import pair, static_conv



class PatchConvsAsMatmuls:
    name = "patch_convs_as_matmuls"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "convs_rewritten")


def patch_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
    """``conv2d(x, weight, bias, stride=kernel)`` as a GEMM over the image's patches."""
    n, c, h, w = x.shape
    out, _, kh, kw = weight.shape
    hp, wp = h // kh, w // kw
    if (hp * kh, wp * kw) != (h, w):
        x = x[:, :, :hp * kh, :wp * kw]
    patches = x.reshape(n, c, hp, kh, wp, kw).permute(0, 2, 4, 1, 3, 5)
    y = torch.nn.functional.linear(patches.reshape(n * hp * wp, c * kh * kw),
                                   weight.reshape(out, c * kh * kw), bias)
    return y.reshape(n, hp, wp, out).permute(0, 3, 1, 2)


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    def arguments(node):
        found = _patch_conv_args(module, node)
        return None if found is None else (found, {})
    return replace_calls(module, arguments, patch_conv, "convs_rewritten")


def _patch_conv_args(module: torch.fx.GraphModule, node: torch.fx.Node) -> tuple | None:
    """(x, weight, bias) where ``node`` is a 2-D convolution over non-overlapping patches."""
    conv = static_conv(module, node, (torch.float16, torch.bfloat16, torch.float32))
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, groups), value, w = conv
    kernel = list(w.shape[2:])
    if groups != 1 or kernel == [1, 1] or pair(stride) != kernel or any(pair(padding)) \
            or pair(dilation) != [1, 1]:
        return None
    if value.shape[2] < kernel[0] or value.shape[3] < kernel[1]:
        return None
    return (x, weight, bias)
