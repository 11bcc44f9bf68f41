"""A value many decode kernels read, stored once for all of them.

Inductor gives a Triton kernel its inputs in fixed strides, and a value it has not stored
(a cheap pointwise it would otherwise compute inside each reader) is copied into a buffer
of that kernel's own: the step's additive mask was computed again for every layer's
attention, one kernel a layer, and the rotary cos/sin for every layer's q/k/v product.
One forced-stride copy of the value, which Inductor stores, is what every reader then
takes as it is.
"""

from __future__ import annotations

import torch
from torch._inductor import inductor_prims

from targets.aoti.passes.decode_patterns import val

_ALIAS = torch.ops.aten.alias.default


def stored_once(module: torch.fx.GraphModule, target, positions: tuple[int, ...]) -> int:
    """Each value that two or more ``target`` calls read at argument ``positions``
    (through aliases) becomes one stored copy they all read; returns how many."""
    readers: dict[torch.fx.Node, list[tuple[torch.fx.Node, int]]] = {}
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target is not target:
            continue
        for i in positions:
            if i < len(node.args) and isinstance(node.args[i], torch.fx.Node):
                readers.setdefault(_unaliased(node.args[i]), []).append((node, i))
    stored = 0
    for value, uses in readers.items():
        fake = val(value)
        # weights and inputs are stored already
        if len(uses) < 2 or fake is None or value.op != "call_function":
            continue
        with module.graph.inserting_after(value):
            fixed = module.graph.call_function(inductor_prims.force_stride_order,
                                               (value, _contiguous(fake.shape)))
        fixed.meta = dict(value.meta)
        for node, i in uses:
            node.update_arg(i, fixed)
        stored += 1
    return stored


def _unaliased(node: torch.fx.Node) -> torch.fx.Node:
    while node.op == "call_function" and node.target is _ALIAS:
        node = node.args[0]
    return node


def _contiguous(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= int(size)
    return strides[::-1]
