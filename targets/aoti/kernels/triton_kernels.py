"""The Triton kernels behind the decode-step ops (ops.py), and their launchers.

A batch-1 decode step streams the weights once: each kernel here reads its weight bytes
once, in 16-byte loads, with the small ops around a product (the RMSNorm before it, a
gated activation, a residual add after) done inside it instead of as small kernels of
their own. Shapes are compile-time constants (a decode step's are fixed), so the loops
have static bounds and the masks fold away where the block divides the size. So are the
float settings (eps, the norm's offset, the attention scale): AOTInductor passes a float
argument as fp64, which turned a norm's whole product into fp64 arithmetic
(docs/design-notes.md).

Each kernel has a plain form and a ``_gdc`` one, a programmatic dependent launch
(Hopper and later): it starts while the kernel before it drains, loads what no kernel of
the step writes (weights; the cache's past rows where a script gave the cache) first,
then waits (``gdc_wait``) before it reads anything the step computed, and so before it
writes, and lets the kernel after it start early. The timing scripts and tests start it
through Triton's launcher (``pdl=True``); a built library through AOTInductor's,
rewritten while the cuda target compiles (dependent_launch.py). The attention kernels:
decode_attention.py; the pieces a row kernel is made of: row_parts.py; a gated product's
dependent launch: row_loop_triton.py's row loop (gemv_config).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import (declare_writes, dependent_launch_here,
                                                   launcher, library_launches_dependent)
from targets.aoti.kernels.int8_words_triton import launch_int8_words, words_fit
from targets.aoti.kernels.row_loop_triton import KERNELS as ROW_LOOP_KERNELS
from targets.aoti.kernels.row_loop_triton import row_loop_config
# the pieces: int4_triton.py's and int8_triton.py's epilogue takes _finish and _program_rows
from targets.aoti.kernels.row_parts import (_column_sums, _finish, _first_columns,
                                            _program_rows)
from targets.aoti.kernels.pipe_gemv_triton import launch_pipe_gemv
from targets.aoti.kernels.split_gemv_triton import (launch_split_gemv, longer_than_ahead,
                                                    split_config)


@triton.jit
def _row_gemv(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr,
              EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
              HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, AHEAD: tl.constexpr, GDC: tl.constexpr,
              W_AHEAD: tl.constexpr, TILE_X: tl.constexpr, ROT_ROWS: tl.constexpr,
              HEAD_D: tl.constexpr):
    """(this program's rows, their values): rows of W this program reduces; a gated
    product also reads the rows N below them."""
    rows = _program_rows(BLOCK_N, ROT_ROWS, HEAD_D)
    row_ok = rows < N
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    y, u, square_sum = _first_columns(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET, N, K,
                                      BLOCK_N, HAS_NORM, ACT, AHEAD, GDC and W_AHEAD)
    y_rest, up, squares_rest = _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET,
                                            N, K, BLOCK_N, BLOCK_K, HAS_NORM, ACT,
                                            AHEAD, TILE_X)
    y = _finish(y + y_rest, u, up, square_sum + squares_rest, b_ptr, r_ptr, s_ptr, cos_ptr,
                sin_ptr, rows, row_ok, EPS, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES,
                HAS_SCALE, BLOCK_N, ROT_ROWS, HEAD_D)
    return rows, y


@triton.jit
def row_gemv_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr,
                    EPS: tl.constexpr, OFFSET: tl.constexpr,
                    N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                    HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                    HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    AHEAD: tl.constexpr, TILE_X: tl.constexpr = False,
                    ROT_ROWS: tl.constexpr = 0, HEAD_D: tl.constexpr = 0):
    """reference.row_gemv, started as a plain launch."""
    rows, y = _row_gemv(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, EPS,
                        OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, HAS_SCALE, BLOCK_N,
                        BLOCK_K, AHEAD, False, False, TILE_X, ROT_ROWS, HEAD_D)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def row_gemv_kernel_gdc(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr,
                        out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                        N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                        HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, AHEAD: tl.constexpr, W_AHEAD: tl.constexpr,
                        TILE_X: tl.constexpr = False, ROT_ROWS: tl.constexpr = 0,
                        HEAD_D: tl.constexpr = 0):
    """reference.row_gemv as a programmatic dependent launch (Hopper and later): its first
    AHEAD columns of weights loaded before it waits for the kernel before (W_AHEAD: the
    weight is one no kernel of the step writes)."""
    rows, y = _row_gemv(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, EPS,
                        OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, HAS_SCALE, BLOCK_N,
                        BLOCK_K, AHEAD, True, W_AHEAD, TILE_X, ROT_ROWS, HEAD_D)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


declare_writes(row_gemv_kernel_gdc, "out_ptr")


# weight elements a thread holds while it waits for the kernel before (32 registers)
_AHEAD_PER_THREAD = 64
# a pipelined product's copies: 3 and 4 stages timed alike, 6 slower
PIPE_STAGES = 4


def gemv_config(rows: int, cols: int, gated: bool, dependent: bool = False,
                weight_bytes: int = 2, multiprocessors: int = 0,
                splittable: bool = False, streamable: bool = False,
                x_qblock: int = 0) -> tuple:
    """(BLOCK_N, BLOCK_K, num_warps, AHEAD[, TILE_X, TURNS[, SPLIT[, STAGES]]]): enough
    programs to keep every SM's loads in flight (several per SM), 16-byte loads along K
    (int8 rows: 1024 columns a tile, and a gated product's pairs of rows four a program);
    a ``dependent`` launch of a product that is not gated loads as many of a program's
    first columns ahead of its wait as fit in registers, a plain one none (AHEAD 0: the
    loop alone).
    A dependent gated product of 16-bit rows of at most 2,048 columns on a GPU of
    ``multiprocessors``: the row loop (row_loop_triton.row_loop_config); a dependent small
    product of 16-bit rows that is not gated: 4 warps a program, not 8. A dependent
    launch of int8 rows longer than a program holds ahead, ``splittable`` (counters
    given, no norm, gate or rotary rows): split along K (split_gemv_triton.split_config).
    A dependent launch of 16-bit rows more than twice as long as a program holds ahead,
    ``streamable`` (no norm, gate, bias or rotary rows): the rest of each row streams
    through shared memory, STAGES - 1 tiles in flight (pipe_gemv_triton.py). int8 rows
    against x's int8 codes (``x_qblock``): x_codes_config's.
    """
    int8 = weight_bytes == 1
    if int8 and x_qblock:
        return x_codes_config(cols, gated, dependent)
    if dependent and splittable and int8 and longer_than_ahead(cols):
        block_n, block_k, warps, ahead, split = split_config(cols)
        return block_n, block_k, warps, ahead, False, 0, split
    if dependent and gated and weight_bytes == 2 and cols <= 2048 and multiprocessors:
        return row_loop_config(rows, cols, multiprocessors)
    block_k = min(1024 if int8 else 256 if rows >= 4096 else 512,
                  triton.next_power_of_2(cols))
    if rows <= 2048 and cols <= 2048:  # a small product: more, smaller programs
        # dependent 16-bit rows: 4 warps (the ~1.1B's o beside gate/up's row loop in the
        # decode chain: 2.8 us a call against 3.4, the chain 2% faster); int8 not timed
        block_n, warps = 2, 4 if dependent and not gated and weight_bytes == 2 else 8
    elif int8 and gated:  # int8_words_triton's kernel: 4 rows ran faster than 2
        block_n, warps = 4, 4
    else:
        block_n, warps = 8, 4
        while block_n > 1 and rows // block_n < 512:
            block_n //= 2
    # a gated product loads nothing ahead: two rows' columns held ahead in registers
    # starve its loop of them, and it ran slower than the plain loop
    ahead = ahead_columns(block_n, cols, gated, warps) if dependent and not gated else 0
    if dependent and streamable and weight_bytes == 2 and cols > 2 * ahead:
        # the ~1.1B's down (3,584 columns after the 2,048 held): its own time stays, the
        # kernel after it starts sooner
        return block_n, block_k, warps, ahead, False, 0, 0, PIPE_STAGES
    return block_n, block_k, warps, ahead


def x_codes_config(cols: int, gated: bool, dependent: bool) -> tuple:
    """int8 rows against x's int8 codes (int8_dot4_triton.py): 8 rows a program (x's
    quantization, each program's own work, shared by more rows: the decode chain's
    fastest), 1,024 columns a tile, 4 warps; a dependent product that is not gated holds
    up to 2,048 columns ahead (8 int8 rows: 32 registers a thread, as 16-bit rows hold)."""
    ahead = 0
    if dependent and not gated:
        ahead = 16
        while ahead * 2 <= min(cols, 2048):
            ahead *= 2
    return 8, min(1024, triton.next_power_of_2(cols)), 4, ahead


def ahead_columns(block_n: int, cols: int, gated: bool, warps: int) -> int:
    """The widest power-of-two column span (at most ``cols``, at least 16) whose weights a
    program of ``warps`` warps can hold in registers."""
    fits = _AHEAD_PER_THREAD * 32 * warps // (block_n * (2 if gated else 1))
    ahead = 16
    while ahead * 2 <= min(fits, cols):
        ahead *= 2
    return ahead


def rotary_block(block_n: int, rotary_rows: int) -> int:
    """BLOCK_N where the first ``rotary_rows`` rows are rotated: a program takes whole
    pairs of rows, all rotated or none."""
    if not rotary_rows:
        return block_n
    block_n = max(2, block_n)
    while rotary_rows % block_n:
        block_n //= 2
    return block_n


def launch_row_gemv(x, weight, bias, norm_weight, residual, eps: float, offset: float,
                    act: int, config: tuple | None = None, pdl: bool = False,
                    weight_scale=None, rotary_cos=None, rotary_sin=None,
                    rotary_rows: int = 0, head_dim: int = 0,
                    counts: torch.Tensor | None = None, x_qblock: int = 0) -> torch.Tensor:
    """The op's kernel (reference.row_gemv's math); ``weight_scale``: int8 rows' scales;
    ``rotary_*``: the rotary embedding of the first ``rotary_rows`` rows, heads of
    ``head_dim``; ``counts``: int32 zeros, one or more a row, that a product split along
    K counts its parts on and leaves at zero. ``config``: (BLOCK_N, BLOCK_K, num_warps,
    AHEAD[, TILE_X[, TURNS[, SPLIT[, STAGES]]]]) (gemv_config's); TURNS > 0: row_loop_triton's
    kernel, TURNS blocks a program; SPLIT > 0: split_gemv_triton's, SPLIT parts a block;
    STAGES > 0: pipe_gemv_triton's (a product with no norm, gate, bias, scales or rotary
    rows; another takes the one-block kernel). int8 rows in the one-block form read
    their bytes as words (int8_words_triton.py: no int-to-float conversion); with
    ``x_qblock``, against x's int8 codes in blocks of that many columns, always that
    kernel (int8_dot4_triton.py)."""
    width = weight.shape[0] // 2 if act else weight.shape[0]
    cols = weight.shape[1]
    gdc = dependent_launch_here(x.device) and (pdl or library_launches_dependent())
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if gdc else 0
    plain = norm_weight is None and not act and not rotary_rows
    streamable = plain and bias is None and weight_scale is None
    block_n, block_k, warps, ahead, *loop = config or gemv_config(
        width, cols, bool(act), gdc, weight.element_size(), sms,
        plain and counts is not None, streamable, x_qblock)
    tile_x, turns, split, stages = (*loop, False, 0, 0, 0)[:4]
    if x_qblock and any(loop):
        raise ValueError(f"x's int8 codes take the one-block int8 kernel, not config {config}")
    if split:
        return launch_split_gemv(x, weight, bias, residual, counts,
                                 (block_n, block_k, warps, ahead, split), pdl, weight_scale)
    if stages and streamable:
        return launch_pipe_gemv(x, weight, None, residual,
                                (block_n, block_k, warps, ahead, stages, 1), pdl)
    block_n = rotary_block(block_n, rotary_rows)
    if x_qblock or (not turns and not tile_x and weight_scale is not None and words_fit(
            weight, (block_n, block_k, warps, ahead))):  # x's codes: only this kernel
        return launch_int8_words(x, weight, bias, norm_weight, residual, eps, offset, act,
                                 weight_scale, (block_n, block_k, warps, ahead), pdl,
                                 rotary_cos, rotary_sin, rotary_rows, head_dim, x_qblock)
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(width, block_n)
    if turns:  # a grid of fewer programs, each TURNS blocks in a strided loop
        kernels, grid = ROW_LOOP_KERNELS, triton.cdiv(blocks, turns)
        shape = dict(TURNS=turns)
    else:
        kernels, grid, shape = (row_gemv_kernel, row_gemv_kernel_gdc), blocks, dict(
            TILE_X=bool(tile_x))
    launch, gdc = launcher(*kernels, x.device, pdl)
    row = x.reshape(cols)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    # else a copy the step makes: read after the wait
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((grid,))(
        row, weight.contiguous(), dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        dummy if weight_scale is None else weight_scale.reshape(-1),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        HAS_SCALE=weight_scale is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, num_warps=warps,
        ROT_ROWS=rotary_rows, HEAD_D=head_dim, **shape, **weights_first)
    return out
