"""A gated MLP (gate/up, then down with the residual) as one launch, with no program
waiting on another: down split along its K (the intermediate rows) and fused into the
gate/up row loop (row_loop_triton.py).

Each program takes TURNS blocks of BLOCK_N intermediate rows (block ``pid``,
``pid + programs``, ...). For each block it sums gate and up (the norm folded in, as
row_loop_triton does), rounds ``act(gate) * up`` to x's dtype (as the unfused pair
stores it), and multiplies those values into the same rows of down's transposed weight
``down_t`` ([I, N], a row of N contiguous), adding into an N-long partial in registers.
At its end it adds the partial into a global accumulator ``acc`` with atomics, counts
itself in on an int32 counter, and the last program to count in joins: out = acc +
residual in x's dtype, then acc and the counter back to zero, so one zeroed buffer
serves every layer and call (split_gemv_triton.py's join). Any grid size works.

The accumulator is either fp32 (atomic adds of fp32 partials: the sum's order, so its
last bits, vary run to run) or int64 fixed point (FIXED: each block's sum rounded to
a multiple of 2**-32 and added as integers: exact, so the result does not depend on the
order or on the grid, only on BLOCK_N). The ``_gdc`` form loads the first block's gate/up
columns ahead and its rows of down_t before its wait (W_AHEAD). int8 rows (HAS_SCALE):
gate/up's scale a row in the epilogue (row_parts._finish), down's scale a column of
down_t at the join.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.row_parts import (_block_rows, _column_sums, _dot_first, _finish,
                                            _first_tiles, _x_first)

# fixed point: 32 fraction bits, so exact for |sum| < 2**31 (fp16's range is 2**16;
# int8 rows: the sum before down's scale); a block's scaled sum is clamped below 2**63
# (the largest fp32 there) so that its conversion is defined; beyond that range the sum
# wraps, and a NaN or inf is lost
_FRACTION = tl.constexpr(4294967296.0)
_LIMIT = tl.constexpr(9223371487098961920.0)


@triton.jit
def _down_rows(d_ptr, rows, row_ok, cols, col_ok, N: tl.constexpr):
    """The block's rows of down_t, all N columns (masked past N)."""
    return tl.load(d_ptr + rows[:, None] * N + cols[None, :],
                   mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _add_block(partial, h, d, FIXED: tl.constexpr):
    """partial + the block's gated values times its rows of down_t (fixed point: the
    block's fp32 sum rounded to 2**-32 first, so partials add exactly)."""
    part = tl.sum(h[:, None] * d.to(tl.float32), axis=0)
    if FIXED:
        part = tl.minimum(tl.maximum(part * _FRACTION, -_LIMIT), _LIMIT)
        partial += _to_fixed(part)
    else:
        partial += part
    return partial


@triton.jit
def _to_fixed(scaled):
    """An fp32 already scaled by 2**32 as the nearest int64 (ties away from zero): the
    truncation and its remainder are exact (adding 0.5 in fp32 would round)."""
    whole = scaled.to(tl.int64)
    rest = scaled - whole.to(tl.float32)
    return whole + (rest >= 0.5).to(tl.int64) - (rest <= -0.5).to(tl.int64)


@triton.jit
def _join(acc_ptr, counts_ptr, r_ptr, ds_ptr, out_ptr, partial, cols, col_ok,
          N: tl.constexpr, HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
          FIXED: tl.constexpr):
    """The partial added into acc; the last program to count in stores acc (times
    down's scale a column, int8 rows) + residual and leaves acc and the counter at
    zero."""
    tl.atomic_add(acc_ptr + cols, partial, mask=col_ok, sem="relaxed", scope="gpu")
    # every thread's adds before the count: the release below then covers them
    tl.debug_barrier()
    seen = tl.atomic_add(counts_ptr, 1, sem="acq_rel", scope="gpu")
    if seen == tl.num_programs(0) - 1:
        # .cg: other programs' adds, in L2; read past this SM's L1
        total = tl.load(acc_ptr + cols, mask=col_ok, other=0, cache_modifier=".cg")
        if FIXED:
            total = total.to(tl.float32) * (1.0 / _FRACTION)
        if HAS_SCALE:
            total = total * tl.load(ds_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_RES:
            total += tl.load(r_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=col_ok)
        tl.store(acc_ptr + cols, tl.zeros_like(partial), mask=col_ok)
        tl.store(counts_ptr, 0)  # the next layer or call starts at zero


@triton.jit
def _gated_mlp(x_ptr, w_ptr, d_ptr, nw_ptr, r_ptr, s_ptr, ds_ptr, acc_ptr, counts_ptr,
               out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr, I: tl.constexpr,
               K: tl.constexpr, N: tl.constexpr, N_POW: tl.constexpr,
               HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
               HAS_SCALE: tl.constexpr, FIXED: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
               TURNS: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr):
    programs = tl.num_programs(0)
    block = tl.program_id(0)
    rows = _block_rows(block, BLOCK_N, 0, 0)
    cols = tl.arange(0, N_POW)
    col_ok = cols < N
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    w, u = _first_tiles(w_ptr, rows, rows < I, I, K, ACT, AHEAD)
    d = _down_rows(d_ptr, rows, rows < I, cols, col_ok, N)
    if GDC and W_AHEAD:
        tl.extra.cuda.gdc_wait()
    x, squares = _x_first(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, AHEAD)
    if FIXED:
        partial = tl.zeros((N_POW,), dtype=tl.int64)
    else:
        partial = tl.zeros((N_POW,), dtype=tl.float32)
    for _ in range(TURNS):
        row_ok = rows < I
        after = _block_rows(block + programs, BLOCK_N, 0, 0)
        # the next block's first columns and rows of down_t, in flight meanwhile
        w_next, u_next = _first_tiles(w_ptr, after, after < I, I, K, ACT, AHEAD)
        d_next = _down_rows(d_ptr, after, after < I, cols, col_ok, N)
        y, u_sums = _dot_first(w, u, x, ACT)
        y_rest, up, squares_rest = _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET,
                                                I, K, BLOCK_N, BLOCK_K, HAS_NORM, ACT,
                                                AHEAD, False)
        h = _finish(y + y_rest, u_sums, up, squares + squares_rest, x_ptr, x_ptr, s_ptr,
                    x_ptr, x_ptr, rows, row_ok, EPS, I, K, False, HAS_NORM, ACT, False,
                    HAS_SCALE, BLOCK_N, 0, 0)
        # rounded to x's dtype, as gate/up's own launch stores it for down
        h = tl.where(row_ok, h, 0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
        partial = _add_block(partial, h, d, FIXED)
        block += programs
        rows, w, u, d = after, w_next, u_next, d_next
    _join(acc_ptr, counts_ptr, r_ptr, ds_ptr, out_ptr, partial, cols, col_ok, N, HAS_RES,
          HAS_SCALE, FIXED)


@triton.jit
def gated_mlp_kernel(x_ptr, w_ptr, d_ptr, nw_ptr, r_ptr, s_ptr, ds_ptr, acc_ptr,
                     counts_ptr, out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                     I: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
                     N_POW: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                     HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr, FIXED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     AHEAD: tl.constexpr, TURNS: tl.constexpr):
    """gate/up and down (+ residual) as one launch, started as a plain launch."""
    _gated_mlp(x_ptr, w_ptr, d_ptr, nw_ptr, r_ptr, s_ptr, ds_ptr, acc_ptr, counts_ptr,
               out_ptr, EPS, OFFSET, I, K, N, N_POW, HAS_NORM, ACT, HAS_RES, HAS_SCALE,
               FIXED, BLOCK_N, BLOCK_K,
               AHEAD, TURNS, False, False)


@triton.jit
def gated_mlp_kernel_gdc(x_ptr, w_ptr, d_ptr, nw_ptr, r_ptr, s_ptr, ds_ptr, acc_ptr,
                         counts_ptr, out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                         I: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
                         N_POW: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                         HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                         FIXED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         AHEAD: tl.constexpr, TURNS: tl.constexpr, W_AHEAD: tl.constexpr):
    """The same as a programmatic dependent launch: the first block's AHEAD columns of
    gate/up and its rows of down_t loaded before the wait (W_AHEAD)."""
    _gated_mlp(x_ptr, w_ptr, d_ptr, nw_ptr, r_ptr, s_ptr, ds_ptr, acc_ptr, counts_ptr,
               out_ptr, EPS, OFFSET, I, K, N, N_POW, HAS_NORM, ACT, HAS_RES, HAS_SCALE,
               FIXED, BLOCK_N, BLOCK_K,
               AHEAD, TURNS, True, W_AHEAD)


# not acc_ptr nor counts_ptr: the kernel leaves them at zero (split_gemv_triton's join)
declare_writes(gated_mlp_kernel_gdc, "out_ptr")

KERNELS = (gated_mlp_kernel, gated_mlp_kernel_gdc)

# programs a multiprocessor runs at once by default: two rows of gate/up ahead and two
# of down_t, the partial in registers, 8 warps (80 registers a thread at the ~1.1B's
# shape; 4 warps took 128 and spilled)
_PER_SM = 2


def mlp_config(inter: int, cols: int, out: int, sms: int, per_sm: int = _PER_SM,
               block_n: int = 2, warps: int = 8) -> tuple:
    """(BLOCK_N, BLOCK_K, num_warps, AHEAD, TURNS) for gate/up of ``inter`` gated rows
    over ``cols`` columns and down to ``out``: each block's whole rows of gate/up loaded
    ahead (up to 2,048 columns; the rest in a loop of 512), and as many turns as make
    the grid ``per_sm`` programs a multiprocessor, one wave: every program adds its
    partial of ``out`` sums once, so fewer programs, fewer atomics."""
    ahead = min(2048, triton.next_power_of_2(cols))
    turns = triton.cdiv(triton.cdiv(inter, block_n), per_sm * sms)
    return block_n, min(512, ahead), warps, ahead, turns


def mlp_accumulator(out: int, fixed: bool, device) -> tuple:
    """(acc, counts): the zeroed buffers launch_gated_mlp takes (int64 acc: the
    fixed-point form), left at zero by every launch."""
    acc = torch.zeros(out, dtype=torch.int64 if fixed else torch.float32, device=device)
    return acc, torch.zeros(1, dtype=torch.int32, device=device)


def launch_gated_mlp(x, gate_up, down_t, norm_weight, residual, eps, offset, act,
                     acc, counts, config=None, pdl=False, gate_up_scale=None,
                     down_scale=None) -> torch.Tensor:
    """``reference.row_gemv(reference.row_gemv(x, gate_up, None, norm_weight, None, eps,
    offset, act), down_t.t(), None, None, residual, 0.0, 0.0, 0)`` as one launch, up to
    the order of the sums. ``down_t``: down's weight transposed, [I, N] contiguous;
    ``acc``: N zeros, float32 (atomic adds) or int64 (fixed point: deterministic);
    ``counts``: int32 zeros, at least one; both left at zero. ``config``:
    (BLOCK_N, BLOCK_K, num_warps, AHEAD, TURNS), mlp_config's by default. int8 rows:
    ``gate_up_scale`` a row of gate_up [2I] and ``down_scale`` a row of down [N] (a
    column of down_t, applied at the join), both or neither."""
    cols = x.shape[-1]
    inter = gate_up.shape[0] // 2 if act else gate_up.shape[0]
    out_width = down_t.shape[1]
    if down_t.shape[0] != inter or gate_up.shape[1] != cols:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} and down_t "
                         f"{tuple(down_t.shape)} do not fit x's {cols} columns")
    _check_buffers(acc, counts, out_width)
    if (gate_up_scale is None) != (down_scale is None):
        raise ValueError("int8 rows take both scales (gate_up_scale, down_scale) or none")
    if config is None:
        sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
               if x.device.type == "cuda" else 1)
        config = mlp_config(inter, cols, out_width, sms)
    block_n, block_k, warps, ahead, turns = config
    programs = triton.cdiv(triton.cdiv(inter, block_n), turns)
    out = torch.empty((*x.shape[:-1], out_width), dtype=x.dtype, device=x.device)
    launch, gdc = launcher(gated_mlp_kernel, gated_mlp_kernel_gdc, x.device, pdl)
    dummy = gate_up  # an unused pointer argument (its branch is compiled out)
    weights_first = dict(W_AHEAD=gate_up.is_contiguous() and down_t.is_contiguous()
                         ) if gdc else {}
    launch((programs,))(
        x.reshape(cols).contiguous(), gate_up.contiguous(), down_t.contiguous(),
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(out_width).contiguous(),
        dummy if gate_up_scale is None else gate_up_scale.reshape(-1),
        dummy if down_scale is None else down_scale.reshape(-1), acc, counts, out, EPS=eps, OFFSET=offset, I=inter, K=cols, N=out_width,
        N_POW=triton.next_power_of_2(out_width), HAS_NORM=norm_weight is not None,
        ACT=act, HAS_RES=residual is not None, HAS_SCALE=gate_up_scale is not None,
        FIXED=acc.dtype == torch.int64,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, TURNS=turns, num_warps=warps,
        **weights_first)
    return out


def _check_buffers(acc, counts, out_width: int) -> None:
    if (acc is None or acc.dtype not in (torch.float32, torch.int64)
            or acc.numel() < out_width):
        got = "none" if acc is None else f"{acc.numel()} {acc.dtype}"
        raise ValueError(f"acc: {out_width} float32 or int64 zeros needed "
                         f"(mlp_accumulator), got {got}")
    if counts is None or counts.dtype != torch.int32 or counts.numel() < 1:
        got = "none" if counts is None else f"{counts.numel()} {counts.dtype}"
        raise ValueError(f"counts: 1 int32 zero needed (mlp_accumulator), got {got}")
