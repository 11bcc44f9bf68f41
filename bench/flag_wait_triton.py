"""A timing tool, not the library's (until it wins): the decode chain's kernels with a
finer wait at a kernel boundary than ``gdc_wait`` (griddepcontrol.wait, which waits for
the whole kernel before to exit and flush its memory).

A flag wait: each program of the kernel before counts itself in on its own int32 slot
after its last store (``tl.debug_barrier()``, then a release atomic at gpu scope); the
kernel after it, instead of ``gdc_wait``, spins (acquire loads at gpu scope, with
``nanosleep`` between polls) until the slot reaches the count of the programs that
count in (TARGET). POLL threads of a program poll (1, 32 or all), then a CTA barrier.
With SUBS counters a slot, a program counts in on the one of its index modulo SUBS and
thread t polls counter t modulo SUBS (POLL at least SUBS): the arrivals spread over
SUBS lines (on the H200 that lost more than one counter: more lines polled).
Safe as a dependent launch only: a dependent grid starts after every program of the
kernel before has run ``griddepcontrol.launch_dependents`` (at its start here), so each
of them is resident while the grid after spins (no starvation).

A slot is set back to zero without an atomic by the kernel two on (program 0, after its
own wait): by then every program of the kernel that spun on it has passed its wait
(RESET). The chain's first launch resets the slot its last launch spun on (the step
before's). Past LIMIT polls a program gives up and counts itself on ``err_ptr``: a bug
shows as a count there, not as a hung GPU. Under ``TRITON_INTERPRET=1`` (programs run
one after the other) POLL 0: a Triton atomic read, no inline assembly, no griddepcontrol.

The kernels: triton_kernels.py's row_gemv (one block a program), row_loop_triton.py's
row loop and decode_attention.py's split kernel with its join, each with the flag wait
(WAIT_FLAG) or ``gdc_wait`` in its place and, with ARRIVE, the count after its stores.
fp16 rows only (no bias, no int8 scales, no rotary rows: the chain has none).
"""

from __future__ import annotations

import triton
import triton.language as tl

from targets.aoti.kernels.decode_attention import _join_heads
from targets.aoti.kernels.row_parts import (_block_rows, _column_sums, _dot_first, _finish,
                                            _first_sums, _first_tiles, _x_first)

# polls before a program gives up (with a nanosleep of 32 ns or more: over 30 ms)
LIMIT = tl.constexpr(1 << 20)
# the counters' spacing in int32s: each its own 128-byte line
STRIDE = 32
_STRIDE = tl.constexpr(STRIDE)
# counters a slot holds at most (SUBS): a slot is SLOT_SUBS * STRIDE int32s
SLOT_SUBS = 32


@triton.jit
def _spin(wait_ptr, err_ptr, TARGET: tl.constexpr, POLL: tl.constexpr, NS: tl.constexpr,
          SUBS: tl.constexpr):
    """Until the slot's SUBS counters at wait_ptr hold TARGET counts between them (counter
    j: the programs whose index is j modulo SUBS): the first POLL threads poll, thread t
    counter t modulo SUBS, with acquire loads; past LIMIT polls a thread gives up and adds
    one at err_ptr."""
    if POLL == 0:  # the interpreter (no inline assembly); portable, every thread
        for j in tl.static_range(SUBS):
            share = TARGET // SUBS + (j < TARGET % SUBS)
            seen = tl.atomic_add(wait_ptr + j * _STRIDE, 0, sem="acquire", scope="gpu")
            while seen < share:
                seen = tl.atomic_add(wait_ptr + j * _STRIDE, 0, sem="acquire", scope="gpu")
    else:
        tl.inline_asm_elementwise(
            f"""{{
            .reg .pred fw_skip, fw_more, fw_done, fw_late;
            .reg .u32 fw_tid, fw_sub, fw_want, fw_n;
            .reg .u64 fw_off, fw_at;
            mov.u32 $0, 0;
            mov.u32 fw_tid, %tid.x;
            setp.ge.u32 fw_skip, fw_tid, {POLL};
            @fw_skip bra FW_END;
            and.b32 fw_sub, fw_tid, {SUBS - 1};
            setp.lt.u32 fw_more, fw_sub, {TARGET % SUBS};
            selp.u32 fw_want, {TARGET // SUBS + 1}, {TARGET // SUBS}, fw_more;
            mul.wide.u32 fw_off, fw_sub, {_STRIDE * 4};
            add.s64 fw_at, $1, fw_off;
            mov.u32 fw_n, 0;
            FW_POLL:
            ld.acquire.gpu.global.u32 $0, [fw_at];
            setp.ge.u32 fw_done, $0, fw_want;
            @fw_done bra FW_END;
            add.u32 fw_n, fw_n, 1;
            setp.ge.u32 fw_late, fw_n, {LIMIT};
            @fw_late red.global.add.u32 [$2], 1;
            @fw_late bra FW_END;
            nanosleep.u32 {NS};
            bra FW_POLL;
            FW_END:
            }}""",
            "=r,l,l", [wait_ptr, err_ptr], dtype=tl.int32, is_pure=False, pack=1)
    # the pollers' acquire, then every thread of the program (the CTA barrier orders them)
    tl.debug_barrier()


@triton.jit
def _wait(wait_ptr, reset_ptr, err_ptr, first, WAIT_FLAG: tl.constexpr, RESET: tl.constexpr,
          TARGET: tl.constexpr, POLL: tl.constexpr, NS: tl.constexpr, SUBS: tl.constexpr):
    """The wait for the kernel before: its flag (WAIT_FLAG) or gdc_wait (not under the
    interpreter: POLL 0); then, with RESET, program ``first`` zeroes the slot the kernel
    before spun on (all of it has passed its wait)."""
    if WAIT_FLAG:
        _spin(wait_ptr, err_ptr, TARGET, POLL, NS, SUBS)
    elif POLL != 0:
        tl.extra.cuda.gdc_wait()
    if RESET:
        if first:
            tl.store(reset_ptr + tl.arange(0, SUBS) * _STRIDE, tl.zeros((SUBS,), tl.int32))


@triton.jit
def _arrive(count_ptr, index, ARRIVE: tl.constexpr, SUBS: tl.constexpr):
    """After the program's last store: every thread's stores, then one release count on
    the counter of the program's ``index`` modulo SUBS (SUBS counters: fewer programs
    wait on each other's atomics at one address)."""
    if ARRIVE:
        tl.debug_barrier()
        tl.atomic_add(count_ptr + (index % SUBS) * _STRIDE, 1, sem="release", scope="gpu")


@triton.jit
def row_gemv_flag_kernel(x_ptr, w_ptr, nw_ptr, r_ptr, out_ptr, wait_ptr, reset_ptr,
                         count_ptr, err_ptr, EPS: tl.constexpr, N: tl.constexpr,
                         K: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                         WAIT_FLAG: tl.constexpr, RESET: tl.constexpr,
                         ARRIVE: tl.constexpr, TARGET: tl.constexpr, POLL: tl.constexpr,
                         NS: tl.constexpr, SUBS: tl.constexpr = 1):
    """triton_kernels.row_gemv_kernel_gdc (not gated, fp16 rows): the first AHEAD columns
    of weights loaded, then the wait (flag or gdc_wait), the rest, the store, the count."""
    rows = _block_rows(tl.program_id(0), BLOCK_N, 0, 0)
    row_ok = rows < N
    if POLL != 0:  # the kernel after may start (not under the interpreter)
        tl.extra.cuda.gdc_launch_dependents()
    w_first, u_first = _first_tiles(w_ptr, rows, row_ok, N, K, 0, AHEAD)
    _wait(wait_ptr, reset_ptr, err_ptr, tl.program_id(0) == 0, WAIT_FLAG, RESET, TARGET,
          POLL, NS, SUBS)
    y, u, square_sum = _first_sums(x_ptr, nw_ptr, w_first, u_first, 0.0, K, HAS_NORM, 0,
                                   AHEAD)
    y_rest, up, squares_rest = _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, 0.0, N, K,
                                            BLOCK_N, BLOCK_K, HAS_NORM, 0, AHEAD, False)
    y = _finish(y + y_rest, u, up, square_sum + squares_rest, w_ptr, r_ptr, w_ptr, w_ptr,
                w_ptr, rows, row_ok, EPS, N, K, False, HAS_NORM, 0, HAS_RES, False,
                BLOCK_N, 0, 0)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)
    _arrive(count_ptr, tl.program_id(0), ARRIVE, SUBS)


@triton.jit
def row_loop_flag_kernel(x_ptr, w_ptr, nw_ptr, out_ptr, wait_ptr, reset_ptr, count_ptr,
                         err_ptr, EPS: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                         ACT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         AHEAD: tl.constexpr, TURNS: tl.constexpr, WAIT_FLAG: tl.constexpr,
                         RESET: tl.constexpr, ARRIVE: tl.constexpr, TARGET: tl.constexpr,
                         POLL: tl.constexpr, NS: tl.constexpr, SUBS: tl.constexpr = 1):
    """row_loop_triton.row_loop_kernel_gdc for gate/up (norm, gated activation, fp16 rows):
    the first block's AHEAD columns, then the wait, the loop, then the count."""
    programs = tl.num_programs(0)
    block = tl.program_id(0)
    rows = _block_rows(block, BLOCK_N, 0, 0)
    if POLL != 0:  # the kernel after may start (not under the interpreter)
        tl.extra.cuda.gdc_launch_dependents()
    w, u = _first_tiles(w_ptr, rows, rows < N, N, K, ACT, AHEAD)
    _wait(wait_ptr, reset_ptr, err_ptr, block == 0, WAIT_FLAG, RESET, TARGET, POLL, NS,
          SUBS)
    x, squares = _x_first(x_ptr, nw_ptr, 0.0, K, True, AHEAD)
    for _ in range(TURNS):
        row_ok = rows < N
        after = _block_rows(block + programs, BLOCK_N, 0, 0)
        w_next, u_next = _first_tiles(w_ptr, after, after < N, N, K, ACT, AHEAD)
        y, u_sums = _dot_first(w, u, x, ACT)
        y_rest, up, squares_rest = _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, 0.0, N,
                                                K, BLOCK_N, BLOCK_K, True, ACT, AHEAD,
                                                False)
        y = _finish(y + y_rest, u_sums, up, squares + squares_rest, w_ptr, w_ptr, w_ptr,
                    w_ptr, w_ptr, rows, row_ok, EPS, N, K, False, True, ACT, False, False,
                    BLOCK_N, 0, 0)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)
        block += programs
        rows, w, u = after, w_next, u_next
    _arrive(count_ptr, tl.program_id(0), ARRIVE, SUBS)


@triton.jit
def attention_flag_kernel(q_ptr, pk_ptr, nk_ptr, pv_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr,
                          acc_ptr, counts_ptr, out_ptr, wait_ptr, reset_ptr, count_ptr,
                          err_ptr, sq_h, spk_h, spk_s, snk_h, spv_h, spv_s, snv_h, sm,
                          SCALE: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                          G: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                          BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                          JOIN_G: tl.constexpr, BLOCK_J: tl.constexpr,
                          WAIT_FLAG: tl.constexpr, RESET: tl.constexpr,
                          ARRIVE: tl.constexpr, TARGET: tl.constexpr, POLL: tl.constexpr,
                          NS: tl.constexpr, SUBS: tl.constexpr = 1):
    """decode_attention.attention_join_kernel_gdc (fp16, the cache's past rows read before
    the wait): the joining program of each key/value head counts in after its store, so
    the kernel after waits for a count of the key/value heads."""
    if POLL != 0:  # the kernel after may start (not under the interpreter)
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    s = split * BLOCK_S + tl.arange(0, BLOCK_S)
    g_ok, d_ok, s_ok = g < G, d < D, s < S
    heads = kvh * G + g
    kv_ok = s_ok[:, None] & d_ok[None, :]
    k = tl.load(pk_ptr + kvh * spk_h + s[:, None] * spk_s + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(pv_ptr + kvh * spv_h + s[:, None] * spv_s + d[None, :], mask=kv_ok, other=0.0)
    _wait(wait_ptr, reset_ptr, err_ptr, (kvh == 0) & (split == 0), WAIT_FLAG, RESET, TARGET,
          POLL, NS, SUBS)
    q = tl.load(q_ptr + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)
    scores = tl.dot(q, tl.trans(k))
    added = tl.load(mask_ptr + s * sm, mask=s_ok, other=float("-inf")).to(tl.float32)
    scores = scores * SCALE + added[None, :]
    top = tl.maximum(tl.max(scores, axis=1), -1e30)  # a block of masked slots only: no NaN
    p = tl.exp(scores - top[:, None])
    total = tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v)
    part = heads * SPLITS + split
    tl.store(m_ptr + part, top, mask=g_ok)
    tl.store(l_ptr + part, total, mask=g_ok)
    tl.store(acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=g_ok[:, None])
    tl.debug_barrier()
    seen = tl.atomic_add(counts_ptr + kvh, 1, sem="acq_rel", scope="gpu")
    if seen == SPLITS - 1:
        _join_heads(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, out_ptr, kvh,
                    sq_h, snk_h, snv_h, sm, SCALE, S, D, G, SPLITS, JOIN_G, BLOCK_J,
                    BLOCK_D)
        tl.store(counts_ptr + kvh, 0)
        _arrive(count_ptr, kvh, ARRIVE, SUBS)
