"""Bool operands of a comparison cast to the dtype PyTorch compares them in, for TVM.

TVM 0.27's LLVM codegen has no comparison of two bools: ``mask > 0`` on a bool mask
imports as ``greater(mask, const(False, "bool"))`` and fails to compile with the internal
error ``Check failed: (t.MatchesCode(DLDataTypeCode::kDLFloat))`` (``==``/``!=`` emit an
invalid ``fcmp`` on ``i1``). LongT5's local and side attention masks do this; the whole
partition went to the CPU fallback. PyTorch compares in the operands' promoted dtype
(bool against an int is int64, against a float is float32), so each bool tensor operand
is cast to it first (to int8 where both are bool): the same result, on TVM.

    before: gt(mask, 0)                                 bool > int -> bool
    after:  gt(_to_copy(mask, dtype=int64), 0)
"""

from __future__ import annotations

import torch
from torch.fx import Node

from targets.tvm.passes.operand_casts import OperandCasts

aten = torch.ops.aten


class BoolComparisonsAsNumbers(OperandCasts):
    name = "bool_comparisons_as_numbers"
    ops = tuple(getattr(getattr(aten, op), overload) for op in ("eq", "ne", "gt", "ge", "lt", "le")
                for overload in ("Tensor", "Scalar"))

    def cast_to(self, node: Node, value: torch.Tensor) -> torch.dtype | None:
        if value.dtype != torch.bool:
            return None
        promoted = torch.result_type(*(_operand(a) for a in node.args[:2]))
        return torch.int8 if promoted == torch.bool else promoted


def _operand(arg):
    """A comparison's operand as ``torch.result_type`` takes it: a tensor or a number."""
    return arg.meta["val"] if isinstance(arg, Node) else arg
