"""``row_gemv`` over int4 rows (int4_rows.py's format): the decode step's products at a
quarter of fp16's bytes, with the same folds as fp16 and int8 rows (the norm before,
bias, rotary, the gated activation, the residual: triton_kernels._finish).

A program reduces BLOCK_N rows, BLOCK_G groups a step: it loads a [BLOCK_N, BLOCK_G,
group/8] tile of 32-bit words (four bytes, eight weights each), multiplies the low
nibbles by the groups' first halves of x and the high ones by their second halves,
scales each group's sum and adds its offset times the group's sum of x. The kernel is
bound by its instructions, not by memory (Nsight Compute: issue slots 53-70% busy, DRAM
25-33%), so nibbles become floats two a mask (_nibble_pair), with no int-to-float
conversion. The ``_gdc`` form (a programmatic dependent launch) lets the next kernel
start at once, loads its first two tiles of weights and of their (scale, offset) pairs
and only then waits for the kernel before. After the wait,
everything it reads of the step (x, the residual) is asked for at once, before the first
barrier: a read issued after one costs the kernel a round trip of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.triton_kernels import _finish, _program_rows, rotary_block


@triton.jit
def _packed_tile(w_ptr, rows, row_ok, first, K: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_G: tl.constexpr):
    """The rows' packed bytes of BLOCK_G groups from group ``first``, as 32-bit words:
    [BLOCK_N, BLOCK_G, GROUP / 8] (a row's K / 2 bytes start where a word does: K is a
    multiple of the group, at least 8)."""
    width: tl.constexpr = GROUP // 8
    g = first + tl.arange(0, BLOCK_G)
    j = tl.arange(0, width)
    tile = rows[:, None, None] * (K // 8) + g[None, :, None] * width + j[None, None, :]
    ok = row_ok[:, None, None] & (g < K // GROUP)[None, :, None] & (j >= 0)[None, None, :]
    return tl.load(w_ptr.to(tl.pointer_type(tl.uint32)) + tile, mask=ok, other=0,
                   eviction_policy="evict_first")


@triton.jit
def _scale_pairs(s_ptr, rows, row_ok, first, K: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_G: tl.constexpr):
    """The rows' (scale, offset) pairs of BLOCK_G groups from group ``first``: [BLOCK_N,
    BLOCK_G, 2]."""
    groups: tl.constexpr = K // GROUP
    g = first + tl.arange(0, BLOCK_G)
    pair = ((rows[:, None, None] * groups + g[None, :, None]) * 2
            + tl.arange(0, 2)[None, None, :])
    ok = row_ok[:, None, None] & (g < groups)[None, :, None]
    return tl.load(s_ptr + pair, mask=ok, other=0.0)


@triton.jit
def _first_tiles(w_ptr, s_ptr, rows, row_ok, K: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_G: tl.constexpr):
    """The rows' first two tiles of bytes and of (scale, offset) pairs (the second the
    first again where one step covers K)."""
    first = _packed_tile(w_ptr, rows, row_ok, 0, K, GROUP, BLOCK_G)
    pairs = _scale_pairs(s_ptr, rows, row_ok, 0, K, GROUP, BLOCK_G)
    second = first
    pairs2 = pairs
    if BLOCK_G < K // GROUP:
        second = _packed_tile(w_ptr, rows, row_ok, BLOCK_G, K, GROUP, BLOCK_G)
        pairs2 = _scale_pairs(s_ptr, rows, row_ok, BLOCK_G, K, GROUP, BLOCK_G)
    return first, second, pairs, pairs2


@triton.jit
def _x_tile(x_ptr, nw_ptr, first, K: tl.constexpr, GROUP: tl.constexpr,
            BLOCK_G: tl.constexpr, HAS_NORM: tl.constexpr):
    """x's first and second halves of BLOCK_G groups from group ``first`` ([BLOCK_G,
    GROUP / 2] each), and the norm's weights over them (x again without a norm)."""
    half: tl.constexpr = GROUP // 2
    g = first + tl.arange(0, BLOCK_G)
    at = g[:, None] * GROUP + tl.arange(0, half)[None, :]
    ok = (g < K // GROUP)[:, None] & (at >= 0)
    x_low = tl.load(x_ptr + at, mask=ok, other=0.0)
    x_high = tl.load(x_ptr + at + half, mask=ok, other=0.0)
    nw_low, nw_high = x_low, x_high
    if HAS_NORM:
        nw_low = tl.load(nw_ptr + at, mask=ok, other=0.0)
        nw_high = tl.load(nw_ptr + at + half, mask=ok, other=0.0)
    return x_low, x_high, nw_low, nw_high


@triton.jit
def halves_as_floats(pair):
    """(the low 16-bit half, the high one) of each 32-bit word as the fp16 it holds, in
    fp32 (the conversion picks an operand's half for free: no shift). A half holding an
    integer q below 1024 alone is the fp16 subnormal q x 2^-24: so one mask turns two
    integers into floats, with no int-to-float conversion."""
    low = pair.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    high = (pair >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return low, high


@triton.jit
def _nibble_pair(words, SHIFT: tl.constexpr):
    """(the nibble at bit SHIFT, the one at bit SHIFT + 16) of each 32-bit word, times
    2^-24, in fp32."""
    return halves_as_floats((words >> SHIFT) & 0x000F000F)


@triton.jit
def _word_nibbles(words):
    """(l0, l1, l2, l3, h0, h1, h2, h3): byte b's low nibble lb (a first-half weight)
    and high one hb (the second half's) of each word, x 2^-24."""
    l0, l2 = _nibble_pair(words, 0)
    h0, h2 = _nibble_pair(words, 4)
    l1, l3 = _nibble_pair(words, 8)
    h1, h3 = _nibble_pair(words, 12)
    return l0, l1, l2, l3, h0, h1, h2, h3


@triton.jit
def _quarters(x, BLOCK_G: tl.constexpr, GROUP: tl.constexpr):
    """x [BLOCK_G, GROUP / 2] as four [BLOCK_G, GROUP / 8]: its columns 4w, 4w + 1, 4w + 2,
    4w + 3 (a word's four bytes)."""
    pairs = tl.reshape(x, (BLOCK_G, GROUP // 8, 2, 2))
    even, odd = tl.split(pairs)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _split_x_dot(words, x_low, x_high, BLOCK_G: tl.constexpr, GROUP: tl.constexpr):
    """Each row's sum over a group of nibble x 2^-24 times x, [BLOCK_N, BLOCK_G], with x
    split into a word's four byte columns (a chain of FMAs a word). A word's low nibbles
    are its bytes' first-half weights (x_low), its high ones the second half's."""
    l0, l1, l2, l3, h0, h1, h2, h3 = _word_nibbles(words)
    xl0, xl1, xl2, xl3 = _quarters(x_low, BLOCK_G, GROUP)
    xh0, xh1, xh2, xh3 = _quarters(x_high, BLOCK_G, GROUP)
    p = (l0 * xl0[None, :, :] + l1 * xl1[None, :, :] + l2 * xl2[None, :, :]
         + l3 * xl3[None, :, :] + h0 * xh0[None, :, :] + h1 * xh1[None, :, :]
         + h2 * xh2[None, :, :] + h3 * xh3[None, :, :])
    return tl.sum(p, axis=2)


@triton.jit
def _joined_dot(words, x_low, x_high, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                GROUP: tl.constexpr):
    """_split_x_dot with the nibbles joined back into the bytes' order instead, x as
    loaded (two sums: each a chain of FMAs within a thread)."""
    l0, l1, l2, l3, h0, h1, h2, h3 = _word_nibbles(words)
    shape: tl.constexpr = (BLOCK_N, BLOCK_G, GROUP // 2)  # join's last axis: b = 0, 1, 2, 3
    low = tl.reshape(tl.join(tl.join(l0, l2), tl.join(l1, l3)), shape)
    high = tl.reshape(tl.join(tl.join(h0, h2), tl.join(h1, h3)), shape)
    return tl.sum(low * x_low[None, :, :], axis=2) + tl.sum(high * x_high[None, :, :], axis=2)


@triton.jit
def _group_sums(x_ptr, w_ptr, s_ptr, nw_ptr, rows, row_ok, ahead, ahead2, pairs, pairs2,
                OFFSET: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_NORM: tl.constexpr,
                SPLIT_X: tl.constexpr):
    """(each row's scaled group sums, a [BLOCK_N, BLOCK_G] tile not yet summed; the sum of
    x^2, a scalar) over all K columns of the rows at ``w_ptr``/``s_ptr``; ``ahead``,
    ``ahead2``, ``pairs``, ``pairs2``: their first two tiles of bytes and of (scale,
    offset) pairs, loaded by the caller (a dependent launch: before its wait). Each step
    loads the tiles two steps on, and x one step on, before its own sums: a step's x moves
    between layouts through shared memory (a barrier), and a load issued after that
    barrier would leave one tile a thread in flight, or wait a round trip for x."""
    groups: tl.constexpr = K // GROUP
    acc = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    squares = tl.zeros((BLOCK_G, GROUP // 2), dtype=tl.float32)
    x_next = _x_tile(x_ptr, nw_ptr, 0, K, GROUP, BLOCK_G, HAS_NORM)
    for first in tl.static_range(0, groups, BLOCK_G):
        x_low, x_high, nw_low, nw_high = x_next
        if first + BLOCK_G < groups:
            x_next = _x_tile(x_ptr, nw_ptr, first + BLOCK_G, K, GROUP, BLOCK_G, HAS_NORM)
        x_low = x_low.to(tl.float32)
        x_high = x_high.to(tl.float32)
        if HAS_NORM:
            squares += x_low * x_low + x_high * x_high
            x_low = x_low * (nw_low.to(tl.float32) + OFFSET)
            x_high = x_high * (nw_high.to(tl.float32) + OFFSET)
        x_sum = tl.sum(x_low + x_high, axis=1)
        packed = ahead
        scale, offset = tl.split(pairs.to(tl.float32))
        ahead = ahead2
        pairs = pairs2
        if first + 2 * BLOCK_G < groups:
            ahead2 = _packed_tile(w_ptr, rows, row_ok, first + 2 * BLOCK_G, K, GROUP, BLOCK_G)
            pairs2 = _scale_pairs(s_ptr, rows, row_ok, first + 2 * BLOCK_G, K, GROUP,
                                  BLOCK_G)
        if SPLIT_X:
            dot = _split_x_dot(packed, x_low, x_high, BLOCK_G, GROUP)
        else:
            dot = _joined_dot(packed, x_low, x_high, BLOCK_N, BLOCK_G, GROUP)
        acc += dot * (scale * 16777216.0) + offset * x_sum[None, :]  # nibbles came x 2^-24
    return acc, tl.sum(tl.sum(squares, axis=1), axis=0)


@triton.jit
def _int4_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                   EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                   K: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, GDC: tl.constexpr,
                   ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr, SPLIT_X: tl.constexpr):
    rows = _program_rows(BLOCK_N, ROT_ROWS, HEAD_D)
    row_ok = rows < N
    up_ptr = w_ptr + N * (K // 2)  # a gated product's up rows: N rows below the gate's
    if GDC:  # the next kernel may start at once
        tl.extra.cuda.gdc_launch_dependents()
    # no kernel of the step writes weights: their first bytes are loaded before the wait
    up_s_ptr = s_ptr + N * (K // GROUP) * 2
    ahead, ahead2, pairs, pairs2 = _first_tiles(w_ptr, s_ptr, rows, row_ok, K, GROUP,
                                                BLOCK_G)
    up_ahead, up_ahead2, up_pairs, up_pairs2 = ahead, ahead2, pairs, pairs2
    if ACT != 0:
        up_ahead, up_ahead2, up_pairs, up_pairs2 = _first_tiles(up_ptr, up_s_ptr, rows,
                                                                row_ok, K, GROUP, BLOCK_G)
    if GDC:
        tl.extra.cuda.gdc_wait()
    res = row_ok  # no residual: not read
    if HAS_RES:  # loaded with x, not after the sums: no round trip of its own at the end
        res = tl.load(r_ptr + rows, mask=row_ok, other=0.0)
    acc, square_sum = _group_sums(x_ptr, w_ptr, s_ptr, nw_ptr, rows, row_ok, ahead, ahead2,
                                  pairs, pairs2, OFFSET, K, GROUP, BLOCK_N, BLOCK_G, HAS_NORM,
                                  SPLIT_X)
    up = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    if ACT != 0:
        up, _ = _group_sums(x_ptr, up_ptr, up_s_ptr, nw_ptr, rows, row_ok, up_ahead,
                            up_ahead2, up_pairs, up_pairs2, OFFSET, K, GROUP, BLOCK_N,
                            BLOCK_G, HAS_NORM, SPLIT_X)
    zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
    y = _finish(tl.sum(acc, axis=1), zero, up, zero + square_sum, b_ptr, r_ptr, s_ptr,
                cos_ptr, sin_ptr, rows, row_ok, EPS, N, K, HAS_BIAS, HAS_NORM, ACT,
                False, False, BLOCK_N, ROT_ROWS, HEAD_D)
    if HAS_RES:
        y += res.to(tl.float32)
    return rows, y


@triton.jit
def int4_row_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                         out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                         N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                         HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                         HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_G: tl.constexpr, ROT_ROWS: tl.constexpr,
                         HEAD_D: tl.constexpr, SPLIT_X: tl.constexpr):
    """reference.row_gemv over int4 rows, started as a plain launch."""
    rows, y = _int4_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             EPS, OFFSET, N, K, GROUP, HAS_BIAS, HAS_NORM, ACT, HAS_RES,
                             BLOCK_N, BLOCK_G, False, ROT_ROWS, HEAD_D, SPLIT_X)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def int4_row_gemv_kernel_gdc(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                             N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                             HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                             ACT: tl.constexpr, HAS_RES: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                             ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr,
                             SPLIT_X: tl.constexpr):
    """reference.row_gemv over int4 rows as a programmatic dependent launch."""
    rows, y = _int4_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             EPS, OFFSET, N, K, GROUP, HAS_BIAS, HAS_NORM, ACT, HAS_RES,
                             BLOCK_N, BLOCK_G, True, ROT_ROWS, HEAD_D, SPLIT_X)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


declare_writes(int4_row_gemv_kernel_gdc, "out_ptr")

# bytes of weights a program's thread holds a step: 16-byte loads
_BYTES_PER_THREAD = 16


def int4_config(rows: int, cols: int, group: int,
                gated: bool) -> tuple[int, int, int, bool]:
    """(BLOCK_N, BLOCK_G, num_warps, SPLIT_X): threads that each load 16 bytes a step,
    BLOCK_N rows (fewer where the product has few rows, so every SM gets programs). Long
    rows (a down projection) take twice the groups a step at 8 warps, and a head's many
    rows 8 rows a program: the fastest of bench/int4_rows_cuda.py's sweep for those
    shapes. x split into a word's byte columns for a gated product, the nibbles joined
    into the bytes' order for the others: each the faster as a dependent launch."""
    warps = 8 if cols >= 4096 and rows < 16384 else 4
    block_n = 8 if rows >= 16384 else 4 if rows >= 2048 else 2
    return block_n, groups_a_step(block_n, warps, cols, group), warps, gated


def groups_a_step(block_n: int, warps: int, cols: int, group: int) -> int:
    """BLOCK_G for ``block_n`` rows of ``cols`` columns in groups of ``group``, a program
    of ``warps`` warps: each thread loads 16 bytes of weights a step."""
    tile = _BYTES_PER_THREAD * 32 * warps  # bytes a step
    block_g = max(1, tile // (block_n * group // 2))
    return min(block_g, triton.next_power_of_2(cols // group))


def launch_int4_row_gemv(x, packed, scales, bias, norm_weight, residual, eps: float,
                         offset: float, act: int, config: tuple | None = None,
                         pdl: bool = False, rotary_cos=None, rotary_sin=None,
                         rotary_rows: int = 0, head_dim: int = 0) -> torch.Tensor:
    """The op's kernel over int4 rows (``packed`` [rows, K/2], ``scales`` [rows, K/group,
    2]); ``config``: (BLOCK_N, BLOCK_G, num_warps[, SPLIT_X]) (int4_config's; without
    SPLIT_X, int4_config's for the product); the rest as triton_kernels.launch_row_gemv."""
    cols = x.shape[-1]
    group = cols // scales.shape[1]
    width = packed.shape[0] // 2 if act else packed.shape[0]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    launch, _ = launcher(int4_row_gemv_kernel, int4_row_gemv_kernel_gdc, x.device, pdl)
    default = int4_config(width, cols, group, bool(act))
    block_n, block_g, warps, *split_x = config or default
    block_n = rotary_block(block_n, rotary_rows)
    dummy = packed  # an unused pointer argument (its branch is compiled out)
    launch((triton.cdiv(width, block_n),))(
        x.reshape(cols), packed.contiguous(), scales.contiguous(),
        dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, GROUP=group,
        HAS_BIAS=bias is not None, HAS_NORM=norm_weight is not None, ACT=act,
        HAS_RES=residual is not None, BLOCK_N=block_n, BLOCK_G=block_g,
        ROT_ROWS=rotary_rows, HEAD_D=head_dim,
        SPLIT_X=bool(split_x[0] if split_x else default[3]),
        num_warps=warps)
    return out
