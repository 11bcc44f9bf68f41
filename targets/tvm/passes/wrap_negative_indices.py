"""Make the indices of advanced indexing non-negative, for backends that gather without
wrapping them (TVM's ``take`` in its "fast" mode reads out of bounds on -1).

``x[..., [-2], :]`` is legal PyTorch (Falcon's multi-query attention picks its key and
value heads that way); torch.export keeps the -2 as a constant index tensor, and TVM
returned garbage for it (Falcon's logits off by 0.9). Each index tensor of
``aten.index.Tensor`` is wrapped as ``where(i < 0, i + size, i)``: the same values for
valid indices, three cheap elementwise ops, and correct on any backend. ``aten.select.int``
with a negative index (``x[:, -1]``, BigBird's last block) imports as the same ``take``:
its index becomes ``index + size`` where the size is static (a dynamic one keeps the op
off TVM: target.py's ``supports``).

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
            if node.op == "call_function" and node.target is aten.select.int:
                count += _select_from_the_front(node)
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


def _select_from_the_front(node: torch.fx.Node) -> int:
    """``select(x, dim, -k)`` as ``select(x, dim, size - k)`` where the size is static."""
    source, dim, index = node.args[:3]
    value = source.meta.get("val")
    if value is None or not isinstance(index, int) or index >= 0 or \
            not isinstance(value.shape[dim], int):
        return 0
    size = value.shape[dim]
    node.args = (source, dim, index + size, *node.args[3:])
    return 1


def negative_select_on_a_dynamic_dim(node: torch.fx.Node) -> bool:
    """A select this pass cannot make non-negative: its dim's size is only known at run time."""
    if node.target is not aten.select.int:
        return False
    source, dim, index = node.args[:3]
    value = source.meta.get("val")
    return isinstance(index, int) and index < 0 and value is not None and \
        not isinstance(value.shape[dim], int)


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
