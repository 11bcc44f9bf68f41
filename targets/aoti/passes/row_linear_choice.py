"""Each one-row linear that nothing folds into as cuBLAS's GEMM or as our row kernel,
whichever this GPU runs faster at its shape.

    before: y = linear(x, W, b)                    x: one row; row_linears_as_kernels would
                                                   make it row_gemv(x, W, b)
    after:  y = addmm(b, x.reshape(1, K), W.t())   where cuBLAS timed under MARGIN of it

The row kernel (kernels/triton_kernels.py) is sized for a decode step's products, K of
2-6 k; a classifier's first linear over a flattened feature map (VGG's 25088 x 4096)
streamed its weights slower than cuBLAS's split-K kernels. So each such shape is timed
on the build's GPU, both as CUDA graphs of back-to-back calls (call_timing.py), and
cuBLAS keeps the linears it runs faster. ``addmm`` is the form Inductor leaves to cuBLAS
at one row (it turns a one-row ``mm`` into a reduction under coordinate-descent tuning).
Only linears the row kernel would take alone: one it fuses a norm, a gated activation
or a residual add into is not timed (its fused time is not what is compared here).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute
from targets.aoti.kernels import ops
from targets.aoti.passes.call_timing import TimedRewrite, faster, random_on_gpu, rewrite_chosen
from targets.aoti.passes.decode_kernels import _row_linear
from targets.aoti.passes.decode_patterns import match_gated, match_norm, match_residual


class RowLinearsOnCublasByTiming(TimedRewrite):
    name, record = "row_linears_on_cublas_by_timing", "row_linears"

    def can_time(self) -> bool:
        return ops.TRITON and torch.cuda.is_available()

    def times(self, _x, weight: torch.Tensor, bias: torch.Tensor | None) -> dict:
        """ms a call on random inputs of the linear's shape: the row kernel, cuBLAS."""
        x, w, b = random_on_gpu(weight[:1], weight, bias)
        with torch.no_grad():
            return {"row_kernel": self.timer(lambda: ops.row_gemv(x, w, b, None, None, 0.0,
                                                                  0.0, 0)),
                    "cublas": self.timer(lambda: linear_on_cublas(x, w, b))}

    def pick(self, times: dict, key) -> str | None:
        return faster(times["row_kernel"], {"cublas": times["cublas"]})

    def rewritten(self, program: ExportedProgram, choose) -> PassResult:
        return rewritten(program, choose)

    def label(self, key) -> str:
        return _label(key)


def rewritten(program: ExportedProgram, choose: Callable[[tuple, tuple], object]
              ) -> PassResult:
    """``program`` with each lone one-row linear for which ``choose(key, (x, weight,
    bias))`` answers truly (x: the input's example value) as ``linear_on_cublas``;
    ``info["row_linears_on_cublas"]``: how many."""
    return rewrite_chosen(program, choose, _lone_row_linear, linear_on_cublas,
                          "row_linears_on_cublas")


def linear_on_cublas(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                     ) -> torch.Tensor:
    """``linear(x, weight, bias)`` for an ``x`` of one row, as one ``addmm`` (a zero bias
    where there is none)."""
    row = x.reshape(1, x.shape[-1])
    shift = bias if bias is not None else row.new_zeros(weight.shape[0])
    return torch.addmm(shift, row, weight.t()).reshape(*x.shape[:-1], weight.shape[0])


def _lone_row_linear(module: torch.fx.GraphModule, node: torch.fx.Node):
    """(args, key, sample) where ``node`` is a one-row linear the row kernel would take
    with nothing folded into it, else None."""
    if not _row_linear(module, node) or match_norm(node.args[0]) is not None or \
            match_gated(node) is not None or match_residual(node) is not None:
        return None
    weight = attribute(module, node.args[1])
    bias_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    bias = attribute(module, bias_node)
    key = (tuple(weight.shape), bias is not None, weight.dtype)
    return (node.args[0], node.args[1], bias_node), key, (node.args[0].meta["val"], weight,
                                                           bias)


def _label(key) -> str:
    (rows, cols), bias, _ = key
    return f"{cols} -> {rows}" + (" with bias" if bias else "")
