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
decode_attention.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import (declare_writes, dependent_launch_here,
                                                   launcher, library_launches_dependent)


@triton.jit
def _activation(y, ACT: tl.constexpr):
    if ACT == 1:  # silu
        y = y / (1.0 + tl.exp(-y))
    elif ACT == 2:  # gelu (erf)
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 3:  # gelu (tanh)
        inner = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (2.0 / (1.0 + tl.exp(-2.0 * inner)))
    return y


@triton.jit
def _first_tiles(w_ptr, rows, row_ok, N: tl.constexpr, K: tl.constexpr,
                 ACT: tl.constexpr, AHEAD: tl.constexpr):
    """The rows' weights over the first AHEAD columns (and the up rows' N below), loaded
    before anything the step computed is read: no kernel of the step writes weights."""
    first = tl.arange(0, AHEAD)
    tile = rows[:, None] * K + first[None, :]
    ok = row_ok[:, None] & (first < K)[None, :]
    w_first = tl.load(w_ptr + tile, mask=ok, other=0.0, eviction_policy="evict_first")
    if ACT != 0:
        u_first = tl.load(w_ptr + N * K + tile, mask=ok, other=0.0,
                          eviction_policy="evict_first")
    else:
        u_first = w_first
    return w_first, u_first


@triton.jit
def _x_first(x_ptr, nw_ptr, OFFSET: tl.constexpr, K: tl.constexpr, HAS_NORM: tl.constexpr,
             AHEAD: tl.constexpr):
    """(x over the first AHEAD columns, times the norm's weight; their sum of x^2)."""
    first = tl.arange(0, AHEAD)
    first_ok = first < K
    x = tl.load(x_ptr + first, mask=first_ok, other=0.0).to(tl.float32)
    square_sum = tl.sum(x * x, axis=0)
    if HAS_NORM:  # the norm's scale is one number: applied to the sums at the end
        x = x * (tl.load(nw_ptr + first, mask=first_ok, other=0.0).to(tl.float32) + OFFSET)
    return x, square_sum


@triton.jit
def _dot_first(w_first, u_first, x, ACT: tl.constexpr):
    """(y, u) over the first columns: their weights against _x_first's x."""
    y = tl.sum(w_first.to(tl.float32) * x[None, :], axis=1)
    if ACT != 0:
        u = tl.sum(u_first.to(tl.float32) * x[None, :], axis=1)
    else:
        u = y
    return y, u


@triton.jit
def _first_sums(x_ptr, nw_ptr, w_first, u_first, OFFSET: tl.constexpr, K: tl.constexpr,
                HAS_NORM: tl.constexpr, ACT: tl.constexpr, AHEAD: tl.constexpr):
    """(y, u, the sum of x^2) over the first AHEAD columns, their weights loaded before."""
    x, square_sum = _x_first(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, AHEAD)
    y, u = _dot_first(w_first, u_first, x, ACT)
    return y, u, square_sum


@triton.jit
def _first_columns(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET: tl.constexpr,
                   N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                   HAS_NORM: tl.constexpr, ACT: tl.constexpr, AHEAD: tl.constexpr,
                   WAIT: tl.constexpr):
    """(y, u, each row's sum of x^2) over the first AHEAD columns: their weights first;
    with WAIT, the wait for the kernel before comes next, while it drains, and only then
    x (what the step computed)."""
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if AHEAD > 0:
        w_first, u_first = _first_tiles(w_ptr, rows, row_ok, N, K, ACT, AHEAD)
    if WAIT:
        tl.extra.cuda.gdc_wait()
    if AHEAD > 0:
        y, u_sums, squares = _first_sums(x_ptr, nw_ptr, w_first, u_first, OFFSET, K,
                                         HAS_NORM, ACT, AHEAD)
        square_sum += squares
        if ACT != 0:
            u = u_sums
    return y, u, square_sum


@triton.jit
def _column_sums(x_ptr, w_ptr, nw_ptr, rows, row_ok, OFFSET: tl.constexpr,
                 N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, HAS_NORM: tl.constexpr, ACT: tl.constexpr,
                 AHEAD: tl.constexpr, TILE_X: tl.constexpr):
    """(y, the up rows' products not yet summed, each row's sum of x^2) over the columns
    from AHEAD on, BLOCK_K at a time.
    TILE_X: x (and the norm's weight) read as a tile of the weights' shape, 8 columns a
    thread for both (int8 rows: 8-byte loads), so the two share one register layout.
    Read as a row, x is moved into the weights' layout through shared memory, behind a
    barrier, every block. Faster alone for some products, not in the step's chain of
    kernels: an option for the timing scripts, not a default."""
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if TILE_X:
        squares = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in tl.static_range(AHEAD, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        if TILE_X:
            cols = tl.max_contiguous(tl.multiple_of(cols, 8), 8)
        col_ok = cols < K
        if TILE_X:
            at = (rows * 0)[:, None] + cols[None, :]
            x_ok = (rows >= 0)[:, None] & col_ok[None, :]
        else:
            at = cols
            x_ok = col_ok
        # x before the weights, as the kernel always read them: with the weights' loads
        # first, the compiler's schedule made the unrolled gated and long products slower
        x = tl.load(x_ptr + at, mask=x_ok, other=0.0).to(tl.float32)
        if HAS_NORM:
            squares += x * x
            x = x * (tl.load(nw_ptr + at, mask=x_ok, other=0.0).to(tl.float32) + OFFSET)
        tile = rows[:, None] * K + cols[None, :]
        ok = row_ok[:, None] & col_ok[None, :]
        w = tl.load(w_ptr + tile, mask=ok, other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * (x if TILE_X else x[None, :])
        if ACT != 0:
            w2 = tl.load(w_ptr + N * K + tile, mask=ok, other=0.0,
                         eviction_policy="evict_first")
            up += w2.to(tl.float32) * (x if TILE_X else x[None, :])
    if TILE_X:  # each row of the tile summed the same squares
        square_sum = tl.sum(squares, axis=1)
    else:
        square_sum = tl.zeros((BLOCK_N,), dtype=tl.float32) + tl.sum(squares, axis=0)
    return tl.sum(acc, axis=1), up, square_sum


@triton.jit
def _finish(y, u, up, square_sum, b_ptr, r_ptr, s_ptr, cos_ptr, sin_ptr, rows, row_ok,
            EPS: tl.constexpr, N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
            HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
            HAS_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, ROT_ROWS: tl.constexpr,
            HEAD_D: tl.constexpr):
    """The sums' epilogue: int8 rows' scales, the norm's scale, bias, the gated
    activation, rotary embedding (rows below ROT_ROWS), the residual. The up rows'
    products ``up`` are summed only here, after y's epilogue: the compiler then keeps
    their loads in flight through the column loop instead of waiting on them every block
    (summed in the loop, gate/up took two thirds longer a call)."""
    if HAS_SCALE:  # int8 rows: one scale a row, applied to the sums
        y = y * tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    scale = tl.rsqrt(square_sum / K + EPS)
    if HAS_NORM:
        y = y * scale
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if ROT_ROWS > 0:
        y = _rotate_pairs(y, rows, cos_ptr, sin_ptr, BLOCK_N, ROT_ROWS, HEAD_D)
    if ACT != 0:
        u += tl.sum(up, axis=1)
        if HAS_SCALE:
            u = u * tl.load(s_ptr + N + rows, mask=row_ok, other=0.0).to(tl.float32)
        if HAS_NORM:
            u = u * scale
        if HAS_BIAS:
            u += tl.load(b_ptr + N + rows, mask=row_ok, other=0.0).to(tl.float32)
        y = _activation(y, ACT) * u
    if HAS_RES:
        y += tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    return y


@triton.jit
def _program_rows(BLOCK_N: tl.constexpr, ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    """The rows this program reduces: its block's (_block_rows)."""
    return _block_rows(tl.program_id(0), BLOCK_N, ROT_ROWS, HEAD_D)


@triton.jit
def _block_rows(block, BLOCK_N: tl.constexpr, ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    """The rows of a block: BLOCK_N in a row, or below ROT_ROWS (rotary embedding in the
    epilogue) pairs of rows half a head apart, (d, d + HEAD_D / 2), next to each other, so
    that each row's partner is in the same block."""
    idx = tl.arange(0, BLOCK_N)
    rows = block * BLOCK_N + idx
    if ROT_ROWS > 0:
        half: tl.constexpr = HEAD_D // 2
        low = block * (BLOCK_N // 2) + idx // 2  # the pair's first row, counted
        paired = (low // half) * HEAD_D + low % half + (idx % 2) * half  # over all heads
        rows = tl.where(rows < ROT_ROWS, paired, rows)
    return rows


@triton.jit
def _rotate_pairs(y, rows, cos_ptr, sin_ptr, BLOCK_N: tl.constexpr, ROT_ROWS: tl.constexpr,
                  HEAD_D: tl.constexpr):
    """``y * cos + rotate_half(y) * sin`` over the rows below ROT_ROWS, each row's
    partner next to it (_program_rows)."""
    first, second = tl.split(tl.reshape(y, (BLOCK_N // 2, 2)))
    partner = tl.reshape(tl.join(second, first), (BLOCK_N,))
    d = rows % HEAD_D
    cos = tl.load(cos_ptr + d).to(tl.float32)
    sin = tl.load(sin_ptr + d).to(tl.float32)
    turned = y * cos + tl.where(d < HEAD_D // 2, -partner, partner) * sin
    return tl.where(rows < ROT_ROWS, turned, y)


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


def gemv_config(rows: int, cols: int, gated: bool, dependent: bool = False,
                weight_bytes: int = 2, multiprocessors: int = 0) -> tuple:
    """(BLOCK_N, BLOCK_K, num_warps, AHEAD[, TILE_X, TURNS]): enough programs to keep
    every SM's loads in flight (several per SM), 16-byte loads along K (int8 rows: 1024
    columns a tile, and a gated product's pairs of rows two a program); a ``dependent``
    launch of a product that is not gated loads as many of a program's first columns
    ahead of its wait as fit in registers, a plain one none (AHEAD 0: the loop alone).
    A dependent gated product of 16-bit rows of at most 2,048 columns on a GPU of
    ``multiprocessors``: the row loop (row_loop_triton.row_loop_config)."""
    int8 = weight_bytes == 1
    if dependent and gated and weight_bytes == 2 and cols <= 2048 and multiprocessors:
        from targets.aoti.kernels.row_loop_triton import row_loop_config
        return row_loop_config(rows, cols, multiprocessors)
    block_k = min(1024 if int8 else 256 if rows >= 4096 else 512,
                  triton.next_power_of_2(cols))
    if rows <= 2048 and cols <= 2048:  # a small product: more, smaller programs
        block_n, warps = 2, 8
    elif int8 and gated:
        block_n, warps = 2, 4
    else:
        block_n, warps = 8, 4
        while block_n > 1 and rows // block_n < 512:
            block_n //= 2
    # a gated product loads nothing ahead: two rows' columns held ahead in registers
    # starve its loop of them, and it ran slower than the plain loop
    ahead = ahead_columns(block_n, cols, gated, warps) if dependent and not gated else 0
    return block_n, block_k, warps, ahead


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
                    rotary_rows: int = 0, head_dim: int = 0) -> torch.Tensor:
    """The op's kernel (reference.row_gemv's math); ``weight_scale``: int8 rows' scales;
    ``rotary_*``: the rotary embedding of the first ``rotary_rows`` rows, heads of
    ``head_dim``. ``config``: (BLOCK_N, BLOCK_K, num_warps, AHEAD[, TILE_X[, TURNS]])
    (gemv_config's); TURNS > 0: row_loop_triton's kernel, TURNS blocks a program."""
    width = weight.shape[0] // 2 if act else weight.shape[0]
    cols = weight.shape[1]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    gdc = dependent_launch_here(x.device) and (pdl or library_launches_dependent())
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if gdc else 0
    block_n, block_k, warps, ahead, *loop = config or gemv_config(
        width, cols, bool(act), gdc, weight.element_size(), sms)
    tile_x, turns = (*loop, False, 0)[:2]
    block_n = rotary_block(block_n, rotary_rows)
    blocks = triton.cdiv(width, block_n)
    if turns:  # a grid of fewer programs, each TURNS blocks in a strided loop
        from targets.aoti.kernels import row_loop_triton as loop_kernels
        kernels, grid = loop_kernels.KERNELS, triton.cdiv(blocks, turns)
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
