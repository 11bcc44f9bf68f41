"""Attention of new tokens over a KV cache, and the custom op a target may fuse it into.

``grouped_attention`` is the math every generating step runs (exporter/lm/attention.py
says why it is written this way): grouped-query heads meet their key/value head by a
reshape, and the past slots and the new rows are scored apart, so the cache is read in
place and never repeated or concatenated.

``edge_exporter::cached_attention`` is the same math for a full-attention layer, whose
slot ``s`` holds position ``s`` (runtime/generation/layout.py), as one op: new row ``i``
(position ``start + i``) sees the slots below ``start`` and the new rows up to itself.
That is exactly the contract of ONNX Runtime's ``GroupQueryAttention`` (past buffer,
``seqlens_k``, causal), so the onnx target lowers the op to that one fused kernel (the
one ONNX Runtime GenAI runs) where the step would otherwise be ~35 small nodes a layer.
The op lives in the runtime so a partition left on the CPU fallback can still run it.
"""

from __future__ import annotations

import torch

OP_NAMESPACE = "edge_exporter"


def grouped_attention(query: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
                      new_k: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor | None,
                      scaling: float, softcap: float | None) -> torch.Tensor:
    """``query`` [B, H, T, D], past [B, KVH, S, D], new rows [B, KVH, T, D], ``mask``
    additive [1 or B, 1 or H, T, S + T]. Returns [B, T, H, Dv]."""
    batch, heads, length, _ = query.shape
    kv_heads = new_k.shape[1]
    groups = heads // kv_heads
    # head h attends with key/value head h // groups (transformers' repeat_kv order)
    grouped = query.reshape(batch, kv_heads, groups * length, query.shape[-1])
    scores = torch.cat([grouped @ past_k.transpose(-1, -2),
                        grouped @ new_k.transpose(-1, -2)], dim=-1) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    slots = past_k.shape[-2]
    shape = scores.shape
    if mask is not None:  # one mask for all heads, or one a head (T5's position bias)
        per_head = mask.view(mask.shape[0], kv_heads, groups, length, -1) if mask.shape[1] > 1 \
            else mask[:, :, None]
        scores = (scores.view(batch, kv_heads, groups, length, -1) + per_head).view(shape)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = probs[..., :slots] @ past_v + probs[..., slots:] @ new_v  # [B, KVH, G*T, Dv]
    return out.reshape(batch, heads, length, out.shape[-1]).transpose(1, 2)


def linear_cache_mask(start: torch.Tensor, slots: int, length: int,
                      dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of a full-attention layer: [1, 1, T, slots + T]."""
    device = start.device
    past_ok = torch.arange(slots, device=device)[None, :] < start
    rows = torch.arange(length, device=device)
    new_ok = rows[None, :] <= rows[:, None]
    allowed = torch.cat([past_ok.expand(length, slots), new_ok], dim=1)
    zero = torch.zeros((), dtype=dtype, device=device)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(allowed, zero, blocked)[None, None]


@torch.library.custom_op(f"{OP_NAMESPACE}::cached_attention", mutates_args=())
def cached_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     past_key: torch.Tensor, past_value: torch.Tensor, start: torch.Tensor,
                     scaling: float, softcap: float) -> torch.Tensor:
    """``query`` [1, H, T, D]; ``key``/``value`` the T new rows [1, KVH, T, D]; the past
    [1, KVH, slots, D] with slot s holding position s; ``start`` (0-d) the first new
    token's position; ``softcap`` 0 for none. Returns [1, T, H, Dv]."""
    mask = linear_cache_mask(start, past_key.shape[-2], query.shape[-2], query.dtype)
    return grouped_attention(query, past_key, past_value, key, value, mask, scaling,
                             softcap or None).contiguous()


@cached_attention.register_fake
def _(query, key, value, past_key, past_value, start, scaling, softcap):
    batch, heads, length, _ = query.shape
    return query.new_empty((batch, length, heads, value.shape[-1]))
