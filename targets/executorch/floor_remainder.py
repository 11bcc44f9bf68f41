"""Integer ``remainder`` as torch means it on ExecuTorch: its portable kernels (1.5)
compute an integer remainder with the dividend's sign, as C's ``%`` does, where torch's
takes the divisor's (``remainder(-1, 8)``: ExecuTorch -1, torch 7). A generating build's
cache mask reads slot positions through ``remainder(start - 1 - slot, slots)``: its
decode attended to empty slots and no token matched. Float remainders agree.

    before: remainder(a, b)
    after:  remainder(remainder(a, b) + b, b)    (the same value under either rule)
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import rewrite_and_recapture

_REMAINDERS = (torch.ops.aten.remainder.Scalar, torch.ops.aten.remainder.Tensor)


class FloorRemainder:
    name = "floor_remainder"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite, "remainders")


def _rewrite(module: torch.fx.GraphModule) -> dict:
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        value = node.meta.get("val")
        if node.target not in _REMAINDERS or not isinstance(value, torch.Tensor) \
                or value.dtype.is_floating_point or value.dtype.is_complex:
            continue
        dividend, divisor = node.args[:2]
        with graph.inserting_after(node):
            shifted = graph.call_function(torch.ops.aten.add.Tensor if isinstance(
                divisor, torch.fx.Node) else torch.ops.aten.add.Scalar, (node, divisor))
        with graph.inserting_after(shifted):
            again = graph.call_function(node.target, (shifted, divisor))
        node.replace_all_uses_with(again, delete_user_cb=lambda user: user is not shifted)
        count += 1
    graph.lint()
    module.recompile()
    return {"remainders": count}
