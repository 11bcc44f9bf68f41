"""The math of the decode-step ops in plain torch: their CPU kernel, their kernel where
Triton is not installed, and what the Triton kernels are checked against.

``row_gemv``: a linear over one row with what surrounds it in a decoder layer folded in:

    x' = x * rsqrt(mean(x^2) + eps) * (norm_weight + offset)     if norm_weight is given
    y  = (x' @ W.T) * weight_scale + bias                         W: [N, K] (or [2N, K]);
                                                                  weight_scale: int8 W's
                                                                  per-row scales, if given
    (W uint8 [N, K/2]: int4 rows, weight_scale their groups' (scale, offset): int4_weight)
    y  = y * cos + rotate_half(y) * sin   each head of head_dim   over rows < rotary_rows
    y  = act(y[:N]) * y[N:]                                       if act (a gated MLP)
    y  = y + residual                                             if residual is given

``row_gemv_argmax``: ``row_gemv`` without residual, gate or rotary rows (a model's head),
and the greedy token: ``argmax`` of those logits as int64 [1] (the first of equal maxima;
a NaN is the largest, the first NaN wins: torch.argmax's rules).

``row_gemv_argmax_advance``: ``row_gemv_argmax``, then the token written into the step's
``input_ids`` and one added to its ``positions``, in place.

``decode_attention``: one query row over ``cat(past, new)`` keys and values with an
additive mask, grouped-query heads (head h reads key/value head h // (H / KVH)), as
``scaled_dot_product_attention(q, cat(pk, nk), cat(pv, nv), mask, scale=s, enable_gqa)``.

``decode_attention_store``: ``decode_attention``, then the new key and value written into
the past buffers in place at slot ``positions[0] % slots`` (a slot the step's mask hides).
"""

from __future__ import annotations

import torch

ACTIVATIONS = ("none", "silu", "gelu", "gelu_tanh")


def activation(y: torch.Tensor, act: int) -> torch.Tensor:
    name = ACTIVATIONS[act]
    if name == "silu":
        return torch.nn.functional.silu(y)
    if name == "gelu":
        return torch.nn.functional.gelu(y)
    if name == "gelu_tanh":
        return torch.nn.functional.gelu(y, approximate="tanh")
    return y


def row_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             norm_weight: torch.Tensor | None, residual: torch.Tensor | None, eps: float,
             offset: float, act: int, weight_scale: torch.Tensor | None = None,
             rotary_cos: torch.Tensor | None = None, rotary_sin: torch.Tensor | None = None,
             rotary_rows: int = 0, head_dim: int = 0,
             counts: torch.Tensor | None = None, x_qblock: int = 0) -> torch.Tensor:
    """``counts``: the split kernel's join counters (the Triton op's), unused here;
    ``x_qblock``: x (normed) quantized to int8 in blocks of that many columns first."""
    row = x.reshape(x.shape[-1]).float()
    if norm_weight is not None:
        row = row * torch.rsqrt(row.pow(2).mean() + eps) * (norm_weight.float() + offset)
    if x_qblock:
        row = block_quantized(row, x_qblock)
    if weight.dtype == torch.uint8:
        weight, weight_scale = int4_weight(weight, weight_scale), None
    y = weight.float() @ row
    if weight_scale is not None:
        y = y * weight_scale.reshape(-1).float()
    if bias is not None:
        y = y + bias.float()
    if rotary_rows:
        heads = y[:rotary_rows].reshape(-1, head_dim)
        first, second = heads.chunk(2, dim=-1)
        turned = torch.cat([-second, first], dim=-1)
        heads = heads * rotary_cos.reshape(-1).float() + turned * rotary_sin.reshape(-1).float()
        y = torch.cat([heads.reshape(-1), y[rotary_rows:]])
    if act:
        half = y.shape[0] // 2
        y = activation(y[:half], act) * y[half:]
    if residual is not None:
        y = y + residual.reshape(-1).float()
    return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[0])


def block_quantized(row: torch.Tensor, qblock: int) -> torch.Tensor:
    """``row`` quantized to int8 codes in blocks of ``qblock`` (the block's largest
    magnitude over 127 its scale, rounded half away from zero) and back (float32)."""
    blocks = row.reshape(-1, qblock)
    largest = blocks.abs().amax(dim=1, keepdim=True)
    t = blocks * torch.where(largest > 0, 127.0 / largest, torch.zeros_like(largest))
    codes = torch.trunc(t + torch.where(t >= 0, 0.5, -0.5))
    return (codes * (largest / 127.0)).reshape(-1)


def row_gemv_argmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    norm_weight: torch.Tensor | None, eps: float, offset: float,
                    weight_scale: torch.Tensor | None = None, x_qblock: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    logits = row_gemv(x, weight, bias, norm_weight, None, eps, offset, 0, weight_scale,
                      x_qblock=x_qblock)
    return logits, torch.argmax(logits.reshape(-1)).reshape(1)


def row_gemv_argmax_advance(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            norm_weight: torch.Tensor | None, eps: float, offset: float,
                            weight_scale: torch.Tensor | None, input_ids: torch.Tensor,
                            positions: torch.Tensor, x_qblock: int = 0
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``row_gemv_argmax``; then the token written into ``input_ids`` and one added to
    ``positions``, in place (a greedy step's next inputs)."""
    logits, token = row_gemv_argmax(x, weight, bias, norm_weight, eps, offset, weight_scale,
                                    x_qblock)
    input_ids.copy_(token.reshape(input_ids.shape))
    positions.add_(1)
    return logits, token


def int4_weight(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] of int4 rows (kernels/int4_rows.py's format): byte j of
    each group of ``packed`` [N, K/2] holds q[j] (low nibble) and q[j + group/2], and
    each weight is ``q * scale + offset`` with ``scales`` [N, K/group, 2]."""
    rows, groups = scales.shape[0], scales.shape[1]
    nibbles = packed.reshape(rows, groups, -1)
    q = torch.cat([nibbles & 15, nibbles >> 4], dim=-1).float()
    return (q * scales[..., :1].float() + scales[..., 1:].float()).reshape(rows, -1)


def row_gemv_shape(x: torch.Tensor, weight: torch.Tensor, act: int) -> torch.Size:
    width = weight.shape[0] // 2 if act else weight.shape[0]
    return torch.Size((*x.shape[:-1], width))


def decode_attention(query: torch.Tensor, past_k: torch.Tensor, new_k: torch.Tensor,
                     past_v: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor,
                     scale: float, cache_ahead: bool = False,
                     counts: torch.Tensor | None = None) -> torch.Tensor:
    """``query`` [1, H, 1, D], past [1, KVH, S, D], new [1, KVH, 1, D], ``mask`` additive
    [1, 1, 1, S + 1]; returns [1, H, 1, Dv] in the query's dtype (``cache_ahead`` steers
    only when the GPU kernel reads the cache, ``counts`` only how it joins)."""
    heads, kv_heads = query.shape[1], past_k.shape[1]
    keys = torch.cat([past_k, new_k], dim=2).float().repeat_interleave(heads // kv_heads, 1)
    values = torch.cat([past_v, new_v], dim=2).float().repeat_interleave(heads // kv_heads, 1)
    scores = query.float() @ keys.transpose(-1, -2) * scale + mask.float()
    out = torch.softmax(scores, dim=-1) @ values
    return out.to(query.dtype)


def decode_attention_store(query: torch.Tensor, past_k: torch.Tensor, new_k: torch.Tensor,
                           past_v: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor,
                           scale: float, cache_ahead: bool, counts: torch.Tensor,
                           positions: torch.Tensor) -> torch.Tensor:
    """``decode_attention``'s output; ``past_k``/``past_v`` get the new row in place."""
    out = decode_attention(query, past_k, new_k, past_v, new_v, mask, scale)
    slot = int(positions.reshape(-1)[0]) % past_k.shape[2]
    past_k[:, :, slot] = new_k[:, :, 0]
    past_v[:, :, slot] = new_v[:, :, 0]
    return out


def decode_attention_o(query: torch.Tensor, past_k: torch.Tensor, new_k: torch.Tensor,
                       past_v: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor,
                       scale: float, cache_ahead: bool, counts: torch.Tensor,
                       weight: torch.Tensor, weight_scale: torch.Tensor | None,
                       residual: torch.Tensor, flags: torch.Tensor, slot: int,
                       reset: int) -> torch.Tensor:
    """o (+ ``residual``) over ``decode_attention``'s heads as one row [1, 1, H * Dv]:
    ``row_gemv(attention, weight, residual=residual)``; ``flags``, ``slot`` and ``reset``
    order the GPU kernel's launches and change nothing here."""
    out = decode_attention(query, past_k, new_k, past_v, new_v, mask, scale)
    return _o_row(out, weight, weight_scale, residual)


def decode_attention_o_store(query: torch.Tensor, past_k: torch.Tensor, new_k: torch.Tensor,
                             past_v: torch.Tensor, new_v: torch.Tensor, mask: torch.Tensor,
                             scale: float, cache_ahead: bool, counts: torch.Tensor,
                             weight: torch.Tensor, weight_scale: torch.Tensor | None,
                             residual: torch.Tensor, flags: torch.Tensor, slot: int,
                             reset: int, positions: torch.Tensor) -> torch.Tensor:
    """``decode_attention_o``'s output; ``past_k``/``past_v`` get the new row in place
    (``decode_attention_store``)."""
    out = decode_attention_store(query, past_k, new_k, past_v, new_v, mask, scale,
                                 cache_ahead, counts, positions)
    return _o_row(out, weight, weight_scale, residual)


def _o_row(out: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None,
           residual: torch.Tensor) -> torch.Tensor:
    """o (+ ``residual``) over an attention's heads [1, H, 1, Dv] as one row."""
    row = out.transpose(1, 2).reshape(*residual.shape[:-1], -1)
    return row_gemv(row, weight, None, None, residual, 0.0, 0.0, 0, weight_scale)
