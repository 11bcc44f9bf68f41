"""int8 rows against x quantized to int8 in blocks of QBLOCK columns: four products a
word in one dp4a instruction, the pieces int8_words_triton.py's kernel takes when its
QBLOCK is set.

A word of int8 weights and a word of x's int8 codes give their four products' sum in one
dp4a (PTX ``dp4a.s32.s32``), where the float form spends a permute, a subtract and an
FMA on each weight. Every program quantizes the x columns of its tile itself (x times the
norm's weight; the norm's own scale stays outside, as in the float form): a block's scale
is its largest magnitude over 127, its codes rounded half away from zero, so a block's
products are the int32 sum of its words' dp4a times its scale. The block size is the
kernel's, not the tile's, so every configuration computes the same codes (llama.cpp's
CUDA matrix-vector kernels quantize x the same way, in blocks of 32).
Under Triton's interpreter (no inline PTX) dp4a is four sign-extended byte products.
"""

from __future__ import annotations

import triton
import triton.language as tl

from targets.aoti.kernels.row_parts import _by_byte, _x_by_words


@triton.jit
def _dp4a(words, x_words, PTX: tl.constexpr):
    """Each word's four signed bytes times x_words' four, summed (int32)."""
    x_words = tl.broadcast_to(x_words, words.shape)
    if PTX:
        return tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
            [words, x_words, tl.zeros(words.shape, dtype=tl.int32)], dtype=tl.int32,
            is_pure=True, pack=1)
    total = tl.zeros(words.shape, dtype=tl.int32)
    for byte in tl.static_range(4):  # << then >> sign-extends byte ``byte``
        total += ((words << (24 - 8 * byte)) >> 24) * ((x_words << (24 - 8 * byte)) >> 24)
    return total


@triton.jit
def _x_codes(x_ptr, nw_ptr, start, OFFSET: tl.constexpr, K: tl.constexpr,
             WIDTH: tl.constexpr, HAS_NORM: tl.constexpr, QBLOCK: tl.constexpr):
    """x from column ``start`` (times the norm's weight) as WIDTH words of int8 codes,
    x[start + 4j + k] in byte k of word j; the scale of each block of QBLOCK columns;
    x^2 summed a word."""
    x, squares = _x_by_words(x_ptr, nw_ptr, start, OFFSET, K, WIDTH, HAS_NORM)
    squares = tl.sum(squares, axis=1)
    blocks = tl.reshape(x, (WIDTH * 4 // QBLOCK, QBLOCK))
    largest = tl.max(tl.abs(blocks), axis=1)
    inverse = tl.where(largest > 0, 127.0 / tl.where(largest > 0, largest, 1.0), 0.0)
    t = blocks * inverse[:, None]
    codes = tl.reshape((t + tl.where(t >= 0, 0.5, -0.5)).to(tl.int32), (WIDTH, 4))
    c0, c1, c2, c3 = _by_byte(codes)
    words = (c0 & 0xFF) | ((c1 & 0xFF) << 8) | ((c2 & 0xFF) << 16) | (c3 << 24)
    return words, largest / 127.0, squares


@triton.jit
def _block_sums(words, x_words, x_scales, WIDTH: tl.constexpr, QBLOCK: tl.constexpr,
                PTX: tl.constexpr):
    """[rows, blocks]: each block's int32 sum of dp4a products times x's block scale."""
    products = _dp4a(words, x_words[None, :], PTX)
    rows: tl.constexpr = words.shape[0]
    sums = tl.sum(tl.reshape(products, (rows, WIDTH * 4 // QBLOCK, QBLOCK // 4)), axis=2)
    return sums.to(tl.float32) * x_scales[None, :]


@triton.jit
def _dot4_sums(words, up_words, acc, up, squares, x_ptr, nw_ptr, start,
               OFFSET: tl.constexpr, K: tl.constexpr, WIDTH: tl.constexpr,
               HAS_NORM: tl.constexpr, ACT: tl.constexpr, PTX: tl.constexpr,
               QBLOCK: tl.constexpr):
    """int8_words_triton._word_sums over x's int8 codes: acc (and up) [rows, WIDTH * 4 /
    QBLOCK] plus a tile of WIDTH words a row; squares plus x^2 over the tile."""
    x_words, x_scales, sq = _x_codes(x_ptr, nw_ptr, start, OFFSET, K, WIDTH, HAS_NORM,
                                     QBLOCK)
    squares += sq
    acc += _block_sums(words, x_words, x_scales, WIDTH, QBLOCK, PTX)
    if ACT != 0:
        up += _block_sums(up_words, x_words, x_scales, WIDTH, QBLOCK, PTX)
    return acc, up, squares

