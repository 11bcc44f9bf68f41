"""int8 rows against x's int8 codes (int8_dot4_triton.py) as a row loop: a grid of few
programs, each taking TURNS blocks of rows in a strided loop, the next block's whole rows
loaded while the current one is summed (row_loop_triton.py's shape, for int8 words).

In the one-block-a-program form every program quantizes x itself, which is most of its
instructions at a few rows a program; here a program quantizes x once for all its turns
and holds the codes (K / 4 words across its threads), so each further block costs its
words' loads and one dp4a a word. Rows up to a power of two of columns (the decode
products with the norm folded: 2,048 on the ~1.1B) are held whole; the epilogue is
row_parts._finish.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.int8_dot4_triton import _block_sums, _x_codes
from targets.aoti.kernels.int8_words_triton import _word_tile
from targets.aoti.kernels.row_parts import _block_rows, _finish


@triton.jit
def _codes_loop(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr,
                EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr,
                TURNS: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
                ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr, PTX: tl.constexpr,
                QBLOCK: tl.constexpr):
    programs = tl.num_programs(0)
    block = tl.program_id(0)
    rows = _block_rows(block, BLOCK_N, ROT_ROWS, HEAD_D)
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    words, up_words = _word_tile(w_ptr, rows, rows < N, 0, N, K, WIDTH, ACT)
    if GDC and W_AHEAD:
        tl.extra.cuda.gdc_wait()
    x_words, x_scales, squares = _x_codes(x_ptr, nw_ptr, 0, OFFSET, K, WIDTH, HAS_NORM,
                                          QBLOCK)
    square_sum = tl.sum(squares, axis=0)
    for _ in range(TURNS):
        row_ok = rows < N
        after = _block_rows(block + programs, BLOCK_N, ROT_ROWS, HEAD_D)
        # the next block's rows, in flight while this one is summed
        w_next, u_next = _word_tile(w_ptr, after, after < N, 0, N, K, WIDTH, ACT)
        y = tl.sum(_block_sums(words, x_words, x_scales, WIDTH, QBLOCK, PTX), axis=1)
        up = tl.zeros((BLOCK_N, WIDTH * 4 // QBLOCK), dtype=tl.float32)
        if ACT != 0:
            up = _block_sums(up_words, x_words, x_scales, WIDTH, QBLOCK, PTX)
        y = _finish(y, tl.zeros((BLOCK_N,), dtype=tl.float32), up, square_sum, b_ptr,
                    r_ptr, s_ptr, cos_ptr, sin_ptr, rows, row_ok, EPS, N, K, HAS_BIAS,
                    HAS_NORM, ACT, HAS_RES, True, BLOCK_N, ROT_ROWS, HEAD_D)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)
        block += programs
        rows, words, up_words = after, w_next, u_next


@triton.jit
def int8_codes_loop_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr,
                           out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                           N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                           HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                           BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, TURNS: tl.constexpr,
                           ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr, PTX: tl.constexpr,
                           QBLOCK: tl.constexpr):
    """reference.row_gemv(x_qblock=QBLOCK) over int8 rows, a plain launch."""
    _codes_loop(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr, EPS,
                OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, BLOCK_N, WIDTH, TURNS,
                False, False, ROT_ROWS, HEAD_D, PTX, QBLOCK)


@triton.jit
def int8_codes_loop_kernel_gdc(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr,
                               sin_ptr, out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                               N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                               HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                               HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                               WIDTH: tl.constexpr, TURNS: tl.constexpr,
                               W_AHEAD: tl.constexpr, ROT_ROWS: tl.constexpr,
                               HEAD_D: tl.constexpr, PTX: tl.constexpr,
                               QBLOCK: tl.constexpr):
    """The same as a programmatic dependent launch: the first block's rows loaded
    before the wait (W_AHEAD: a weight no kernel of the step writes)."""
    _codes_loop(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr, EPS,
                OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, BLOCK_N, WIDTH, TURNS,
                True, W_AHEAD, ROT_ROWS, HEAD_D, PTX, QBLOCK)


declare_writes(int8_codes_loop_kernel_gdc, "out_ptr")


def codes_loop_fits(weight: torch.Tensor, block_n: int, x_qblock: int) -> bool:
    """int8 rows of whole blocks of x_qblock columns (a power of two, 16 or more), at most
    4,096 of them (a block's whole rows held twice in registers)."""
    cols = weight.shape[1]
    return (weight.dtype == torch.int8 and x_qblock >= 16 and x_qblock & (x_qblock - 1) == 0
            and cols % x_qblock == 0 and cols <= 4096 and block_n >= 1)


def launch_int8_codes_loop(x, weight, bias, norm_weight, residual, eps: float, offset: float,
                           act: int, weight_scale, x_qblock: int, config: tuple,
                           pdl: bool = False, rotary_cos=None, rotary_sin=None,
                           rotary_rows: int = 0, head_dim: int = 0) -> torch.Tensor:
    """reference.row_gemv(x_qblock=) over int8 rows ``weight`` with their ``weight_scale``
    (launch_row_gemv's other arguments); ``config``: (BLOCK_N, programs, num_warps), the
    grid's programs each taking ceil(blocks / programs) blocks in turn; BLOCK_N already
    fitted to the rotary rows (triton_kernels.rotary_block)."""
    block_n, programs, warps = config
    if not codes_loop_fits(weight, block_n, x_qblock) or weight_scale is None:
        raise ValueError(f"int8 rows with their scales in whole blocks of {x_qblock} "
                         f"columns, at most 4,096, config {config}")
    width = weight.shape[0] // 2 if act else weight.shape[0]
    cols = weight.shape[1]
    blocks = triton.cdiv(width, block_n)
    programs = min(programs, blocks)
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    launch, gdc = launcher(int8_codes_loop_kernel, int8_codes_loop_kernel_gdc, x.device, pdl)
    dummy = weight_scale  # an unused pointer argument (its branch is compiled out)
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((programs,))(
        x.reshape(cols), weight.contiguous(), dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        weight_scale.reshape(-1),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        BLOCK_N=block_n, WIDTH=triton.next_power_of_2(cols) // 4,
        TURNS=triton.cdiv(blocks, programs), ROT_ROWS=rotary_rows, HEAD_D=head_dim,
        PTX=os.environ.get("TRITON_INTERPRET") != "1", QBLOCK=x_qblock, num_warps=warps,
        **weights_first)
    return out
