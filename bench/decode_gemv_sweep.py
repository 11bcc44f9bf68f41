"""On the GPU machine: the decode step's products (row_gemv) in each of the kernel's loop
forms, fp16 and int8 rows, against each product's own bytes.

    python bench/decode_gemv_sweep.py --out FILE [--jobs 14] [--layers 22] [--compile-only]
        [--forms unrolled,tile-x]

Forms (launch_row_gemv's config tail, TILE_X):
  unrolled     x read as a row and moved into the weights' layout every block (through
               shared memory, behind a barrier): as built
  tile-x       x read as a tile of the weights' shape: one layout, no exchange
Each form over BLOCK_N 2/4/8, two BLOCK_K, 4 or 8 warps. The kernels are compiled first
in ``--jobs`` processes side by side (Triton's disk cache; ``--compile-only`` stops
there, ``--jobs 0`` skips it), then timed one at a time in this process: a CUDA graph of
one call per layer, each layer with its own weights, median of 30 replays (bench/decode_kernels_microbench.py). Every configuration's output
is checked against the reference math first (relative error; fp16 gate 2e-3). Rows go
to FILE (JSON lines); the best configuration of each form per product is printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_kernels_cuda import SHAPES  # noqa: E402
from bench.decode_kernels_microbench import graph_time  # noqa: E402

FORMS = {"unrolled": (False,), "tile-x": (True,)}


def configs(int8: bool, forms=tuple(FORMS)) -> list[tuple]:
    blocks = (512, 1024) if int8 else (256, 512)
    return [(rows, block, warps, 0, *FORMS[form]) for form, rows, block, warps in
            itertools.product(forms, (2, 4, 8), blocks, (4, 8))]


def case(shape: tuple, int8: bool, layers: int) -> dict:
    """The product's operands: ``layers`` weights of its shape, x, the norm's weight, the
    residual, int8 rows' scales."""
    name, n, k, norm, act, res = shape
    rows = 2 * n if act else n
    cuda = dict(device="cuda", dtype=torch.float16)
    if int8:
        weights = [torch.randint(-127, 128, (rows, k), device="cuda", dtype=torch.int8)
                   for _ in range(layers)]
    else:
        weights = [torch.randn(rows, k, **cuda) * 0.02 for _ in range(layers)]
    return {"weights": weights, "x": torch.randn(1, 1, k, **cuda),
            "norm": torch.rand(k, **cuda) + 0.5 if norm else None,
            "res": torch.randn(1, 1, n, **cuda) if res else None,
            "scale": torch.rand(rows, **cuda) * 2e-4 + 1e-4 if int8 else None, "act": act,
            "bytes": rows * k * (1 if int8 else 2) + (rows * 2 if int8 else 0)}


def call(c: dict, weight, config):
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    return launch_row_gemv(c["x"], weight, None, c["norm"], c["res"], 1e-5, 0.0, c["act"],
                           config, weight_scale=c["scale"])


def compile_all(work: list) -> list:
    """Each (shape, int8, config) launched once, so its kernel is in the disk cache."""
    failed = []
    for shape, int8, config in work:
        c = case(shape, int8, 1)
        try:
            call(c, c["weights"][0], config)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a config that does not compile: skipped
            failed.append((shape[0], int8, config, f"{type(exc).__name__}: {str(exc)[:160]}"))
    return failed


def measure(shape: tuple, int8: bool, layers: int, skip: set, out, forms) -> None:
    from targets.aoti.kernels import reference
    from targets.aoti.kernels.triton_kernels import gemv_config
    name, n, k, norm, act, res = shape
    c = case(shape, int8, layers)
    want = reference.row_gemv(c["x"], c["weights"][0], None, c["norm"], c["res"], 1e-5, 0.0,
                              act, c["scale"]).float()
    default = gemv_config(n, k, bool(act), False, 1 if int8 else 2)
    best: dict[str, tuple] = {}
    for config in [default, *configs(int8, forms)]:
        if (name, int8, config) in skip:
            continue
        try:
            got = call(c, c["weights"][0], config).float()
        except Exception as exc:  # noqa: BLE001 - not compiled (--jobs 0): skipped
            print(f"  {name} {config}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        err = ((got - want).norm() / want.norm()).item()
        us = graph_time([lambda w=w: call(c, w, config) for w in c["weights"]],
                        warm=2, runs=30) * 1000 / layers
        row = {"product": name, "int8": int8, "config": config, "us": us, "rel_err": err,
               "tb_s": c["bytes"] / us / 1e6, "mb": c["bytes"] / 1e6, "default": config == default}
        out.write(json.dumps(row) + "\n")
        form = "default" if config == default else next(
            f for f, tail in FORMS.items() if tuple(config[4:]) == tail)
        if err < 2e-3 and (form not in best or us < best[form][1]):
            best[form] = (config, us)
    label = f"{name}{' int8' if int8 else ''} ({c['bytes'] / 1e6:.2f} MB)"
    print(f"{label:34s} " + " | ".join(
        f"{form} {cfg[:3]} {us:.2f} us {c['bytes'] / us / 1e6:.2f} TB/s"
        for form, (cfg, us) in best.items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=14)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated")
    args = parser.parse_args()
    forms = args.forms.split(",")
    work = [(shape, int8, config) for int8 in (False, True) for shape in SHAPES
            for config in configs(int8, forms)]
    failed = []
    if args.jobs:  # --jobs 0: compiled by an earlier --compile-only run
        chunks = [work[i::args.jobs] for i in range(args.jobs)]
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            failed = [f for part in pool.map(compile_all, chunks) for f in part]
    for name, int8, config, why in failed:
        print(f"  not compiled: {name} int8={int8} {config}: {why}")
    if args.compile_only:
        return
    skip = {(name, int8, config) for name, int8, config, _ in failed}
    with open(args.out, "a") as out:
        for int8 in (False, True):
            for shape in SHAPES:
                layers = args.layers if shape[0] != "lm_head+norm" else 2
                measure(shape, int8, layers, skip, out, forms)


if __name__ == "__main__":
    main()
