"""Integer operands of a true division cast to its float result type first, for TVM.

``torch.ones_like(int64_mask) / 4`` is true division in PyTorch: float32 out. TVM's
importer keeps the int64 operands and divides as integers (LongT5's block ids came out
int64, and the build failed validation). Each ``aten.div`` without a rounding mode whose
result is floating gets its integral tensor operands converted to that dtype: the same
values on every backend, one cast each.

    before: div(mask_ones, 4)                         int64 / int -> float32
    after:  div(_to_copy(mask_ones, dtype=float32), 4)
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult

aten = torch.ops.aten
_TRUE_DIVISIONS = (aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)


class TrueDivisionInFloat:
    name = "true_division_in_float"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        graph, count = program.graph, 0
        for node in list(graph.nodes):
            result = node.meta.get("val")
            if node.op != "call_function" or node.target not in _TRUE_DIVISIONS or \
                    node.kwargs.get("rounding_mode") is not None or \
                    not isinstance(result, torch.Tensor) or not result.dtype.is_floating_point:
                continue
            args = list(node.args)
            for position, operand in enumerate(args[:2]):
                value = operand.meta.get("val") if isinstance(operand, torch.fx.Node) else None
                if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point:
                    args[position] = _cast(graph, node, operand, value, result.dtype)
                    count += 1
            node.args = tuple(args)
        if count:
            program.graph_module.recompile()
        return PassResult(program, modified=bool(count), info={"operands_cast": count})


def _cast(graph: torch.fx.Graph, before: torch.fx.Node, operand: torch.fx.Node,
          value: torch.Tensor, dtype: torch.dtype) -> torch.fx.Node:
    with graph.inserting_before(before):
        cast = graph.call_function(aten._to_copy.default, (operand,), {"dtype": dtype})
    cast.meta = {**operand.meta, "val": value.to(dtype)}
    return cast
