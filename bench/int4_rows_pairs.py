"""A bench form of the int4-row product (targets/aoti/kernels/int4_triton.py's math, format
and folds) with fewer instructions a weight: several rows a thread and fp16 pairs.

- **Rows a thread.** A program's tile of words is [BLOCK_G, 4, BLOCK_N, 4]: a thread
  holds 4 words (16 bytes, 32 weights) of one quarter of a group for every one of the
  program's rows (the rows' axis after the groups' and quarters', and num_warps =
  BLOCK_G * 4 / 32, so Triton's layout gives threads the groups and quarters and keeps
  the rows within a thread), so x's loads, conversion, norm, squares and sums are paid
  once a column, not once a weight, and reach the rows without shared memory.
- **fp16 pairs.** A word's nibbles become four fp16 pairs with one LOP3 each (``(w & mask)
  | 0x6400``: 1024 + q, or 1024 + 16 q for a high nibble) and one HADD2/HFMA2 that leaves
  q - 8 exactly; HFMA2 multiplies two weights by two x's. A group's sum is then
  ``scale * sum((q - 8) x) + (offset + 8 scale) * sum(x)``.
- **Partial sums.** Each thread's fp16 pair accumulators take 8 products a lane (the low
  half's 4 words, and the high half's) and are flushed into fp32 once a group: |q - 8| <= 8,
  so a lane stays finite while |x * norm weight| < 1023 (8 x 8 x 1023 < 65504). The
  x sums, squares, scales and offsets stay fp32.

fp16 x and rows only (a bench kernel: the library's kernel is unchanged). Offline
instruction counts: ``python bench/int4_rows_count.py`` (sm_90a, Triton's ptxas).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.int4_triton import halves_as_floats
from targets.aoti.kernels.triton_kernels import _finish, _program_rows, rotary_block

# q - 8 from a word's four pairs and their four HFMA2 into two fp16-pair sums (low half's
# columns, high half's): 13 instructions for 8 weights. 0x6408 = 1032, 0x2c00 = 1/16,
# 0xd480 = -72: (1024 + 16 q) / 16 - 72 = q - 8.
_PAIR_DOT = tl.constexpr("""{
.reg .b32 t0, t1, t2, t3, s, m0, m1, c, k, d, e;
mov.b32 m0, 0x000f000f; mov.b32 m1, 0x00f000f0; mov.b32 c, 0x64006400;
mov.b32 k, 0x64086408; mov.b32 d, 0x2c002c00; mov.b32 e, 0xd480d480;
lop3.b32 t0, $2, m0, c, 0xea; lop3.b32 t1, $2, m1, c, 0xea;
shr.b32 s, $2, 8;
lop3.b32 t2, s, m0, c, 0xea; lop3.b32 t3, s, m1, c, 0xea;
sub.f16x2 t0, t0, k; sub.f16x2 t2, t2, k;
fma.rn.f16x2 t1, t1, d, e; fma.rn.f16x2 t3, t3, d, e;
fma.rn.f16x2 $0, t0, $3, $7; fma.rn.f16x2 $0, t2, $4, $0;
fma.rn.f16x2 $1, t1, $5, $8; fma.rn.f16x2 $1, t3, $6, $1;
}""")


@triton.jit
def _pair_dot(words, xa, xb, ya, yb, low, high, EMULATE: tl.constexpr):
    """(low, high) sums plus one word's (q - 8) x: xa = x's columns (4i, 4i + 2) of the
    word's low-nibble weights, xb (4i + 1, 4i + 3), ya / yb the high nibbles'. fp16 pair
    sums (_PAIR_DOT), or under EMULATE (Triton's interpreter runs no PTX) fp32 sums of the
    same lanes."""
    if EMULATE:
        xa0, xa1 = halves_as_floats(xa)
        xb0, xb1 = halves_as_floats(xb)
        ya0, ya1 = halves_as_floats(ya)
        yb0, yb1 = halves_as_floats(yb)
        low += (_q(words, 0) * xa0 + _q(words, 16) * xa1 + _q(words, 8) * xb0
                + _q(words, 24) * xb1)
        high += (_q(words, 4) * ya0 + _q(words, 20) * ya1 + _q(words, 12) * yb0
                 + _q(words, 28) * yb1)
        return low, high
    return tl.inline_asm_elementwise(_PAIR_DOT, "=r,=r,r,r,r,r,r,r,r",
                                     [words, xa, xb, ya, yb, low, high],
                                     dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)


@triton.jit
def _q(words, SHIFT: tl.constexpr):
    """q - 8 of the nibble at bit SHIFT, in fp32 (the emulation's)."""
    return ((words >> SHIFT) & 15).to(tl.float32) - 8.0


@triton.jit
def _flush(low, high, EMULATE: tl.constexpr):
    """The lanes of two pair sums, added in fp32."""
    if EMULATE:
        return low + high
    a, b = halves_as_floats(low)
    c, d = halves_as_floats(high)
    return (a + b) + (c + d)


@triton.jit
def _pack(a, b, EMULATE: tl.constexpr):
    """fp32 a, b as one fp16 pair (a in the low half): one cvt (tl's casts and shifts
    under the interpreter)."""
    if EMULATE:
        low = a.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
        return low | (b.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32) << 16)
    return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [a, b],
                                     dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _x_word(x_ptr, nw_ptr, at, ok, OFFSET: tl.constexpr, HAS_NORM: tl.constexpr,
            EMULATE: tl.constexpr):
    """x's columns at, at + 1, at + 2, at + 3 (``at`` [BLOCK_G, 4] of fp16 columns) times
    the norm's weights: (pair (at, at + 2), pair (at + 1, at + 3), their fp32 sum, the sum
    of their squares before the norm's weights)."""
    xu = x_ptr.to(tl.pointer_type(tl.uint32))
    e = tl.load(xu + at // 2, mask=ok, other=0)
    o = tl.load(xu + at // 2 + 1, mask=ok, other=0)
    x0, x1 = halves_as_floats(e)  # nibble-free: fp16 halves, converted for free
    x2, x3 = halves_as_floats(o)
    squares = x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
    if HAS_NORM:
        nu = nw_ptr.to(tl.pointer_type(tl.uint32))
        n0, n1 = halves_as_floats(tl.load(nu + at // 2, mask=ok, other=0))
        n2, n3 = halves_as_floats(tl.load(nu + at // 2 + 1, mask=ok, other=0))
        if OFFSET != 0.0:  # x + 0.0 is an add of its own (-0.0 + 0.0 is +0.0)
            n0, n1, n2, n3 = n0 + OFFSET, n1 + OFFSET, n2 + OFFSET, n3 + OFFSET
        x0, x1, x2, x3 = x0 * n0, x1 * n1, x2 * n2, x3 * n3
    return _pack(x0, x2, EMULATE), _pack(x1, x3, EMULATE), (x0 + x1) + (x2 + x3), squares


@triton.jit
def _words(w_ptr, rows, row_ok, first, K: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_G: tl.constexpr):
    """The rows' words of BLOCK_G groups from group ``first``: four [BLOCK_G, 4, BLOCK_N]
    (a group's quarter c holds words 4c .. 4c + 3; the k-th of them)."""
    g = first + tl.arange(0, BLOCK_G)
    c = tl.arange(0, 4)
    k = tl.arange(0, 4)
    at = (g[:, None, None, None] * 16 + c[None, :, None, None] * 4
          + rows[None, None, :, None] * (K // 8) + k[None, None, None, :])
    ok = (g < K // 128)[:, None, None, None] & row_ok[None, None, :, None]
    tile = tl.load(w_ptr.to(tl.pointer_type(tl.uint32)) + at, mask=ok, other=0,
                   eviction_policy="evict_first")
    even, odd = tl.split(tl.reshape(tile, (BLOCK_G, 4, BLOCK_N, 2, 2)))
    w0, w2 = tl.split(even)
    w1, w3 = tl.split(odd)
    return w0, w1, w2, w3


@triton.jit
def _pairs(s_ptr, rows, row_ok, first, K: tl.constexpr, BLOCK_G: tl.constexpr):
    """The rows' (scale, offset) pairs of BLOCK_G groups, one 32-bit word each, repeated
    for a group's four quarters: [BLOCK_G, 4, BLOCK_N]."""
    g = first + tl.arange(0, BLOCK_G)
    quarter = tl.arange(0, 4)[None, :, None] * 0  # each quarter's thread loads its own
    at = g[:, None, None] + quarter + rows[None, None, :] * (K // 128)
    ok = (g < K // 128)[:, None, None] & row_ok[None, None, :]
    return tl.load(s_ptr.to(tl.pointer_type(tl.uint32)) + at, mask=ok, other=0)


@triton.jit
def _ahead(w_ptr, s_ptr, rows, row_ok, K: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_G: tl.constexpr):
    """(words, pairs) of the first two steps (the second the first again where one step
    covers K)."""
    tile = _words(w_ptr, rows, row_ok, 0, K, BLOCK_N, BLOCK_G)
    pairs = _pairs(s_ptr, rows, row_ok, 0, K, BLOCK_G)
    tile2, pairs2 = tile, pairs
    if BLOCK_G < K // 128:
        tile2 = _words(w_ptr, rows, row_ok, BLOCK_G, K, BLOCK_N, BLOCK_G)
        pairs2 = _pairs(s_ptr, rows, row_ok, BLOCK_G, K, BLOCK_G)
    return tile, pairs, tile2, pairs2


@triton.jit
def _step(acc, tile, pairs, x, EMULATE: tl.constexpr):
    """acc [BLOCK_G, 4, BLOCK_N] plus one step's scaled group sums (``x``: the step's
    pairs and sums from _x_step)."""
    w0, w1, w2, w3 = tile
    (a0, b0, a1, b1, a2, b2, a3, b3, c0, d0, c1, d1, c2, d2, c3, d3, x_sum) = x
    zero = tl.zeros(w0.shape, tl.float32) if EMULATE else tl.zeros_like(w0)
    low, high = _pair_dot(w0, a0[:, :, None], b0[:, :, None], c0[:, :, None],
                          d0[:, :, None], zero, zero, EMULATE)
    low, high = _pair_dot(w1, a1[:, :, None], b1[:, :, None], c1[:, :, None],
                          d1[:, :, None], low, high, EMULATE)
    low, high = _pair_dot(w2, a2[:, :, None], b2[:, :, None], c2[:, :, None],
                          d2[:, :, None], low, high, EMULATE)
    low, high = _pair_dot(w3, a3[:, :, None], b3[:, :, None], c3[:, :, None],
                          d3[:, :, None], low, high, EMULATE)
    scale, offset = halves_as_floats(pairs)
    return acc + scale * _flush(low, high, EMULATE) + (offset + 8.0 * scale) * x_sum[:, :, None]


@triton.jit
def _x_step(x_ptr, nw_ptr, first, K: tl.constexpr, BLOCK_G: tl.constexpr,
            OFFSET: tl.constexpr, HAS_NORM: tl.constexpr, EMULATE: tl.constexpr):
    """One step's x for every thread's quarter: its words' pairs (a, b low half; c, d
    high half; [BLOCK_G, 4] each), the quarter's x sum and squares."""
    g = first + tl.arange(0, BLOCK_G)
    c = tl.arange(0, 4)
    base = g[:, None] * 128 + c[None, :] * 16
    ok = (g < K // 128)[:, None] & (c >= 0)[None, :]
    a0, b0, s0, q0 = _x_word(x_ptr, nw_ptr, base, ok, OFFSET, HAS_NORM, EMULATE)
    a1, b1, s1, q1 = _x_word(x_ptr, nw_ptr, base + 4, ok, OFFSET, HAS_NORM, EMULATE)
    a2, b2, s2, q2 = _x_word(x_ptr, nw_ptr, base + 8, ok, OFFSET, HAS_NORM, EMULATE)
    a3, b3, s3, q3 = _x_word(x_ptr, nw_ptr, base + 12, ok, OFFSET, HAS_NORM, EMULATE)
    c0, d0, t0, r0 = _x_word(x_ptr, nw_ptr, base + 64, ok, OFFSET, HAS_NORM, EMULATE)
    c1, d1, t1, r1 = _x_word(x_ptr, nw_ptr, base + 68, ok, OFFSET, HAS_NORM, EMULATE)
    c2, d2, t2, r2 = _x_word(x_ptr, nw_ptr, base + 72, ok, OFFSET, HAS_NORM, EMULATE)
    c3, d3, t3, r3 = _x_word(x_ptr, nw_ptr, base + 76, ok, OFFSET, HAS_NORM, EMULATE)
    x_sum = ((s0 + s1) + (s2 + s3)) + ((t0 + t1) + (t2 + t3))
    squares = ((q0 + q1) + (q2 + q3)) + ((r0 + r1) + (r2 + r3))
    return (a0, b0, a1, b1, a2, b2, a3, b3, c0, d0, c1, d1, c2, d2, c3, d3, x_sum), squares


@triton.jit
def _sums(x_ptr, w_ptr, s_ptr, nw_ptr, rows, row_ok, ahead, OFFSET: tl.constexpr,
          K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
          HAS_NORM: tl.constexpr, EMULATE: tl.constexpr):
    """(each row's group sums [BLOCK_G, 4, BLOCK_N], not yet summed; x's squares
    [BLOCK_G, 4]) over K; ``ahead``: _ahead's first two steps' words and pairs, loaded
    by the caller (before its wait). Each step loads the words two steps on before its
    own sums."""
    groups: tl.constexpr = K // 128
    acc = tl.zeros((BLOCK_G, 4, BLOCK_N), dtype=tl.float32)
    squares = tl.zeros((BLOCK_G, 4), dtype=tl.float32)
    tile, pairs, tile2, pairs2 = ahead
    for first in tl.static_range(0, groups, BLOCK_G):
        here, here_pairs = tile, pairs
        tile, pairs = tile2, pairs2
        if first + 2 * BLOCK_G < groups:
            tile2 = _words(w_ptr, rows, row_ok, first + 2 * BLOCK_G, K, BLOCK_N, BLOCK_G)
            pairs2 = _pairs(s_ptr, rows, row_ok, first + 2 * BLOCK_G, K, BLOCK_G)
        x, step_squares = _x_step(x_ptr, nw_ptr, first, K, BLOCK_G, OFFSET, HAS_NORM,
                                 EMULATE)
        squares += step_squares
        acc = _step(acc, here, here_pairs, x, EMULATE)
    return acc, squares


@triton.jit
def int4_pairs_kernel(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                      EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                      K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                      ACT: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_G: tl.constexpr, GDC: tl.constexpr, ROT_ROWS: tl.constexpr,
                      HEAD_D: tl.constexpr, EMULATE: tl.constexpr):
    """reference.row_gemv over int4 rows (groups of 128), fp16 pairs, rows a thread."""
    rows = _program_rows(BLOCK_N, ROT_ROWS, HEAD_D)
    row_ok = rows < N
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    up_ptr = w_ptr + N * (K // 2)
    up_s_ptr = s_ptr + N * (K // 128) * 2
    ahead = _ahead(w_ptr, s_ptr, rows, row_ok, K, BLOCK_N, BLOCK_G)  # before the wait
    up_ahead = ahead
    if ACT != 0:
        up_ahead = _ahead(up_ptr, up_s_ptr, rows, row_ok, K, BLOCK_N, BLOCK_G)
    if GDC:
        tl.extra.cuda.gdc_wait()
    res = row_ok  # no residual: not read
    if HAS_RES:  # asked for with x, not after the sums
        res = tl.load(r_ptr + rows, mask=row_ok, other=0.0)
    acc, squares = _sums(x_ptr, w_ptr, s_ptr, nw_ptr, rows, row_ok, ahead, OFFSET, K,
                         BLOCK_N, BLOCK_G, HAS_NORM, EMULATE)
    up = tl.zeros((BLOCK_N, 1), dtype=tl.float32)
    if ACT != 0:
        up_acc, _ = _sums(x_ptr, up_ptr, up_s_ptr, nw_ptr, rows, row_ok, up_ahead, OFFSET,
                          K, BLOCK_N, BLOCK_G, HAS_NORM, EMULATE)
        up = tl.sum(tl.sum(up_acc, axis=0), axis=0)[:, None]
    zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = tl.sum(tl.sum(squares, axis=1), axis=0)
    y = _finish(tl.sum(tl.sum(acc, axis=0), axis=0), zero, up, zero + square_sum, b_ptr,
                r_ptr, s_ptr, cos_ptr, sin_ptr, rows, row_ok, EPS, N, K, HAS_BIAS, HAS_NORM,
                ACT, False, False, BLOCK_N, ROT_ROWS, HEAD_D)
    if HAS_RES:
        y += res.to(tl.float32)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


def pairs_config(rows: int, cols: int, block_n: int = 8) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_G, num_warps): 16 groups a step (a 2048-column row in one step), a
    thread a group quarter, so 2 warps hold every row of the program in each thread."""
    block_g = min(16, triton.next_power_of_2(cols // 128))
    return block_n, block_g, max(1, block_g * 4 // 32)


def launch_int4_pairs(x, packed, scales, bias, norm_weight, residual, eps: float,
                      offset: float, act: int, config: tuple | None = None,
                      pdl: bool = False, rotary_cos=None, rotary_sin=None,
                      rotary_rows: int = 0, head_dim: int = 0) -> torch.Tensor:
    """launch_int4_row_gemv's contract over fp16 rows with groups of 128; ``config``:
    (BLOCK_N, BLOCK_G, num_warps) (pairs_config's by default)."""
    cols = x.shape[-1]
    if (x.dtype != torch.float16 or scales.dtype != torch.float16
            or cols // scales.shape[1] != 128):
        raise ValueError("int4 pairs: fp16 x and rows with groups of 128 only")
    width = packed.shape[0] // 2 if act else packed.shape[0]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    block_n, block_g, warps = config or pairs_config(width, cols)
    block_n = rotary_block(block_n, rotary_rows)
    dummy = packed
    args = (x.reshape(cols), packed.contiguous(), scales.contiguous(),
            dummy if bias is None else bias, dummy if norm_weight is None else norm_weight,
            dummy if residual is None else residual.reshape(width).contiguous(),
            dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
            dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out)
    int4_pairs_kernel[(triton.cdiv(width, block_n),)](
        *args, EPS=eps, OFFSET=offset, N=width, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        BLOCK_N=block_n, BLOCK_G=block_g, GDC=pdl, ROT_ROWS=rotary_rows, HEAD_D=head_dim,
        EMULATE=os.environ.get("TRITON_INTERPRET") == "1", num_warps=warps, launch_pdl=pdl)
    return out
