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
cuDNN's time. Only static image sizes and half-precision constant weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute, replace_calls, rewrite_and_recapture
from targets.aoti.kernels import ops
from targets.aoti.kernels.depthwise_conv import depthwise_conv2d
from targets.aoti.passes.call_timing import faster, graph_replay_ms
from targets.aoti.passes.conv_calls import output_size, pair, static_conv

# (pixels, channels, warps) a program; timed, the fastest kept
TILES = ((64, 32, 4), (32, 64, 4), (128, 16, 4), (16, 64, 2))


class DepthwiseConvsByTiming:
    name = "depthwise_convs_by_timing"
    required = False

    def __init__(self, timer: Callable[[Callable], float] | None = None) -> None:
        self.timer = timer or graph_replay_ms

    def __call__(self, program: ExportedProgram) -> PassResult:
        timed: dict = {}

        def choose(key, sample):
            here = ops.TRITON and torch.cuda.is_available()
            if not here or sample[0].device.type != "cuda":
                return None
            if key not in timed:
                timed[key] = self._times(*sample)
            kernels = {tile: t for tile, t in timed[key].items() if tile != "cudnn"}
            return faster(timed[key]["cudnn"], kernels)

        result = rewritten(program, choose)
        result.info["depthwise"] = {_label(key): {str(k): round(v * 1000, 1)
                                                  for k, v in t.items()}
                                    for key, t in timed.items()}  # us a call
        return result

    def _times(self, x, weight, bias, stride, padding, dilation) -> dict:
        """ms a call on random inputs: cuDNN at its faster layout, the kernel at each of
        TILES on the input laid out as the program's (a tile that cannot run is left out)."""
        x = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda").normal_()
        w = torch.randn(weight.shape, dtype=weight.dtype, device="cuda")
        b = None if bias is None else torch.randn(bias.shape, dtype=bias.dtype, device="cuda")
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
    def rewrite(module: torch.fx.GraphModule) -> dict:
        def arguments(node):
            found = _depthwise_args(module, node)
            if found is None:
                return None
            args, key, sample = found
            tile = choose(key, sample)
            return ((*args, *tile), {}) if tile else None
        return replace_calls(module, arguments, depthwise_conv2d, "depthwise_kernels")
    return rewrite_and_recapture(program, rewrite, "depthwise_kernels")


def _depthwise_args(module: torch.fx.GraphModule, node: torch.fx.Node):
    """(args, key, sample) where ``node`` is a depthwise convolution, one filter a
    channel: the op's arguments less the tile, what its time depends on, and the input's
    example value, the filters, the bias and the settings to time it with."""
    conv = static_conv(module, node, (torch.float16, torch.bfloat16))
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, groups), value, w = conv
    channels = value.shape[1]
    if groups != channels or w.shape[0] != channels or w.shape[1] != 1:
        return None
    if w.dtype != value.dtype or min(output_size(conv)) < 1:
        return None
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
