"""``row_gemv`` over int4 rows (int4_rows.py's format): the decode step's products at a
quarter of fp16's bytes, with the same folds as fp16 and int8 rows (the norm before,
bias, rotary, the gated activation, the residual: triton_kernels._finish).

A program reduces BLOCK_N rows, BLOCK_G groups a step: it loads a [BLOCK_N, BLOCK_G,
group/2] tile of bytes (two weights each), multiplies the low nibbles by the groups'
first halves of x and the high ones by their second halves, scales each group's sum and
adds its offset times the group's sum of x. The ``_gdc`` form (a programmatic dependent
launch) lets the next kernel start at once, loads its first two tiles of weights and of
their (scale, offset) pairs and only then waits for the kernel before. After the wait,
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
    """The rows' packed bytes of BLOCK_G groups from group ``first``: [BLOCK_N, BLOCK_G,
    GROUP / 2]."""
    half: tl.constexpr = GROUP // 2
    g = first + tl.arange(0, BLOCK_G)
    j = tl.arange(0, half)
    tile = rows[:, None, None] * (K // 2) + g[None, :, None] * half + j[None, None, :]
    ok = row_ok[:, None, None] & (g < K // GROUP)[None, :, None] & (j >= 0)[None, None, :]
    return tl.load(w_ptr + tile, mask=ok, other=0, eviction_policy="evict_first")


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
def _group_sums(x_ptr, w_ptr, s_ptr, nw_ptr, rows, row_ok, ahead, ahead2, pairs, pairs2,
                OFFSET: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, HAS_NORM: tl.constexpr):
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
        packed = ahead.to(tl.int32)
        scale, offset = tl.split(pairs.to(tl.float32))
        ahead = ahead2
        pairs = pairs2
        if first + 2 * BLOCK_G < groups:
            ahead2 = _packed_tile(w_ptr, rows, row_ok, first + 2 * BLOCK_G, K, GROUP, BLOCK_G)
            pairs2 = _scale_pairs(s_ptr, rows, row_ok, first + 2 * BLOCK_G, K, GROUP,
                                  BLOCK_G)
        low = (packed & 15).to(tl.float32)
        high = (packed >> 4).to(tl.float32)
        dot = tl.sum(low * x_low[None, :, :] + high * x_high[None, :, :], axis=2)
        acc += dot * scale + offset * x_sum[None, :]
    return acc, tl.sum(tl.sum(squares, axis=1), axis=0)


@triton.jit
def _int4_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                   EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                   K: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, GDC: tl.constexpr,
                   ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
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
                                  pairs, pairs2, OFFSET, K, GROUP, BLOCK_N, BLOCK_G, HAS_NORM)
    up = tl.zeros((BLOCK_N, BLOCK_G), dtype=tl.float32)
    if ACT != 0:
        up, _ = _group_sums(x_ptr, up_ptr, up_s_ptr, nw_ptr, rows, row_ok, up_ahead,
                            up_ahead2, up_pairs, up_pairs2, OFFSET, K, GROUP, BLOCK_N,
                            BLOCK_G, HAS_NORM)
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
                         HEAD_D: tl.constexpr):
    """reference.row_gemv over int4 rows, started as a plain launch."""
    rows, y = _int4_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             EPS, OFFSET, N, K, GROUP, HAS_BIAS, HAS_NORM, ACT, HAS_RES,
                             BLOCK_N, BLOCK_G, False, ROT_ROWS, HEAD_D)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def int4_row_gemv_kernel_gdc(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             out_ptr, EPS: tl.constexpr, OFFSET: tl.constexpr,
                             N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                             HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
                             ACT: tl.constexpr, HAS_RES: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                             ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    """reference.row_gemv over int4 rows as a programmatic dependent launch."""
    rows, y = _int4_row_gemv(x_ptr, w_ptr, s_ptr, b_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr,
                             EPS, OFFSET, N, K, GROUP, HAS_BIAS, HAS_NORM, ACT, HAS_RES,
                             BLOCK_N, BLOCK_G, True, ROT_ROWS, HEAD_D)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


declare_writes(int4_row_gemv_kernel_gdc, "out_ptr")

# bytes of weights a program's thread holds a step: 16-byte loads
_BYTES_PER_THREAD = 16


def int4_config(rows: int, cols: int, group: int, gated: bool) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_G, num_warps): threads that each load 16 bytes a step, BLOCK_N rows
    (fewer where the product has few rows, so every SM gets programs). Long rows (a down
    projection) take twice the groups a step at 8 warps, and a head's many rows 8 rows a
    program: the fastest of bench/int4_rows_cuda.py's sweep for those shapes."""
    warps = 8 if cols >= 4096 and rows < 16384 else 4
    block_n = 8 if rows >= 16384 else 4 if rows >= 2048 else 2
    tile = _BYTES_PER_THREAD * 32 * warps  # bytes a step
    block_g = max(1, tile // (block_n * group // 2))
    block_g = min(block_g, triton.next_power_of_2(cols // group))
    return block_n, block_g, warps


def launch_int4_row_gemv(x, packed, scales, bias, norm_weight, residual, eps: float,
                         offset: float, act: int, config: tuple | None = None,
                         pdl: bool = False, rotary_cos=None, rotary_sin=None,
                         rotary_rows: int = 0, head_dim: int = 0) -> torch.Tensor:
    """The op's kernel over int4 rows (``packed`` [rows, K/2], ``scales`` [rows, K/group,
    2]); the rest as triton_kernels.launch_row_gemv."""
    cols = x.shape[-1]
    group = cols // scales.shape[1]
    width = packed.shape[0] // 2 if act else packed.shape[0]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    launch, _ = launcher(int4_row_gemv_kernel, int4_row_gemv_kernel_gdc, x.device, pdl)
    block_n, block_g, warps = config or int4_config(width, cols, group, bool(act))
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
        ROT_ROWS=rotary_rows, HEAD_D=head_dim, num_warps=warps)
    return out
