"""int4 rows (int4_rows.py's format) against x quantized to int8 in blocks of QBLOCK
columns: the pieces int4_triton.py's kernel takes when its QBLOCK is set.

A packed word holds eight nibbles: byte b's low one the weight of column 4w + b of its
group's first half, its high one column 4w + b of the second half. Masked in place
(``w & 0x0F0F0F0F``, ``w & 0xF0F0F0F0``: one instruction each, no shift: the high ones
come 16 times their value, which the block's scale takes back), each is a word of four
unsigned bytes, against x's four int8 codes in one ``dp4a.u32.s32``, where the float
form spends a mask, a conversion and an FMA on each weight. A thread holds 16 columns of
a half (4 words, a chunk) within one of x's blocks: a chunk's sums chain through dp4a's
accumulator and take the block's scale once. x is quantized as int8_dot4_triton.py's
``_x_codes`` does (each program its own, the blocks the kernel's, not its steps').
"""

from __future__ import annotations

import triton
import triton.language as tl

from targets.aoti.kernels.int8_dot4_triton import _dp4a, _dp4a_unsigned, _x_codes


@triton.jit
def _x_chunks(x_ptr, nw_ptr, first, OFFSET: tl.constexpr, K: tl.constexpr,
              GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HAS_NORM: tl.constexpr,
              QBLOCK: tl.constexpr, PTX: tl.constexpr):
    """x's int8 codes over BLOCK_G groups from group ``first`` (int4_triton._dot4_sums'):
    the low half's words [BLOCK_G, GROUP / 32, 4] (chunks of 16 columns, 4 words), the
    high half's, each chunk's block scale (the low half's, the high's / 16), each group's
    sum of quantized x, and x^2 summed."""
    chunks: tl.constexpr = GROUP // 32
    words, scales, squares = _x_codes(x_ptr, nw_ptr, first * GROUP, OFFSET, K,
                                      BLOCK_G * GROUP // 4, HAS_NORM, QBLOCK)
    blocks: tl.constexpr = BLOCK_G * GROUP // QBLOCK
    ones = tl.full((BLOCK_G * GROUP // 4,), 0x01010101, dtype=tl.int32)
    codes = tl.sum(tl.reshape(_dp4a(words, ones, PTX), (blocks, QBLOCK // 4)), axis=1)
    x_sum = tl.sum(tl.reshape(codes.to(tl.float32) * scales, (BLOCK_G, GROUP // QBLOCK)),
                   axis=1)
    halves = tl.permute(tl.reshape(words, (BLOCK_G, 2, chunks, 4)), (0, 2, 3, 1))
    low, high = tl.split(halves)
    per_chunk = tl.reshape(tl.broadcast_to(scales[:, None], (blocks, QBLOCK // 16)),
                           (BLOCK_G, 2, chunks))
    s_low, s_high = tl.split(tl.permute(per_chunk, (0, 2, 1)))
    return low, high, s_low, s_high * 0.0625, x_sum, tl.sum(squares, axis=0)


@triton.jit
def _four(words):
    """A chunk's four words (the last two axes, (2, 2)) as four tensors."""
    even, odd = tl.split(words)
    w0, w2 = tl.split(even)
    w1, w3 = tl.split(odd)
    return w0, w1, w2, w3


@triton.jit
def _nibble_dots(packed, low, high, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                 GROUP: tl.constexpr, PTX: tl.constexpr):
    """Each row's int32 sums of nibble times code over each chunk: (the low nibbles' (the
    group's first half), the high ones' times 16), [BLOCK_N, BLOCK_G, GROUP / 32]: masked
    in place, a word's four nibbles against x's four codes in one dp4a."""
    shape: tl.constexpr = (BLOCK_N, BLOCK_G, GROUP // 32)
    w0, w1, w2, w3 = _four(tl.reshape(packed, (BLOCK_N, BLOCK_G, GROUP // 32, 2, 2)))
    l0, l1, l2, l3 = _four(tl.reshape(low, (BLOCK_G, GROUP // 32, 2, 2)))
    h0, h1, h2, h3 = _four(tl.reshape(high, (BLOCK_G, GROUP // 32, 2, 2)))
    lo = tl.zeros(shape, dtype=tl.int32)
    hi = tl.zeros(shape, dtype=tl.int32)
    lo = _dp4a_unsigned(w0 & 0x0F0F0F0F, l0[None, :, :], lo, PTX)
    hi = _dp4a_unsigned(w0 & 0xF0F0F0F0, h0[None, :, :], hi, PTX)
    lo = _dp4a_unsigned(w1 & 0x0F0F0F0F, l1[None, :, :], lo, PTX)
    hi = _dp4a_unsigned(w1 & 0xF0F0F0F0, h1[None, :, :], hi, PTX)
    lo = _dp4a_unsigned(w2 & 0x0F0F0F0F, l2[None, :, :], lo, PTX)
    hi = _dp4a_unsigned(w2 & 0xF0F0F0F0, h2[None, :, :], hi, PTX)
    lo = _dp4a_unsigned(w3 & 0x0F0F0F0F, l3[None, :, :], lo, PTX)
    hi = _dp4a_unsigned(w3 & 0xF0F0F0F0, h3[None, :, :], hi, PTX)
    return lo, hi
