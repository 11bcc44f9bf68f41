"""On the GPU machine: what a kernel of the 1.1B decode step costs beyond its bytes.

    python bench/decode_kernel_floor.py [--out FILE] [--runs 50] [--dependent-forms]

Each figure is a CUDA graph of 22 launches, each over its own buffers (L2 holds none
between calls), median of ``--runs`` replays (CUDA events), divided by 22:
- ``empty``: a kernel that moves nothing (each program reads and writes one number) at
  the step's grid sizes: the graph's floor per kernel;
- ``read``: a pure read of each product's weight bytes with that product's program count
  (16-byte loads, a sum a program);
- ``row_gemv``: the step's own product kernel as a built library runs it.
Each of the first two plain and as a programmatic dependent launch (the wait at the end:
the most a dependent launch can overlap). Then ``us = start/drain + MB / bandwidth``,
fitted over the five products for each kind: the fixed cost a kernel pays, and the
bandwidth it streams at once started. ``--dependent-forms``: only the dependent read's
forms against row_gemv's dependent form (dependent_forms()).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode_kernels_microbench import graph_time  # noqa: E402

CALLS = 22
# (rows, cols, gated) of the step's products: q/k/v, o, gate/up, down, head
PRODUCTS = {"qkv": (2560, 2048, 0), "o": (2048, 2048, 0), "gate_up": (5632, 2048, 1),
            "down": (2048, 5632, 0), "head": (32000, 2048, 0)}


@triton.jit
def empty_kernel(in_ptr, out_ptr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    at = tl.program_id(0)
    tl.store(out_ptr + at, tl.load(in_ptr + at) + 1.0)


@triton.jit
def read_kernel(w_ptr, out_ptr, prev_ptr, PER: tl.constexpr, BLOCK: tl.constexpr,
                GDC: tl.constexpr, AFTER: tl.constexpr = False):
    """AFTER: one load of the kernel before's output after the wait (as row_gemv reads x).
    The program's loads are all issued before the wait (32 registers a thread, Triton 3.6
    for sm_90)."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    base = tl.program_id(0).to(tl.int64) * PER
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in tl.static_range(0, PER, BLOCK):  # 16-byte loads, all before the wait
        acc += tl.load(w_ptr + base + start + tl.arange(0, BLOCK),
                       eviction_policy="evict_first").to(tl.float32)
    total = tl.sum(acc, axis=0)
    if GDC:  # nothing above reads what the kernel before wrote: wait only here
        tl.extra.cuda.gdc_wait()
    if AFTER:
        total += tl.load(prev_ptr + tl.program_id(0))
    tl.store(out_ptr + tl.program_id(0), total)


def programs(name: str) -> int:
    """The product's program count as built (gemv_config's plain configuration)."""
    from targets.aoti.kernels.triton_kernels import gemv_config
    rows, cols, gated = PRODUCTS[name]
    return triton.cdiv(rows, gemv_config(rows, cols, bool(gated))[0])


def weight_elements(name: str) -> int:
    rows, cols, gated = PRODUCTS[name]
    return rows * cols * (2 if gated else 1)


def per_call_us(calls) -> float:
    return graph_time(calls, warm=2, runs=ARGS.runs) * 1000 / CALLS


def empty_us(grid: int, pdl: bool) -> float:
    buffers = [torch.rand(grid, device="cuda") for _ in range(CALLS + 1)]
    return per_call_us([lambda i=i: empty_kernel[(grid,)](
        buffers[i], buffers[i + 1], GDC=pdl, num_warps=4, launch_pdl=pdl)
        for i in range(CALLS)])


def read_us(name: str, pdl: bool, after: bool = False) -> tuple[float, float]:
    """us a call, and the first call's relative error against torch's sums."""
    grid = programs(name)
    per = weight_elements(name) // grid
    block = 2048 if per % 2048 == 0 else 1024
    weights = [torch.randn(grid * per, device="cuda", dtype=torch.float16)
               for _ in range(CALLS)]
    sums = [torch.rand(grid, device="cuda") for _ in range(CALLS + 1)]
    forms = dict(PER=per, BLOCK=block, GDC=pdl, AFTER=after, num_warps=4)
    expected = weights[0].float().reshape(grid, per).sum(1) + (sums[0] if after else 0)
    read_kernel[(grid,)](weights[0], sums[1], sums[0], **forms)
    error = ((sums[1] - expected).norm() / expected.norm()).item()
    us = per_call_us([lambda i=i: read_kernel[(grid,)](
        weights[i], sums[i + 1], sums[i], **forms, launch_pdl=pdl) for i in range(CALLS)])
    return us, error


def row_gemv_us(name: str, pdl: bool = False) -> float:
    """As a built library runs it, or (``pdl``) the dependent form with its columns ahead."""
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    rows, cols, gated = PRODUCTS[name]
    weights = [torch.randn(rows * (2 if gated else 1), cols, device="cuda",
                           dtype=torch.float16) * 0.02 for _ in range(CALLS)]
    x = torch.randn(1, 1, cols, device="cuda", dtype=torch.float16)
    return per_call_us([lambda w=w: launch_row_gemv(x, w, None, None, None, 1e-5, 0.0, gated,
                                                    pdl=pdl) for w in weights])


def dependent_forms(record) -> None:
    """Why a dependent row_gemv gains less than the dependent read: the read with one
    load after its wait, and row_gemv's dependent form (its whole weight slice ahead of
    its wait on q/k/v and o)."""
    for name in ("qkv", "o"):
        mb = weight_elements(name) * 2 / 1e6
        for label, forms in (("read", {}), ("read, a load after the wait", {"after": True})):
            us, error = read_us(name, True, **forms)
            record({"kind": label, "product": name, "mb": mb, "dependent": True, "us": us,
                    "rel_err": error})
        record({"kind": "row_gemv", "product": name, "mb": mb, "dependent": True,
                "us": row_gemv_us(name, pdl=True)})


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares of us = a + MB * b; returns (a us, 1 / b in TB/s)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points) /
             sum((x - mean_x) ** 2 for x, _ in points))
    return mean_y - slope * mean_x, 1 / slope


def main() -> None:
    rows = []

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if ARGS.out:
            with open(ARGS.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    if ARGS.dependent_forms:
        return dependent_forms(record)
    for grid in sorted({64, 32} | {programs(name) for name in PRODUCTS}):
        for pdl in (False, True):
            record({"kind": "empty", "grid": grid, "dependent": pdl,
                    "us": empty_us(grid, pdl)})
    for name in PRODUCTS:
        mb = weight_elements(name) * 2 / 1e6
        for pdl in (False, True):
            us, error = read_us(name, pdl)
            record({"kind": "read", "product": name, "grid": programs(name), "mb": mb,
                    "dependent": pdl, "us": us, "rel_err": error})
        record({"kind": "row_gemv", "product": name, "grid": programs(name), "mb": mb,
                "dependent": False, "us": row_gemv_us(name)})
    print("| kind | launch | start/drain us | TB/s once started | " +
          " | ".join(PRODUCTS) + " |")
    for kind, pdl in (("read", False), ("read", True), ("row_gemv", False)):
        mine = [r for r in rows if r["kind"] == kind and r["dependent"] == pdl]
        fixed, rate = fit([(r["mb"], r["us"]) for r in mine])
        print(f"| {kind} | {'dependent' if pdl else 'plain'} | {fixed:.2f} | {rate:.2f} | " +
              " | ".join(f"{r['us']:.2f}" for r in mine) + " |")
    print("empty kernel, us a call (grid: plain / dependent): " + ", ".join(
        f"{r['grid']}: {r['us']:.2f}" if not r["dependent"] else f"/{r['us']:.2f}"
        for r in rows if r["kind"] == "empty"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--dependent-forms", action="store_true",
                        help="only dependent_forms(): the read's forms against row_gemv's")
    ARGS = parser.parse_args()
    torch.manual_seed(0)
    main()
