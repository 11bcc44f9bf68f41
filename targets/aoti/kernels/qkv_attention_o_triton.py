"""A decode layer's q/k/v product, attention and o (+ residual) as one launch: a 1-D grid
of [q/k/v's row programs][the attention's blocks][o's row programs]. Not an op yet: a
timing script's kernel (bench/decode_chain_qkv.py) until the 22-layer chain decides.

q/k/v programs compute their rows as the library's q/k/v launch does (triton_kernels.py's
row pieces: the RMSNorm folded in, the rotary embedding of q's and k's rows in the
epilogue; their first AHEAD columns of weights loaded before the launch's wait), store
them, and count in on their key/value head's counter. Program p takes the rows of head
group p // PER in turn (PER = (G + 2) x D / BLOCK_Q programs a group: the group's G query
heads, then its key row, then its value row), so the first group's attention can start
while the later groups' rows are computed. The attention's blocks
(attention_o_triton.py's, decode_attention.py's pieces) spin until their group's PER
programs have counted in, then run as in attention_o_triton.py, reading q and the new
key and value from the stored rows; o's programs as there: Wo's rows loaded before the
wait, a spin until every key/value head has joined.

Why no spin waits forever: a program waits only on programs of a lower index (an
attention block on q/k/v programs, an o program on the attention's), and a q/k/v
program waits on nothing of this launch. A GPU dispatches a 1-D grid's programs in the
order of their index (NVIDIA hardware does; CUDA does not promise it), so whatever a
spinning program waits on is resident or done. Beyond that, at the ~1.1B's shape the
whole grid is resident at once on an H200 in CONFIG (resident_programs(): registers and
warps from the offline sm_90a compile, bench/decode_chain_qkv.py's ``__main__``), so
the order does not matter there: 2,560 q/k/v rows 8 a program (320) + 4 x 4 attention
blocks + 2,048 o rows 8 a program (256) = 592 programs of 4 warps, 96 registers: 5 a
SM, 660 on 132 SMs. With o's 4 rows a program none compiled was (q/k/v's 4, 8 or 16:
1,168, 848, 688 programs against 924, 792, 660). Over int8 rows o keeps 4 (its 8 took
156+ registers) and q/k/v takes 32: 80 + 8 x 4 + 512 = 624 against 660. A configuration
keeps the property where resident_programs() >= grid_programs() (the chain's do). The
kernel after it starts only once every program of this one has (each triggers it at its
start), and the kernel before ends before any count or spin (both come after the wait).
Past 2^20 polls a spin traps (attention_o_triton._poll): the step fails, never returns
wrong numbers. Under Triton's interpreter programs run one after another.

Counters: one slot of ``flags`` (attention_o_slots: SLOTS slots of STRIDE int32s, each
its own 128-byte line) a launch: its int32 0 the attention's flag (o's spin), 1 + kvh
head kvh's q/k/v count. Program 0, after its wait, zeroes the whole ``reset`` slot, the
next launch's (flag_slots); the join's ``counts`` are left at zero as there.
The stored rows are read with plain loads by the library's pieces: the spin's acquire at
gpu scope and the CTA barrier after it order them after the counts' release, past this
SM's L1 (as attention_o_triton.py's int4 o rows read the attention's output).
Float rows (fp16/bf16/fp32) or int8 rows with a scale a row (q/k/v's read as
int8_words_triton.py's words, o's as attention_o's), no bias; ``positions``: the store
form (the new key and value written into the past buffers at slot ``position % slots``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.attention_o_slots import SLOTS, STRIDE
from targets.aoti.kernels.attention_o_triton import _o_rows, _poll
from targets.aoti.kernels.decode_attention import _attention_block, _join_heads, _store_row
from targets.aoti.kernels.dependent_launch import launcher
from targets.aoti.kernels.int8_words_triton import _word_rows
from targets.aoti.kernels.row_parts import _block_rows, _column_sums, _finish, _first_columns

_STRIDE = tl.constexpr(STRIDE)
# (q/k/v rows a program, their columns loaded ahead, columns a step after, blocks of slots
# a key/value head, o's rows a program, warps): at the ~1.1B's shape the whole grid is
# resident at once on 132 SMs (why that matters: the docstring)
CONFIG = (8, 1024, 512, 4, 8, 4)


@triton.jit
def _qkv_block(pid, G: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
               BLOCK_Q: tl.constexpr):
    """(the row block, in _block_rows' numbering, that program ``pid`` computes; its key/
    value head): a head group's query rows, then its key rows, then its value rows."""
    PER: tl.constexpr = (G + 2) * D // BLOCK_Q
    QB: tl.constexpr = G * D // BLOCK_Q  # a group's blocks of query rows
    HB: tl.constexpr = D // BLOCK_Q  # a head's blocks
    group = pid // PER
    i = pid % PER
    block = tl.where(i < QB, group * QB + i,
                     tl.where(i < QB + HB, KVH * QB + group * HB + (i - QB),
                              KVH * (QB + HB) + group * HB + (i - QB - HB)))
    return block, group


@triton.jit
def _qkv_rows(x_ptr, w_ptr, s_ptr, nw_ptr, cos_ptr, sin_ptr, qkv_ptr, flags_ptr, count_ptr,
              pid, reset, EPS: tl.constexpr, OFFSET: tl.constexpr, K: tl.constexpr,
              HAS_NORM: tl.constexpr, ROT_ROWS: tl.constexpr, G: tl.constexpr,
              KVH: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr,
              BLOCK_KQ: tl.constexpr, AHEAD: tl.constexpr, GDC: tl.constexpr,
              WORDS: tl.constexpr, PRMT: tl.constexpr):
    """A q/k/v program: its rows as triton_kernels._row_gemv computes them (WORDS: int8
    rows with ``s_ptr``'s scales, as int8_words_triton.py's kernel), stored, then counted
    in on its head's counter (``count_ptr`` + head)."""
    NQ: tl.constexpr = (G + 2) * KVH * D
    block, group = _qkv_block(pid, G, KVH, D, BLOCK_Q)
    rows = _block_rows(block, BLOCK_Q, ROT_ROWS, D)
    row_ok = rows < NQ
    if WORDS:  # no bias or residual: their pointers are never read
        y = _word_rows(x_ptr, w_ptr, w_ptr, nw_ptr, x_ptr, s_ptr, cos_ptr, sin_ptr, rows,
                       row_ok, EPS, OFFSET, NQ, K, False, HAS_NORM, 0, False, BLOCK_Q,
                       BLOCK_KQ, AHEAD, GDC, True, ROT_ROWS, D, PRMT)
    else:
        y = _float_rows(x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, rows, row_ok, EPS, OFFSET,
                        NQ, K, HAS_NORM, ROT_ROWS, D, BLOCK_Q, BLOCK_KQ, AHEAD, GDC)
    if pid == 0:  # past its wait: every launch before this one has ended
        tl.store(flags_ptr + reset * _STRIDE + tl.arange(0, _STRIDE), 0)
    tl.store(qkv_ptr + rows, y.to(qkv_ptr.dtype.element_ty), mask=row_ok)
    tl.debug_barrier()  # every thread's stores before the count
    tl.atomic_add(count_ptr + group, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _float_rows(x_ptr, w_ptr, nw_ptr, cos_ptr, sin_ptr, rows, row_ok, EPS: tl.constexpr,
                OFFSET: tl.constexpr, NQ: tl.constexpr, K: tl.constexpr,
                HAS_NORM: tl.constexpr, ROT_ROWS: tl.constexpr, D: tl.constexpr,
                BLOCK_Q: tl.constexpr, BLOCK_KQ: tl.constexpr, AHEAD: tl.constexpr,
                GDC: tl.constexpr):
    """Float rows' values: triton_kernels._row_gemv's pieces (weights ahead, the wait)."""
    y, u, square_sum = _first_columns(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET, NQ, K,
                                      BLOCK_Q, HAS_NORM, 0, AHEAD, GDC)
    y_rest, up, squares = _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET, NQ, K,
                                       BLOCK_Q, BLOCK_KQ, HAS_NORM, 0, AHEAD, False)
    # no bias, residual or scales: their pointers are never read
    return _finish(y + y_rest, u, up, square_sum + squares, w_ptr, x_ptr, w_ptr, cos_ptr,
                   sin_ptr, rows, row_ok, EPS, NQ, K, False, HAS_NORM, 0, False, False,
                   BLOCK_Q, ROT_ROWS, D)


@triton.jit
def _prefetch_rows(pk_ptr, pv_ptr, kvh, split, spk_h, spk_s, spv_h, spv_s, S: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    """The block's past key and value rows into L2 before the wait (the cache is no
    kernel's of the step where the caller says so): one prefetch a row, its first 128
    bytes (a whole row of 64 fp16), so the loads after the spin hit L2."""
    s = tl.minimum(split * BLOCK_S + tl.arange(0, BLOCK_S), S - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l",
                              [pk_ptr + kvh * spk_h + s * spk_s], dtype=tl.int32,
                              is_pure=False, pack=1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l",
                              [pv_ptr + kvh * spv_h + s * spv_s], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _attention_rows(qkv_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr,
                    att_ptr, flag_ptr, count_ptr, pos_ptr, block, spk_h, spk_s, spv_h, spv_s,
                    sm, SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                    G: tl.constexpr, KVH: tl.constexpr, SPLITS: tl.constexpr,
                    BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                    IEEE: tl.constexpr, JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                    BLOCK_Q: tl.constexpr, POLL: tl.constexpr, GDC: tl.constexpr,
                    CACHE_AHEAD: tl.constexpr, STORE: tl.constexpr):
    """An attention block (``block`` of KVH x SPLITS): after the wait, the spin until its
    head group's q/k/v rows are stored; then attention_o_triton.py's block and join.
    CACHE_AHEAD: its past rows prefetched into L2 before the wait."""
    kvh = block // SPLITS
    if CACHE_AHEAD:
        _prefetch_rows(pk_ptr, pv_ptr, kvh, block % SPLITS, spk_h, spk_s, spv_h, spv_s, S,
                       BLOCK_S)
    nk_ptr = qkv_ptr + G * KVH * D  # the stored rows: q's heads, then k's, then v's
    nv_ptr = nk_ptr + KVH * D
    if GDC:
        tl.extra.cuda.gdc_wait()
    _poll(count_ptr + kvh, (G + 2) * D // BLOCK_Q, POLL)
    _attention_block(qkv_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, kvh,
                     block % SPLITS, D, spk_h, spk_s, spv_h, spv_s, sm, SCALE, S, D, G,
                     SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, False, False)
    tl.debug_barrier()  # every thread's stores before the count
    seen = tl.atomic_add(counts_ptr + kvh, 1, sem="acq_rel", scope="gpu")
    if seen == SPLITS - 1:
        _join_heads(qkv_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, att_ptr, kvh,
                    D, D, D, sm, SCALE, S, D, G, SPLITS, JOIN_G, BLOCK_J, BLOCK_D)
        tl.store(counts_ptr + kvh, 0)
        tl.debug_barrier()  # the head's output stored before the flag counts it
        tl.atomic_add(flag_ptr, 1, sem="release", scope="gpu")
        if STORE:  # every block of this head read its past rows before counting in
            _store_row(pk_ptr, nk_ptr, pv_ptr, nv_ptr, pos_ptr, kvh, spk_h, spk_s, D, spv_h,
                       spv_s, D, S, D, BLOCK_D)


@triton.jit
def _qkv_attention_o(x_ptr, wq_ptr, sq_ptr, nw_ptr, cos_ptr, sin_ptr, qkv_ptr, pk_ptr, pv_ptr,
                     mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr, att_ptr, flags_ptr,
                     wo_ptr, so_ptr, out_ptr, pos_ptr, slot, reset, spk_h, spk_s, spv_h,
                     spv_s, sm, EPS: tl.constexpr, OFFSET: tl.constexpr, HIDDEN: tl.constexpr,
                     HAS_NORM: tl.constexpr, ROT_ROWS: tl.constexpr,
                     BLOCK_Q: tl.constexpr, BLOCK_KQ: tl.constexpr, AHEAD: tl.constexpr,
                     SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                     G: tl.constexpr, KVH: tl.constexpr, SPLITS: tl.constexpr,
                     BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                     IEEE: tl.constexpr, JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                     N: tl.constexpr, BLOCK_N: tl.constexpr, POLL: tl.constexpr,
                     GDC: tl.constexpr, CACHE_AHEAD: tl.constexpr, STORE: tl.constexpr,
                     WORDS: tl.constexpr, HAS_SCALE: tl.constexpr, PRMT: tl.constexpr):
    """HIDDEN: q/k/v's columns (the layer's input ``x_ptr``, also o's residual); N: o's
    rows, over G x KVH x D columns. WORDS: q/k/v's rows int8 (``sq_ptr`` their scales),
    HAS_SCALE: o's (``so_ptr``)."""
    pid = tl.program_id(0)
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    QP: tl.constexpr = (G + 2) * KVH * D // BLOCK_Q  # q/k/v's programs
    AP: tl.constexpr = KVH * SPLITS  # the attention's
    flag_ptr = flags_ptr + slot * _STRIDE  # the attention's flag, then the heads' counts
    if pid < QP:
        _qkv_rows(x_ptr, wq_ptr, sq_ptr, nw_ptr, cos_ptr, sin_ptr, qkv_ptr, flags_ptr,
                  flag_ptr + 1, pid, reset, EPS, OFFSET, HIDDEN, HAS_NORM, ROT_ROWS, G, KVH,
                  D, BLOCK_Q, BLOCK_KQ, AHEAD, GDC, WORDS, PRMT)
    elif pid < QP + AP:
        _attention_rows(qkv_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                        counts_ptr, att_ptr, flag_ptr, flag_ptr + 1, pos_ptr, pid - QP,
                        spk_h, spk_s, spv_h, spv_s, sm, SCALE, S, D, G, KVH, SPLITS,
                        BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G, BLOCK_J, BLOCK_Q, POLL,
                        GDC, CACHE_AHEAD, STORE)
    else:
        _o_rows(att_ptr, wo_ptr, so_ptr, x_ptr, out_ptr, flag_ptr, pid - QP - AP, N,
                G * KVH * D, KVH, BLOCK_N, HAS_SCALE, 0, 1, POLL, GDC)  # float or int8 rows


@triton.jit
def qkv_attention_o_kernel(x_ptr, wq_ptr, sq_ptr, nw_ptr, cos_ptr, sin_ptr, qkv_ptr, pk_ptr,
                           pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr, att_ptr,
                           flags_ptr, wo_ptr, so_ptr, out_ptr, pos_ptr, slot, reset,
                           spk_h, spk_s, spv_h, spv_s, sm, EPS: tl.constexpr,
                           OFFSET: tl.constexpr, HIDDEN: tl.constexpr, HAS_NORM: tl.constexpr,
                           ROT_ROWS: tl.constexpr, BLOCK_Q: tl.constexpr,
                           BLOCK_KQ: tl.constexpr, AHEAD: tl.constexpr,
                           SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                           G: tl.constexpr, KVH: tl.constexpr, SPLITS: tl.constexpr,
                           BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
                           BLOCK_D: tl.constexpr, IEEE: tl.constexpr, JOIN_G: tl.constexpr,
                           BLOCK_J: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr,
                           POLL: tl.constexpr, STORE: tl.constexpr, WORDS: tl.constexpr,
                           HAS_SCALE: tl.constexpr, PRMT: tl.constexpr):
    _qkv_attention_o(x_ptr, wq_ptr, sq_ptr, nw_ptr, cos_ptr, sin_ptr, qkv_ptr, pk_ptr,
                     pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr, att_ptr, flags_ptr,
                     wo_ptr, so_ptr, out_ptr, pos_ptr, slot, reset, spk_h, spk_s, spv_h, spv_s,
                     sm, EPS, OFFSET, HIDDEN, HAS_NORM, ROT_ROWS, BLOCK_Q, BLOCK_KQ, AHEAD,
                     SCALE, S, D, G, KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G,
                     BLOCK_J, N, BLOCK_N, POLL, False, False, STORE, WORDS, HAS_SCALE, PRMT)


@triton.jit
def qkv_attention_o_kernel_gdc(x_ptr, wq_ptr, sq_ptr, nw_ptr, cos_ptr, sin_ptr, qkv_ptr,
                               pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr,
                               att_ptr, flags_ptr, wo_ptr, so_ptr, out_ptr, pos_ptr, slot,
                               reset, spk_h, spk_s, spv_h, spv_s, sm, EPS: tl.constexpr,
                               OFFSET: tl.constexpr, HIDDEN: tl.constexpr,
                               HAS_NORM: tl.constexpr, ROT_ROWS: tl.constexpr,
                               BLOCK_Q: tl.constexpr, BLOCK_KQ: tl.constexpr,
                               AHEAD: tl.constexpr, SCALE: tl.constexpr, S: tl.constexpr,
                               D: tl.constexpr, G: tl.constexpr, KVH: tl.constexpr,
                               SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                               BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                               IEEE: tl.constexpr, JOIN_G: tl.constexpr,
                               BLOCK_J: tl.constexpr, N: tl.constexpr,
                               BLOCK_N: tl.constexpr, POLL: tl.constexpr,
                               CACHE_AHEAD: tl.constexpr, STORE: tl.constexpr,
                               WORDS: tl.constexpr, HAS_SCALE: tl.constexpr,
                               PRMT: tl.constexpr):
    _qkv_attention_o(x_ptr, wq_ptr, sq_ptr, nw_ptr, cos_ptr, sin_ptr, qkv_ptr, pk_ptr,
                     pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, counts_ptr, att_ptr, flags_ptr,
                     wo_ptr, so_ptr, out_ptr, pos_ptr, slot, reset, spk_h, spk_s, spv_h, spv_s,
                     sm, EPS, OFFSET, HIDDEN, HAS_NORM, ROT_ROWS, BLOCK_Q, BLOCK_KQ, AHEAD,
                     SCALE, S, D, G, KVH, SPLITS, BLOCK_S, BLOCK_G, BLOCK_D, IEEE, JOIN_G,
                     BLOCK_J, N, BLOCK_N, POLL, True, CACHE_AHEAD, STORE, WORDS, HAS_SCALE,
                     PRMT)


def resident_programs(registers: int, warps: int, shared: int, multiprocessors: int) -> int:
    """Programs of ``warps`` warps, ``registers`` a thread and ``shared`` bytes that a
    Hopper GPU holds at once: per SM at most 32 programs, 64 warps, 64K registers
    (allocated 256 a warp) and 228 KiB of shared memory (1 KiB of it reserved a program)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_shared = 228 * 1024 // (shared + 1024)
    return multiprocessors * min(32, 64 // warps, 65536 // (per_warp * warps), by_shared)


def grid_programs(qkv_rows: int, kv_heads: int, o_rows: int, config: tuple) -> int:
    return qkv_rows // config[0] + kv_heads * config[3] + triton.cdiv(o_rows, config[4])


def _check(x, qkv_weight, qkv_scale, o_weight, o_scale, heads, kv_heads, dim, slots, flags,
           slot, reset, config):
    """ValueError where the launch cannot take these shapes or this config."""
    block_q, ahead, block_kq, splits, block_n, warps = config
    hidden, cols = x.shape[-1], heads * dim
    for rows, scales in ((qkv_weight, qkv_scale), (o_weight, o_scale)):
        if rows.dtype == torch.uint8 or (rows.dtype == torch.int8) != (scales is not None) \
                or (scales is not None and scales.numel() != rows.shape[0]):
            raise ValueError("float rows, or int8 rows with a scale a row")
    if qkv_weight.dtype == torch.int8 and hidden % 4:  # read as words of four
        raise ValueError(f"int8 q/k/v rows of {hidden} columns: not whole words")
    if not (qkv_weight.is_contiguous() and o_weight.is_contiguous()):
        # a copy would be the kernel before, and the rows are read before the wait
        raise ValueError("q/k/v's and o's rows must be contiguous")
    if tuple(qkv_weight.shape) != ((heads + 2 * kv_heads) * dim, hidden) or heads % kv_heads:
        raise ValueError(f"q/k/v's rows {tuple(qkv_weight.shape)}: not {heads} + 2 x "
                         f"{kv_heads} heads of {dim} over {hidden} columns")
    if tuple(o_weight.shape) != (hidden, cols) or cols & (cols - 1) or cols > 4096 \
            or slots > 512:
        raise ValueError(f"o's row of {heads} x {dim} over {slots} slots is not joined")
    if flags.numel() < SLOTS * STRIDE or not (0 <= slot < SLOTS and 0 <= reset < SLOTS) \
            or kv_heads + 1 > STRIDE:
        raise ValueError(f"flags: {SLOTS} slots of {STRIDE} int32s, slot/reset below {SLOTS}")
    powers = (block_q, block_kq, block_n, warps) + ((ahead,) if ahead else ())
    if min(splits, *powers) < 1 or any(p & (p - 1) for p in powers) or block_q < 2 \
            or dim % block_q or (ahead and ahead < 16) or block_kq < 16:
        raise ValueError(f"config {config}: (q/k/v rows a power of two dividing the head, "
                         "columns ahead, columns a step, blocks of slots, o's rows, warps)")


def launch_qkv_attention_o(x, qkv_weight, norm_weight, eps: float, offset: float,
                           rotary_cos, rotary_sin, heads: int, past_k, past_v, mask,
                           scale: float, counts, o_weight, flags, slot: int, reset: int,
                           config: tuple, positions=None, pdl: bool = False,
                           cache_ahead: bool = False, qkv_scale=None, o_scale=None):
    """(o's output + ``x``, the stored q/k/v row): reference.row_gemv(x, ``qkv_weight``,
    norm, rotary of q's and k's rows where ``rotary_cos`` is given) split into q, k and v
    (``heads`` query heads, past_k's key/value heads), then
    reference.decode_attention_o(..., o_weight, residual=x). ``counts`` int32 zeros, one
    a key/value head (left at zero); ``flags`` int32, SLOTS x STRIDE, zeros before the
    step's first launch (``slot`` counted on, ``reset`` zeroed: flag_slots).
    ``positions``: the store form. ``config``: CONFIG's fields (explicit: no default).
    ``cache_ahead``: a dependent launch prefetches the past rows into L2 before its wait
    (the cache is the caller's, no kernel of the step writes it). ``qkv_scale``/``o_scale``:
    int8 rows' scales, a row each (int8 q/k/v rows: int8_words_triton.py's words)."""
    kv_heads, slots, dim = past_k.shape[1], past_k.shape[2], past_k.shape[-1]
    _check(x, qkv_weight, qkv_scale, o_weight, o_scale, heads, kv_heads, dim, slots, flags,
           slot, reset, config)
    if positions is not None and (past_k.stride(-1) != 1 or past_v.stride(-1) != 1):
        raise ValueError("storing the new row needs past rows of unit stride")
    block_q, ahead, block_kq, splits, block_n, warps = config
    hidden, rows, nq = x.shape[-1], o_weight.shape[0], qkv_weight.shape[0]
    groups, block_d = heads // kv_heads, max(16, triton.next_power_of_2(dim))
    join_g = triton.next_power_of_2(groups)
    store = positions is not None
    kernel, gdc = launcher(qkv_attention_o_kernel, qkv_attention_o_kernel_gdc, x.device,
                           pdl)
    prefetch = dict(CACHE_AHEAD=bool(cache_ahead)) if gdc else {}
    past_k, past_v = (t if t.stride(-1) == 1 else t.contiguous() for t in (past_k, past_v))
    device = x.device
    qkv = torch.empty((nq,), dtype=x.dtype, device=device)
    tops = torch.empty((heads * splits,), dtype=torch.float32, device=device)
    sums = torch.empty_like(tops)
    accs = torch.empty((heads * splits, block_d), dtype=torch.float32, device=device)
    att = torch.empty((heads * dim,), dtype=x.dtype, device=device)
    out = torch.empty((*x.shape[:-1], rows), dtype=x.dtype, device=device)
    rotary, dummy = rotary_cos is not None, qkv_weight  # dummy: a pointer never read
    kernel((grid_programs(nq, kv_heads, rows, config),))(
        x.reshape(hidden).contiguous(), qkv_weight,
        dummy if qkv_scale is None else qkv_scale.reshape(-1),
        dummy if norm_weight is None else norm_weight,
        rotary_cos.reshape(-1).contiguous() if rotary else dummy,
        rotary_sin.reshape(-1).contiguous() if rotary else dummy, qkv, past_k, past_v,
        mask, tops, sums, accs, counts, att, flags, o_weight,
        dummy if o_scale is None else o_scale.reshape(-1), out,
        positions if store else counts, slot, reset, past_k.stride(1), past_k.stride(2),
        past_v.stride(1), past_v.stride(2), mask.stride(-1),
        EPS=float(eps), OFFSET=float(offset), HIDDEN=hidden,
        HAS_NORM=norm_weight is not None, ROT_ROWS=(heads + kv_heads) * dim if rotary else 0,
        BLOCK_Q=block_q, BLOCK_KQ=min(block_kq, triton.next_power_of_2(hidden)),
        AHEAD=min(ahead, triton.next_power_of_2(hidden)), SCALE=float(scale), S=slots,
        D=dim, G=groups, KVH=kv_heads, SPLITS=splits,
        BLOCK_S=max(16, triton.next_power_of_2(triton.cdiv(slots, splits))),
        BLOCK_G=max(16, triton.next_power_of_2(groups)), BLOCK_D=block_d,
        IEEE=x.dtype == torch.float32, JOIN_G=join_g,
        BLOCK_J=min(max(2, triton.next_power_of_2(splits)),
                    max(2, 8192 // (join_g * block_d))),
        N=rows, BLOCK_N=block_n, POLL=int(device.type == "cuda"), STORE=store,
        WORDS=qkv_scale is not None, HAS_SCALE=o_scale is not None,
        PRMT=os.environ.get("TRITON_INTERPRET") != "1", num_warps=warps, **prefetch)
    return out, qkv
