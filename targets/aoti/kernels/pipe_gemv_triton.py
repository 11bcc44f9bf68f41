"""A row gemv whose weights stream through shared memory: the column loop after the
columns a program holds ahead of its wait is a ``tl.range`` with ``num_stages``, so Triton's
software pipeliner turns its weight loads into cp.async copies STAGES - 1 tiles ahead of
the sums (registers hold one tile at a time, shared memory the ones in flight).

triton_kernels.py's one-block kernel holds a program's first AHEAD columns in registers and
then loads the rest a tile at a time, unrolled: after the wait a program has few bytes in
flight, which is slow for rows much longer than what it holds ahead (a ~1.1B's down,
5,632 columns). Here the same first columns go ahead in registers, the pipeline's first
copies go out right after the wait (they read x, which the kernel before wrote), and the
held columns are summed at the end. gemv_config picks it (a STAGES field) for dependent
launches of such rows; ``launch_row_gemv`` starts it. With TURNS > 1 a program takes TURNS
blocks of rows (``pid``, ``pid + programs``, ...) as one loop of tiles, so the pipeline
runs on across them; a block's sums are finished and stored at its last tile.

Folds: the RMSNorm before (its sum of squares read from x once, after the wait), rotary
rows, the residual (row_parts._finish, as the other row kernels); no gate, bias or int8
scales. A configuration: (BLOCK_N, BLOCK_K, warps, AHEAD, STAGES, TURNS), AHEAD a multiple
of BLOCK_K below K.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.row_parts import _block_rows, _finish, _first_tiles, _x_first


@triton.jit
def _squares(x_ptr, START: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """x's sum of squares over the columns from START on (the norm's scale)."""
    total = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in tl.static_range(START, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        total += x * x
    return tl.sum(total, axis=0)


@triton.jit
def _pipe_gemv(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS: tl.constexpr,
               OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, AHEAD: tl.constexpr, STAGES: tl.constexpr,
               TURNS: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
               ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    programs = tl.num_programs(0)
    pid = tl.program_id(0)
    rows = _block_rows(pid, BLOCK_N, ROT_ROWS, HEAD_D)
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    # the first block's first AHEAD columns in registers, then the wait
    w_first, _ = _first_tiles(w_ptr, rows, rows < N, N, K, 0, AHEAD)
    if GDC and W_AHEAD:
        tl.extra.cuda.gdc_wait()
    tiles: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = zeros
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    # every tile of every turn but the first block's AHEAD columns, STAGES - 1 in flight;
    # the pipeline's first copies go right after the wait, before any sum
    for t in tl.range(AHEAD // BLOCK_K, TURNS * tiles, num_stages=STAGES):
        at = _block_rows(pid + (t // tiles) * programs, BLOCK_N, ROT_ROWS, HEAD_D)
        cols = (t % tiles) * BLOCK_K + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_NORM:
            x = x * (tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + OFFSET)
        w = tl.load(w_ptr + at[:, None] * K + cols[None, :],
                    mask=(at < N)[:, None] & col_ok[None, :], other=0.0,
                    eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        if t % tiles == tiles - 1:  # the block's last tile: its epilogue and store
            y = tl.sum(acc, axis=1)
            if t < tiles:  # the first block: the columns held ahead; the norm's squares
                x_first, squares = _x_first(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, AHEAD)
                y += tl.sum(w_first.to(tl.float32) * x_first[None, :], axis=1)
                if HAS_NORM:
                    square_sum = zeros + squares + _squares(x_ptr, AHEAD, K, BLOCK_K)
            y = _finish(y, zeros, acc, square_sum, w_ptr, r_ptr, w_ptr, cos_ptr, sin_ptr,
                        at, at < N, EPS, N, K, False, HAS_NORM, 0, HAS_RES, False, BLOCK_N,
                        ROT_ROWS, HEAD_D)
            tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=at < N)
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)


@triton.jit
def pipe_gemv_kernel(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                     EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                     K: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                     STAGES: tl.constexpr, TURNS: tl.constexpr, ROT_ROWS: tl.constexpr = 0,
                     HEAD_D: tl.constexpr = 0):
    """reference.row_gemv (no bias, gate or scales), started as a plain launch."""
    _pipe_gemv(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET, N, K,
               HAS_NORM, HAS_RES, BLOCK_N, BLOCK_K, AHEAD, STAGES, TURNS, False, False,
               ROT_ROWS, HEAD_D)


@triton.jit
def pipe_gemv_kernel_gdc(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                         EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                         K: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         AHEAD: tl.constexpr, STAGES: tl.constexpr, TURNS: tl.constexpr,
                         W_AHEAD: tl.constexpr, ROT_ROWS: tl.constexpr = 0,
                         HEAD_D: tl.constexpr = 0):
    """The same as a programmatic dependent launch: the first block's AHEAD columns of
    weights loaded before the wait (W_AHEAD), the pipeline's copies after it."""
    _pipe_gemv(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET, N, K,
               HAS_NORM, HAS_RES, BLOCK_N, BLOCK_K, AHEAD, STAGES, TURNS, True, W_AHEAD,
               ROT_ROWS, HEAD_D)


declare_writes(pipe_gemv_kernel_gdc, "out_ptr")


def check_config(config: tuple, cols: int) -> None:
    """A configuration the kernel computes right: ValueError otherwise."""
    block_n, block_k, warps, ahead, stages, turns = config
    if ahead % block_k or not 0 < ahead < cols or min(block_n, warps, stages, turns) < 1:
        raise ValueError(f"pipe config {config}: AHEAD a positive multiple of BLOCK_K "
                         f"below {cols} columns, the rest at least 1")


def launch_pipe_gemv(x, weight, norm_weight, residual, config: tuple, pdl: bool = False,
                     eps: float = 1e-5, offset: float = 0.0, rotary_cos=None,
                     rotary_sin=None, rotary_rows: int = 0,
                     head_dim: int = 0) -> torch.Tensor:
    """reference.row_gemv(x, weight, None, norm_weight, residual, eps, offset, 0, None,
    rotary_cos, rotary_sin, rotary_rows, head_dim) through the pipelined loop."""
    rows, cols = weight.shape
    check_config(config, cols)
    block_n, block_k, warps, ahead, stages, turns = config
    if rotary_rows and rotary_rows % block_n:
        raise ValueError(f"BLOCK_N {block_n} must divide the {rotary_rows} rotary rows")
    out = torch.empty((*x.shape[:-1], rows), dtype=x.dtype, device=x.device)
    grid = triton.cdiv(triton.cdiv(rows, block_n), turns)
    launch, gdc = launcher(pipe_gemv_kernel, pipe_gemv_kernel_gdc, x.device, pdl)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((grid,))(
        x.reshape(cols), weight.contiguous(),
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(rows).contiguous(),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=rows, K=cols, HAS_NORM=norm_weight is not None,
        HAS_RES=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead,
        STAGES=stages, TURNS=turns, num_warps=warps,
        ROT_ROWS=rotary_rows, HEAD_D=head_dim, **weights_first)
    return out
