"""The decode attention and o (+ residual) as one launch, o split along K by key/value
head (decode_chain_cuda.py's ``... attention-o fused ...`` variants). o's columns of
key/value head g are the outputs of its G query heads, so a program takes one head g
and one block of o's rows: it loads its tile of Wo (the block's rows x the head's G x D
columns) before the wait, then computes the head's whole attention itself (its G query
heads over every past slot in blocks, online softmax, then the new row), multiplies it
with its tile, and stores its rows' partial sums. The KVH programs of a block of rows
count in on the block's counter; the last adds the parts in head order (whoever joins:
the result does not depend on the order they finish), adds the residual, stores o and
sets the counter back to zero (split_gemv_triton.py's join), so one buffer of counters
serves every layer and every call.

A head's attention is computed once for every block of rows (its cache rows read from
L2 after the first): more blocks stream Wo with more programs but read the cache more.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _head_attention(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, kvh, sq_h, spk_h,
                    spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE: tl.constexpr,
                    S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                    BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, IEEE: tl.constexpr):
    """Key/value head ``kvh``'s G query heads' attention over the past slots and the new
    row, as one row of G x D float32 (head after head, as o's columns are)."""
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    g_ok = g < G
    heads = kvh * G + g
    q = tl.load(q_ptr + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None], other=0.0)
    key = tl.load(nk_ptr + kvh * snk_h + d).to(tl.float32)
    value = tl.load(nv_ptr + kvh * snv_h + d).to(tl.float32)
    # the new row first: its weight is 1 at its own top, which stays finite
    top = (tl.sum(q.to(tl.float32) * key[None, :], axis=1) * SCALE
           + tl.load(mask_ptr + S * sm).to(tl.float32))
    total = tl.full((BLOCK_G,), 1.0, tl.float32)
    out = tl.zeros((BLOCK_G, D), tl.float32) + value[None, :]
    for first in range(0, S, BLOCK_S):
        s = first + tl.arange(0, BLOCK_S)
        s_ok = s < S
        k = tl.load(pk_ptr + kvh * spk_h + s[:, None] * spk_s + d[None, :],
                    mask=s_ok[:, None], other=0.0)
        v = tl.load(pv_ptr + kvh * spv_h + s[:, None] * spv_s + d[None, :],
                    mask=s_ok[:, None], other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        added = tl.load(mask_ptr + s * sm, mask=s_ok, other=float("-inf")).to(tl.float32)
        scores = scores * SCALE + added[None, :]
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        kept = tl.exp(top - new_top)
        p = tl.exp(scores - new_top[:, None])
        total = total * kept + tl.sum(p, axis=1)
        if IEEE:
            out = out * kept[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            out = out * kept[:, None] + tl.dot(p.to(v.dtype), v)
        top = new_top
    out = tl.where(g_ok[:, None], out / total[:, None], 0.0)
    # the padding rows (zeros) folded onto the G real ones: one row of G x D
    return tl.sum(tl.reshape(out, (BLOCK_G // G, G * D)), axis=0)


@triton.jit
def _fused(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, w_ptr, s_ptr, r_ptr,
           part_ptr, counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h,
           sm,
           SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
           KVH: tl.constexpr, N: tl.constexpr, BLOCK_R: tl.constexpr,
           BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, IEEE: tl.constexpr,
           HAS_SCALE: tl.constexpr, GDC: tl.constexpr):
    # a block's KVH programs are neighbours in the grid: they finish close together
    kvh = tl.program_id(0) % KVH
    block = tl.program_id(0) // KVH
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    idx = tl.arange(0, BLOCK_R)
    rows = block * BLOCK_R + idx
    row_ok = rows < N
    cols = kvh * G * D + tl.arange(0, G * D)
    # Wo's tile: no kernel of the step writes it, nor the cache's past rows
    w = tl.load(w_ptr + rows[:, None] * (KVH * G * D) + cols[None, :], mask=row_ok[:, None],
                other=0.0, eviction_policy="evict_first")
    if GDC:
        tl.extra.cuda.gdc_wait()
    att = _head_attention(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, kvh, sq_h, spk_h,
                          spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S, D, G, BLOCK_S,
                          BLOCK_G, IEEE)
    y = tl.sum(w.to(tl.float32) * att[None, :], axis=1)
    tl.store(part_ptr + tl.program_id(0) * BLOCK_R + idx, y)
    tl.debug_barrier()  # every thread's stores before the count
    seen = tl.atomic_add(counts_ptr + block, 1, sem="acq_rel", scope="gpu")
    if seen == KVH - 1:
        total = tl.zeros((BLOCK_R,), tl.float32)
        for i in tl.static_range(KVH):  # in head order, whoever joins
            # .cg: other programs wrote them; read past this SM's L1
            total += tl.load(part_ptr + (block * KVH + i) * BLOCK_R + idx,
                             cache_modifier=".cg")
        if HAS_SCALE:  # int8 rows: a scale a row
            total *= tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        total += tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_ok)
        tl.store(counts_ptr + block, 0)  # every head counted in: back to zero


@triton.jit
def fused_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, w_ptr, s_ptr, r_ptr,
                 part_ptr, counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                 snv_h, sm,
                 SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                 KVH: tl.constexpr, N: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, IEEE: tl.constexpr,
                 HAS_SCALE: tl.constexpr):
    _fused(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, w_ptr, s_ptr, r_ptr, part_ptr,
           counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE,
           S, D, G, KVH, N, BLOCK_R, BLOCK_S, BLOCK_G, IEEE, HAS_SCALE, False)


@triton.jit
def fused_kernel_gdc(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, w_ptr, s_ptr,
                     r_ptr, part_ptr, counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h,
                     spv_h,
                     spv_s, snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr,
                     D: tl.constexpr, G: tl.constexpr, KVH: tl.constexpr, N: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                     IEEE: tl.constexpr, HAS_SCALE: tl.constexpr):
    _fused(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, w_ptr, s_ptr, r_ptr, part_ptr,
           counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE,
           S, D, G, KVH, N, BLOCK_R, BLOCK_S, BLOCK_G, IEEE, HAS_SCALE, True)


def fused_sizes(query, past_k, weight, blocks: int, block_s: int) -> dict:
    """The kernel's constexprs: a query [1, H, 1, D] over a past [1, KVH, S, D], o's
    ``weight`` [N, H * D] in ``blocks`` blocks of rows, the slots ``block_s`` at a time
    (D and the group H / KVH powers of two: a head's columns are one tile)."""
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    groups = heads // kv_heads
    rows, cols = weight.shape
    for name, value in (("head width", dim), ("query heads a key/value head", groups)):
        if value != triton.next_power_of_2(value):
            raise ValueError(f"{name}: a power of two, got {value}")
    if cols != heads * dim or dim < 16:
        raise ValueError(f"o's columns: {heads} x {dim} (at least 16 wide), got {cols}")
    return dict(SCALE=float(dim ** -0.5), S=slots, D=dim, G=groups, KVH=kv_heads, N=rows,
                BLOCK_R=triton.next_power_of_2(triton.cdiv(rows, blocks)),
                BLOCK_S=max(16, block_s), BLOCK_G=max(16, groups),
                IEEE=query.dtype == torch.float32)


def fused_counters(blocks: int, device) -> torch.Tensor:
    """The zeroed int32 counters (one a block of rows) the launches share."""
    return torch.zeros(blocks, dtype=torch.int32, device=device)


def launch_fused_attention_o(query, past_k, new_k, past_v, new_v, mask, weight, residual,
                             counts, blocks: int = 32, block_s: int = 64, warps: int = 8,
                             stages: int = 2, pdl: bool = False,
                             weight_scale=None) -> torch.Tensor:
    """reference.row_gemv(decode_attention(...) as a row, ``weight``, residual) in one
    launch of KVH x ``blocks`` programs; ``counts``: int32 zeros, at least one a block
    of rows (fused_counters), left at zero; ``weight_scale``: int8 rows' scales."""
    sizes = fused_sizes(query, past_k, weight, blocks, block_s)
    row_blocks = triton.cdiv(weight.shape[0], sizes["BLOCK_R"])
    if counts.dtype != torch.int32 or counts.numel() < row_blocks:
        raise ValueError(f"counts: {row_blocks} int32 zeros needed, got {counts.numel()}")
    query, past_k, past_v, new_k, new_v = (t if t.stride(-1) == 1 else t.contiguous()
                                           for t in (query, past_k, past_v, new_k, new_v))
    programs = sizes["KVH"] * row_blocks
    parts = torch.empty((programs * sizes["BLOCK_R"],), dtype=torch.float32,
                        device=query.device)
    out = torch.empty((*residual.shape[:-1], weight.shape[0]), dtype=residual.dtype,
                      device=residual.device)
    kernel = fused_kernel_gdc if pdl else fused_kernel
    extra = dict(launch_pdl=True) if pdl else {}
    kernel[(programs,)](
        query, past_k, new_k, past_v, new_v, mask, weight.contiguous(),
        weight if weight_scale is None else weight_scale.reshape(-1),
        residual.reshape(-1).contiguous(), parts, counts, out, query.stride(1),
        past_k.stride(1), past_k.stride(2), new_k.stride(1), past_v.stride(1),
        past_v.stride(2), new_v.stride(1), mask.stride(-1), num_warps=warps,
        num_stages=stages, HAS_SCALE=weight_scale is not None, **sizes, **extra)
    return out
