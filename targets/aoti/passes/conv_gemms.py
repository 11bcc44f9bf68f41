"""Each dense convolution as cuDNN's kernel or as one GEMM over its windows, whichever this
GPU runs faster at the call's shape.

    before: y = conv2d(x, W, b, stride=s, padding=p, dilation=d)          W: [O, C, kh, kw]
    after:  cols = windows of pad(x, p) as [N*Ho*Wo, kh*kw*C]        (a gather, or a view)
            y = linear(cols, W.permute(0, 2, 3, 1).reshape(O, -1), b) as [N, O, Ho, Wo],
                laid out channels-last

At batch 1 cuDNN runs a small convolution as an implicit GEMM of few tiles, each looping
over all of C*kh*kw, so its time hardly falls with the pixels; cuBLAS splits the same
product across the GPU, but the GEMM needs the windows gathered first. Which form wins
depends on the shape, so each distinct call (input and filter shapes, stride, padding,
dilation, dtype) is timed on the build's GPU: cuDNN with the input as given and
channels-last, against the windows gathered by one kernel plus the GEMM on them.
Inductor makes the gather one kernel too, and folds into it a pointwise kernel that makes
the input for this convolution alone (a ReLU after a batch norm, say): there the gather
costs only its time beyond such a kernel. Where the GEMM form takes under MARGIN of cuDNN's time,
the call is rewritten. A 1x1 convolution of stride 1 is a GEMM already
(cuDNN runs cuBLAS's kernels for it): left as it is. Only groups of 1 (grouped_convs.py
and depthwise_convs.py take the rest), static image sizes and half-precision constant
weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute
from targets.aoti.passes.call_timing import TimedRewrite, faster, random_on_gpu, rewrite_chosen
from targets.aoti.passes.conv_calls import pair, static_dense, windows


class ConvsAsGemmsByTiming(TimedRewrite):
    name, record = "convs_as_gemms_by_timing", "convs"

    def pick(self, times: dict, key) -> bool:
        gemm = gemm_cost(times, fusable=key[-1])
        return faster(times["cudnn"], {"gemm": gemm}) is not None

    def rewritten(self, program: ExportedProgram, choose) -> PassResult:
        return rewritten(program, choose)

    def label(self, key) -> str:
        return _label(key)

    def times(self, x, weight, bias, stride, padding, dilation) -> dict:
        """ms a call on random inputs: cuDNN at its faster layout; the windows gathered by
        one kernel (im2col's); the GEMM alone, on windows made beforehand; one pointwise
        kernel over the input (what a kernel making the input costs)."""
        x, weight, bias = random_on_gpu(x, weight, bias)
        last = x.to(memory_format=torch.channels_last)
        args = (stride, padding, dilation)
        out, channels, kh, kw = weight.shape
        cols = windows(last, (kh, kw), *args).permute(0, 2, 3, 4, 5, 1).reshape(
            -1, kh * kw * channels)
        filters = weight.permute(0, 2, 3, 1).reshape(out, -1)
        with torch.no_grad():
            cudnn = min(self.timer(lambda: F.conv2d(a, w, bias, *args)) for a, w in (
                (x, weight), (last, weight.to(memory_format=torch.channels_last))))
            return {"cudnn": cudnn,
                    "gather": self.timer(lambda: F.unfold(x, (kh, kw), dilation, padding,
                                                          stride)),
                    "gemm_alone": self.timer(lambda: F.linear(cols, filters, bias)),
                    "pointwise": self.timer(lambda: torch.relu(last))}


def gemm_cost(times: dict, fusable: bool) -> float:
    """The GEMM form's time from ``_times``' parts. Where a pointwise kernel alone makes
    the input, Inductor folds the gather into it (one kernel writing the windows), so the
    gather costs only what it takes beyond that kernel; otherwise it is a kernel more."""
    gather = max(0.0, times["gather"] - times["pointwise"]) if fusable else times["gather"]
    return times["gemm_alone"] + gather


def rewritten(program: ExportedProgram, choose: Callable[[tuple, tuple], bool]
              ) -> PassResult:
    """``program`` with each dense convolution on the GPU for which ``choose(key,
    sample)`` says so as ``conv_as_gemm``; ``info["convs_as_gemms"]``: how many."""
    return rewrite_chosen(program, choose, _dense_args, conv_as_gemm, "convs_as_gemms")


def conv_as_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: list, padding: list, dilation: list) -> torch.Tensor:
    """``conv2d(x, weight, bias, stride, padding, dilation)`` as one GEMM of the windows
    (taps, then channels, along a row) by the filters; the result channels-last."""
    n = x.shape[0]
    out, channels, kh, kw = weight.shape
    found = windows(x, (kh, kw), stride, padding, dilation)  # [N, C, Ho, Wo, kh, kw]
    ho, wo = found.shape[2:4]
    cols = found.permute(0, 2, 3, 4, 5, 1).reshape(n * ho * wo, kh * kw * channels)
    filters = weight.permute(0, 2, 3, 1).reshape(out, kh * kw * channels)
    return F.linear(cols, filters, bias).reshape(n, ho, wo, out).permute(0, 3, 1, 2)


def _dense_args(module: torch.fx.GraphModule, node: torch.fx.Node):
    """(args, key, sample) where ``node`` is a convolution of one group with windows to
    gather, else None: the rewrite's arguments, what its kernels' times depend on, and
    the input's, filters' and bias's tensors (the input's example value) to time it."""
    conv = static_dense(module, node)
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, _), value, w = conv
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    if list(w.shape[2:]) == [1, 1] and stride == [1, 1]:
        return None  # a GEMM already: cuDNN runs cuBLAS's kernels for it
    key = (tuple(value.shape), tuple(w.shape), tuple(stride), tuple(padding),
           tuple(dilation), bias is not None, value.dtype, _made_pointwise(x))
    sample = (value, w, attribute(module, bias), stride, padding, dilation)
    return (x, weight, bias, stride, padding, dilation), key, sample


def _made_pointwise(x) -> bool:
    """Whether a pointwise op whose only reader is this convolution makes its input."""
    return (isinstance(x, torch.fx.Node) and x.op == "call_function" and len(x.users) == 1
            and torch.Tag.pointwise in getattr(x.target, "tags", ()))


def _label(key) -> str:
    shape, filters, stride = key[0], key[1], key[2]
    return (f"{'x'.join(map(str, shape))} by {filters[0]}x{filters[2]}x{filters[3]}"
            + (f" stride {stride[0]}" if stride != (1, 1) else "")
            + (" (input made pointwise)" if key[-1] else ""))
