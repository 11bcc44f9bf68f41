"""A linear whose output width is not a multiple of 16 bytes (GPT-2's 50257-word head),
computed over a weight padded with zero rows to that multiple, then sliced.

    before: y = linear(x, W, b)                       W: [N, K], N * itemsize % 16 != 0
    after:  y = linear(x, [W; 0], [b; 0])[..., :N]    [W; 0]: [N', K], N' the next multiple

With an output row stride that is not 16-byte aligned, cuBLAS can only use its
alignment-1 kernels, which run a vocabulary head many times slower than the aligned
GEMM of the padded width. The padded weight is a new constant made here, so nothing is
padded at run time; embedding lookups of a tied weight read it too (their ids stay under
N), so the artifact holds one copy (a generating build's entry points share it: their
weight store is keyed by content).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import add_constant, attribute, rewrite_and_recapture

_LINEAR = torch.ops.aten.linear.default
_EMBEDDING = torch.ops.aten.embedding.default
_ALIGN_BYTES = 16


class LinearsAlignedByPadding:
    name = "linears_aligned_by_padding"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "linears_padded")


def sliced_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  width: int) -> torch.Tensor:
    """``linear`` over a padded ``weight``, keeping the first ``width`` outputs."""
    return torch.nn.functional.linear(x, weight, bias)[..., :width]


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    padded = 0
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target is not _LINEAR:
            continue
        weight = attribute(module, node.args[1])
        bias_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        bias = attribute(module, bias_node)
        if not _needs_padding(weight) or (bias_node is not None and bias is None):
            continue
        width = weight.shape[0]
        extra = _padded_width(weight) - width
        first = next(n for n in module.graph.nodes if n.op != "placeholder")
        new_weight = add_constant(module, f"{node.args[1].target}_padded",
                                  torch.cat([weight, weight.new_zeros(extra, weight.shape[1])]),
                                  before=first)
        new_bias = None if bias is None else add_constant(
            module, f"{bias_node.target}_padded", torch.cat([bias, bias.new_zeros(extra)]),
            before=first)
        _retarget_tied_embeddings(module, weight, new_weight)
        with module.graph.inserting_before(node):
            replacement = module.graph.call_function(
                sliced_linear, (node.args[0], new_weight, new_bias, width))
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        module.graph.erase_node(node)
        padded += 1
    module.recompile()
    return {"linears_padded": padded}


def _retarget_tied_embeddings(module: torch.fx.GraphModule, weight: torch.Tensor,
                              padded: torch.fx.Node) -> None:
    """Embedding lookups of the same tensor (a tied head) read the padded copy instead."""
    for node in list(module.graph.nodes):
        if node.op != "get_attr" or node is padded or attribute(module, node) is not weight:
            continue
        for user in list(node.users):
            if user.op == "call_function" and user.target is _EMBEDDING \
                    and user.args[0] is node:
                user.replace_input_with(node, padded)


def _needs_padding(weight: torch.Tensor | None) -> bool:
    return (weight is not None and type(weight) in (torch.Tensor, torch.nn.Parameter)
            and weight.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and weight.dim() == 2 and _padded_width(weight) != weight.shape[0])


def _padded_width(weight: torch.Tensor) -> int:
    step = _ALIGN_BYTES // weight.element_size()
    return -(-weight.shape[0] // step) * step
