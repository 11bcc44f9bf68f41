"""Attention written out as two matmuls around a softmax, as one fused attention call.

    before: s = (q * a) @ k.transpose(-2, -1)           a: a number (or none)
            t = chain(s)     views, adds of terms that do not read s, products by numbers
            y = softmax(t, -1) @ v                      (a dropout of p = 0 between: none)
    after:  y = scaled_dot_product_attention(q, k, v, attn_mask=chain(0), scale=a * c)

where c is the product of the chain's numbers. With t in s's shape, the chain's views
compose to nothing (no view permutes), so t = c * s + chain(0): the chain run on zeros is
the additive mask, a constant where its terms are (freezing folds it: Swin's relative
position bias and shifted-window mask). Models whose attention is written out this way
(timm's Swin, older encoders) ran two batched GEMMs and a softmax kernel a layer; with
49-token windows both GEMMs had unaligned rows, which cuBLAS runs on its slow alignment-1
kernels. Only half-precision attention of 4-d inputs whose scores feed nothing else.
Which fused kernel runs it is timed per call (passes/attention_kernels.py): torch's own
choice for Swin-T's windows, cuDNN's, ran slower by the clock than the two GEMMs.
"""

from __future__ import annotations

import numbers

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import rewrite_and_recapture

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default}
_HALF = (torch.float16, torch.bfloat16)


class WrittenAttentionAsSdpa:
    name = "written_attention_as_sdpa"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "attentions_fused")


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    found = [f for f in map(_written_attention, list(module.graph.nodes)) if f]
    graph = module.graph
    for q, k, v, scale, scores, chain, path in found:
        out = path[-1]
        with graph.inserting_before(out):
            mask = None
            if any(link.target is aten.add.Tensor for link in chain):
                like = _val(scores)  # no read of q: constant, so freezing folds the mask
                mask = graph.call_function(aten.zeros.default, (list(like.shape),), {
                    "dtype": like.dtype, "device": like.device})
                side = scores
                for link in chain:  # the chain again, on zeros: the additive mask
                    mask = graph.node_copy(link, lambda n, s=side, m=mask: m if n is s else n)
                    side = link
            fused = graph.call_function(aten.scaled_dot_product_attention.default, (q, k, v),
                                        {"attn_mask": mask, "scale": scale})
        fused.meta = dict(out.meta)
        out.replace_all_uses_with(fused)
        for node in reversed(path):  # dropout counts as impure: dead code would keep it
            if not node.users:
                graph.erase_node(node)
    module.recompile()
    return {"attentions_fused": len(found)}


def _written_attention(scores: torch.fx.Node):
    """``(q, k, v, scale, scores, chain, path)`` where ``scores`` is ``(q * a) @ k^T``
    and ``path`` ends in ``softmax(chain(scores), -1) @ v``, as the module docstring
    describes: every node from the query's scaling to that matmul."""
    query_key = _query_key(scores)
    if query_key is None:
        return None
    link, chain, c = scores, [], 1.0
    while True:  # forward along the chain to the softmax, each link read once
        if len(link.users) != 1:
            return None
        step = next(iter(link.users))
        if _is_call(step, aten.softmax.int):
            break
        c = _chain_step(step, link, c)
        if c is None:
            return None
        chain.append(step)
        link = step
    probs, path = step, [*query_key[3], scores, *chain, step]
    if (len(probs.args) != 2 or probs.kwargs or probs.args[1] not in (-1, _rank(link) - 1)
            or _val(link).shape != _val(scores).shape):
        return None
    while len(probs.users) == 1 and _is_call(user := next(iter(probs.users)),
                                             aten.dropout.default):
        if not (user.args[1] == 0 or user.args[2] is False):
            return None
        probs = user
        path.append(user)
    if len(probs.users) != 1:
        return None
    out = next(iter(probs.users))
    if not (_is_call(out, aten.matmul.default) and out.args[0] is probs):
        return None
    q, k, a, _ = query_key
    v = out.args[1]
    if not _fits(q, k, v):
        return None
    return q, k, v, float(a * c), scores, chain, [*path, out]


def _query_key(scores: torch.fx.Node):
    """``(q, k, a, nodes)`` where ``scores`` is ``matmul(q * a, transpose(k))`` (nodes: the
    scaling, if any, and the transpose); else None."""
    if not (_is_call(scores, aten.matmul.default) and len(scores.args) == 2):
        return None
    scaled, key_t = scores.args
    if not isinstance(key_t, torch.fx.Node) or len(key_t.users) != 1:
        return None
    rank = _rank(key_t)
    last_two = {(-2, -1), (-1, -2), (rank - 2, rank - 1), (rank - 1, rank - 2)}
    if _is_call(key_t, aten.transpose.int) and tuple(key_t.args[1:3]) in last_two:
        k = key_t.args[0]
    elif _is_call(key_t, aten.permute.default) and list(key_t.args[1]) == [
            *range(rank - 2), rank - 1, rank - 2]:
        k = key_t.args[0]
    else:
        return None
    q, a, nodes = scaled, 1.0, [key_t]
    if (_is_call(scaled, aten.mul.Tensor, aten.div.Tensor) and len(scaled.users) == 1
            and isinstance(scaled.args[1], numbers.Real)):
        by = float(scaled.args[1])
        q, a = scaled.args[0], (by if scaled.target is aten.mul.Tensor else 1 / by)
        nodes.insert(0, scaled)
    return q, k, a, nodes


def _chain_step(step: torch.fx.Node, link: torch.fx.Node, c: float) -> float | None:
    """The product of numbers after ``step`` (which reads ``link``, the scores' side), or
    None where ``step`` is not a view, an add of another term or a product by a number."""
    if step.target in _VIEWS and step.args[0] is link:
        return c
    if (_is_call(step, aten.add.Tensor) and len(step.args) == 2 and not step.kwargs
            and step.args[0] is not step.args[1] and _val(step).shape == _val(link).shape):
        return c  # the other term cannot read the scores: each link has one reader
    if (_is_call(step, aten.mul.Tensor, aten.div.Tensor) and step.args[0] is link
            and isinstance(step.args[1], numbers.Real) and not step.kwargs):
        by = float(step.args[1])
        return c * by if step.target is aten.mul.Tensor else c / by
    return None


def _fits(q, k, v) -> bool:
    """4-d half-precision query, key and value of the same batch and heads (no
    broadcasting), keys and values of one length."""
    values = [_val(t) if isinstance(t, torch.fx.Node) else None for t in (q, k, v)]
    if any(t is None or t.dim() != 4 or t.dtype not in _HALF for t in values):
        return False
    q, k, v = values
    return (q.dtype == k.dtype == v.dtype and q.shape[:2] == k.shape[:2] == v.shape[:2]
            and k.shape[2] == v.shape[2] and q.shape[3] == k.shape[3])


def _is_call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and (
        node.target in targets)


def _val(node: torch.fx.Node):
    return node.meta.get("val")


def _rank(node: torch.fx.Node) -> int:
    value = _val(node)
    return value.dim() if isinstance(value, torch.Tensor) else -1
