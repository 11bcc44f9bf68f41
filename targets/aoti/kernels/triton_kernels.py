"""The Triton kernels behind the decode-step ops (ops.py), and their launchers.

A batch-1 decode step streams the weights once: each kernel here reads its weight bytes
once, in 16-byte loads, with the small ops around a product (the RMSNorm before it, a
gated activation, a residual add after) done inside it instead of as small kernels of
their own. Shapes are compile-time constants (a decode step's are fixed), so the loops
have static bounds and the masks fold away where the block divides the size. So are the
float settings (eps, the norm's offset, the attention scale): AOTInductor passes a float
argument as fp64, which turned a norm's whole product into fp64 arithmetic
(docs/design-notes.md).

With ``GDC`` (``pdl=True``: Triton's own launcher starts it as a programmatic dependent
launch, Hopper and later) a kernel starts while the kernel before it drains: it loads what
no kernel of the step writes (weights, the cache's past rows) first, then waits
(``gdc_wait``) before it reads anything the step computed, and so before it writes, and
lets the kernel after it start early. Only the timing scripts and tests launch so: in a
built library the kernels run without it (AOTInductor's launcher sets no launch
attribute, and torch takes a kernel with Triton's wait instruction in it as writing every
argument, so AOTInductor copied each weight before each call; bench/RESULTS.md, session
60).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton


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
def row_gemv_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, s_ptr, out_ptr,
                    EPS: tl.constexpr, OFFSET: tl.constexpr,
                    N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                    HAS_NORM: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                    HAS_SCALE: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                    GDC: tl.constexpr, W_AHEAD: tl.constexpr, TILE_X: tl.constexpr = False):
    # rows of W this program reduces; a gated product also reads the rows N below them
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = 0.0
    if AHEAD > 0:
        # the first AHEAD columns of the weight rows: no kernel of the step writes
        # weights, so they are loaded before waiting for the kernel before, while it drains
        first = tl.arange(0, AHEAD)
        first_ok = first < K
        tile = rows[:, None] * K + first[None, :]
        ok = row_ok[:, None] & first_ok[None, :]
        w_first = tl.load(w_ptr + tile, mask=ok, other=0.0, eviction_policy="evict_first")
        if ACT != 0:
            u_first = tl.load(w_ptr + N * K + tile, mask=ok, other=0.0,
                              eviction_policy="evict_first")
        else:
            u_first = w_first
    if GDC and W_AHEAD:  # what the kernels before wrote (x, the residual) is read after
        tl.extra.cuda.gdc_wait()
    if AHEAD > 0:
        x = tl.load(x_ptr + first, mask=first_ok, other=0.0).to(tl.float32)
        square_sum = tl.sum(x * x, axis=0)
        if HAS_NORM:  # the norm's scale is one number: applied to the sums at the end
            x = x * (tl.load(nw_ptr + first, mask=first_ok, other=0.0).to(tl.float32) +
                     OFFSET)
        y = tl.sum(w_first.to(tl.float32) * x[None, :], axis=1)
        if ACT != 0:
            u = tl.sum(u_first.to(tl.float32) * x[None, :], axis=1)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if TILE_X:
        squares = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    # TILE_X: x (and the norm's weight) read as a tile of the weights' shape, 8 columns a
    # thread for both (int8 rows: 8-byte loads), so the two share one register layout.
    # Read as a row, x is moved into the weights' layout through shared memory, behind a
    # barrier, every block. Faster alone for some products, not in the step's chain of
    # kernels: an option for the timing scripts, not a default.
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
    y += tl.sum(acc, axis=1)
    if HAS_SCALE:  # int8 rows: one scale a row, applied to the sums
        y = y * tl.load(s_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if TILE_X:  # each row of the tile summed the same squares: a norm scale a row
        square_sum += tl.sum(squares, axis=1)
    else:
        square_sum += tl.sum(squares, axis=0)
    scale = tl.rsqrt(square_sum / K + EPS)
    if HAS_NORM:
        y = y * scale
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
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
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


# weight elements a thread holds while it waits for the kernel before (32 registers)
_AHEAD_PER_THREAD = 64


def gemv_config(rows: int, cols: int, gated: bool, dependent: bool = False,
                weight_bytes: int = 2) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, AHEAD): enough programs to keep every SM's loads in
    flight (several per SM), 16-byte loads along K (int8 rows: 1024 columns a tile, and
    a gated product's pairs of rows two a program, the fastest in session 61's sweep,
    bench/RESULTS.md); a ``dependent`` launch loads as many of a program's first columns
    ahead of its wait as fit in registers, a plain one none (AHEAD 0: the loop alone, the
    kernel as the built library runs it)."""
    int8 = weight_bytes == 1
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
    ahead = ahead_columns(block_n, cols, gated, warps) if dependent else 0
    return block_n, block_k, warps, ahead


def ahead_columns(block_n: int, cols: int, gated: bool, warps: int) -> int:
    """The widest power-of-two column span (at most ``cols``, at least 16) whose weights a
    program of ``warps`` warps can hold in registers."""
    fits = _AHEAD_PER_THREAD * 32 * warps // (block_n * (2 if gated else 1))
    ahead = 16
    while ahead * 2 <= min(fits, cols):
        ahead *= 2
    return ahead


def dependent_launch_here(device: torch.device) -> bool:
    """Whether kernels here may wait on the one before (griddepcontrol: Hopper and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _launcher(kernel, grid: tuple, pdl: bool):
    """``kernel`` on ``grid`` through wrap_triton (what torch.export and AOTInductor trace
    into), or with ``pdl`` through Triton's own launcher as a programmatic dependent
    launch (the timing scripts and tests)."""
    if pdl:
        return functools.partial(kernel[grid], launch_pdl=True)
    return wrap_triton(kernel)[grid]


def launch_row_gemv(x, weight, bias, norm_weight, residual, eps: float, offset: float,
                    act: int, config: tuple | None = None, pdl: bool = False,
                    weight_scale=None) -> torch.Tensor:
    """The op's kernel (reference.row_gemv's math); ``weight_scale``: int8 rows' scales.
    ``config``: (BLOCK_N, BLOCK_K, num_warps, AHEAD[, TILE_X]) (gemv_config's)."""
    width = weight.shape[0] // 2 if act else weight.shape[0]
    cols = weight.shape[1]
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    gdc = pdl and dependent_launch_here(x.device)
    block_n, block_k, warps, ahead, *loop = config or gemv_config(
        width, cols, bool(act), gdc, weight.element_size())
    tile_x = bool(loop and loop[0])
    row = x.reshape(cols)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    ahead_ok = weight.is_contiguous()  # else a copy the step makes: read after the wait
    _launcher(row_gemv_kernel, (triton.cdiv(width, block_n),), pdl)(
        row, weight.contiguous(), dummy if bias is None else bias,
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(width).contiguous(),
        dummy if weight_scale is None else weight_scale.reshape(-1), out,
        EPS=eps, OFFSET=offset, N=width, K=cols, HAS_BIAS=bias is not None,
        HAS_NORM=norm_weight is not None, ACT=act, HAS_RES=residual is not None,
        HAS_SCALE=weight_scale is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, GDC=gdc, W_AHEAD=ahead_ok,
        TILE_X=tile_x, num_warps=warps)
    return out


@triton.jit
def attention_split_kernel(q_ptr, pk_ptr, pv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                           sq_h, spk_h, spk_s, spv_h, spv_s, sm, SCALE: tl.constexpr,
                           S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                           SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                           BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
                           GDC: tl.constexpr, CACHE_AHEAD: tl.constexpr):
    """One key/value head's G query heads over BLOCK_S past slots: the block's max score,
    sum of exponentials and weighted values (flash-decoding's partial results).
    CACHE_AHEAD: the past rows are the cache's own (no copy the step made), so they are
    read before waiting for the kernel before."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    s = split * BLOCK_S + tl.arange(0, BLOCK_S)
    g_ok, d_ok, s_ok = g < G, d < D, s < S
    heads = kvh * G + g
    kv_ok = s_ok[:, None] & d_ok[None, :]
    if GDC and not CACHE_AHEAD:
        tl.extra.cuda.gdc_wait()
    k = tl.load(pk_ptr + kvh * spk_h + s[:, None] * spk_s + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(pv_ptr + kvh * spv_h + s[:, None] * spv_s + d[None, :], mask=kv_ok, other=0.0)
    if GDC and CACHE_AHEAD:
        tl.extra.cuda.gdc_wait()
    q = tl.load(q_ptr + heads[:, None] * sq_h + d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)
    if IEEE:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    added = tl.load(mask_ptr + s * sm, mask=s_ok, other=float("-inf")).to(tl.float32)
    scores = scores * SCALE + added[None, :]
    top = tl.maximum(tl.max(scores, axis=1), -1e30)  # a block of masked slots only: no NaN
    p = tl.exp(scores - top[:, None])
    total = tl.sum(p, axis=1)
    if IEEE:
        acc = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v)
    part = heads * SPLITS + split
    tl.store(m_ptr + part, top, mask=g_ok)
    tl.store(l_ptr + part, total, mask=g_ok)
    tl.store(acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=g_ok[:, None])


@triton.jit
def attention_combine_kernel(q_ptr, nk_ptr, nv_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
                             out_ptr, sq_h, snk_h, snv_h, sm, SCALE: tl.constexpr,
                             S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                             SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
                             BLOCK_D: tl.constexpr, GDC: tl.constexpr):
    """One query head: its partial results joined, with the new row's key and value."""
    if GDC:  # everything it reads is the step's own: nothing to load ahead
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    h = tl.program_id(0)
    kvh = h // G
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + h * sq_h + d, mask=d_ok, other=0.0).to(tl.float32)
    key = tl.load(nk_ptr + kvh * snk_h + d, mask=d_ok, other=0.0).to(tl.float32)
    value = tl.load(nv_ptr + kvh * snv_h + d, mask=d_ok, other=0.0).to(tl.float32)
    new = tl.sum(q * key, axis=0) * SCALE + tl.load(mask_ptr + S * sm).to(tl.float32)
    j = tl.arange(0, BLOCK_SPLITS)
    j_ok = j < SPLITS
    tops = tl.load(m_ptr + h * SPLITS + j, mask=j_ok, other=-1e30)
    sums = tl.load(l_ptr + h * SPLITS + j, mask=j_ok, other=0.0)
    accs = tl.load(acc_ptr + (h * SPLITS + j)[:, None] * BLOCK_D + d[None, :],
                   mask=j_ok[:, None], other=0.0)
    top = tl.maximum(tl.max(tops, axis=0), new)
    weights = tl.exp(tops - top)
    weight_new = tl.exp(new - top)
    total = tl.sum(sums * weights, axis=0) + weight_new
    out = (tl.sum(accs * weights[:, None], axis=0) + weight_new * value) / total
    tl.store(out_ptr + h * D + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def launch_decode_attention(query, past_k, new_k, past_v, new_v, mask, scale: float,
                            block_s: int | None = None, pdl: bool = False) -> torch.Tensor:
    heads, dim = query.shape[1], query.shape[-1]
    kv_heads, slots = past_k.shape[1], past_k.shape[2]
    groups = heads // kv_heads
    # 32 slots a program fill the GPU at a few hundred slots; longer caches take longer
    # blocks, so the join's partial results stay few
    block_s = block_s or (32 if slots <= 1024 else 64 if slots <= 4096 else 128)
    splits = triton.cdiv(slots, block_s)
    block_splits = max(2, triton.next_power_of_2(splits))
    block_d = max(16, triton.next_power_of_2(dim))
    # the past rows as the cache holds them (a copy would be made by the step itself)
    cache_ahead = past_k.stride(-1) == 1 and past_v.stride(-1) == 1
    query, past_k, past_v = (t if t.stride(-1) == 1 else t.contiguous()
                             for t in (query, past_k, past_v))
    new_k, new_v = (t if t.stride(-1) == 1 else t.contiguous() for t in (new_k, new_v))
    tops = torch.empty((heads * splits,), dtype=torch.float32, device=query.device)
    sums = torch.empty_like(tops)
    accs = torch.empty((heads * splits, block_d), dtype=torch.float32, device=query.device)
    out = torch.empty((1, heads, 1, dim), dtype=query.dtype, device=query.device)
    ieee = query.dtype == torch.float32
    gdc = pdl and dependent_launch_here(query.device)
    _launcher(attention_split_kernel, (kv_heads, splits), pdl)(
        query, past_k, past_v, mask, tops, sums, accs, query.stride(1),
        past_k.stride(1), past_k.stride(2), past_v.stride(1), past_v.stride(2),
        mask.stride(-1), SCALE=float(scale), S=slots, D=dim, G=groups, SPLITS=splits,
        BLOCK_S=block_s, BLOCK_G=max(16, triton.next_power_of_2(groups)), BLOCK_D=block_d,
        IEEE=ieee, GDC=gdc, CACHE_AHEAD=cache_ahead, num_warps=4)
    _launcher(attention_combine_kernel, (heads,), pdl)(
        query, new_k, new_v, mask, tops, sums, accs, out, query.stride(1),
        new_k.stride(1), new_v.stride(1), mask.stride(-1), SCALE=float(scale), S=slots,
        D=dim, G=groups, SPLITS=splits, BLOCK_SPLITS=block_splits, BLOCK_D=block_d,
        GDC=gdc, num_warps=min(8, max(1, block_splits * block_d // 1024)))
    return out
