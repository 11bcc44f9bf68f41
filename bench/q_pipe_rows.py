"""A row gemv over int8 (or 16-bit) rows whose weights stream through shared memory: the
column loop is a ``tl.range`` with ``num_stages``, so Triton's software pipeliner turns
its weight loads into cp.async copies STAGES - 1 tiles ahead of the sums (registers hold
one tile, shared memory the ones in flight). pipe_gemv_triton.py's kernel for 16-bit
rows with no gate or scales, widened to what int8 rows need: a scale a row, the gated
product (gate rows and the up rows N below them, both streamed), the norm before.

Quantized rows hold few bytes a program in registers (int8 gate/up none ahead of its
wait, 8 KB a program in all), so a product of them keeps fewer bytes in flight than an
fp16 one; with TURNS > 1 a program takes TURNS blocks of rows (``pid``, ``pid +
programs``, ...) as one loop of tiles and the copies run on across them.

A configuration: (BLOCK_N, BLOCK_K, warps, AHEAD, STAGES, TURNS[, X_ONCE]). AHEAD: the
first block's first columns held in registers before the wait (a multiple of BLOCK_K
below K, or 0), or its whole row (K's next power of two, with TURNS > 1: summed after
the loop, so the pipeline's first copies go out right after the wait). x (and the norm's
weight) is copied with each tile; X_ONCE (one tile a row): read once before the loop
instead, but its move into the tile's layout (a barrier) then waits for it, and the
first copies go out only after that. Folds: RMSNorm, int8 scales, SiLU x up, rotary rows,
the residual (row_parts._finish, as the library's row kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import launcher
from targets.aoti.kernels.pipe_gemv_triton import _squares
from targets.aoti.kernels.row_parts import (_block_rows, _dot_first, _finish, _first_tiles,
                                            _x_first)


@triton.jit
def _x_times_norm(x_ptr, nw_ptr, cols, col_ok, OFFSET: tl.constexpr,
                  HAS_NORM: tl.constexpr):
    """x over ``cols`` in fp32, times the norm's weight (the norm's scale comes last)."""
    x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if HAS_NORM:
        x = x * (tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + OFFSET)
    return x


@triton.jit
def _q_pipe_rows(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                 EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                 HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 AHEAD: tl.constexpr, STAGES: tl.constexpr, TURNS: tl.constexpr,
                 GDC: tl.constexpr, ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr,
                 X_ONCE: tl.constexpr):
    programs = tl.num_programs(0)
    pid = tl.program_id(0)
    rows = _block_rows(pid, BLOCK_N, ROT_ROWS, HEAD_D)
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if AHEAD > 0:  # no kernel of the step writes weights: held before the wait
        w_first, u_first = _first_tiles(w_ptr, rows, rows < N, N, K, ACT, AHEAD)
    if GDC:
        tl.extra.cuda.gdc_wait()
    tiles: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    # the loop's first tile: past the columns held ahead (the whole first block: AHEAD >= K)
    START: tl.constexpr = tiles if AHEAD >= K else AHEAD // BLOCK_K
    zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = zeros
    one = tl.arange(0, BLOCK_K)
    x_row = one.to(tl.float32)  # X_ONCE: x read once, here
    if X_ONCE:
        x_row = _x_times_norm(x_ptr, nw_ptr, one, one < K, OFFSET, HAS_NORM)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    # every tile of every turn but the first block's AHEAD columns, STAGES - 1 in flight
    for t in tl.range(START, TURNS * tiles, num_stages=STAGES):
        at = _block_rows(pid + (t // tiles) * programs, BLOCK_N, ROT_ROWS, HEAD_D)
        cols = (t % tiles) * BLOCK_K + one
        col_ok = cols < K
        if X_ONCE:
            x = x_row
        else:
            x = _x_times_norm(x_ptr, nw_ptr, cols, col_ok, OFFSET, HAS_NORM)
        tile = at[:, None] * K + cols[None, :]
        ok = (at < N)[:, None] & col_ok[None, :]
        w = tl.load(w_ptr + tile, mask=ok, other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        if ACT != 0:  # the up rows, N below the gate's
            w2 = tl.load(w_ptr + N * K + tile, mask=ok, other=0.0,
                         eviction_policy="evict_first")
            up += w2.to(tl.float32) * x[None, :]
        if t % tiles == tiles - 1:  # the block's last tile: its epilogue and store
            y = tl.sum(acc, axis=1)
            u = zeros
            if t // tiles == START // tiles:  # the loop's first block: the norm's squares
                if HAS_NORM:
                    square_sum = zeros + _squares(x_ptr, 0, K, BLOCK_K)
            if t < tiles and AHEAD > 0:  # the first block: the columns held ahead
                x_first, _ = _x_first(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, AHEAD)
                y += tl.sum(w_first.to(tl.float32) * x_first[None, :], axis=1)
                if ACT != 0:
                    u += tl.sum(u_first.to(tl.float32) * x_first[None, :], axis=1)
            y = _finish(y, u, up, square_sum, s_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, at,
                        at < N, EPS, N, K, False, HAS_NORM, ACT, HAS_RES, HAS_SCALE,
                        BLOCK_N, ROT_ROWS, HEAD_D)
            tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=at < N)
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if AHEAD >= K:  # the first block, held whole: summed last, the copies went out first
        x_first, _ = _x_first(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, AHEAD)
        y, u = _dot_first(w_first, u_first, x_first, ACT)
        y = _finish(y, u, up, square_sum, s_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, rows,
                    rows < N, EPS, N, K, False, HAS_NORM, ACT, HAS_RES, HAS_SCALE, BLOCK_N,
                    ROT_ROWS, HEAD_D)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def q_pipe_rows_kernel(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                       EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                       K: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                       HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                       STAGES: tl.constexpr, TURNS: tl.constexpr,
                       ROT_ROWS: tl.constexpr = 0, HEAD_D: tl.constexpr = 0,
                       X_ONCE: tl.constexpr = False):
    """reference.row_gemv (no bias) over int8 or 16-bit rows, as a plain launch."""
    _q_pipe_rows(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET,
                 N, K, HAS_NORM, ACT, HAS_RES, HAS_SCALE, BLOCK_N, BLOCK_K, AHEAD, STAGES,
                 TURNS, False, ROT_ROWS, HEAD_D, X_ONCE)


@triton.jit
def q_pipe_rows_kernel_gdc(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                           EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                           K: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                           HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           AHEAD: tl.constexpr, STAGES: tl.constexpr, TURNS: tl.constexpr,
                           ROT_ROWS: tl.constexpr = 0, HEAD_D: tl.constexpr = 0,
                           X_ONCE: tl.constexpr = False):
    """The same as a programmatic dependent launch: the first block's AHEAD columns of
    weights before the wait, the pipeline's copies after it."""
    _q_pipe_rows(x_ptr, w_ptr, s_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET,
                 N, K, HAS_NORM, ACT, HAS_RES, HAS_SCALE, BLOCK_N, BLOCK_K, AHEAD, STAGES,
                 TURNS, True, ROT_ROWS, HEAD_D, X_ONCE)


def check_rows_config(config: tuple, cols: int) -> None:
    """A configuration the kernel computes right: ValueError otherwise."""
    block_n, block_k, warps, ahead, stages, turns, *x_once = config
    tiles = triton.cdiv(cols, block_k)
    if x_once and x_once[0] and tiles > 1:
        raise ValueError(f"q-pipe config {config}: x read once needs one tile a row")
    whole = ahead == triton.next_power_of_2(cols)  # the first block held whole
    part = ahead % block_k == 0 and 0 <= ahead < cols and (not ahead or tiles > 1)
    if not (part or whole and turns > 1) or min(block_n, warps, stages, turns) < 1:
        raise ValueError(f"q-pipe config {config}: AHEAD a multiple of BLOCK_K below "
                         f"{cols} columns (0 with one tile a row), or the whole row "
                         f"({triton.next_power_of_2(cols)}) with TURNS > 1; the rest at "
                         f"least 1")


def launch_q_pipe_rows(x, weight, weight_scale, norm_weight, residual, act: int,
                       config: tuple, pdl: bool = False, eps: float = 1e-5,
                       offset: float = 0.0, rotary_cos=None, rotary_sin=None,
                       rotary_rows: int = 0, head_dim: int = 0) -> torch.Tensor:
    """reference.row_gemv(x, weight, None, norm_weight, residual, eps, offset, act,
    weight_scale, rotary_cos, rotary_sin, rotary_rows, head_dim) through the pipelined
    loop; ``weight``: int8 rows with ``weight_scale`` (one a row), or 16-bit rows."""
    rows, cols = weight.shape
    width = rows // 2 if act else rows
    check_rows_config(config, cols)
    block_n, block_k, warps, ahead, stages, turns, *x_once = config
    if rotary_rows and rotary_rows % block_n:
        raise ValueError(f"BLOCK_N {block_n} must divide the {rotary_rows} rotary rows")
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    grid = triton.cdiv(triton.cdiv(width, block_n), turns)
    launch, _ = launcher(q_pipe_rows_kernel, q_pipe_rows_kernel_gdc, x.device, pdl)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    launch((grid,))(
        x.reshape(cols), weight.contiguous(),
        dummy if weight_scale is None else weight_scale.reshape(-1),
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_NORM=norm_weight is not None,
        ACT=act, HAS_RES=residual is not None, HAS_SCALE=weight_scale is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, STAGES=stages, TURNS=turns,
        ROT_ROWS=rotary_rows, HEAD_D=head_dim, X_ONCE=bool(x_once and x_once[0]),
        num_warps=warps)
    return out
