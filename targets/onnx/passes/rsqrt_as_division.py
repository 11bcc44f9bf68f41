"""Write ``x * rsqrt(v)`` as ``x / sqrt(v)``, the form ONNX Runtime fuses into one
normalization kernel.

An RMSNorm (LLaMA, Mistral, Qwen, Gemma, T5...) is ``x * rsqrt(mean(x^2) + eps) * w``.
torch.onnx writes rsqrt as Sqrt then Reciprocal, and ONNX Runtime's
SimplifiedLayerNormFusion matches only Pow, ReduceMean, Add, Sqrt, **Div**, Mul: with the
Reciprocal the norm stays six nodes a layer where fused it is one kernel.
Dividing by the square root is the same value within a rounding (the division rounds
once where the reciprocal and the product round twice).

    before: r = rsqrt(add(mean(pow(x, 2)), eps)); y = mul(x, r)
    after:  s = sqrt(add(mean(pow(x, 2)), eps));  y = div(x, s)

Only where the rsqrt feeds multiplications and nothing else.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult

aten = torch.ops.aten


class RsqrtAsDivision:
    name = "rsqrt_as_division"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        graph, count = program.graph, 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not aten.rsqrt.default:
                continue
            users = list(node.users)
            if not users or any(not _is_product_with(user, node) for user in users):
                continue
            with graph.inserting_before(node):
                root = graph.call_function(aten.sqrt.default, node.args)
                root.meta = dict(node.meta)
            for user in users:
                other = user.args[1] if user.args[0] is node else user.args[0]
                with graph.inserting_before(user):
                    quotient = graph.call_function(aten.div.Tensor, (other, root))
                    quotient.meta = dict(user.meta)
                user.replace_all_uses_with(quotient)
                # a product the program returns (a partition's output) keeps its spec
                program.graph_signature.replace_all_uses(user.name, quotient.name)
                graph.erase_node(user)
                count += 1
            graph.erase_node(node)
        if count:
            program.graph_module.recompile()
        return PassResult(program, modified=bool(count), info={"products_rewritten": count})


def _is_product_with(user: torch.fx.Node, rsqrt: torch.fx.Node) -> bool:
    """``mul(other, rsqrt)`` of two tensors, with the product's shape and dtype the
    other factor's (so a division by the root gives the same tensor)."""
    if user.op != "call_function" or user.target is not aten.mul.Tensor or user.kwargs:
        return False
    if len(user.args) != 2 or rsqrt not in user.args or user.args[0] is user.args[1]:
        return False
    other = user.args[1] if user.args[0] is rsqrt else user.args[0]
    if not isinstance(other, torch.fx.Node):
        return False
    mine, theirs = user.meta.get("val"), other.meta.get("val")
    return (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)
            and mine.shape == theirs.shape and mine.dtype == theirs.dtype)
