"""decode_chain_cuda.py's variants whose down (or q/k/v) streams its weights through shared
memory: the row gemv's column loop written as a ``tl.range`` loop with ``num_stages``, so
Triton's software pipeliner turns its weight loads into cp.async copies STAGES - 1 tiles
ahead of the sums (registers hold one tile at a time, shared memory the ones in flight).

The one-block kernel (triton_kernels.py) keeps down's first 2,048 columns in registers
ahead of its wait, then loads the other 3,584 a tile at a time: a program has few bytes
in flight after the wait, and down reads 3.3 TB/s where gate/up's row loop reads 4.1.
Here the same first columns go ahead in registers (the wait must come before the
pipeline's first copies, which read x too), and the rest of the row streams through the
pipeline. With TURNS > 1 a program takes TURNS blocks of rows (block ``pid``, ``pid +
programs``, ...) as one loop of tiles, so the pipeline runs on across the blocks without
draining between them; a block's sums are finished and stored at its last tile.

Folds: the RMSNorm before (its sum of squares read from x once, after the wait), rotary
rows, the residual (row_parts._finish, as the library's kernels); no gate, bias or int8
scales (down and q/k/v have none). A configuration: (BLOCK_N, BLOCK_K, warps, AHEAD,
STAGES, TURNS), AHEAD a multiple of BLOCK_K below K.

    python bench/decode_chain_cuda.py --rounds 30 --variants "dependent + join,
        dependent + join + pipe down 4 rows 4 stages,..."      (on the GPU machine)

Without a GPU, ``python bench/decode_pipe_gemv.py`` compiles each variant's ``_gdc`` kernel
for sm_90a and prints registers, shared memory, the cp.async copies in its PTX and
whether every copy comes after the wait.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.aoti.kernels.dependent_launch import declare_writes, launcher  # noqa: E402
from targets.aoti.kernels.row_parts import (_block_rows, _finish, _first_tiles,  # noqa: E402
                                            _x_first)


@triton.jit
def _squares(x_ptr, START: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """x's sum of squares over the columns from START on (the norm's scale)."""
    total = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in tl.static_range(START, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
        total += x * x
    return tl.sum(total, axis=0)


@triton.jit
def _pipe_gemv(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS: tl.constexpr,
               OFFSET: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, AHEAD: tl.constexpr, STAGES: tl.constexpr,
               TURNS: tl.constexpr, GDC: tl.constexpr, W_AHEAD: tl.constexpr,
               ROT_ROWS: tl.constexpr, HEAD_D: tl.constexpr):
    programs = tl.num_programs(0)
    pid = tl.program_id(0)
    rows = _block_rows(pid, BLOCK_N, ROT_ROWS, HEAD_D)
    if GDC:  # the next kernel may start as soon as every program here has
        tl.extra.cuda.gdc_launch_dependents()
    if GDC and not W_AHEAD:  # a weight copied just before: read after the wait
        tl.extra.cuda.gdc_wait()
    # the first block's first AHEAD columns in registers, then the wait
    w_first, _ = _first_tiles(w_ptr, rows, rows < N, N, K, 0, AHEAD)
    if GDC and W_AHEAD:
        tl.extra.cuda.gdc_wait()
    tiles: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
    square_sum = zeros
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    # every tile of every turn but the first block's AHEAD columns, STAGES - 1 in flight;
    # the pipeline's first copies go right after the wait, before any sum
    for t in tl.range(AHEAD // BLOCK_K, TURNS * tiles, num_stages=STAGES):
        at = _block_rows(pid + (t // tiles) * programs, BLOCK_N, ROT_ROWS, HEAD_D)
        cols = (t % tiles) * BLOCK_K + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if HAS_NORM:
            x = x * (tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32) + OFFSET)
        w = tl.load(w_ptr + at[:, None] * K + cols[None, :],
                    mask=(at < N)[:, None] & col_ok[None, :], other=0.0,
                    eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        if t % tiles == tiles - 1:  # the block's last tile: its epilogue and store
            y = tl.sum(acc, axis=1)
            if t < tiles:  # the first block: the columns held ahead; the norm's squares
                x_first, squares = _x_first(x_ptr, nw_ptr, OFFSET, K, HAS_NORM, AHEAD)
                y += tl.sum(w_first.to(tl.float32) * x_first[None, :], axis=1)
                if HAS_NORM:
                    square_sum = zeros + squares + _squares(x_ptr, AHEAD, K, BLOCK_K)
            y = _finish(y, zeros, acc, square_sum, w_ptr, r_ptr, w_ptr, cos_ptr, sin_ptr,
                        at, at < N, EPS, N, K, False, HAS_NORM, 0, HAS_RES, False, BLOCK_N,
                        ROT_ROWS, HEAD_D)
            tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=at < N)
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)


@triton.jit
def pipe_gemv_kernel(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                     EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                     K: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr,
                     STAGES: tl.constexpr, TURNS: tl.constexpr, ROT_ROWS: tl.constexpr = 0,
                     HEAD_D: tl.constexpr = 0):
    """reference.row_gemv (no bias, gate or scales), started as a plain launch."""
    _pipe_gemv(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET, N, K,
               HAS_NORM, HAS_RES, BLOCK_N, BLOCK_K, AHEAD, STAGES, TURNS, False, False,
               ROT_ROWS, HEAD_D)


@triton.jit
def pipe_gemv_kernel_gdc(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr,
                         EPS: tl.constexpr, OFFSET: tl.constexpr, N: tl.constexpr,
                         K: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         AHEAD: tl.constexpr, STAGES: tl.constexpr, TURNS: tl.constexpr,
                         W_AHEAD: tl.constexpr, ROT_ROWS: tl.constexpr = 0,
                         HEAD_D: tl.constexpr = 0):
    """The same as a programmatic dependent launch: the first block's AHEAD columns of
    weights loaded before the wait (W_AHEAD), the pipeline's copies after it."""
    _pipe_gemv(x_ptr, w_ptr, nw_ptr, r_ptr, cos_ptr, sin_ptr, out_ptr, EPS, OFFSET, N, K,
               HAS_NORM, HAS_RES, BLOCK_N, BLOCK_K, AHEAD, STAGES, TURNS, True, W_AHEAD,
               ROT_ROWS, HEAD_D)


declare_writes(pipe_gemv_kernel_gdc, "out_ptr")


def check_config(config: tuple, cols: int) -> None:
    """A configuration the kernel computes right: ValueError otherwise."""
    block_n, block_k, warps, ahead, stages, turns = config
    if ahead % block_k or not 0 < ahead < cols or min(block_n, warps, stages, turns) < 1:
        raise ValueError(f"pipe config {config}: AHEAD a positive multiple of BLOCK_K "
                         f"below {cols} columns, the rest at least 1")


def launch_pipe_gemv(x, weight, norm_weight, residual, config: tuple, pdl: bool = False,
                     eps: float = 1e-5, offset: float = 0.0, rotary_cos=None,
                     rotary_sin=None, rotary_rows: int = 0,
                     head_dim: int = 0) -> torch.Tensor:
    """reference.row_gemv(x, weight, None, norm_weight, residual, eps, offset, 0, None,
    rotary_cos, rotary_sin, rotary_rows, head_dim) through the pipelined loop."""
    rows, cols = weight.shape
    check_config(config, cols)
    block_n, block_k, warps, ahead, stages, turns = config
    if rotary_rows and rotary_rows % block_n:
        raise ValueError(f"BLOCK_N {block_n} must divide the {rotary_rows} rotary rows")
    out = torch.empty((*x.shape[:-1], rows), dtype=x.dtype, device=x.device)
    grid = triton.cdiv(triton.cdiv(rows, block_n), turns)
    launch, gdc = launcher(pipe_gemv_kernel, pipe_gemv_kernel_gdc, x.device, pdl)
    dummy = weight  # an unused pointer argument (its branch is compiled out)
    weights_first = dict(W_AHEAD=weight.is_contiguous()) if gdc else {}
    launch((grid,))(
        x.reshape(cols), weight.contiguous(),
        dummy if norm_weight is None else norm_weight,
        dummy if residual is None else residual.reshape(rows).contiguous(),
        dummy if rotary_cos is None else rotary_cos.reshape(-1).contiguous(),
        dummy if rotary_sin is None else rotary_sin.reshape(-1).contiguous(), out,
        EPS=eps, OFFSET=offset, N=rows, K=cols, HAS_NORM=norm_weight is not None,
        HAS_RES=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead,
        STAGES=stages, TURNS=turns, num_warps=warps,
        ROT_ROWS=rotary_rows, HEAD_D=head_dim, **weights_first)
    return out


class PipeLaunch:
    """A chain configuration that is a launch of its own (decode_chain_cuda.step's
    ``configs[name](x, rows, scale, fold, pdl)``): the pipelined product."""

    def __init__(self, config: tuple):
        self.config = config

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        if scale is not None or fold.get("act"):
            raise ValueError("a pipelined product takes 16-bit rows and no gate")
        return launch_pipe_gemv(x, weight, fold.get("norm"), fold.get("residual"),
                                self.config, pdl)

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"pipe{self.config}"


# In the 22-layer chain: down with 4 rows, 2,048 columns ahead and 3 or 4 stages ran
# 0.979-0.986 of "dependent + join" (down's own time unchanged, the step's time between
# kernels shorter); fewer columns ahead, more turns, narrower tiles and q/k/v lost.
# name -> {product: (BLOCK_N, BLOCK_K, warps, AHEAD, STAGES, TURNS)}. down: 2,048 rows of
# 5,632 columns (the library: 4 rows, 4 warps, 2,048 ahead, 512-column tiles, 512
# programs); q/k/v: 2,560 rows of 2,048 (the library holds the whole row ahead)
CHANGES = {
    "pipe down 4 rows 3 stages": {"down": (4, 512, 4, 2048, 3, 1)},
    "pipe down 4 rows 4 stages": {"down": (4, 512, 4, 2048, 4, 1)},
    "pipe down 4 rows 6 stages": {"down": (4, 512, 4, 2048, 6, 1)},
    "pipe down 4 rows 1024 ahead 6 stages": {"down": (4, 512, 4, 1024, 6, 1)},
    "pipe down 4 rows 1024 ahead 4 stages": {"down": (4, 512, 4, 1024, 4, 1)},
    "pipe down 4 rows 256-column tiles 1024 ahead 8 stages": {
        "down": (4, 256, 4, 1024, 8, 1)},
    "pipe down 4 rows 8 warps 4 stages": {"down": (4, 512, 8, 2048, 4, 1)},
    "pipe down 2 rows 4 stages": {"down": (2, 512, 4, 2048, 4, 1)},
    "pipe down 8 rows 8 warps 4 stages": {"down": (8, 512, 8, 2048, 4, 1)},
    "pipe down 4 rows 2 turns 6 stages": {"down": (4, 512, 4, 2048, 6, 2)},
    "pipe down 4 rows 1024-column tiles 2 turns 4 stages": {
        "down": (4, 1024, 4, 2048, 4, 2)},
    "pipe q/k/v 4 rows 1024 ahead 3 stages": {"qkv": (4, 512, 4, 1024, 3, 1)},
    "pipe q/k/v 4 rows 1024 ahead 2 turns 4 stages": {"qkv": (4, 512, 4, 1024, 4, 2)},
}


def pipe_variants(default: dict) -> dict:
    """decode_chain_cuda.variants()'s entries: "dependent + join" with CHANGES' products."""
    return {f"dependent + join + {name}": (True, {**default, **{
        product: PipeLaunch(c) for product, c in changes.items()}}, None, True)
        for name, changes in CHANGES.items()}


# (rows, columns, norm, residual) of the ~1.1B's products
SHAPES = {"qkv": (2560, 2048, True, False), "down": (2048, 5632, False, True)}


def compiled(product: str, config: tuple):
    """The ``_gdc`` kernel of ``config`` compiled for sm_90a: (ptxas's registers, shared
    bytes, cp.async copies in the PTX, whether all of them come after the wait)."""
    from bench.int4_rows_ptx import registers, sm90_compiled
    n, k, norm, res = SHAPES[product]
    block_n, block_k, warps, ahead, stages, turns = config
    values = dict(EPS=1e-5, OFFSET=0.0, N=n, K=k, HAS_NORM=norm, HAS_RES=res,
                  BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=ahead, STAGES=stages,
                  TURNS=turns, W_AHEAD=True, ROT_ROWS=0, HEAD_D=0)
    kernel = sm90_compiled(pipe_gemv_kernel_gdc, {}, values, warps)
    ptx = kernel.asm["ptx"]
    copies = [m.start() for m in re.finditer(r"cp\.async\.c[ag]\.shared", ptx)]
    wait = ptx.find("griddepcontrol.wait")
    return (int(registers(ptx)), kernel.metadata.shared, len(copies),
            bool(copies) and 0 <= wait < min(copies))


def main() -> None:
    for name, changes in CHANGES.items():
        for product, config in changes.items():
            regs, shared, copies, after = compiled(product, config)
            print(f"{name:56s} {str(config):30s} registers {regs:3d}, shared {shared:6d} B, "
                  f"cp.async {copies:3d}{', all after the wait' if after else ''}",
                  flush=True)


if __name__ == "__main__":
    main()
