"""``row_gemv`` split along K, for int8 rows too long to hold ahead of a dependent
launch's wait (the ~1.1B's down: 2,048 rows of 5,632 columns; gemv_config chooses it,
split_config's shape). SPLIT programs share a block of rows, each over one part of the
columns; each stores its part's sums, counts itself in on the block's int32 counter, and
the last of them to count in joins the parts (added in part order, so the result does
not depend on which program joins), does the epilogue (int8 rows' scales, bias, the
residual: row_parts._finish) and the one store, and sets the counter back to zero, so
one buffer of counters serves every layer and every call (decode_attention.py's join;
the pass gives the step one buffer for both, passes/decode_kernels.py).

No norm, no gated activation, no rotary rows: a norm's scale needs the whole row of x,
and down and o have none. reference.row_gemv's math otherwise; int8 rows take their
scale a row (HAS_SCALE). The ``_gdc`` form (a programmatic dependent launch) loads its
part's first AHEAD columns of weights before it waits; with AHEAD at least the part's
width, a program's whole share of the weights is in flight before the wait.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from targets.aoti.kernels.dependent_launch import declare_writes, launcher
from targets.aoti.kernels.row_parts import _finish

# the one-block kernel's program (4 rows, 4 warps): the most columns of a row it loads
# ahead of its wait (4 rows x 2,048 bytes: 16 registers a thread); longer rows split
_MOST_AHEAD = 2048
# a split program: 8 rows, 4 warps, parts of 512 columns, each part's whole width loaded
# ahead of the wait (8 rows x 512 bytes: 8 registers a thread)
_BLOCK_N, _WARPS, _PART = 8, 4, 512


def split_config(cols: int) -> tuple:
    """(BLOCK_N, BLOCK_K, num_warps, AHEAD, SPLIT) for int8 rows of ``cols`` columns:
    parts of 512 columns (the last one masked), a power of two, so no part loads masked
    columns it does not hold (a part of 1,408 as one 2,048-column tile converted 45% more
    weights than it held); 8 rows a program share each column's x."""
    part = min(_PART, triton.next_power_of_2(cols))
    return _BLOCK_N, part, _WARPS, part, triton.cdiv(cols, part)


def longer_than_ahead(cols: int) -> bool:
    """Whether a program of the one-block kernel (4 rows, 4 warps) cannot hold a whole
    row ahead of its wait: where splitting along K pays."""
    return cols > _MOST_AHEAD


@triton.jit
def _part_sums(x_ptr, w_ptr, rows, row_ok, lo, K: tl.constexpr, PART: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
               WAIT: tl.constexpr):
    """Each row's sum over the columns lo .. lo + PART: the first AHEAD columns' weights
    loaded first (then, with WAIT, the wait for the kernel before), the rest BLOCK_K at a
    time."""
    first = tl.arange(0, AHEAD)
    first_ok = (first < PART) & (lo + first < K)
    w_first = tl.load(w_ptr + rows[:, None] * K + lo + first[None, :],
                      mask=row_ok[:, None] & first_ok[None, :], other=0.0,
                      eviction_policy="evict_first")
    if WAIT:
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + lo + first, mask=first_ok, other=0.0).to(tl.float32)
    y = tl.sum(w_first.to(tl.float32) * x[None, :], axis=1)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in tl.static_range(AHEAD, PART, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = (cols < PART) & (lo + cols < K)
        x = tl.load(x_ptr + lo + cols, mask=col_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * K + lo + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0,
                    eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
    return y + tl.sum(acc, axis=1)


@triton.jit
def _split_gemv(x_ptr, w_ptr, b_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr,
                N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr, SPLIT: tl.constexpr,
                PART: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                AHEAD: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr):
    # a block's parts are neighbours in the grid: they finish close together
    block = tl.program_id(0) // SPLIT
    part = tl.program_id(0) % SPLIT
    idx = tl.arange(0, BLOCK_N)
    rows = block * BLOCK_N + idx
    row_ok = rows < N
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    y = _part_sums(x_ptr, w_ptr, rows, row_ok, part * PART, K, PART, BLOCK_N, BLOCK_K,
                   AHEAD, GDC and W_AHEAD)
    tl.store(part_ptr + tl.program_id(0) * BLOCK_N + idx, y)
    # every thread's stores before the count: the release below then covers them
    tl.debug_barrier()
    seen = tl.atomic_add(counts_ptr + block, 1, sem="acq_rel", scope="gpu")
    if seen == SPLIT - 1:
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for i in tl.static_range(SPLIT):  # in part order, whoever joins
            # .cg: other programs wrote them; read past this SM's L1
            total += tl.load(part_ptr + (block * SPLIT + i) * BLOCK_N + idx,
                             cache_modifier=".cg")
        zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
        total = _finish(total, zeros, zeros[:, None], zeros, b_ptr, r_ptr, s_ptr, b_ptr,
                        b_ptr, rows, row_ok, 1.0, N, K, HAS_BIAS, False, 0, HAS_RES,
                        HAS_SCALE, BLOCK_N, 0, 0)
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_ok)
        # every part of this block counted in: the next layer or call starts at zero
        tl.store(counts_ptr + block, 0)


@triton.jit
def split_gemv_kernel(x_ptr, w_ptr, b_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr,
                      N: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_RES: tl.constexpr, HAS_SCALE: tl.constexpr, SPLIT: tl.constexpr,
                      PART: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      AHEAD: tl.constexpr):
    """row_gemv split along K, started as a plain launch."""
    _split_gemv(x_ptr, w_ptr, b_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr, N, K,
                HAS_BIAS, HAS_RES, HAS_SCALE, SPLIT, PART, BLOCK_N, BLOCK_K, AHEAD, False,
                False)


@triton.jit
def split_gemv_kernel_gdc(x_ptr, w_ptr, b_ptr, r_ptr, s_ptr, part_ptr, counts_ptr,
                          out_ptr, N: tl.constexpr, K: tl.constexpr,
                          HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                          HAS_SCALE: tl.constexpr, SPLIT: tl.constexpr,
                          PART: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                          W_AHEAD: tl.constexpr):
    """The same as a programmatic dependent launch (W_AHEAD: its part's first AHEAD
    columns of weights before the wait)."""
    _split_gemv(x_ptr, w_ptr, b_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr, N, K,
                HAS_BIAS, HAS_RES, HAS_SCALE, SPLIT, PART, BLOCK_N, BLOCK_K, AHEAD, True,
                W_AHEAD)


# not counts_ptr: the kernel leaves it at zero (as decode_attention.py's join)
declare_writes(split_gemv_kernel_gdc, "part_ptr", "out_ptr")


def split_counters(weight: torch.Tensor, config: tuple | None = None) -> torch.Tensor:
    """The zeroed int32 counters (one a block of rows) a launch of ``config`` takes."""
    block_n = (config or split_config(weight.shape[1]))[0]
    return torch.zeros(triton.cdiv(weight.shape[0], block_n), dtype=torch.int32,
                       device=weight.device)


def launch_split_gemv(x, weight, bias, residual, counts, config: tuple | None = None,
                      pdl: bool = False, weight_scale=None) -> torch.Tensor:
    """reference.row_gemv(x, weight, bias, None, residual, ..., act=0, weight_scale)
    split along K. ``counts``: int32 zeros, at least one a block (split_counters), left
    at zero; ``config``: (BLOCK_N, BLOCK_K, num_warps, AHEAD, SPLIT), AHEAD and BLOCK_K
    powers of two (AHEAD at least 16); by default split_config's."""
    rows, cols = weight.shape
    block_n, block_k, warps, ahead, split = config or split_config(cols)
    blocks = triton.cdiv(rows, block_n)
    if counts is None or counts.dtype != torch.int32 or counts.numel() < blocks:
        got = "none" if counts is None else f"{counts.numel()} {counts.dtype}"
        raise ValueError(f"counts: {blocks} int32 zeros needed (split_counters), got {got}")
    part = triton.cdiv(cols, split)
    out = torch.empty((*x.shape[:-1], rows), dtype=x.dtype, device=x.device)
    partials = torch.empty(blocks * split * block_n, dtype=torch.float32, device=x.device)
    launch, gdc = launcher(split_gemv_kernel, split_gemv_kernel_gdc, x.device, pdl)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((blocks * split,))(
        x.reshape(cols), weight.contiguous(), dummy if bias is None else bias,
        dummy if residual is None else residual.reshape(rows).contiguous(),
        dummy if weight_scale is None else weight_scale.reshape(-1), partials, counts, out,
        N=rows, K=cols, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        HAS_SCALE=weight_scale is not None, SPLIT=split, PART=part, BLOCK_N=block_n,
        BLOCK_K=block_k, AHEAD=ahead, num_warps=warps, **weights_first)
    return out
