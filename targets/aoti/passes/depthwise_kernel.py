"""Each depthwise convolution the taps leave to cuDNN (depthwise_convs.py: over its
multiply-add bound, or a shape Inductor's reduction does not take) as our direct kernel
(kernels/depthwise_triton.py) where this GPU runs that faster at the call's shape.

    before: y = conv2d(x, W, b, stride, padding, dilation, groups=C)      W: [C, 1, kh, kw]
    after:  y = depthwise_conv2d(x, W, b, stride, padding, dilation, tile sizes)

cuDNN's depthwise kernels for large filters (a ConvNeXt's 7x7 over a 56x56 image) took
10-17 us for about 1 MB of activations at batch 1; the work is moving those bytes once
and 49 multiply-adds an output, which a direct kernel keeps on chip. Which is faster
depends on the shape, so each distinct call (input shape and layout, filter, stride,
padding, dilation, dtype) is timed on the build's GPU, cuDNN at its faster layout
against the kernel at a few tile sizes on the input as laid out, each as CUDA graphs of
back-to-back calls (call_timing.py), and rewritten where the kernel takes under MARGIN of
cuDNN's time. Only static image sizes and half-precision constant weights. A candidate,
off by default: the kernel has not yet beaten cuDNN on a measured shape, and each tile it
times is compiled while the build runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute
from targets.aoti.kernels import ops
from targets.aoti.kernels.depthwise_conv import depthwise_conv2d
from targets.aoti.passes.call_timing import TimedRewrite, faster, random_on_gpu, rewrite_chosen
from targets.aoti.passes.conv_calls import pair, static_depthwise

# (pixels, channels, warps) a program, timed, the fastest kept: small tiles, so that a
# 56x56 image of 40-96 channels makes thousands of programs to hide the loads' latency
# (tiles of 1-2 k outputs left one program an SM, several times slower than cuDNN)
TILES = ((8, 8, 1), (16, 8, 1), (32, 8, 1), (16, 16, 1), (64, 8, 2))


class DepthwiseConvsByTiming(TimedRewrite):
    name, record = "depthwise_convs_by_timing", "depthwise"

    def can_time(self) -> bool:
        return ops.TRITON and torch.cuda.is_available()

    def pick(self, times: dict, key) -> tuple | None:
        return faster(times["cudnn"], {tile: t for tile, t in times.items() if tile != "cudnn"})

    def rewritten(self, program: ExportedProgram, choose) -> PassResult:
        return rewritten(program, choose)

    def label(self, key) -> str:
        return _label(key)

    def times(self, x, weight, bias, stride, padding, dilation) -> dict:
        """ms a call on random inputs: cuDNN at its faster layout, the kernel at each of
        TILES on the input laid out as the program's (a tile that cannot run is left out)."""
        x = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda").normal_()
        w, b = random_on_gpu(weight, bias)
        args, groups = (stride, padding, dilation), x.shape[1]
        times = {}
        with torch.no_grad():
            times["cudnn"] = min(self.timer(lambda: F.conv2d(a, w, b, *args, groups=groups))
                                 for a in (x.contiguous(),
                                           x.contiguous(memory_format=torch.channels_last)))
            for tile in TILES:
                try:
                    times[tile] = self.timer(lambda: depthwise_conv2d(x, w, b, *args, *tile))
                except Exception:  # noqa: BLE001 - Triton's own errors (resources, compile)
                    continue
        return times


def rewritten(program: ExportedProgram, choose: Callable[[tuple, tuple], object]
              ) -> PassResult:
    """``program`` with each static half-precision depthwise convolution for which
    ``choose(key, sample)`` gives a tile (pixels, channels, warps) as ``depthwise_conv2d``
    at that tile; ``info["depthwise_kernels"]``: how many."""
    return rewrite_chosen(program, choose, _depthwise_args, depthwise_conv2d,
                          "depthwise_kernels", extra=lambda tile: tile)


def _depthwise_args(module: torch.fx.GraphModule, node: torch.fx.Node):
    """(args, key, sample) where ``node`` is a depthwise convolution, one filter a
    channel: the op's arguments less the tile, what its time depends on, and the input's
    example value, the filters, the bias and the settings to time it with."""
    conv = static_depthwise(module, node)
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, _), value, w = conv
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    key = (tuple(value.shape), tuple(value.stride()), tuple(w.shape), tuple(stride),
           tuple(padding), tuple(dilation), bias is not None, value.dtype)
    sample = (value, w, attribute(module, bias), stride, padding, dilation)
    return (x, weight, bias, stride, padding, dilation), key, sample


def _label(key) -> str:
    shape, strides, filters = key[0], key[1], key[2]
    last = strides[1] == 1 and shape[1] > 1
    return (f"{'x'.join(map(str, shape))} by {filters[2]}x{filters[3]}"
            + (f" stride {key[3][0]}" if key[3] != (1, 1) else "")
            + (" channels-last" if last else ""))
