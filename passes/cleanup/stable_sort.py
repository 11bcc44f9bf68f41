"""Every sort of the program as a stable sort: equal keys keep their input order.

An unstable sort leaves the order of equal keys unspecified, and torch's CPU sort orders
them one way past 16 elements while ONNX Runtime's TopK (lower index first, by the ONNX
spec) and a stable sort order them another. An MoE router's sort of its top-k expert ids
is all ties (32 keys of 4 values): backends that are each right disagree on its indices
and on every row gathered by them, so a candidate lowering checked exactly against the
program's own outputs is refused for being right. A stable sort is one of the orders an
unstable one allows, and the only one every backend can be held to.

    before: sort(x, dim, descending)                    (aten.sort.default; argsort alike)
    after:  sort(x, stable=True, dim=dim, descending=descending)   (aten.sort.stable)
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.in_place import rewrite_in_place

# each op's default overload (self, dim=-1, descending=False) -> its stable one
_STABLE = {torch.ops.aten.sort.default: torch.ops.aten.sort.stable,
           torch.ops.aten.argsort.default: torch.ops.aten.argsort.stable}


class StableSort:
    name = "stable_sort"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        if not any(is_unstable_sort(node) for node in program.graph.nodes):
            return PassResult(program, modified=False, info={"sorts": 0})
        return rewrite_in_place(program, _rewrite, "sorts")


def is_unstable_sort(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and (node.target in _STABLE or (
        node.target in _STABLE.values() and not node.kwargs.get("stable")))


def _rewrite(module: torch.fx.GraphModule) -> dict:
    count = 0
    for node in module.graph.nodes:
        if not is_unstable_sort(node):
            continue
        if node.target in _STABLE:
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
            descending = node.args[2] if len(node.args) > 2 else node.kwargs.get(
                "descending", False)
            node.target, node.args = _STABLE[node.target], (node.args[0],)
            node.kwargs = {"stable": True, "dim": dim, "descending": descending}
        else:
            node.kwargs = {**node.kwargs, "stable": True}
        count += 1
    module.graph.lint()
    module.recompile()
    return {"sorts": count}
