"""Tensor operands cast to another dtype before an op, where TVM gets the op wrong or
cannot compile it on the operands' own dtype: the base of true_division.py and
bool_comparisons.py. A pass names its ops and, per operand, the dtype to cast it to
(None keeps it); each cast is one ``aten._to_copy`` inserted before the op."""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import Graph, Node

from passes.base import PassResult


class OperandCasts:
    name = "operand_casts"
    required = False
    ops: tuple = ()

    def cast_to(self, node: Node, value: torch.Tensor) -> torch.dtype | None:
        """The dtype the tensor operand ``value`` of ``node`` should have; None keeps it."""
        raise NotImplementedError

    def __call__(self, program: ExportedProgram) -> PassResult:
        graph, count = program.graph, 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in self.ops:
                continue
            args = list(node.args)
            for position, operand in enumerate(args[:2]):
                value = operand.meta.get("val") if isinstance(operand, Node) else None
                dtype = self.cast_to(node, value) if isinstance(value, torch.Tensor) else None
                if dtype is not None and dtype != value.dtype:
                    args[position] = _cast(graph, node, operand, value, dtype)
                    count += 1
            node.args = tuple(args)
        if count:
            program.graph_module.recompile()
        return PassResult(program, modified=bool(count), info={"operands_cast": count})


def _cast(graph: Graph, before: Node, operand: Node, value: torch.Tensor,
          dtype: torch.dtype) -> Node:
    with graph.inserting_before(before):
        cast = graph.call_function(torch.ops.aten._to_copy.default, (operand,), {"dtype": dtype})
    cast.meta = {**operand.meta, "val": value.to(dtype)}
    return cast
