"""Make the indices of advanced indexing non-negative, for backends that gather without
wrapping them (TVM's ``take`` in its "fast" mode reads out of bounds on -1).

``x[..., [-2], :]`` is legal PyTorch (Falcon's multi-query attention picks its key and
value heads that way); torch.export keeps the -2 as a constant index tensor, and TVM
returned garbage for it (Falcon's logits off by 0.9). Each index tensor of
``aten.index.Tensor`` is wrapped as ``where(i < 0, i + size, i)``: the same values for
valid indices, three cheap elementwise ops, and correct on any backend.

    before: index(x, [None, idx])                       idx = [-2]
    after:  index(x, [None, where(idx < 0, idx + x.size(1), idx)])
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult

aten = torch.ops.aten


class WrapNegativeIndices:
    name = "wrap_negative_indices"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        graph, count = program.graph, 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not aten.index.Tensor:
                continue
            source, indices = node.args[0], list(node.args[1])
            shape = source.meta["val"].shape
            for dim, index in enumerate(indices):
                value = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
                if value is None or value.dtype not in (torch.int64, torch.int32) or \
                        not isinstance(shape[dim], int):
                    continue
                indices[dim] = _wrapped(graph, node, index, value, shape[dim])
                count += 1
            node.args = (source, indices, *node.args[2:])
        if count:
            program.graph_module.recompile()
        return PassResult(program, modified=bool(count), info={"indices_wrapped": count})


def _wrapped(graph: torch.fx.Graph, before: torch.fx.Node, index: torch.fx.Node,
             value: torch.Tensor, size: int) -> torch.fx.Node:
    with graph.inserting_before(before):
        negative = graph.call_function(aten.lt.Scalar, (index, 0))
        shifted = graph.call_function(aten.add.Scalar, (index, size))
        wrapped = graph.call_function(aten.where.self, (negative, shifted, index))
    negative.meta = {**index.meta, "val": value < 0}
    shifted.meta = {**index.meta, "val": value + size}
    wrapped.meta = {**index.meta, "val": torch.where(value < 0, value + size, value)}
    return wrapped
