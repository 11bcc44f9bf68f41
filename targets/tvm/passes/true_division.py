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
from torch.fx import Node

from targets.tvm.passes.operand_casts import OperandCasts

aten = torch.ops.aten


class TrueDivisionInFloat(OperandCasts):
    name = "true_division_in_float"
    ops = (aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)

    def cast_to(self, node: Node, value: torch.Tensor) -> torch.dtype | None:
        result = node.meta.get("val")
        if node.kwargs.get("rounding_mode") is not None or \
                not isinstance(result, torch.Tensor) or not result.dtype.is_floating_point:
            return None
        return None if value.dtype.is_floating_point else result.dtype
