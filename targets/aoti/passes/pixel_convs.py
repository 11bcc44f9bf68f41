"""A convolution over a one-pixel image at batch 1 (a squeeze-and-excite block's two 1x1
convolutions on the pooled vector) as a linear over one row, which the cuda target's last
pass (row_linears.py) turns into a reduction Inductor compiles with the ops around it.

    before: y = conv2d(s, W, b)                        s: [1, C, 1, 1], W: [O, C, 1, 1]
    after:  y = linear(s.reshape(1, C), W2, b).reshape(1, O, 1, 1)   W2 = W as [O, C]

cuDNN runs each such convolution as a cuBLAS matrix-vector kernel, a launch of its own
that the activation after it cannot join; EfficientNet, MobileNetV3 and RegNetY have two a
block. As one-row linears they become Triton reductions with the activation in their
epilogue (the row pass takes a linear of a 2-D constant weight: W2 is one). Only 1x1
filters without padding, groups 1, static shapes and half-precision constant weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import add_constant, replace_calls, rewrite_and_recapture
from targets.aoti.passes.conv_calls import pair, static_conv


class PixelConvsAsRowLinears:
    name = "pixel_convs_as_row_linears"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "pixel_convs_rewritten")


def pixel_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
    """``conv2d(x, weight.reshape(O, C, 1, 1), bias)`` for a one-pixel ``x`` of batch 1,
    as a linear by the 2-D ``weight``."""
    out, channels = weight.shape
    return F.linear(x.reshape(1, channels), weight, bias).reshape(1, out, 1, 1)


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    def arguments(node):
        conv = static_conv(module, node, (torch.float16, torch.bfloat16))
        if conv is None:
            return None
        (x, weight, bias, _, padding, _, groups), value, w = conv
        if (tuple(value.shape) != (1, value.shape[1], 1, 1) or tuple(w.shape[2:]) != (1, 1)
                or groups != 1 or any(pair(padding)) or w.dtype != value.dtype):
            return None
        flat = add_constant(module, f"{weight.target}_rows", w.reshape(w.shape[:2]), node)
        return (x, flat, bias), {}
    return replace_calls(module, arguments, pixel_conv, "pixel_convs_rewritten")
