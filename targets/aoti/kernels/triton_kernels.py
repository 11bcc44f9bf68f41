"""The Triton kernels behind the decode-step ops (ops.py), and their launchers.

A batch-1 decode step streams the weights once: each kernel here reads its weight bytes
once, in 16-byte loads, with the small ops around a product (the RMSNorm before it, a
gated activation, a residual add after) done inside it instead of as small kernels of
their own. Shapes are compile-time constants (a decode step's are fixed), so the loops
have static bounds and the masks fold away where the block divides the size. So are the
float settings (eps, the norm's offset, the attention scale): AOTInductor passes a float
argument as fp64, which turned a norm's whole product into fp64 arithmetic
(docs/design-notes.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton


@triton.jit
def _activation(y, ACT: tl.constexpr):
    if ACT == 1:  # silu
        y = y / (1.0 + tl.exp(-y))
    elif ACT == 2:  # gelu (erf)
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 3:  # gelu (tanh)
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (2.0 / (1.0 + tl.exp(-2.0 * inner)))
    return y


@triton.jit
def row_gemv_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, out_ptr,
                    EPS: tl.constexpr, OFFSET: tl.constexpr,
                    N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                    HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # rows of W this program reduces; a gated product also reads the rows N below them
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in tl.static_range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_NORM:  # the norm's scale is one number: applied to the sums at the end
            squares += x * x
            x = x * (tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + OFFSET)
        tile = rows[:, None] * K + cols[None, :]
        ok = row_ok[:, None] & col_ok[None, :]
        w = tl.load(w_ptr + tile, mask=ok, other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        if ACT != 0:
            w2 = tl.load(w_ptr + N * K + tile, mask=ok, other=0.0,
                         eviction_policy="evict_first")
            up += w2.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_NORM:
        y = y * tl.rsqrt(tl.sum(squares, axis=0) / K + EPS)
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if ACT != 0:
        u = tl.sum(up, axis=1)
        if HAS_NORM:
            u = u * tl.rsqrt(tl.sum(squares, axis=0) / K + EPS)
        if HAS_BIAS:
            u += tl.load(b_ptr + N + rows, mask=row_ok, other=0.0).to(tl.float32)
        y = _activation(y, ACT) * u
    if HAS_RES:
        y += tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


def gemv_config(rows: int, cols: int, gated: bool) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps): enough programs to keep every SM's loads in flight
    (several per SM), 16-byte loads along K."""
    block_k = min(256 if rows >= 4096 else 512, triton.next_power_of_2(cols))
    if rows <= 2048 and cols <= 2048:  # a small product: more, smaller programs
        return 2, block_k, 8
    block_n = 8
    while block_n > 1 and rows // block_n < 512:
        block_n //= 2
    return block_n, block_k, 4


def launch_row_gemv(x, weight, bias, norm_weight, residual, eps: float, offset: float,
                    act: int, config: tuple[int, int, int] | None = None) -> torch.Tensor:
    width = weight.shape[0] // 2 if act else weight.shape[0]
    cols = weight.shape[1]
    out = torch.empty((*x.shape[:-1], width), dtype=weight.dtype, device=x.device)
    block_n, block_k, warps = config or gemv_config(width, cols, bool(act))
    row = x.reshape(cols)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    wrap_triton(row_gemv_kernel)[(triton.cdiv(width, block_n),)](
        row, weight.contiguous(), dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return out


@triton.jit
def attention_split_kernel(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                           sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE: tl.constexpr,
                           S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                           SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                           BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                           IEEE: tl.constexpr):
    """One key/value head's G query heads over BLOCK_S past slots: the block's max score,
    sum of exponentials and weighted values (flash-decoding's partial results)."""
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    s = split * BLOCK_S + tl.arange(0, BLOCK_S)
    g_ok, d_ok, s_ok = g < G, d < D, s < S
    heads = kvh * G + g
    q = tl.load(q_ptr + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)
    kv_ok = s_ok[:, None] & d_ok[None, :]
    k = tl.load(pk_ptr + kvh * spk_h + s[:, None] * spk_s + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(pv_ptr + kvh * spv_h + s[:, None] * spv_s + d[None, :], mask=kv_ok, other=0.0)
    if IEEE:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    added = tl.load(mask_ptr + s * sm, mask=s_ok, other=float("-inf")).to(tl.float32)
    scores = scores * SCALE + added[None, :]
    top = tl.maximum(tl.max(scores, axis=1), -1e30)  # a block of masked slots only: no NaN
    p = tl.exp(scores - top[:, None])
    total = tl.sum(p, axis=1)
    if IEEE:
        acc = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v)
    part = heads * SPLITS + split
    tl.store(m_ptr + part, top, mask=g_ok)
    tl.store(l_ptr + part, total, mask=g_ok)
    tl.store(acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=g_ok[:, None])


@triton.jit
def attention_combine_kernel(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                             out_ptr, sq_h, snk_h, snv_h, sm, SCALE: tl.constexpr,
                             S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                             SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    """One query head: its partial results joined, with the new row's key and value."""
    h = tl.program_id(0)
    kvh = h // G
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + h * sq_h + d, mask=d_ok, other=0.0).to(tl.float32)
    key = tl.load(nk_ptr + kvh * snk_h + d, mask=d_ok, other=0.0).to(tl.float32)
    value = tl.load(nv_ptr + kvh * snv_h + d, mask=d_ok, other=0.0).to(tl.float32)
    new = tl.sum(q * key, axis=0) * SCALE + tl.load(mask_ptr + S * sm).to(tl.float32)
    j = tl.arange(0, BLOCK_SPLITS)
    j_ok = j < SPLITS
    tops = tl.load(m_ptr + h * SPLITS + j, mask=j_ok, other=-1e30)
    sums = tl.load(l_ptr + h * SPLITS + j, mask=j_ok, other=0.0)
    accs = tl.load(acc_ptr + (h * SPLITS + j)[:, None] * BLOCK_D + d[None, :],
                   mask=j_ok[:, None], other=0.0)
    top = tl.maximum(tl.max(tops, axis=0), new)
    weights = tl.exp(tops - top)
    weight_new = tl.exp(new - top)
    total = tl.sum(sums * weights, axis=0) + weight_new
    out = (tl.sum(accs * weights[:, None], axis=0) + weight_new * value) / total
    tl.store(out_ptr + h * D + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def launch_decode_attention(query, past_k, new_k, past_v, new_v, mask, scale: float,
                            block_s: int | None = None) -> torch.Tensor:
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    groups = heads // kv_heads
    # 32 slots a program fill the GPU at a few hundred slots; longer caches take longer
    # blocks, so the join's partial results stay few
    block_s = block_s or (32 if slots <= 1024 else 64 if slots <= 4096 else 128)
    splits = triton.cdiv(slots, block_s)
    block_splits = max(2, triton.next_power_of_2(splits))
    block_d = max(16, triton.next_power_of_2(dim))
    query, past_k, past_v = (t if t.stride(-1) == 1 else t.contiguous()
                             for t in (query, past_k, past_v))
    new_k, new_v = (t if t.stride(-1) == 1 else t.contiguous() for t in (new_k, new_v))
    tops = torch.empty((heads * splits,), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(tops)
    accs = torch.empty((heads * splits, block_d), dtype=torch.float32, device=query.device)
    out = torch.empty((1, heads, 1, dim), dtype=query.dtype, device=query.device)
    ieee = query.dtype == torch.float32
    wrap_triton(attention_split_kernel)[(kv_heads, splits)](
        query, past_k, past_v, mask, tops, sums, accs, query.stride(1),
        past_k.stride(1), past_k.stride(2), past_v.stride(1), past_v.stride(2),
        mask.stride(-1), SCALE=float(scale), S=slots, D=dim, G=groups, SPLITS=splits,
        BLOCK_S=block_s, BLOCK_G=max(16, triton.next_power_of_2(groups)), BLOCK_D=block_d,
        IEEE=ieee, num_warps=4)
    wrap_triton(attention_combine_kernel)[(heads,)](
        query, new_k, new_v, mask, tops, sums, accs, out, query.stride(1),
        new_k.stride(1), new_v.stride(1), mask.stride(-1), SCALE=float(scale), S=slots,
        D=dim, G=groups, SPLITS=splits, BLOCK_SPLITS=block_splits, BLOCK_D=block_d,
        num_warps=min(8, max(1, block_splits * block_d // 1024)))
    return out
