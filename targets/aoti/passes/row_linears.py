"""A linear over one row (a batch-1 decode step) as a multiply-and-sum that Inductor
compiles into a Triton reduction, instead of a cuBLAS GEMM call.

    before: y = linear(x, W, b)                       x: [1, .., 1, K], W: [N, K]
    after:  y = sum(x.float() * W.float(), -1).to(x.dtype) + b

A matrix-vector product reads W once and does little else: its speed is the memory's,
and Triton's reduction reads W at least as fast as cuBLAS's M = 1 kernels (docs/
design-notes.md). A reduction also lets Inductor
fold the ops around it (the RMSNorm before, SiLU-times-up before the down projection)
into its loads, where a GEMM call is a wall between kernels. The products and the sum are
in float32, as cuBLAS accumulates fp16 GEMMs.

Only where the row count is known to be 1 at capture (a dynamic prompt length is not)
and the weight is a plain float tensor (quantized weights keep their own kernels).
"""

from __future__ import annotations

import math

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute, replace_calls, rewrite_and_recapture

_LINEAR = torch.ops.aten.linear.default


class SingleRowLinearsAsReductions:
    name = "single_row_linears_as_reductions"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "linears_rewritten")


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
    """``linear(x, weight, bias)`` for an ``x`` of one row, as a float32 multiply-and-sum."""
    row = x.reshape(1, x.shape[-1]).float()
    out = (row * weight.float()).sum(-1).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    def arguments(node):
        if not (node.op == "call_function" and node.target is _LINEAR and _one_row(node)
                and _plain_float(attribute(module, node.args[1]))):
            return None
        return tuple(node.args), dict(node.kwargs)
    return replace_calls(module, arguments, row_linear, "linears_rewritten")


def _one_row(node: torch.fx.Node) -> bool:
    value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if value is None or value.dim() < 1:
        return False
    leading = value.shape[:-1]
    return all(isinstance(d, int) for d in leading) and math.prod(leading) == 1


def _plain_float(weight: torch.Tensor | None) -> bool:
    return (weight is not None and type(weight) in (torch.Tensor, torch.nn.Parameter)
            and weight.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and weight.dim() == 2)
