"""A timing tool, not the library's: ``row_gemv`` over int8 rows (``--quantize
int8-weight``: a signed byte a weight, a scale a row) with fewer instructions a weight
than the general row kernel (targets/aoti/kernels/triton_kernels.py, HAS_SCALE), which
the cuda target keeps: built into a 1.1B int8 step, this kernel made it 40% slower. Same
folds as the library's (the norm before, bias, rotary, the gated activation, the
residual: row_parts._finish); reference.row_gemv's math.

A program reduces BLOCK_N rows, BLOCK_W 32-bit words (four weights each) a step. A mask
makes each float: a signed byte b with its top bit flipped is b + 128 (0..255), and alone
in the low bits of a 32-bit word that is an fp32 subnormal, exact, which an FMA takes as
it is (no conversion); x's columns are scaled by powers of two to bring the products back
into the normal range (_byte_dot). Each row's sum is then the dot less 128 x the sum of x
(x as multiplied: after the norm's weights, before its scale, which applies to both
alike). x is read in the weights' own layout, each thread's columns serving its BLOCK_N /
8 rows, so no step moves it through shared memory. The ``_gdc`` form (a programmatic
dependent launch) loads its first two tiles of weights before it waits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.int4_triton import halves_as_floats
from targets.aoti.kernels.row_parts import _finish, _program_rows
from targets.aoti.kernels.triton_kernels import rotary_block


@triton.jit
def _word_tile(w_ptr, rows, row_ok, first, K: tl.constexpr, BLOCK_W: tl.constexpr):
    """The rows' bytes over BLOCK_W words from word ``first``, as 32-bit words [BLOCK_N,
    BLOCK_W] (K a multiple of 4: each row starts where a word does)."""
    words: tl.constexpr = K // 4
    j = first + tl.arange(0, BLOCK_W)
    ok = row_ok[:, None] & (j < words)[None, :]
    return tl.load(w_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] * words + j[None, :],
                   mask=ok, other=0, eviction_policy="evict_first")


@triton.jit
def _first_tiles(w_ptr, rows, row_ok, K: tl.constexpr, BLOCK_W: tl.constexpr):
    """The rows' first two tiles (the second the first again where one step covers K)."""
    first = _word_tile(w_ptr, rows, row_ok, 0, K, BLOCK_W)
    second = first
    if BLOCK_W < K // 4:
        second = _word_tile(w_ptr, rows, row_ok, BLOCK_W, K, BLOCK_W)
    return first, second


@triton.jit
def _columns(ptr, first, K: tl.constexpr, BLOCK_W: tl.constexpr):
    """A vector's columns 4j, 4j + 1, 4j + 2, 4j + 3 for BLOCK_W weight words j from
    ``first``, in fp32 ([BLOCK_W] each). fp16 as two 32-bit words of two halves (read
    as floats with no shift); other dtypes one column a load."""
    j = first + tl.arange(0, BLOCK_W)
    ok = j < K // 4
    if ptr.dtype.element_ty == tl.float16:
        pairs = ptr.to(tl.pointer_type(tl.uint32)) + 2 * j
        c0, c1 = halves_as_floats(tl.load(pairs, mask=ok, other=0))
        c2, c3 = halves_as_floats(tl.load(pairs + 1, mask=ok, other=0))
    else:
        c0 = tl.load(ptr + 4 * j, mask=ok, other=0.0).to(tl.float32)
        c1 = tl.load(ptr + 4 * j + 1, mask=ok, other=0.0).to(tl.float32)
        c2 = tl.load(ptr + 4 * j + 2, mask=ok, other=0.0).to(tl.float32)
        c3 = tl.load(ptr + 4 * j + 3, mask=ok, other=0.0).to(tl.float32)
    return c0, c1, c2, c3


@triton.jit
def _x_columns(x_ptr, nw_ptr, first, OFFSET: tl.constexpr, K: tl.constexpr,
               BLOCK_W: tl.constexpr, HAS_NORM: tl.constexpr):
    """x's columns (_columns) times the norm's weights (+ OFFSET) where there is a norm,
    scaled for _byte_dot. Loaded in the weights' column layout (a program's threads
    outnumber its words, so the compiler loads them there): no step moves x between
    layouts through shared memory."""
    x0, x1, x2, x3 = _columns(x_ptr, first, K, BLOCK_W)
    low = _X_LOW_SCALE
    high = _X_HIGH_SCALE
    if HAS_NORM:
        n0, n1, n2, n3 = _columns(nw_ptr, first, K, BLOCK_W)
        if OFFSET != 0:
            n0, n1, n2, n3 = n0 + OFFSET, n1 + OFFSET, n2 + OFFSET, n3 + OFFSET
        n0, n1, n2, n3 = n0 * low, n1 * high, n2 * low, n3 * high
        return x0 * n0, x1 * n1, x2 * n2, x3 * n3
    return x0 * low, x1 * high, x2 * low, x3 * high


@triton.jit
def _x_sum_terms(x_ptr, nw_ptr, OFFSET: tl.constexpr, K: tl.constexpr,
                 HAS_NORM: tl.constexpr, BLOCK: tl.constexpr):
    """(x as multiplied, x^2) over K columns added up BLOCK apart, each column once a
    program ([BLOCK] each, summed by the caller after the dot: a reduction's barrier
    before it would hold its first loads of x back by a round trip). In the weights'
    layout each thread would add its columns again for every warp that shares them."""
    sums = tl.zeros((BLOCK,), dtype=tl.float32)
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in tl.static_range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        if HAS_NORM:
            squares += x * x
            nw = tl.load(nw_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            x = x * (nw + OFFSET) if OFFSET != 0 else x * nw
        sums += x
    return sums, squares


# A byte u alone at bits 0-7 of a 32-bit word is the fp32 subnormal u x 2^-149, at bits
# 8-15 u x 2^-141 (exact; fp32 arithmetic here keeps subnormals). x's columns come scaled
# so that each product lands at (b + 128) x x x 2^-59, well inside fp32's normal range
# (fp16 x times fp16 norm weights is below 2^38: no overflow at 2^90).
_X_LOW_SCALE = tl.constexpr(2.0 ** 90)  # a word's bytes 0 and 2
_X_HIGH_SCALE = tl.constexpr(2.0 ** 82)  # bytes 1 and 3
_SUM_SCALE = tl.constexpr(2.0 ** 59)


@triton.jit
def _byte_dot(acc, words, x0, x1, x2, x3):
    """``acc`` plus each word's four bytes b as (b + 128) x 2^-59 times x's four columns
    (scaled as above): [BLOCK_N, BLOCK_W], masks and a shift a word, no conversion, a
    chain of four FMAs."""
    flipped = words ^ 0x80808080
    high = flipped >> 16
    acc = acc + (flipped & 0xFF).to(tl.float32, bitcast=True) * x0[None, :]
    acc = acc + (flipped & 0xFF00).to(tl.float32, bitcast=True) * x1[None, :]
    acc = acc + (high & 0xFF).to(tl.float32, bitcast=True) * x2[None, :]
    return acc + (high & 0xFF00).to(tl.float32, bitcast=True) * x3[None, :]


@triton.jit
def _word_sums(x_ptr, nw_ptr, w_ptr, up_ptr, rows, row_ok, ahead, ahead2, up_ahead,
               up_ahead2, OFFSET: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_W: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr):
    """(the rows' byte dots and the up rows', [BLOCK_N, BLOCK_W] tiles not yet summed)
    over all K columns; ``ahead``, ``ahead2`` (and the up rows'): their first two tiles,
    loaded by the caller. Each step loads the tiles two steps on and x one step on
    before its own sums."""
    words: tl.constexpr = K // 4
    acc = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    x_next = _x_columns(x_ptr, nw_ptr, 0, OFFSET, K, BLOCK_W, HAS_NORM)
    for first in tl.static_range(0, words, BLOCK_W):
        x0, x1, x2, x3 = x_next
        if first + BLOCK_W < words:
            x_next = _x_columns(x_ptr, nw_ptr, first + BLOCK_W, OFFSET, K, BLOCK_W,
                                HAS_NORM)
        packed = ahead
        up_packed = up_ahead
        ahead = ahead2
        up_ahead = up_ahead2
        if first + 2 * BLOCK_W < words:
            ahead2 = _word_tile(w_ptr, rows, row_ok, first + 2 * BLOCK_W, K, BLOCK_W)
            if ACT != 0:
                up_ahead2 = _word_tile(up_ptr, rows, row_ok, first + 2 * BLOCK_W, K, BLOCK_W)
        acc = _byte_dot(acc, packed, x0, x1, x2, x3)
        if ACT != 0:
            up = _byte_dot(up, up_packed, x0, x1, x2, x3)
    return acc, up


@triton.jit
def _int8_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                   EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                   K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                   ACT: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_W: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
                   ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    rows = _program_rows(BLOCK_N, ROT_ROWS, HEAD_D)
    row_ok = rows < N
    up_ptr = w_ptr + N * K  # a gated product's up rows: N rows below the gate's
    if GDC:  # the next kernel may start at once
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    ahead, ahead2 = _first_tiles(w_ptr, rows, row_ok, K, BLOCK_W)
    up_ahead, up_ahead2 = ahead, ahead2
    if ACT != 0:
        up_ahead, up_ahead2 = _first_tiles(up_ptr, rows, row_ok, K, BLOCK_W)
    if GDC and W_AHEAD:
        tl.extra.cuda.gdc_wait()
    res = row_ok  # no residual: not read
    if HAS_RES:  # loaded with x, not after the sums: no round trip of its own at the end
        res = tl.load(r_ptr + rows, mask=row_ok, other=0.0)
    sums, squares = _x_sum_terms(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, 1024)
    acc, up = _word_sums(x_ptr, nw_ptr, w_ptr, up_ptr, rows, row_ok, ahead, ahead2,
                         up_ahead, up_ahead2, OFFSET, K, BLOCK_N, BLOCK_W, HAS_NORM, ACT)
    x_sum = tl.sum(sums, axis=0)
    square_sum = tl.sum(squares, axis=0)
    # the products came as (b + 128) x x x 2^-59: a row's sum is 2^59 x its dot less
    # 128 x sum(x)
    zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
    y = tl.sum(acc, axis=1) * _SUM_SCALE - 128.0 * x_sum
    y = _finish(y, zero - 128.0 * x_sum, up * _SUM_SCALE, zero + square_sum, b_ptr, r_ptr,
                s_ptr, cos_ptr, sin_ptr, rows, row_ok, EPS, N, K, HAS_BIAS, HAS_NORM, ACT,
                False, True, BLOCK_N, ROT_ROWS, HEAD_D)
    if HAS_RES:
        y += res.to(tl.float32)
    return rows, y


@triton.jit
def int8_row_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                         out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                         N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                         HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                         ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    """reference.row_gemv over int8 rows, started as a plain launch."""
    rows, y = _int8_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             EPS, OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, BLOCK_N,
                             BLOCK_W, False, False, ROT_ROWS, HEAD_D)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def int8_row_gemv_kernel_gdc(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                             N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                             HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                             HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_W: tl.constexpr, W_AHEAD: tl.constexpr,
                             ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    """reference.row_gemv over int8 rows as a programmatic dependent launch (W_AHEAD: the
    weight is one no kernel of the step writes, so its first tiles load before the
    wait)."""
    rows, y = _int8_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             EPS, OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, BLOCK_N,
                             BLOCK_W, True, W_AHEAD, ROT_ROWS, HEAD_D)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


declare_writes(int8_row_gemv_kernel_gdc, "out_ptr")


def int8_config(rows: int, cols: int, gated: bool) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_W, num_warps): 16-byte loads, 128 words (512 columns) a step at 8
    warps, so the program's threads outnumber a step's words and x is loaded straight
    into the weights' layout (fewer words, 4 warps, for short rows). Each thread holds
    BLOCK_N / 8 rows of a step, and each column of x it converts serves them all: 16
    rows a program (a gated product's 16 and their up rows), a head's many rows 32."""
    block_w = min(128, triton.next_power_of_2(max(cols // 4, 1)))
    block_n = 32 if rows >= 16384 else 16
    return block_n, block_w, 8 if block_w == 128 else 4


def launch_int8_row_gemv(x, weight, weight_scale, bias, norm_weight, residual, eps: float,
                         offset: float, act: int, config: tuple | None = None,
                         pdl: bool = False, rotary_cos=None, rotary_sin=None,
                         rotary_rows: int = 0, head_dim: int = 0) -> torch.Tensor:
    """The op's kernel over int8 rows (``weight`` [rows, K], K a multiple of 4,
    ``weight_scale`` one a row); ``config``: (BLOCK_N, BLOCK_W, num_warps)
    (int8_config's); the rest as triton_kernels.launch_row_gemv."""
    width = weight.shape[0] // 2 if act else weight.shape[0]
    cols = weight.shape[1]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    launch, gdc = launcher(int8_row_gemv_kernel, int8_row_gemv_kernel_gdc, x.device, pdl)
    block_n, block_w, warps = config or int8_config(width, cols, bool(act))
    block_n = rotary_block(block_n, rotary_rows)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    # else a copy the step makes: read after the wait
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((triton.cdiv(width, block_n),))(
        x.reshape(cols), weight.contiguous(), weight_scale.reshape(-1),
        dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        BLOCK_N=block_n, BLOCK_W=block_w, ROT_ROWS=rotary_rows, HEAD_D=head_dim,
        num_warps=warps, **weights_first)
    return out
