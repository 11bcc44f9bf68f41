"""The decode attention and o (+ residual) as one launch, the attention's work as the
library's (decode_chain_cuda.py's ``... attention-o joined ...`` variants): a 1-D grid
whose first KVH x SPLITS programs are decode_attention.py's joined kernel (blocks of
slots, the cache's past rows read before the wait; the last of a key/value head joins
its query heads and counts in on a flag), and whose other programs are o's rows: each
loads its rows of Wo whole before the wait, waits for the kernel before (the residual),
then spins on the flag until every key/value head has joined (flag_wait_triton._spin),
and reads the attention's output. So o's weights stream while the attention computes,
and a layer loses a kernel boundary.

Safe because the attention's programs come first in the grid: the GPU dispatches a
grid's programs in order, so they are resident (or done) while o's programs spin; under
Triton's interpreter, which runs programs one after the other in order, they have all
finished before the first o program polls (POLL 0: no inline assembly there).

The flag is one of a few slots (``slot``), each a 128-byte line. It is set back to zero
without an atomic by the kernel after (``reset``: the slot the next launch uses), by its
program 0 after its wait, when every program of the launch that spun on it has ended:
consecutive launches take different slots (attention_o_slots.flag_slots).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bench.flag_wait_triton import STRIDE, _spin
from targets.aoti.kernels.decode_attention import _attention_block, _join_heads
from targets.aoti.kernels.int4_triton import _first_tiles, _group_sums


@triton.jit
def _joined(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
            counts_ptr, att_ptr, flag_ptr, reset_ptr, err_ptr, w_ptr, s_ptr, r_ptr,
            out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm,
            SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
            KVH: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
            BLOCK_D: tl.constexpr, IEEE: tl.constexpr, JOIN_G: tl.constexpr,
            BLOCK_J: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
            BLOCK_N: tl.constexpr, POLL: tl.constexpr, NS: tl.constexpr,
            HAS_SCALE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G4: tl.constexpr,
            SPLIT_X: tl.constexpr, GDC: tl.constexpr):
    pid = tl.program_id(0)
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if pid < KVH * SPLITS:  # the attention: a block of slots of a key/value head
        kvh = pid // SPLITS
        # the cache's rows read before the wait (CACHE_AHEAD)
        _attention_block(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, kvh,
                         pid % SPLITS, sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE, S, D,
                         G, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, GDC, True)
        if pid == 0:  # past its wait: every launch before this one has ended
            tl.store(reset_ptr, 0)
        tl.debug_barrier()  # every thread's stores before the count
        seen = tl.atomic_add(counts_ptr + kvh, 1, sem="acq_rel", scope="gpu")
        if seen == SPLITS - 1:
            _join_heads(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, att_ptr,
                        kvh, sq_h, snk_h, snv_h, sm, SCALE, S, D, G, SPLITS, JOIN_G,
                        BLOCK_J, BLOCK_D)
            tl.store(counts_ptr + kvh, 0)
            tl.debug_barrier()  # the head's output stored before the flag counts it
            tl.atomic_add(flag_ptr, 1, sem="release", scope="gpu")
    else:  # o's rows: Wo's whole rows before the wait, the attention's output after
        rows = (pid - KVH * SPLITS) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        cols = tl.arange(0, K)
        if GROUP:  # int4 rows (int4_triton.py's): their first two tiles
            ahead, ahead2, pairs, pairs2 = _first_tiles(w_ptr, s_ptr, rows, row_ok, K,
                                                        GROUP, BLOCK_G4)
        else:
            w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None],
                        other=0.0, eviction_policy="evict_first")
        if GDC:
            tl.extra.cuda.gdc_wait()
        residual = tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if HAS_SCALE:  # int8 rows: a scale a row
            scale = tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if POLL >= 0:  # POLL -1: no wait for the attention (wrong output: a floor)
            _spin(flag_ptr, err_ptr, KVH, POLL, NS, 1)
        if GROUP:  # x read by int4_triton's loop (plain loads after the acquire)
            acc, _ = _group_sums(att_ptr, w_ptr, s_ptr, att_ptr, rows, row_ok, ahead,
                                 ahead2, pairs, pairs2, 0.0, K, GROUP, BLOCK_N, BLOCK_G4,
                                 False, SPLIT_X)
            y = tl.sum(acc, axis=1)
        else:
            # .cg: other programs of this launch wrote it; read past this SM's L1
            x = tl.load(att_ptr + cols, cache_modifier=".cg").to(tl.float32)
            y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if HAS_SCALE:
            y *= scale
        y += residual
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def joined_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                  counts_ptr, att_ptr, flag_ptr, reset_ptr, err_ptr, w_ptr, s_ptr, r_ptr,
                  out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm,
                  SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                  KVH: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                  JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr, N: tl.constexpr,
                  K: tl.constexpr, BLOCK_N: tl.constexpr, POLL: tl.constexpr,
                  NS: tl.constexpr, HAS_SCALE: tl.constexpr, GROUP: tl.constexpr,
                  BLOCK_G4: tl.constexpr, SPLIT_X: tl.constexpr):
    _joined(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
            counts_ptr, att_ptr, flag_ptr, reset_ptr, err_ptr, w_ptr, s_ptr, r_ptr,
            out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S, D, G,
            KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G, BLOCK_J, N, K, BLOCK_N,
            POLL, NS, HAS_SCALE, GROUP, BLOCK_G4, SPLIT_X, False)


@triton.jit
def joined_kernel_gdc(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                      acc_ptr, counts_ptr, att_ptr, flag_ptr, reset_ptr, err_ptr, w_ptr,
                      s_ptr, r_ptr, out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s,
                      snv_h, sm, SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                      G: tl.constexpr, KVH: tl.constexpr, SPLITS: tl.constexpr,
                      BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                      IEEE: tl.constexpr, JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                      N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                      POLL: tl.constexpr, NS: tl.constexpr, HAS_SCALE: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_G4: tl.constexpr, SPLIT_X: tl.constexpr):
    _joined(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
            counts_ptr, att_ptr, flag_ptr, reset_ptr, err_ptr, w_ptr, s_ptr, r_ptr,
            out_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm, SCALE, S, D, G,
            KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G, BLOCK_J, N, K, BLOCK_N,
            POLL, NS, HAS_SCALE, GROUP, BLOCK_G4, SPLIT_X, True)


def joined_sizes(query, past_k, weight, splits: int, block_n: int, poll: int,
                 ns: int) -> dict:
    """The kernel's constexprs: a query [1, H, 1, D] over a past [1, KVH, S, D] in
    ``splits`` blocks a key/value head, o's ``weight`` [N, H * D] in blocks of
    ``block_n`` rows (H * D a power of two: a row is one tile); POLL threads poll the
    flag (0: Triton atomics, the interpreter's; -1: none, o reads the attention's output
    unwaited, a timing floor), NS ns apart."""
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    rows, cols = weight.shape[0], heads * dim  # int4 rows: cols / 2 bytes
    if weight.shape[1] not in (cols, cols // 2) or cols != triton.next_power_of_2(cols):
        raise ValueError(f"o's columns: {heads} x {dim}, a power of two, got {cols}")
    groups = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(dim))
    join_g = triton.next_power_of_2(groups)
    block_j = max(2, triton.next_power_of_2(splits))
    return dict(SCALE=float(dim ** -0.5), S=slots, D=dim, G=groups, KVH=kv_heads,
                SPLITS=splits, BLOCK_S=max(16, triton.next_power_of_2(
                    triton.cdiv(slots, splits))),
                BLOCK_G=max(16, triton.next_power_of_2(groups)), BLOCK_D=block_d,
                IEEE=query.dtype == torch.float32, JOIN_G=join_g,
                BLOCK_J=min(block_j, max(2, 8192 // (join_g * block_d))), N=rows, K=cols,
                BLOCK_N=block_n, POLL=poll, NS=ns, GROUP=0, BLOCK_G4=1, SPLIT_X=False)


def launch_joined_attention_o(query, past_k, new_k, past_v, new_v, mask, weight, residual,
                              state: dict, slot: int, reset: int, splits: int = 16,
                              block_n: int = 2, warps: int = 4, poll: int = 1,
                              ns: int = 64, pdl: bool = False, weight_scale=None,
                              int4: tuple = ()) -> torch.Tensor:
    """reference.row_gemv(decode_attention(...) as a row, ``weight``, residual) in one
    launch. ``state``: joined_state's buffers (counts left at zero; flag ``slot`` counted
    on, ``reset`` zeroed); ``weight_scale``: int8 rows' scales, or with ``int4`` (groups
    a step, SPLIT_X: int4_triton's) int4 rows' (scale, offset) pairs (``weight`` packed)."""
    sizes = joined_sizes(query, past_k, weight, splits, block_n, poll, ns)
    if int4:
        sizes.update(GROUP=sizes["K"] // weight_scale.shape[1], BLOCK_G4=int4[0],
                     SPLIT_X=bool(int4[1]))
    heads, dim, kv_heads = query.shape[1], query.shape[-1], past_k.shape[1]
    query, past_k, past_v, new_k, new_v = (t if t.stride(-1) == 1 else t.contiguous()
                                           for t in (query, past_k, past_v, new_k, new_v))
    parts = heads * splits
    tops = torch.empty((parts,), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(tops)
    accs = torch.empty((parts, sizes["BLOCK_D"]), dtype=torch.float32, device=query.device)
    att = torch.empty((heads * dim,), dtype=query.dtype, device=query.device)
    out = torch.empty((*residual.shape[:-1], weight.shape[0]), dtype=residual.dtype,
                      device=residual.device)
    flags = state["flags"]
    kernel = joined_kernel_gdc if pdl else joined_kernel
    extra = dict(launch_pdl=True) if pdl else {}
    grid = kv_heads * splits + triton.cdiv(weight.shape[0], block_n)
    kernel[(grid,)](
        query, past_k, new_k, past_v, new_v, mask, tops, sums, accs, state["counts"], att,
        flags[slot * STRIDE:], flags[reset * STRIDE:], state["err"], weight.contiguous(),
        weight if weight_scale is None else weight_scale.contiguous().reshape(-1),
        residual.reshape(-1).contiguous(), out, query.stride(1), past_k.stride(1),
        past_k.stride(2), new_k.stride(1), past_v.stride(1), past_v.stride(2),
        new_v.stride(1), mask.stride(-1), num_warps=warps,
        HAS_SCALE=weight_scale is not None and not int4, **sizes, **extra)
    return out


def joined_state(kv_heads: int, slots: int, device) -> dict:
    """The zeroed buffers the launches share: a count a key/value head, ``slots`` flags
    (each its own 128-byte line), and the count of programs that gave up polling."""
    return {"counts": torch.zeros(kv_heads, dtype=torch.int32, device=device),
            "flags": torch.zeros(slots * STRIDE, dtype=torch.int32, device=device),
            "err": torch.zeros(1, dtype=torch.int32, device=device)}
