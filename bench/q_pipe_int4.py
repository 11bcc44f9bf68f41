"""A row gemv over int4 rows (int4_rows.py's format) whose packed bytes stream through
shared memory: the group loop is a ``tl.range`` with ``num_stages``, so Triton's software
pipeliner turns its word and (scale, offset) loads into cp.async copies STAGES - 1 steps
ahead of the sums. int4_triton.py's kernel holds a program's first two steps of bytes in
registers and loads the rest two steps on; its rows are short (1 KB at 2,048 columns), so
a program has its whole row in flight and then nothing: with TURNS > 1 a program here
takes TURNS blocks of rows (``pid``, ``pid + programs``, ...) as one loop of steps and
the copies run on across them, in shared memory rather than in registers.

A configuration: (BLOCK_N, BLOCK_G, warps, HELD, STAGES, TURNS, SPLIT_X): BLOCK_N rows,
BLOCK_G groups a step (int4_triton.int4_config's two), HELD what the first block holds
in registers before the wait: nothing (0), its first step (1), its whole row (2, with
TURNS > 1: summed after the loop, so the pipeline's copies go out right after the
wait), SPLIT_X int4_triton's choice of
dot. Folds: RMSNorm, SiLU x up (the up rows N below the gate's, both streamed), rotary
rows, the residual (row_parts._finish, as the library's kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import launcher
from targets.aoti.kernels.int4_triton import (_joined_dot, _packed_tile, _scale_pairs,
                                              _split_x_dot, _x_tile)
from targets.aoti.kernels.pipe_gemv_triton import _squares
from targets.aoti.kernels.row_parts import _block_rows, _finish


@triton.jit
def _step_sums(words, pairs, x_ptr, nw_ptr, first, OFFSET: tl.constexpr, K: tl.constexpr,
               GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
               HAS_NORM: tl.constexpr, SPLIT_X: tl.constexpr):
    """Each row's scaled group sums over BLOCK_G groups from group ``first``, [BLOCK_N,
    BLOCK_G]: ``words`` their packed bytes, ``pairs`` their (scale, offset) pairs."""
    x_low, x_high, nw_low, nw_high = _x_tile(x_ptr, nw_ptr, first, K, GROUP, BLOCK_G,
                                             HAS_NORM)
    x_low = x_low.to(tl.float32)
    x_high = x_high.to(tl.float32)
    if HAS_NORM:  # the norm's scale is one number: applied to the sums at the end
        x_low = x_low * (nw_low.to(tl.float32) + OFFSET)
        x_high = x_high * (nw_high.to(tl.float32) + OFFSET)
    x_sum = tl.sum(x_low + x_high, axis=1)
    scale, offset = tl.split(pairs.to(tl.float32))
    if SPLIT_X:
        dot = _split_x_dot(words, x_low, x_high, BLOCK_G, GROUP)
    else:
        dot = _joined_dot(words, x_low, x_high, BLOCK_N, BLOCK_G, GROUP)
    return dot * (scale * 16777216.0) + offset * x_sum[None, :]  # nibbles came x 2^-24


@triton.jit
def _q_pipe_int4(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                 EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 GROUP: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                 HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                 HELD: tl.constexpr, STAGES: tl.constexpr, TURNS: tl.constexpr,
                 GDC: tl.constexpr, ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr,
                 SPLIT_X: tl.constexpr, ROW_G: tl.constexpr):
    programs = tl.num_programs(0)
    pid = tl.program_id(0)
    rows = _block_rows(pid, BLOCK_N, ROT_ROWS, HEAD_D)
    up_ptr = w_ptr + N * (K // 2)  # a gated product's up rows: N rows below the gate's
    up_s_ptr = s_ptr + N * (K // GROUP) * 2
    if GDC:  # the next kernel may start at once
        tl.extra.cuda.gdc_launch_dependents()
    # held before the wait (no kernel of the step writes weights): the first block's
    # first step (HELD 1) or its whole row (HELD 2: HELD_G groups, summed after the loop)
    HELD_G: tl.constexpr = BLOCK_G if HELD == 1 else ROW_G
    if HELD:
        held = _packed_tile(w_ptr, rows, rows < N, 0, K, GROUP, HELD_G)
        held_pairs = _scale_pairs(s_ptr, rows, rows < N, 0, K, GROUP, HELD_G)
        if ACT != 0:
            held_up = _packed_tile(up_ptr, rows, rows < N, 0, K, GROUP, HELD_G)
            held_up_pairs = _scale_pairs(up_s_ptr, rows, rows < N, 0, K, GROUP, HELD_G)
    if GDC:
        tl.extra.cuda.gdc_wait()
    steps: tl.constexpr = (K // GROUP + BLOCK_G - 1) // BLOCK_G
    START: tl.constexpr = steps if HELD == 2 else HELD  # the loop's first step
    zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = zeros
    acc = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    # every step of every turn but the first block's HELD one, STAGES - 1 in flight
    for t in tl.range(START, TURNS * steps, num_stages=STAGES):
        at = _block_rows(pid + (t // steps) * programs, BLOCK_N, ROT_ROWS, HEAD_D)
        first = (t % steps) * BLOCK_G
        words = _packed_tile(w_ptr, at, at < N, first, K, GROUP, BLOCK_G)
        pairs = _scale_pairs(s_ptr, at, at < N, first, K, GROUP, BLOCK_G)
        acc += _step_sums(words, pairs, x_ptr, nw_ptr, first, OFFSET, K, GROUP, BLOCK_N,
                          BLOCK_G, HAS_NORM, SPLIT_X)
        if ACT != 0:
            up_words = _packed_tile(up_ptr, at, at < N, first, K, GROUP, BLOCK_G)
            up_pairs = _scale_pairs(up_s_ptr, at, at < N, first, K, GROUP, BLOCK_G)
            up += _step_sums(up_words, up_pairs, x_ptr, nw_ptr, first, OFFSET, K, GROUP,
                             BLOCK_N, BLOCK_G, HAS_NORM, SPLIT_X)
        if t % steps == steps - 1:  # the block's last step: its epilogue and store
            if t // steps == START // steps:  # the loop's first block: the norm's squares
                if HAS_NORM:
                    square_sum = zeros + _squares(x_ptr, 0, K, GROUP * BLOCK_G)
            if t < steps and HELD == 1:  # the first block: the step held ahead
                acc += _step_sums(held, held_pairs, x_ptr, nw_ptr, 0, OFFSET, K, GROUP,
                                  BLOCK_N, BLOCK_G, HAS_NORM, SPLIT_X)
                if ACT != 0:
                    up += _step_sums(held_up, held_up_pairs, x_ptr, nw_ptr, 0, OFFSET, K,
                                     GROUP, BLOCK_N, BLOCK_G, HAS_NORM, SPLIT_X)
            y = _finish(tl.sum(acc, axis=1), zeros, up, square_sum, r_ptr, r_ptr, s_ptr,
                        cos_ptr, sin_ptr, at, at < N, EPS, N, K, False, HAS_NORM, ACT,
                        HAS_RES, False, BLOCK_N, ROT_ROWS, HEAD_D)
            tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=at < N)
            acc = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
            up = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    if HELD == 2:  # the first block, held whole: summed last, the copies went out first
        first = _step_sums(held, held_pairs, x_ptr, nw_ptr, 0, OFFSET, K, GROUP, BLOCK_N,
                           HELD_G, HAS_NORM, SPLIT_X)
        first_up = first
        if ACT != 0:
            first_up = _step_sums(held_up, held_up_pairs, x_ptr, nw_ptr, 0, OFFSET, K, GROUP,
                                  BLOCK_N, HELD_G, HAS_NORM, SPLIT_X)
        y = _finish(tl.sum(first, axis=1), zeros, first_up, square_sum, r_ptr, r_ptr, s_ptr,
                    cos_ptr, sin_ptr, rows, rows < N, EPS, N, K, False, HAS_NORM, ACT,
                    HAS_RES, False, BLOCK_N, ROT_ROWS, HEAD_D)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def q_pipe_int4_kernel(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                       EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                       K: tl.constexpr, GROUP: tl.constexpr, HAS_NORM: tl.constexpr,
                       ACT: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_G: tl.constexpr, HELD: tl.constexpr, STAGES: tl.constexpr,
                       TURNS: tl.constexpr, ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr,
                       SPLIT_X: tl.constexpr, ROW_G: tl.constexpr):
    """reference.row_gemv (no bias) over int4 rows, as a plain launch."""
    _q_pipe_int4(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET,
                 N, K, GROUP, HAS_NORM, ACT, HAS_RES, BLOCK_N, BLOCK_G, HELD, STAGES, TURNS,
                 False, ROT_ROWS, HEAD_D, SPLIT_X, ROW_G)


@triton.jit
def q_pipe_int4_kernel_gdc(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                           EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                           K: tl.constexpr, GROUP: tl.constexpr, HAS_NORM: tl.constexpr,
                           ACT: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_G: tl.constexpr, HELD: tl.constexpr, STAGES: tl.constexpr,
                           TURNS: tl.constexpr, ROT_ROWS: tl.constexpr,
                           HEAD_D: tl.constexpr, SPLIT_X: tl.constexpr,
                           ROW_G: tl.constexpr):
    """The same as a programmatic dependent launch (HELD: the first step's bytes before
    the wait; the pipeline's copies after it)."""
    _q_pipe_int4(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET,
                 N, K, GROUP, HAS_NORM, ACT, HAS_RES, BLOCK_N, BLOCK_G, HELD, STAGES, TURNS,
                 True, ROT_ROWS, HEAD_D, SPLIT_X, ROW_G)


def check_int4_config(config: tuple, groups: int) -> None:
    """A configuration the kernel computes right over rows of ``groups`` groups:
    ValueError otherwise."""
    block_n, block_g, warps, held, stages, turns, _ = config
    steps = triton.cdiv(groups, block_g)
    if held not in (0, 1, 2) or min(block_n, block_g, warps, stages, turns) < 1 \
            or (held == 1 and steps * turns < 2) or (held == 2 and turns < 2) \
            or block_g & (block_g - 1):
        raise ValueError(f"q-pipe int4 config {config}: HELD 0, 1 (fewer than the steps) "
                         f"or 2 (TURNS > 1), BLOCK_G a power of two, the rest at least 1")


def launch_q_pipe_int4(x, packed, scales, norm_weight, residual, act: int, config: tuple,
                       pdl: bool = False, eps: float = 1e-5, offset: float = 0.0,
                       rotary_cos=None, rotary_sin=None, rotary_rows: int = 0,
                       head_dim: int = 0) -> torch.Tensor:
    """reference.row_gemv(x, packed, None, norm_weight, residual, eps, offset, act,
    scales, rotary_cos, rotary_sin, rotary_rows, head_dim) through the pipelined loop
    (``packed`` [rows, K/2], ``scales`` [rows, K/group, 2])."""
    cols = x.shape[-1]
    group = cols // scales.shape[1]
    width = packed.shape[0] // 2 if act else packed.shape[0]
    check_int4_config(config, scales.shape[1])
    block_n, block_g, warps, held, stages, turns, split_x = config
    if rotary_rows and rotary_rows % block_n:
        raise ValueError(f"BLOCK_N {block_n} must divide the {rotary_rows} rotary rows")
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    grid = triton.cdiv(triton.cdiv(width, block_n), turns)
    launch, _ = launcher(q_pipe_int4_kernel, q_pipe_int4_kernel_gdc, x.device, pdl)
    dummy = packed  # an unused pointer argument (its branch is compiled out)
    launch((grid,))(
        x.reshape(cols), packed.contiguous(), scales.contiguous(),
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, GROUP=group,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        BLOCK_N=block_n, BLOCK_G=block_g, HELD=held, STAGES=stages, TURNS=turns,
        ROT_ROWS=rotary_rows, HEAD_D=head_dim, SPLIT_X=bool(split_x),
        ROW_G=triton.next_power_of_2(scales.shape[1]), num_warps=warps)
    return out
