"""int8 rows (a scale a row) whose weights become fp32 by integer ops alone: the
one-block row kernel (triton_kernels.py's) for int8 rows, with no integer-to-float
conversion instruction.

``w.to(tl.float32)`` on an int8 tile is one I2F a weight on sm_90, and conversions issue
at about a quarter of the rate of integer and fp32 ops: a gate/up's conversions alone
take about as long as its bytes take to read. Here a tile is read as int32 words (four
weights each), xor'd once with 0x80808080 (each byte's sign bit: x + 128, unsigned), and
weight k of a word is one byte permute (PTX prmt) under the exponent of 2^23 and one fp32
subtract:

    float_bits(0x4B0000 << 8 | (x + 128)) - (2^23 + 128) = x      (exact: Sterbenz)

Under Triton's interpreter (no inline PTX) the same bits come from shifts and masks.
Byte k of word j is column 4j + k, so x is read as one row and split into four quarters,
x[4j + k] for each k. The sums are fp32 throughout; only their order within a tile
differs from the one-block kernel's. The epilogue (scales, norm, bias, gate, rotary rows,
residual) is row_parts._finish.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.int8_dot4_triton import _dot4_sums
from targets.aoti.kernels.row_parts import _block_rows, _by_byte, _finish, _x_by_words


@triton.jit
def _byte_as_float(words, BYTE: tl.constexpr):
    """Byte BYTE of each int32 word, an int8 weight, as its exact fp32 value."""
    bits = ((words >> (8 * BYTE)) & 0xFF) ^ 0x4B000080
    return bits.to(tl.float32, bitcast=True) - 8388736.0  # 2^23 + 128


@triton.jit
def _bytes_as_floats(words, PRMT: tl.constexpr):
    """The four int8 weights of each int32 word as exact fp32 values, byte 0 first.
    PRMT: each in one byte permute (PTX prmt, on the GPU) after one xor a word, else
    (the interpreter) in shifts and masks; both give the same bits."""
    if PRMT:
        flipped = words ^ -2139062144  # 0x80808080 as an int32: each byte's sign bit
        b0, b1, b2, b3 = tl.inline_asm_elementwise(
            "{ .reg .b32 hi; mov.b32 hi, 0x4B000000;"
            " prmt.b32 $0, $4, hi, 0x7650; prmt.b32 $1, $4, hi, 0x7651;"
            " prmt.b32 $2, $4, hi, 0x7652; prmt.b32 $3, $4, hi, 0x7653; }",
            "=r,=r,=r,=r,r", [flipped], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
        return (b0.to(tl.float32, bitcast=True) - 8388736.0,
                b1.to(tl.float32, bitcast=True) - 8388736.0,
                b2.to(tl.float32, bitcast=True) - 8388736.0,
                b3.to(tl.float32, bitcast=True) - 8388736.0)
    return (_byte_as_float(words, 0), _byte_as_float(words, 1), _byte_as_float(words, 2),
            _byte_as_float(words, 3))


@triton.jit
def _x_quarters(x_ptr, nw_ptr, start, OFFSET: tl.constexpr, K: tl.constexpr,
                WIDTH: tl.constexpr, HAS_NORM: tl.constexpr):
    """x from column ``start`` (times the norm's weight) as four quarters, x[start + 4j +
    k] for k = 0..3, read as one contiguous row and split in registers; x^2 summed."""
    x, squares = _x_by_words(x_ptr, nw_ptr, start, OFFSET, K, WIDTH, HAS_NORM)
    x0, x1, x2, x3 = _by_byte(x)
    return x0, x1, x2, x3, tl.sum(squares, axis=1)


@triton.jit
def _word_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr, start, OFFSET: tl.constexpr,
               K: tl.constexpr, WIDTH: tl.constexpr, HAS_NORM: tl.constexpr,
               ACT: tl.constexpr, PRMT: tl.constexpr):
    """acc (and up) plus a tile of WIDTH words a row against x from column ``start``:
    byte k of word j against x[start + 4j + k]; squares plus x^2 over the tile."""
    x0, x1, x2, x3, sq = _x_quarters(x_ptr, nw_ptr, start, OFFSET, K, WIDTH, HAS_NORM)
    squares += sq
    w0, w1, w2, w3 = _bytes_as_floats(words, PRMT)
    acc += w0 * x0[None, :]
    acc += w1 * x1[None, :]
    acc += w2 * x2[None, :]
    acc += w3 * x3[None, :]
    if ACT != 0:
        u0, u1, u2, u3 = _bytes_as_floats(up_words, PRMT)
        up += u0 * x0[None, :]
        up += u1 * x1[None, :]
        up += u2 * x2[None, :]
        up += u3 * x3[None, :]
    return acc, up, squares


@triton.jit
def _tile_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr, start, OFFSET: tl.constexpr,
               K: tl.constexpr, WIDTH: tl.constexpr, HAS_NORM: tl.constexpr,
               ACT: tl.constexpr, PRMT: tl.constexpr, QBLOCK: tl.constexpr):
    """_word_sums, or over x's int8 codes where QBLOCK is set (_dot4_sums)."""
    if QBLOCK:
        acc, up, squares = _dot4_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr,
                                      start, OFFSET, K, WIDTH, HAS_NORM, ACT, PRMT, QBLOCK)
    else:
        acc, up, squares = _word_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr,
                                      start, OFFSET, K, WIDTH, HAS_NORM, ACT, PRMT)
    return acc, up, squares


@triton.jit
def _word_tile(w_ptr, rows, row_ok, start, N: tl.constexpr, K: tl.constexpr,
               WIDTH: tl.constexpr, ACT: tl.constexpr):
    """The rows' WIDTH words from column ``start`` (and the up rows' N below); ``w_ptr``
    the int8 rows, read four bytes a word (K a multiple of 4)."""
    words_ptr = w_ptr.to(tl.pointer_type(tl.int32))
    j = tl.arange(0, WIDTH)
    at = rows[:, None] * (K // 4) + start // 4 + j[None, :]
    ok = row_ok[:, None] & (start // 4 + j < K // 4)[None, :]
    words = tl.load(words_ptr + at, mask=ok, other=0, eviction_policy="evict_first")
    if ACT != 0:
        up_words = tl.load(words_ptr + N * (K // 4) + at, mask=ok, other=0,
                           eviction_policy="evict_first")
    else:
        up_words = words
    return words, up_words


@triton.jit
def _int8_words(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr,
                EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                AHEAD: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
                ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr, PRMT: tl.constexpr,
                QBLOCK: tl.constexpr):
    rows = _block_rows(tl.program_id(0), BLOCK_N, ROT_ROWS, HEAD_D)
    row_ok = rows < N
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    y = _word_rows(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, rows, row_ok,
                   EPS, OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, BLOCK_N, BLOCK_K,
                   AHEAD, GDC, W_AHEAD, ROT_ROWS, HEAD_D, PRMT, QBLOCK)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _word_rows(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, rows, row_ok,
               EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
               HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               AHEAD: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
               ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr, PRMT: tl.constexpr,
               QBLOCK: tl.constexpr):
    """``rows``' values (the epilogue's): their first AHEAD columns' words before the
    wait (GDC), the rest in the loop. QBLOCK > 0: against x's int8 codes in blocks of
    QBLOCK columns (int8_dot4_triton.py), a sum a block and row."""
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    if AHEAD > 0:  # no kernel of the step writes weights: loaded before the wait
        first, up_first = _word_tile(w_ptr, rows, row_ok, 0, N, K, AHEAD // 4, ACT)
    if GDC and W_AHEAD:
        tl.extra.cuda.gdc_wait()
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if AHEAD > 0:
        acc0 = tl.zeros((BLOCK_N, AHEAD // (QBLOCK if QBLOCK else 4)), dtype=tl.float32)
        acc0, up0, sq0 = _tile_sums(first, up_first, acc0, acc0, tl.zeros(
            (AHEAD // 4,), dtype=tl.float32), x_ptr, nw_ptr, 0, OFFSET, K, AHEAD // 4,
            HAS_NORM, ACT, PRMT, QBLOCK)
        y += tl.sum(acc0, axis=1)
        u += tl.sum(up0, axis=1)
        square_sum += tl.sum(sq0, axis=0)
    acc = tl.zeros((BLOCK_N, BLOCK_K // (QBLOCK if QBLOCK else 4)), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K // (QBLOCK if QBLOCK else 4)), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K // 4,), dtype=tl.float32)
    for start in tl.static_range(AHEAD, K, BLOCK_K):
        words, up_words = _word_tile(w_ptr, rows, row_ok, start, N, K, BLOCK_K // 4, ACT)
        acc, up, squares = _tile_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr,
                                      start, OFFSET, K, BLOCK_K // 4, HAS_NORM, ACT, PRMT,
                                      QBLOCK)
    y = _finish(y + tl.sum(acc, axis=1), u, up, square_sum + tl.sum(squares, axis=0),
                b_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, rows, row_ok, EPS, N, K, HAS_BIAS,
                HAS_NORM, ACT, HAS_RES, True, BLOCK_N, ROT_ROWS, HEAD_D)
    return y


@triton.jit
def int8_words_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr,
                      EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                      K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                      ACT: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, AHEAD: tl.constexpr, ROT_ROWS: tl.constexpr,
                      HEAD_D: tl.constexpr, PRMT: tl.constexpr, QBLOCK: tl.constexpr):
    """reference.row_gemv over int8 rows with their scales, a plain launch."""
    _int8_words(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr, EPS,
                OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, BLOCK_N, BLOCK_K, AHEAD,
                False, False, ROT_ROWS, HEAD_D, PRMT, QBLOCK)


@triton.jit
def int8_words_kernel_gdc(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr,
                          out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                          N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                          HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          AHEAD: tl.constexpr, W_AHEAD: tl.constexpr,
                          ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr,
                          PRMT: tl.constexpr, QBLOCK: tl.constexpr):
    """The same as a programmatic dependent launch: the first AHEAD columns' words
    before the wait (W_AHEAD: the weight is one no kernel of the step writes)."""
    _int8_words(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, out_ptr, EPS,
                OFFSET, N, K, HAS_BIAS, HAS_NORM, ACT, HAS_RES, BLOCK_N, BLOCK_K, AHEAD,
                True, W_AHEAD, ROT_ROWS, HEAD_D, PRMT, QBLOCK)


declare_writes(int8_words_kernel_gdc, "out_ptr")


def words_fit(weight: torch.Tensor, config: tuple, x_qblock: int = 0) -> bool:
    """Whether int8 rows ``weight`` in one-block ``config`` (BLOCK_N, BLOCK_K, warps,
    AHEAD) can be read as words: whole words a row, tiles of at least 4 words; against
    x's codes in blocks of ``x_qblock`` (a power of two, 16 or more): whole blocks a
    row and a tile."""
    _, block_k, _, ahead = config[:4]
    fit = (weight.dtype == torch.int8 and weight.shape[1] % 4 == 0 and block_k >= 16
           and (ahead == 0 or ahead >= 16))
    if x_qblock:
        fit = fit and (x_qblock >= 16 and x_qblock & (x_qblock - 1) == 0
                       and weight.shape[1] % x_qblock == 0 and block_k % x_qblock == 0
                       and ahead % x_qblock == 0)
    return fit


def launch_int8_words(x, weight, bias, norm_weight, residual, eps: float, offset: float,
                      act: int, weight_scale, config: tuple, pdl: bool = False,
                      rotary_cos=None, rotary_sin=None, rotary_rows: int = 0,
                      head_dim: int = 0, x_qblock: int = 0) -> torch.Tensor:
    """reference.row_gemv over int8 rows ``weight`` with their ``weight_scale``
    (triton_kernels.launch_row_gemv's arguments); ``config``: (BLOCK_N, BLOCK_K,
    num_warps, AHEAD), BLOCK_N already fitted to the rotary rows, words_fit's;
    ``x_qblock``: x quantized to int8 in blocks of that many columns (reference.row_gemv's
    ``x_qblock``), four products a dp4a."""
    if not words_fit(weight, config, x_qblock) or weight_scale is None:
        raise ValueError(f"int8 rows of whole words with their scales, config {config}"
                         + (f", x in blocks of {x_qblock}" if x_qblock else ""))
    block_n, block_k, warps, ahead = config[:4]
    width = weight.shape[0] // 2 if act else weight.shape[0]
    cols = weight.shape[1]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    launch, gdc = launcher(int8_words_kernel, int8_words_kernel_gdc, x.device, pdl)
    dummy = weight_scale  # an unused pointer argument (its branch is compiled out)
    # else a copy the step makes: read after the wait
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((triton.cdiv(width, block_n),))(
        x.reshape(cols), weight.contiguous(), dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        weight_scale.reshape(-1),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, ROT_ROWS=rotary_rows,
        HEAD_D=head_dim, PRMT=os.environ.get("TRITON_INTERPRET") != "1", QBLOCK=x_qblock,
        num_warps=warps,
        **weights_first)
    return out
