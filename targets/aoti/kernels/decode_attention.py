"""The decode step's attention as two Triton kernels (flash-decoding): one query row over
the cache's past rows in blocks of slots, each program a key/value head's grouped query
heads over one block, then a join of the blocks' partial results with the new row's key
and value. Each kernel has a plain and a ``_gdc`` form, as triton_kernels.py's product.

Given a buffer of zeroed counts, the join is done inside the split kernel instead (one
kernel a layer): each program counts itself in with an atomic, and the last of a
key/value head joins all its query heads' partial results at once and sets the count
back to zero, so one buffer serves every layer and every call.

Given the step's positions too (the store form, ``attention_store_kernel``), that joining
program also writes the new row's key and value into the past buffers at slot
``position % slots``: every program of its key/value head has read its past rows before
counting in, and that slot is masked this step (a full cache's is not yet filled, a
ring's holds the position a window back), so the cache write after the step is not
needed. A form of its own, not a flag of the join's: torch takes what a ``_gdc`` kernel
declares written as its results (a copy, where it cannot write in place), so a join that
stores nothing must not declare the past buffers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher


@triton.jit
def _attention_split(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                     sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE: tl.constexpr,
                     S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                     SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                     BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                     GDC: tl.constexpr, CACHE_AHEAD: tl.constexpr):
    """One key/value head's G query heads over BLOCK_S past slots: the block's max score,
    sum of exponentials and weighted values (flash-decoding's partial results).
    CACHE_AHEAD: the past rows are the cache's own (no copy the step made), so they are
    read before waiting for the kernel before."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    _attention_block(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                     tl.program_id(0), tl.program_id(1), sq_h, spk_h, spk_s, spv_h, spv_s,
                     sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, GDC,
                     CACHE_AHEAD)


@triton.jit
def _attention_block(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, kvh, split,
                     sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE: tl.constexpr,
                     S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                     SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                     BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                     GDC: tl.constexpr, CACHE_AHEAD: tl.constexpr):
    """_attention_split's work for key/value head ``kvh``'s block ``split`` (also what
    attention_o_triton.py's programs of the attention do)."""
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    s = split * BLOCK_S + tl.arange(0, BLOCK_S)
    g_ok, d_ok, s_ok = g < G, d < D, s < S
    heads = kvh * G + g
    kv_ok = s_ok[:, None] & d_ok[None, :]
    if GDC and not CACHE_AHEAD:
        tl.extra.cuda.gdc_wait()
    k = tl.load(pk_ptr + kvh * spk_h + s[:, None] * spk_s + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(pv_ptr + kvh * spv_h + s[:, None] * spv_s + d[None, :], mask=kv_ok, other=0.0)
    if GDC and CACHE_AHEAD:
        tl.extra.cuda.gdc_wait()
    q = tl.load(q_ptr + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)
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
def _attention_combine(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                       out_ptr, sq_h, snk_h, snv_h, sm, SCALE: tl.constexpr,
                       S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                       SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
                       BLOCK_D: tl.constexpr, GDC: tl.constexpr):
    """One query head: its partial results joined, with the new row's key and value."""
    if GDC:  # everything it reads is the step's own: nothing to load ahead
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
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


@triton.jit
def _join_heads(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, out_ptr, kvh,
                sq_h, snk_h, snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr,
                D: tl.constexpr, G: tl.constexpr, SPLITS: tl.constexpr,
                JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr):
    """A key/value head's G query heads: all their blocks' partial results joined at
    once (in BLOCK_J blocks a round: one round at the usual cache lengths), with the new
    row's key and value: the G heads share the new row and their blocks' reads, so one
    program joins them all rather than one a head (several times slower)."""
    g = tl.arange(0, JOIN_G)
    d = tl.arange(0, BLOCK_D)
    g_ok, d_ok = g < G, d < D
    heads = kvh * G + g
    q = tl.load(q_ptr + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0).to(tl.float32)
    key = tl.load(nk_ptr + kvh * snk_h + d, mask=d_ok, other=0.0).to(tl.float32)
    value = tl.load(nv_ptr + kvh * snv_h + d, mask=d_ok, other=0.0).to(tl.float32)
    # the new row first: its weight is 1 at its own top
    top = tl.sum(q * key[None, :], axis=1) * SCALE + tl.load(mask_ptr + S * sm).to(tl.float32)
    total = tl.full((JOIN_G,), 1.0, tl.float32)
    out = tl.zeros((JOIN_G, BLOCK_D), tl.float32) + value[None, :]
    for first in range(0, SPLITS, BLOCK_J):
        j = first + tl.arange(0, BLOCK_J)
        part = heads[:, None] * SPLITS + j[None, :]
        ok = g_ok[:, None] & (j < SPLITS)[None, :]
        # .cg: other programs wrote them; read past this SM's L1
        tops = tl.load(m_ptr + part, mask=ok, other=-1e30, cache_modifier=".cg")
        sums = tl.load(l_ptr + part, mask=ok, other=0.0, cache_modifier=".cg")
        accs = tl.load(acc_ptr + part[:, :, None] * BLOCK_D + d[None, None, :],
                       mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
        new_top = tl.maximum(top, tl.max(tops, axis=1))
        kept = tl.exp(top - new_top)
        weights = tl.exp(tops - new_top[:, None])
        total = total * kept + tl.sum(sums * weights, axis=1)
        out = out * kept[:, None] + tl.sum(accs * weights[:, :, None], axis=1)
        top = new_top
    out = out / total[:, None]
    tl.store(out_ptr + heads[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _attention_join(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                    counts_ptr, out_ptr, pos_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                    snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                    G: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                    JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr, GDC: tl.constexpr,
                    CACHE_AHEAD: tl.constexpr, STORE: tl.constexpr):
    """The split kernel's block, then the last of a key/value head's programs to count
    itself in joins the head's partial results and zeroes its count again (STORE: and
    writes the new row into the past buffers at slot ``pos_ptr[0] % S``; pos_ptr is not
    read otherwise)."""
    _attention_split(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, sq_h, spk_h,
                     spk_s, spv_h, spv_s, sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G,
                     BLOCK_D, IEEE, GDC, CACHE_AHEAD)
    kvh = tl.program_id(0)
    # every thread's stores before the count: the release below then covers them
    tl.debug_barrier()
    seen = tl.atomic_add(counts_ptr + kvh, 1, sem="acq_rel", scope="gpu")
    if seen == SPLITS - 1:
        _join_heads(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, out_ptr, kvh,
                    sq_h, snk_h, snv_h, sm, SCALE, S, D, G, SPLITS, JOIN_G, BLOCK_J,
                    BLOCK_D)
        if STORE:  # every program of this head read its past rows before counting in
            _store_row(pk_ptr, nk_ptr, pv_ptr, nv_ptr, pos_ptr, kvh, spk_h, spk_s, snk_h,
                       spv_h, spv_s, snv_h, S, D, BLOCK_D)
        # every program of this head counted in: the next layer or call starts at zero
        tl.store(counts_ptr + kvh, 0)


@triton.jit
def _store_row(pk_ptr, nk_ptr, pv_ptr, nv_ptr, pos_ptr, kvh, spk_h, spk_s, snk_h, spv_h,
               spv_s, snv_h, S: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """A key/value head's new key and value into the past buffers at the step's slot."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    slot = tl.load(pos_ptr) % S
    key = tl.load(nk_ptr + kvh * snk_h + d, mask=d_ok)
    value = tl.load(nv_ptr + kvh * snv_h + d, mask=d_ok)
    tl.store(pk_ptr + kvh * spk_h + slot * spk_s + d, key.to(pk_ptr.dtype.element_ty),
             mask=d_ok)
    tl.store(pv_ptr + kvh * spv_h + slot * spv_s + d, value.to(pv_ptr.dtype.element_ty),
             mask=d_ok)


@triton.jit
def attention_split_kernel(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                           sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE: tl.constexpr,
                           S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                           SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                           BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr):
    _attention_split(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, sq_h, spk_h,
                     spk_s, spv_h, spv_s, sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G,
                     BLOCK_D, IEEE, False, False)


@triton.jit
def attention_split_kernel_gdc(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                               sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE: tl.constexpr,
                               S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                               SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                               BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                               IEEE: tl.constexpr, CACHE_AHEAD: tl.constexpr):
    _attention_split(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, sq_h, spk_h,
                     spk_s, spv_h, spv_s, sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G,
                     BLOCK_D, IEEE, True, CACHE_AHEAD)


@triton.jit
def attention_combine_kernel(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                             out_ptr, sq_h, snk_h, snv_h, sm, SCALE: tl.constexpr,
                             S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                             SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    _attention_combine(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, out_ptr,
                       sq_h, snk_h, snv_h, sm, SCALE, S, D, G, SPLITS, BLOCK_SPLITS,
                       BLOCK_D, False)


@triton.jit
def attention_combine_kernel_gdc(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                                 out_ptr, sq_h, snk_h, snv_h, sm, SCALE: tl.constexpr,
                                 S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                                 SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
                                 BLOCK_D: tl.constexpr):
    _attention_combine(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, out_ptr,
                       sq_h, snk_h, snv_h, sm, SCALE, S, D, G, SPLITS, BLOCK_SPLITS,
                       BLOCK_D, True)


@triton.jit
def attention_join_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                          acc_ptr, counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h,
                          spv_s, snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr,
                          D: tl.constexpr, G: tl.constexpr, SPLITS: tl.constexpr,
                          BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                          BLOCK_D: tl.constexpr, IEEE: tl.constexpr, JOIN_G: tl.constexpr,
                          BLOCK_J: tl.constexpr):
    _attention_join(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                    counts_ptr, out_ptr, counts_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                    snv_h, sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE,
                    JOIN_G, BLOCK_J, False, False, False)


@triton.jit
def attention_join_kernel_gdc(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                              acc_ptr, counts_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h,
                              spv_s, snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr,
                              D: tl.constexpr, G: tl.constexpr, SPLITS: tl.constexpr,
                              BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                              BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                              JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                              CACHE_AHEAD: tl.constexpr):
    _attention_join(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                    counts_ptr, out_ptr, counts_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                    snv_h, sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE,
                    JOIN_G, BLOCK_J, True, CACHE_AHEAD, False)


@triton.jit
def attention_store_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                           acc_ptr, counts_ptr, out_ptr, pos_ptr, sq_h, spk_h, spk_s, snk_h,
                           spv_h, spv_s, snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr,
                           D: tl.constexpr, G: tl.constexpr, SPLITS: tl.constexpr,
                           BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                           BLOCK_D: tl.constexpr, IEEE: tl.constexpr, JOIN_G: tl.constexpr,
                           BLOCK_J: tl.constexpr):
    _attention_join(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                    counts_ptr, out_ptr, pos_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                    snv_h, sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE,
                    JOIN_G, BLOCK_J, False, False, True)


@triton.jit
def attention_store_kernel_gdc(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr,
                               l_ptr, acc_ptr, counts_ptr, out_ptr, pos_ptr, sq_h, spk_h,
                               spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE: tl.constexpr,
                               S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                               SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                               BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                               IEEE: tl.constexpr, JOIN_G: tl.constexpr,
                               BLOCK_J: tl.constexpr, CACHE_AHEAD: tl.constexpr):
    _attention_join(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                    counts_ptr, out_ptr, pos_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                    snv_h, sm, SCALE, S, D, G, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE,
                    JOIN_G, BLOCK_J, True, CACHE_AHEAD, True)


declare_writes(attention_split_kernel_gdc, "m_ptr", "l_ptr", "acc_ptr")
declare_writes(attention_combine_kernel_gdc, "out_ptr")
# not counts_ptr: the kernel leaves it at zero, so a library need not copy it for each
# call (torch's analysis takes the atomics as writes)
declare_writes(attention_join_kernel_gdc, "m_ptr", "l_ptr", "acc_ptr", "out_ptr")
# the past buffers too: the op mutates them in place (ops.decode_attention_store)
declare_writes(attention_store_kernel_gdc, "pk_ptr", "pv_ptr", "m_ptr", "l_ptr", "acc_ptr",
               "out_ptr")


def launch_decode_attention(query, past_k, new_k, past_v, new_v, mask, scale: float,
                            block_s: int | None = None, pdl: bool = False,
                            cache_ahead: bool | None = None,
                            counts: torch.Tensor | None = None,
                            positions: torch.Tensor | None = None) -> torch.Tensor:
    """``cache_ahead``: a dependent launch reads the past rows before its wait (by default
    where a script started it with the cache itself, ``pdl``; False: as in a library).
    ``counts``: int32 zeros, one or more a key/value head: the join inside the split
    kernel, which leaves them at zero; without them a second kernel joins.
    ``positions``: the step's (int64, the first this token's), with ``counts``: the
    new row is also written into ``past_k``/``past_v`` at slot ``position % slots``."""
    if positions is not None and (counts is None or past_k.stride(-1) != 1
                                  or past_v.stride(-1) != 1):
        # a copy of the cache would take the row, not the cache
        raise ValueError("storing the new row needs counts and past rows of unit stride")
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    groups = heads // kv_heads
    # 32 slots a program fill the GPU at a few hundred slots; longer caches take longer
    # blocks, so the join's partial results stay few
    block_s = block_s or (32 if slots <= 1024 else 64 if slots <= 4096 else 128)
    splits = triton.cdiv(slots, block_s)
    block_splits = max(2, triton.next_power_of_2(splits))
    block_d = max(16, triton.next_power_of_2(dim))
    joined = counts is not None
    store = positions is not None
    split, gdc = launcher(
        attention_store_kernel if store else
        attention_join_kernel if joined else attention_split_kernel,
        attention_store_kernel_gdc if store else
        attention_join_kernel_gdc if joined else attention_split_kernel_gdc,
        query.device, pdl)
    # the past rows read before the wait only where the script gave the cache itself; in
    # a library they may be what a kernel of the step wrote
    ahead = pdl if cache_ahead is None else cache_ahead
    cache_first = dict(CACHE_AHEAD=ahead and past_k.stride(-1) == 1 and
                       past_v.stride(-1) == 1) if gdc else {}
    query, past_k, past_v = (t if t.stride(-1) == 1 else t.contiguous()
                             for t in (query, past_k, past_v))
    new_k, new_v = (t if t.stride(-1) == 1 else t.contiguous() for t in (new_k, new_v))
    tops = torch.empty((heads * splits,), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(tops)
    accs = torch.empty((heads * splits, block_d), dtype=torch.float32, device=query.device)
    out = torch.empty((1, heads, 1, dim), dtype=query.dtype, device=query.device)
    sizes = dict(SCALE=float(scale), S=slots, D=dim, G=groups, SPLITS=splits,
                 BLOCK_S=block_s, BLOCK_G=max(16, triton.next_power_of_2(groups)),
                 BLOCK_D=block_d, IEEE=query.dtype == torch.float32, num_warps=4)
    if joined:
        join_g = triton.next_power_of_2(groups)
        # the joining program's blocks a round: 8K float32 partial sums, 64 a thread
        block_j = min(block_splits, max(2, 8192 // (join_g * block_d)))
        split((kv_heads, splits))(
            query, past_k, new_k, past_v, new_v, mask, tops, sums, accs, counts, out,
            *((positions,) if store else ()), query.stride(1), past_k.stride(1),
            past_k.stride(2), new_k.stride(1), past_v.stride(1), past_v.stride(2),
            new_v.stride(1), mask.stride(-1),
            JOIN_G=join_g, BLOCK_J=block_j, **sizes, **cache_first)
        return out
    split((kv_heads, splits))(
        query, past_k, past_v, mask, tops, sums, accs, query.stride(1),
        past_k.stride(1), past_k.stride(2), past_v.stride(1), past_v.stride(2),
        mask.stride(-1), **sizes, **cache_first)
    combine, _ = launcher(attention_combine_kernel, attention_combine_kernel_gdc,
                          query.device, pdl)
    combine((heads,))(
        query, new_k, new_v, mask, tops, sums, accs, out, query.stride(1),
        new_k.stride(1), new_v.stride(1), mask.stride(-1), SCALE=float(scale), S=slots,
        D=dim, G=groups, SPLITS=splits, BLOCK_SPLITS=block_splits, BLOCK_D=block_d,
        num_warps=min(8, max(1, block_splits * block_d // 1024)))
    return out
