"""Attention's query, key and value as views of the packed projection, not copies of it.

    before: qkv = linear(x, W_qkv).unflatten(-1, (3, E)) ... .contiguous()
            q, k, v = qkv[0], qkv[1], qkv[2]      (views, then head reshapes)
            y = scaled_dot_product_attention(q, k, v)
    after:  the same without ``.contiguous()``; the head reshapes become ``reshape``

``nn.MultiheadAttention`` (torchvision's ViT, and any model built on it) makes its packed
projection contiguous before splitting it, and Inductor keeps that copy as one kernel per
split. The attention kernels read strided inputs whose last dimension is dense (what the
split leaves), so the copies only cost launches and bytes. A copy is dropped only where
every use of it is a chain of view ops that ends in the query, key or value of an
attention; ``view`` in those chains becomes ``reshape``, which copies only where the
strides cannot be reinterpreted (a batch above one).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import rewrite_and_recapture

aten = torch.ops.aten
_COPIES = {aten.contiguous.default, aten.clone.default}
_VIEWS = {aten.select.int, aten.view.default, aten.reshape.default, aten.transpose.int,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
          aten.permute.default, aten.unflatten.int, aten.slice.Tensor, aten._unsafe_view.default}
_ATTENTION = aten.scaled_dot_product_attention.default


class AttentionInputsAsViews:
    name = "attention_inputs_as_views"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "copies_dropped")


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    dropped = 0
    for node in list(module.graph.nodes):
        chain = _view_chain_to_attention(node)
        if chain is None:
            continue
        for view in chain:
            if view.target is aten.view.default:
                view.target = aten.reshape.default
        node.replace_all_uses_with(node.args[0])
        module.graph.erase_node(node)
        dropped += 1
    module.recompile()
    return {"copies_dropped": dropped}


def _view_chain_to_attention(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The view nodes between ``node`` (a plain contiguous copy) and the attentions it
    feeds as query, key or value; None where any use leads anywhere else."""
    if node.op != "call_function" or node.target not in _COPIES or node.kwargs.get(
            "memory_format", torch.contiguous_format) not in (None, torch.contiguous_format):
        return None
    if len(node.args) != 1 or not node.users:
        return None
    chain, frontier = [], list(node.users)
    while frontier:
        user = frontier.pop()
        if user.op != "call_function":
            return None
        if user.target is _ATTENTION:
            if any(arg in user.args[3:] or arg in user.kwargs.values()
                   for arg in [node, *chain]):
                return None  # a mask or a scale read from the copy
            continue
        if user.target not in _VIEWS:
            return None
        chain.append(user)
        frontier.extend(user.users)
    return chain
