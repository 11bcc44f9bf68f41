"""Replace explicit attention with ``scaled_dot_product_attention``.

    before: s = matmul(q, transpose(k, -2, -1)) / c [+ mask]; p = softmax(s, -1); o = matmul(p, v)
    after:  o = scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1/c)

so a backend can use its fused attention kernel (FlashAttention-style on GPUs, ONNX
Runtime's Attention / TVM's attention op) instead of materialising the score matrix.
Only this exact chain with single-use intermediates is replaced; dropout on the
probabilities (training) or anything else in between leaves the graph as it is.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import rewrite_and_recapture

aten = torch.ops.aten
_TRANSPOSE = {aten.transpose.int}


class AttentionToSDPA:
    name = "attention_to_sdpa"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _replace_all, "attentions_replaced")


def _replace_all(module: torch.fx.GraphModule) -> dict:
    replaced = 0
    for node in list(module.graph.nodes):
        match = _match(node)
        if match is None:
            continue
        q, k, v, mask, scale = match
        with module.graph.inserting_before(node):
            sdpa = module.graph.call_function(
                aten.scaled_dot_product_attention.default, (q, k, v),
                {"attn_mask": mask, "scale": scale})
        sdpa.meta = dict(node.meta)
        node.replace_all_uses_with(sdpa)
        replaced += 1
    module.graph.eliminate_dead_code()
    module.recompile()
    return {"attentions_replaced": replaced}


def _single(node: object, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and node.target in targets and len(node.users) == 1


def _match(out: torch.fx.Node):
    """(q, k, v, mask, scale) when ``out`` ends the attention chain, else None."""
    if not (out.op == "call_function" and out.target is aten.matmul.default):
        return None
    probs, v = out.args
    if not _single(probs, aten.softmax.int) or probs.args[1] not in (-1, 3):
        return None
    scores, mask = probs.args[0], None
    if _single(scores, aten.add.Tensor) and isinstance(scores.args[1], torch.fx.Node):
        scores, mask = scores.args
    scale = 1.0  # unscaled scores: said explicitly (SDPA's default is 1/sqrt(dim))
    if _single(scores, aten.div.Tensor, aten.mul.Tensor) and isinstance(scores.args[1], (int, float)):
        factor = scores.args[1]
        scale = 1.0 / factor if scores.target is aten.div.Tensor else factor
        scores = scores.args[0]
    if not _single(scores, aten.matmul.default):
        return None
    q, key_t = scores.args
    if not _single(key_t, *_TRANSPOSE) or sorted(key_t.args[1:]) not in ([-2, -1], [2, 3]):
        return None
    if any(_rank(t) != 4 for t in (q, key_t.args[0], v)):
        return None  # SDPA wants [batch, heads, seq, dim]
    return q, key_t.args[0], v, mask, scale


def _rank(node: object) -> int | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value.dim() if isinstance(value, torch.Tensor) else None
