"""reference.row_gemv as a row loop: a grid of few programs, each taking TURNS blocks of
rows in a strided loop (block ``pid``, ``pid + programs``, ...), the next block's first
AHEAD columns of weights loaded before the current block is summed.

The one-block-a-program kernel (triton_kernels.py) keeps a program's weights in flight
only from its start to its sums; a grid of several waves drains and ramps between them,
and its last wave leaves SMs idle. Here a grid that fits the GPU at once streams each
program's blocks back to back: while a block is summed, the next one's bytes are on
their way. x (times the norm's weight) over the first AHEAD columns is read once a
program, not once a block. The same folds, and the same plain and ``_gdc`` forms
(dependent_launch.py): the first block's weights before the wait, all else after it.
launch_row_gemv starts it when a config's TURNS is set; gemv_config sets it for a gated
product's dependent launch (row_loop_config).
"""

from __future__ import annotations

import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes
from targets.aoti.kernels.row_parts import (_block_rows, _column_sums, _dot_first, _finish,
                                            _first_tiles, _x_first)


@triton.jit
def _row_loop(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr,
              EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
              HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, AHEAD: tl.constexpr, TURNS: tl.constexpr,
              GDC: tl.constexpr, W_AHEAD: tl.constexpr, ROT_ROWS: tl.constexpr,
              HEAD_D: tl.constexpr):
    programs = tl.num_programs(0)
    block = tl.program_id(0)
    rows = _block_rows(block, BLOCK_N, ROT_ROWS, HEAD_D)
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    w, u = _first_tiles(w_ptr, rows, rows < N, N, K, ACT, AHEAD)
    if GDC and W_AHEAD:
        tl.extra.cuda.gdc_wait()
    x, squares = _x_first(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, AHEAD)
    for _ in range(TURNS):
        row_ok = rows < N
        after = _block_rows(block + programs, BLOCK_N, ROT_ROWS, HEAD_D)
        # the next block's first columns, in flight while this one is summed
        w_next, u_next = _first_tiles(w_ptr, after, after < N, N, K, ACT, AHEAD)
        y, u_sums = _dot_first(w, u, x, ACT)
        y_rest, up, squares_rest = _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET,
                                                N, K, BLOCK_N, BLOCK_K, HAS_NORM, ACT,
                                                AHEAD, False)
        y = _finish(y + y_rest, u_sums, up, squares + squares_rest, b_ptr, r_ptr, s_ptr,
                    cos_ptr, sin_ptr, rows, row_ok, EPS, N, K, HAS_BIAS, HAS_NORM, ACT,
                    HAS_RES, HAS_SCALE, BLOCK_N, ROT_ROWS, HEAD_D)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)
        block += programs
        rows, w, u = after, w_next, u_next


@triton.jit
def row_loop_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr,
                    EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                    K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                    ACT: tl.constexpr, HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                    TURNS: tl.constexpr, ROT_ROWS: tl.constexpr = 0,
                    HEAD_D: tl.constexpr = 0):
    """reference.row_gemv, TURNS blocks a program, started as a plain launch."""
    _row_loop(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr, EPS,
              OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, HAS_SCALE, BLOCK_N, BLOCK_K,
              AHEAD, TURNS, False, False, ROT_ROWS, HEAD_D)


@triton.jit
def row_loop_kernel_gdc(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr,
                        out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                        K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                        ACT: tl.constexpr, HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                        TURNS: tl.constexpr, W_AHEAD: tl.constexpr,
                        ROT_ROWS: tl.constexpr = 0, HEAD_D: tl.constexpr = 0):
    """The same as a programmatic dependent launch: the first block's AHEAD columns of
    weights loaded before the wait (W_AHEAD: a weight no kernel of the step writes)."""
    _row_loop(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr, EPS,
              OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, HAS_SCALE, BLOCK_N, BLOCK_K,
              AHEAD, TURNS, True, W_AHEAD, ROT_ROWS, HEAD_D)


declare_writes(row_loop_kernel_gdc, "out_ptr")

KERNELS = (row_loop_kernel, row_loop_kernel_gdc)

# row loop programs a multiprocessor holds at once (2 gated rows ahead, 4 warps: about
# 80 registers a thread)
_LOOP_PER_SM = 5


def row_loop_config(rows: int, cols: int, multiprocessors: int) -> tuple:
    """A gated product's row loop (gemv_config's choice): two rows a block, each
    block's whole rows of gate and up loaded while the block before is summed, and as
    many turns as make the grid fit the GPU at once. A grid of one wave streams: in the
    decode chain, gate/up took 11.0 us a call against 14.0 as one block a program, and
    a grid one wave too large (four turns, 704 programs) lost 5%."""
    whole = triton.next_power_of_2(cols)
    turns = triton.cdiv(triton.cdiv(rows, 2), _LOOP_PER_SM * multiprocessors)
    return 2, min(512, whole), 4, whole, False, turns
