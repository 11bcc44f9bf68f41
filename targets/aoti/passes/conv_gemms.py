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
from passes.graph.rewrite import attribute, replace_calls, rewrite_and_recapture
from targets.aoti.passes.call_timing import faster, graph_replay_ms
from targets.aoti.passes.conv_calls import output_size, pair, static_conv, windows


class ConvsAsGemmsByTiming:
    name = "convs_as_gemms_by_timing"
    required = False

    def __init__(self, timer: Callable[[Callable], float] | None = None) -> None:
        self.timer = timer or graph_replay_ms

    def __call__(self, program: ExportedProgram) -> PassResult:
        timed: dict = {}

        def choose(key, sample):
            if sample[0].device.type != "cuda" or not torch.cuda.is_available():
                return False
            if key not in timed:
                timed[key] = self._times(*sample)
            gemm = gemm_cost(timed[key], fusable=key[-1])
            return faster(timed[key]["cudnn"], {"gemm": gemm}) is not None

        result = rewritten(program, choose)
        result.info["convs"] = {_label(key): {k: round(v * 1000, 1) for k, v in t.items()}
                                for key, t in timed.items()}  # us a call
        return result

    def _times(self, x, weight, bias, stride, padding, dilation) -> dict:
        """ms a call on random inputs: cuDNN at its faster layout; the windows gathered by
        one kernel (im2col's); the GEMM alone, on windows made beforehand; one pointwise
        kernel over the input (what a kernel making the input costs)."""
        x = torch.randn(x.shape, dtype=x.dtype, device="cuda")
        weight = torch.randn(weight.shape, dtype=weight.dtype, device="cuda")
        bias = None if bias is None else torch.randn(bias.shape, dtype=bias.dtype,
                                                     device="cuda")
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
    def rewrite(module: torch.fx.GraphModule) -> dict:
        def arguments(node):
            found = _dense_args(module, node)
            if found is None:
                return None
            args, key, sample = found
            return (args, {}) if choose(key, sample) else None
        return replace_calls(module, arguments, conv_as_gemm, "convs_as_gemms")
    return rewrite_and_recapture(program, rewrite, "convs_as_gemms")


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
    conv = static_conv(module, node, (torch.float16, torch.bfloat16))
    if conv is None:
        return None
    (x, weight, bias, stride, padding, dilation, groups), value, w = conv
    if groups != 1 or w.dtype != value.dtype or min(output_size(conv)) < 1:
        return None
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
