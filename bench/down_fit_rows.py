"""int8 rows split along K whose tiles fit their part: no masked columns loaded.

The library's split kernel (targets/aoti/kernels/split_gemv_triton.py) holds a part's
first AHEAD columns as one tile, AHEAD a power of two: the ~1.1B's down (5,632 columns,
4 parts of 1,408) loads a 2,048-column tile whose last 640 columns are masked, so each
thread issues 45% more loads, conversions and products than its part holds. Here a
part's columns are covered by tiles that fit it:

- ``fit_pieces``: at most three powers of two, largest first, the width's own bits
  (1,408 = 1,024 + 256 + 128; 2,816 = 2,048 + 512 + 256): exact for any width of at
  most three bits (in 16-column units), else the third rounded up (at most 1/7 over,
  where one power of two is up to twice the width).
- ``fit_plan``: the part's first min(part, AHEAD) columns as such pieces, held before the
  wait; the rest in whole BLOCK_K tiles, then its remainder as pieces again.

The other fix needs no new kernel: a split whose part is a power of two (down's 5,632 in
11 parts of 512, the library's kernel as it is): ``SPLIT_CHANGES``.

    python bench/down_fit_rows.py [--chain [BASE]]      (without a GPU)

compiles the library's split kernel and this one at down's shape for sm_90a and prints
registers and instructions a weight of the part by class (bench/int8_cvt_rows.py's
count); ``--chain`` prints decode_chain_cuda.py's ``--int8 --variants`` list of
fit_variants (the library's split is now 11 parts of 512; the fitted tiles lost).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets.aoti.kernels.dependent_launch import launcher  # noqa: E402
from targets.aoti.kernels.row_parts import _finish  # noqa: E402


def fit_pieces(width: int) -> tuple:
    """(P1, P2, P3): powers of two, largest first (0: none), each at least 16, whose sum
    is ``width`` rounded up to 16 where that has at most three bits, else the least such
    sum above it (the third piece rounded up)."""
    left = -(-width // 16) * 16
    pieces = []
    while left and len(pieces) < 2:
        pieces.append(1 << (left.bit_length() - 1))
        left -= pieces[-1]
    if left:
        pieces.append(triton.next_power_of_2(left))
    return tuple(pieces + [0] * (3 - len(pieces)))


def fit_plan(part: int, ahead: int, block_k: int) -> dict:
    """A part's cover: the first min(part, ahead) columns as fit_pieces (A1..A3), then
    whole BLOCK_K tiles up to LOOP_END, then the remainder as fit_pieces (T1..T3)."""
    a = fit_pieces(min(part, ahead)) if ahead else (0, 0, 0)
    held = sum(a)
    loop_end = held + max(0, part - held) // block_k * block_k
    t = fit_pieces(part - loop_end) if part > loop_end else (0, 0, 0)
    return dict(A1=a[0], A2=a[1], A3=a[2], HELD=held, LOOP_END=loop_end,
                T1=t[0], T2=t[1], T3=t[2])


@triton.jit
def _tile(w_ptr, rows, row_ok, lo, start, K: tl.constexpr, PART: tl.constexpr,
          WIDTH: tl.constexpr):
    """The rows' weights over the part's columns start .. start + WIDTH."""
    cols = start + tl.arange(0, WIDTH)
    ok = (cols < PART) & (lo + cols < K)
    return tl.load(w_ptr + rows[:, None] * K + lo + cols[None, :],
                   mask=row_ok[:, None] & ok[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _tile_sum(w, x_ptr, lo, start, K: tl.constexpr, PART: tl.constexpr,
              WIDTH: tl.constexpr):
    """Each row's sum of a _tile's weights against x."""
    cols = start + tl.arange(0, WIDTH)
    ok = (cols < PART) & (lo + cols < K)
    x = tl.load(x_ptr + lo + cols, mask=ok, other=0.0).to(tl.float32)
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1)


@triton.jit
def _pieces_sum(x_ptr, w_ptr, rows, row_ok, lo, start, K: tl.constexpr,
                PART: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
                BLOCK_N: tl.constexpr, WAIT: tl.constexpr):
    """Each row's sum over the pieces P1, P2, P3 from ``start``: all their weights
    loaded first (then, with WAIT, the wait for the kernel before), then x."""
    if P1 > 0:
        w1 = _tile(w_ptr, rows, row_ok, lo, start, K, PART, P1)
    if P2 > 0:
        w2 = _tile(w_ptr, rows, row_ok, lo, start + P1, K, PART, P2)
    if P3 > 0:
        w3 = _tile(w_ptr, rows, row_ok, lo, start + P1 + P2, K, PART, P3)
    if WAIT:
        tl.extra.cuda.gdc_wait()
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if P1 > 0:
        y += _tile_sum(w1, x_ptr, lo, start, K, PART, P1)
    if P2 > 0:
        y += _tile_sum(w2, x_ptr, lo, start + P1, K, PART, P2)
    if P3 > 0:
        y += _tile_sum(w3, x_ptr, lo, start + P1 + P2, K, PART, P3)
    return y


@triton.jit
def _fit_part_sums(x_ptr, w_ptr, rows, row_ok, lo, K: tl.constexpr, PART: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A1: tl.constexpr,
                   A2: tl.constexpr, A3: tl.constexpr, HELD: tl.constexpr,
                   LOOP_END: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                   T3: tl.constexpr, WAIT: tl.constexpr):
    """Each row's sum over the columns lo .. lo + PART, as fit_plan covers them."""
    y = _pieces_sum(x_ptr, w_ptr, rows, row_ok, lo, 0, K, PART, A1, A2, A3, BLOCK_N, WAIT)
    if LOOP_END > HELD:  # whole tiles: one sum at the end
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in tl.static_range(HELD, LOOP_END, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + lo + cols, mask=lo + cols < K, other=0.0).to(tl.float32)
            w = _tile(w_ptr, rows, row_ok, lo, start, K, PART, BLOCK_K)
            acc += w.to(tl.float32) * x[None, :]
        y += tl.sum(acc, axis=1)
    if T1 > 0:
        y += _pieces_sum(x_ptr, w_ptr, rows, row_ok, lo, LOOP_END, K, PART, T1, T2, T3,
                         BLOCK_N, False)
    return y


@triton.jit
def _fit_split(x_ptr, w_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr,
               N: tl.constexpr, K: tl.constexpr, HAS_RES: tl.constexpr,
               SPLIT: tl.constexpr, PART: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr,
               A3: tl.constexpr, HELD: tl.constexpr, LOOP_END: tl.constexpr,
               T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr, GDC: tl.constexpr):
    # split_gemv_triton._split_gemv with _fit_part_sums for its _part_sums (int8 rows'
    # scales, no bias): its join, the last of a block's parts to count in
    block = tl.program_id(0) // SPLIT
    idx = tl.arange(0, BLOCK_N)
    rows = block * BLOCK_N + idx
    row_ok = rows < N
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    y = _fit_part_sums(x_ptr, w_ptr, rows, row_ok, (tl.program_id(0) % SPLIT) * PART, K,
                       PART, BLOCK_N, BLOCK_K, A1, A2, A3, HELD, LOOP_END, T1, T2, T3, GDC)
    tl.store(part_ptr + tl.program_id(0) * BLOCK_N + idx, y)
    tl.debug_barrier()  # every thread's stores before the count (its release)
    seen = tl.atomic_add(counts_ptr + block, 1, sem="acq_rel", scope="gpu")
    if seen == SPLIT - 1:
        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for i in tl.static_range(SPLIT):  # in part order, whoever joins
            total += tl.load(part_ptr + (block * SPLIT + i) * BLOCK_N + idx,
                             cache_modifier=".cg")
        zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
        total = _finish(total, zeros, zeros[:, None], zeros, s_ptr, r_ptr, s_ptr, s_ptr,
                        s_ptr, rows, row_ok, 1.0, N, K, False, False, 0, HAS_RES, True,
                        BLOCK_N, 0, 0)
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_ok)
        tl.store(counts_ptr + block, 0)


@triton.jit
def fit_split_kernel(x_ptr, w_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr,
                     N: tl.constexpr, K: tl.constexpr, HAS_RES: tl.constexpr,
                     SPLIT: tl.constexpr, PART: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr,
                     A3: tl.constexpr, HELD: tl.constexpr, LOOP_END: tl.constexpr,
                     T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr):
    """int8 rows split along K, fitted tiles, a plain launch."""
    _fit_split(x_ptr, w_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr, N, K, HAS_RES,
               SPLIT, PART, BLOCK_N, BLOCK_K, A1, A2, A3, HELD, LOOP_END, T1, T2, T3, False)


@triton.jit
def fit_split_kernel_gdc(x_ptr, w_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr,
                         N: tl.constexpr, K: tl.constexpr, HAS_RES: tl.constexpr,
                         SPLIT: tl.constexpr, PART: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr,
                         A3: tl.constexpr, HELD: tl.constexpr, LOOP_END: tl.constexpr,
                         T1: tl.constexpr, T2: tl.constexpr, T3: tl.constexpr):
    """The same as a programmatic dependent launch: the held pieces before the wait."""
    _fit_split(x_ptr, w_ptr, r_ptr, s_ptr, part_ptr, counts_ptr, out_ptr, N, K, HAS_RES,
               SPLIT, PART, BLOCK_N, BLOCK_K, A1, A2, A3, HELD, LOOP_END, T1, T2, T3, True)


def fit_values(rows: int, cols: int, config: tuple) -> dict:
    """The kernels' shape constexprs for ``config`` (BLOCK_N, BLOCK_K, warps, AHEAD,
    SPLIT): AHEAD the most columns of a part held before the wait (any multiple of 16)."""
    block_n, block_k, _, ahead, split = config
    part = triton.cdiv(cols, split)
    return dict(N=rows, K=cols, SPLIT=split, PART=part, BLOCK_N=block_n, BLOCK_K=block_k,
                **fit_plan(part, ahead, block_k))


def launch_fit_split(x, weight, weight_scale, residual, counts, config: tuple,
                     pdl: bool = False) -> torch.Tensor:
    """reference.row_gemv(x, weight, None, None, residual, ..., act=0, weight_scale)
    over int8 rows split along K in fitted tiles; ``counts``: split_counters(weight,
    config), left at zero."""
    rows, cols = weight.shape
    block_n, warps, split = config[0], config[2], config[4]
    blocks = triton.cdiv(rows, block_n)
    if weight_scale is None or counts is None or counts.numel() < blocks:
        raise ValueError(f"int8 rows with their scales and {blocks} int32 zeros to count on")
    out = torch.empty((*x.shape[:-1], rows), dtype=x.dtype, device=x.device)
    partials = torch.empty(blocks * split * block_n, dtype=torch.float32, device=x.device)
    launch, _ = launcher(fit_split_kernel, fit_split_kernel_gdc, x.device, pdl)
    dummy = weight_scale  # an unused pointer argument (its branch is compiled out)
    launch((blocks * split,))(
        x.reshape(cols), weight.contiguous(),
        dummy if residual is None else residual.reshape(rows).contiguous(),
        weight_scale.reshape(-1), partials, counts, out, HAS_RES=residual is not None,
        num_warps=warps, **fit_values(rows, cols, config))
    return out


class FitLaunch:
    """A chain configuration that is a launch of its own (decode_chain_cuda.step's
    ``configs[name](x, rows, scale, fold, pdl)``): launch_fit_split with ``config``, its
    counters made on the first (uncaptured) call and shared by every layer."""

    def __init__(self, config: tuple):
        self.config, self.counts = config, None

    def __call__(self, x, weight, scale, fold: dict, pdl: bool) -> torch.Tensor:
        from targets.aoti.kernels.split_gemv_triton import split_counters
        if fold.get("norm") is not None or fold.get("act"):
            raise ValueError("a split product takes no norm and no gated activation")
        if self.counts is None:
            self.counts = split_counters(weight, self.config)
        return launch_fit_split(x, weight, scale, fold.get("residual"), self.counts,
                                self.config, pdl)

    def __repr__(self) -> str:  # the row's "configs" in the bench's JSON
        return f"fit{self.config}"


# name -> (kernel, down's (BLOCK_N, BLOCK_K, warps, AHEAD, SPLIT)): "fitted" on this
# kernel, "library" the library's split kernel (its part a power of two: nothing masked;
# or the fitted one's twin). The base's down: split_config's (4, 1024, 4, 2048, 4).
CHANGES = {
    "nothing changed": None,  # the base again: the spread between two equal graphs
    "down fitted tiles 4 parts": ("fitted", (4, 1024, 4, 2048, 4)),
    "down fitted tiles 4 parts 8 rows": ("fitted", (8, 1024, 4, 2048, 4)),
    "down library 4 parts 8 rows": ("library", (8, 1024, 4, 2048, 4)),
    # parts of a power of two: 4 rows a program was 18 instructions a weight offline
    "down library 11 parts of 512 8 rows": ("library", (8, 512, 4, 512, 11)),
    "down fitted tiles 2 parts": ("fitted", (4, 1024, 4, 4096, 2)),
    "down library 2 parts whole part ahead": ("library", (4, 1024, 4, 4096, 2)),
}


def _down(change):
    from bench.decode_chain_split import SplitLaunch
    kind, config = change
    return FitLaunch(config) if kind == "fitted" else SplitLaunch(config)


def fit_variants(bases: dict) -> dict:
    """decode_chain_cuda.variants()'s ``--int8`` entries: each base (name -> its variant
    tuple) with CHANGES' down (each variant its own counters)."""
    return {f"{base} + {name}": (pdl, {**configs, **({"down": _down(change)} if change
                                                    else {})}, *rest)
            for base, (pdl, configs, *rest) in bases.items()
            for name, change in CHANGES.items()}


# the base a library runs now: the layer's attention and o in one launch
BASE = "dependent + join + attention-o joined 8 splits 4 rows"


def chain_names(base: str = BASE) -> list[str]:
    """A ``--variants`` list: ``base``, then it with each change, "nothing changed" last."""
    names = [name for name in CHANGES if name != "nothing changed"] + ["nothing changed"]
    return [base] + [f"{base} + {name}" for name in names]


DOWN = (2048, 5632)  # the ~1.1B's down: rows, columns


def compiled(kind: str, config: tuple):
    """The ``_gdc`` kernel of ``kind`` at down's shape in ``config``, compiled for sm_90a
    (int4_rows_ptx.sm90_compiled: 16-byte-aligned pointers)."""
    from bench.int4_rows_ptx import sm90_compiled
    from targets.aoti.kernels.split_gemv_triton import split_gemv_kernel_gdc
    rows, cols = DOWN
    kinds = {"w_ptr": "*i8", "part_ptr": "*fp32", "counts_ptr": "*i32"}
    if kind == "fitted":
        return sm90_compiled(fit_split_kernel_gdc, kinds,
                             dict(HAS_RES=True, **fit_values(rows, cols, config)), config[2])
    block_n, block_k, warps, ahead, split = config
    values = dict(N=rows, K=cols, HAS_BIAS=False, HAS_RES=True, HAS_SCALE=True,
                  SPLIT=split, PART=triton.cdiv(cols, split), BLOCK_N=block_n,
                  BLOCK_K=block_k, AHEAD=ahead, W_AHEAD=True)
    return sm90_compiled(split_gemv_kernel_gdc, kinds, values, warps)


def report(kind: str, config: tuple) -> str:
    """One line: registers; instructions a weight of the part by class (a thread's share
    of BLOCK_N rows x PART columns); the weight loads a thread issues (evict_first, by
    width) and their bytes against the part's."""
    import re

    from bench.int4_rows_ptx import ptxas_report
    from bench.int8_cvt_rows import CLASSES, class_counts, sass
    found = compiled(kind, config)
    text = sass(found)
    counts = class_counts(text)
    weights = config[0] * triton.cdiv(DOWN[1], config[4]) / (32 * config[2])
    loads = re.findall(r"\bLDG\.E\.EF(?:\.(\d+))?", text)
    widths = {f"{w or 32}-bit": loads.count(w) for w in sorted(set(loads))}
    issued = sum(int(w or 32) // 8 for w in loads)
    return (f"{kind:8s} {str(config):24s} regs {ptxas_report(found.asm['ptx'])[0]:3d}  "
            + "  ".join(f"{c} {counts.get(c, 0) / weights:.2f}" for c in CLASSES)
            + f"  | {weights:.0f} weights a thread, weight loads {widths}: "
            f"{issued} bytes ({issued / weights:.2f} a weight)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chain", nargs="?", const=BASE, metavar="BASE",
                        help="print a --variants list over BASE for decode_chain_cuda.py")
    args = parser.parse_args()
    if args.chain:
        print(",".join(chain_names(args.chain)))
        return
    from targets.aoti.kernels.split_gemv_triton import split_config
    print(f"triton {triton.__version__}, sm_90a, down {DOWN}; instructions a weight of "
          f"the part (whole kernel, unrolled) by class")
    base = split_config(DOWN[1])
    for kind, config in [("library", base), ("fitted", base)] + [
            change for change in CHANGES.values() if change and change[1] != base]:
        print(report(kind, config), flush=True)


if __name__ == "__main__":
    main()
