"""In-place shape changes as the views they are, read by what comes after them.

torch.export keeps in-place ops in its graph. ``x.unsqueeze_(2)`` changes the shape of
the tensor ``x`` names, and the model's later ``torch.cat([x, ...])`` reads ``x``'s node,
not the in-place op's: split across partitions (the in-place op on the CPU fallback, the
cat on a backend) or imported by a backend that reads the graph as pure functions, the cat
saw the old shape: wrong values or a "Concat of mixed ranks" (BigBird's attention).

    before: u = unsqueeze_(x, 2); y = cat([x, z], 2)
    after:  u = unsqueeze(x, 2);  y = cat([u, z], 2)

Only ops that change a tensor's shape or strides, never its data, are rewritten: the view
they return aliases the same memory, so what reads ``x`` before the op keeps the old view
and what reads it after gets the new one, as eager PyTorch has it.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import rewrite_and_recapture

aten = torch.ops.aten
_VIEWS = {
    "unsqueeze_.default": "unsqueeze.default", "squeeze_.default": "squeeze.default",
    "squeeze_.dim": "squeeze.dim", "squeeze_.dims": "squeeze.dims",
    "transpose_.default": "transpose.int", "t_.default": "t.default",
    "swapdims_.default": "swapdims.default", "swapaxes_.default": "swapaxes.default",
    "as_strided_.default": "as_strided.default", "detach_.default": "detach.default",
}


def _op(name: str):
    packet, overload = name.split(".")
    return getattr(getattr(aten, packet, None), overload, None)


_OUT_OF_PLACE = {_op(a): _op(b) for a, b in _VIEWS.items() if _op(a) and _op(b)}


class ShapeMutationsAsViews:
    name = "shape_mutations_as_views"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        if not any(n.target in _OUT_OF_PLACE for n in program.graph.nodes):
            return PassResult(program, modified=False, info={"rewritten": 0})
        return rewrite_and_recapture(program, _rewrite, "rewritten")


def _rewrite(module: torch.fx.GraphModule) -> dict:
    graph = module.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    rewritten = 0
    for node in list(graph.nodes):
        view = _OUT_OF_PLACE.get(node.target) if node.op == "call_function" else None
        if view is None or not isinstance(node.args[0], torch.fx.Node):
            continue
        source = node.args[0]
        with graph.inserting_before(node):
            replacement = graph.call_function(view, node.args, node.kwargs)
        replacement.meta = dict(node.meta)
        # what reads the tensor after the op reads the new view; before it, the old one
        for user in [u for u in source.users if order.get(u, -1) > order[node]]:
            user.replace_input_with(source, replacement)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        rewritten += 1
    module.recompile()
    return {"rewritten": rewritten}
