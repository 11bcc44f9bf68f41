"""The pieces of the fp16 / int8 row kernels (triton_kernels.py's one block a program,
row_loop_triton.py's row loop), shared by int4_triton.py's epilogue: a block's rows, its
first columns of weights loaded ahead and summed against x, the column loop, and the
epilogue (norm, bias, gated activation, rotary rows, residual)."""

from __future__ import annotations

import triton
import triton.language as tl


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
def _x_by_words(x_ptr, nw_ptr, start, OFFSET: tl.constexpr, K: tl.constexpr,
                WIDTH: tl.constexpr, HAS_NORM: tl.constexpr):
    """x from column ``start`` as [WIDTH, 4] (x[start + 4j + k] at (j, k), one contiguous
    read), times the norm's weight; x^2 at (j, k) (before the weight)."""
    j = tl.arange(0, WIDTH)
    cols = start + 4 * j[:, None] + tl.arange(0, 4)[None, :]
    col_ok = cols < K
    x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    squares = x * x
    if HAS_NORM:
        x = x * (tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + OFFSET)
    return x, squares


@triton.jit
def _by_byte(t):
    """[WIDTH, 4] split in registers into its four columns, k = 0..3 (byte k of a word)."""
    low, high = tl.split(tl.reshape(t, (t.shape[0], 2, 2)))  # (4j + 2a) and (4j + 2a + 1)
    t0, t2 = tl.split(low)
    t1, t3 = tl.split(high)
    return t0, t1, t2, t3


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
