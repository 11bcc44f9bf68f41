"""Integer ``remainder`` as torch means it on ExecuTorch: its portable kernels (1.5)
compute an integer remainder with the dividend's sign, as C's ``%`` does, where torch's
takes the divisor's (``remainder(-1, 8)``: ExecuTorch -1, torch 7). A generating build's
cache mask reads slot positions through ``remainder(start - 1 - slot, slots)``: its
decode attended to empty slots and no token matched. Float remainders agree.

    before: r = remainder(a, b)
    after:  r0 = remainder(a, b); r = remainder(r0 + b, b)    (the same value either rule)

The graph is edited in place: the new nodes have the remainder's shape and dtype, so
nothing needs tracing again (a recapture of a 300M decoder took a tenth of its build).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult

_REMAINDERS = (torch.ops.aten.remainder.Scalar, torch.ops.aten.remainder.Tensor)


class FloorRemainder:
    name = "floor_remainder"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        count = _rewrite(program.graph_module)
        return PassResult(program, modified=bool(count), info={"remainders": count})


def _rewrite(module: torch.fx.GraphModule) -> int:
    """Each integer remainder computed again from its own result plus the divisor; the
    original node stays last (its name, users and any output spec unchanged)."""
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        value = node.meta.get("val")
        if node.target not in _REMAINDERS or not isinstance(value, torch.Tensor) \
                or value.dtype.is_floating_point or value.dtype.is_complex:
            continue
        dividend, divisor = node.args[:2]
        with graph.inserting_before(node):
            first = graph.call_function(node.target, (dividend, divisor))
            shifted = graph.call_function(torch.ops.aten.add.Tensor if isinstance(
                divisor, torch.fx.Node) else torch.ops.aten.add.Scalar, (first, divisor))
        for made in (first, shifted):  # same shape and dtype as the remainder's
            made.meta = dict(node.meta)
        node.args = (shifted, divisor, *node.args[2:])
        count += 1
    if count:
        graph.lint()
        module.recompile()
    return count
