"""A convolution over a few input channels (an RGB stem's 3) padded with zero channels to a
multiple of 8, where this GPU runs the padded one, pad included, faster.

    before: y = conv2d(x, W, b, stride, padding, dilation)          x: [N, 3, H, W]
    after:  y = conv2d(pad(x, 5 zero channels), pad(W, 5 zero channels), b, ...)

cuDNN's fast half-precision kernels read channels in 16-byte vectors; with 3 channels it
falls back to kernels that gather each element (an RGB stem conv took 7-16 us at
batch 1 on an H200, a fifth or more of a small CNN's GEMM time). The zero channels add
nothing to any output, so the result is the same; the weight's padding folds at freezing
and the input's is one small kernel (or folds into a kernel that makes the input). Each
distinct call (input and filter shapes, stride, padding, dilation, dtype) is timed on the
build's GPU: cuDNN at its faster layout, against the pad plus cuDNN on the padded input
at its faster layout, each as CUDA graphs of back-to-back calls (call_timing.py);
rewritten where the padded form takes under MARGIN of the other. Only groups of 1,
static image sizes and half-precision constant weights. A candidate, off by default: on
RGB stems at batch 1 the pad cost about what the padded convolution saved.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute
from targets.aoti.passes.call_timing import TimedRewrite, faster, random_on_gpu, rewrite_chosen
from targets.aoti.passes.conv_calls import pair, static_dense

ALIGN = 8  # channels a 16-byte vector of half-precision values holds


class NarrowConvsPaddedByTiming(TimedRewrite):
    name, record = "narrow_convs_padded_by_timing", "narrow_convs"

    def pick(self, times: dict, key) -> bool:
        return faster(times["cudnn"], {"padded": times["padded"]}) is not None

    def rewritten(self, program: ExportedProgram, choose) -> PassResult:
        return rewritten(program, choose)

    def label(self, key) -> str:
        return _label(key)

    def times(self, x, weight, bias, stride, padding, dilation) -> dict:
        """ms a call on random inputs, each form at its faster layout: cuDNN as the call
        is; the zero channels' pad plus cuDNN on the padded input."""
        x, weight, bias = random_on_gpu(x, weight, bias)
        args, extra = (bias, stride, padding, dilation), _extra(x.shape[1])
        wide_weight = _widened(weight, extra)
        layouts = (torch.contiguous_format, torch.channels_last)
        with torch.no_grad():
            own = min(self.timer(lambda: F.conv2d(x.contiguous(memory_format=m),
                                                  weight.contiguous(memory_format=m), *args))
                      for m in layouts)
            padded = []
            for m in layouts:
                image = x.contiguous(memory_format=m)
                wide = _widened(image, extra).contiguous(memory_format=m)
                filters = wide_weight.contiguous(memory_format=m)
                padded.append(self.timer(lambda: _widened(image, extra))
                              + self.timer(lambda: F.conv2d(wide, filters, *args)))
        return {"cudnn": own, "padded": min(padded)}


def rewritten(program: ExportedProgram, choose: Callable[[tuple, tuple], bool]
              ) -> PassResult:
    """``program`` with each convolution of one group over channels not a multiple of
    ALIGN for which ``choose(key, sample)`` says so as ``padded_conv``;
    ``info["narrow_convs_padded"]``: how many."""
    return rewrite_chosen(program, choose, _narrow_args, padded_conv, "narrow_convs_padded")


def padded_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                stride: list, padding: list, dilation: list) -> torch.Tensor:
    """``conv2d(x, weight, bias, stride, padding, dilation)`` over input channels padded
    with zeros to a multiple of ALIGN, in the input and the filters alike."""
    extra = _extra(x.shape[1])
    return F.conv2d(_widened(x, extra), _widened(weight, extra), bias, stride, padding,
                    dilation)


def _extra(channels: int) -> int:
    return -channels % ALIGN


def _widened(t: torch.Tensor, extra: int) -> torch.Tensor:
    """``t`` (4-D, channels second) with ``extra`` zero channels after its own."""
    return F.pad(t, (0, 0, 0, 0, 0, extra))


def _narrow_args(module: torch.fx.GraphModule, node: torch.fx.Node):
    """(args, key, sample) where ``node`` is a convolution of one group over input
    channels not a multiple of ALIGN, else None."""
    conv = static_dense(module, node)
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, _), value, w = conv
    if not _extra(value.shape[1]):
        return None
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    key = (tuple(value.shape), tuple(w.shape), tuple(stride), tuple(padding),
           tuple(dilation), bias is not None, value.dtype)
    sample = (value, w, attribute(module, bias), stride, padding, dilation)
    return (x, weight, bias, stride, padding, dilation), key, sample


def _label(key) -> str:
    shape, filters, stride = key[0], key[1], key[2]
    return (f"{'x'.join(map(str, shape))} by {filters[0]}x{filters[2]}x{filters[3]}"
            + (f" stride {stride[0]}" if stride != (1, 1) else ""))
