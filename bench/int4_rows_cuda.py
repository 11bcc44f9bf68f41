"""On the GPU machine: row_gemv over int4 rows (targets/aoti/kernels/int4_triton.py) alone,
the ~1.1B LLaMA shape's five products with their folds, against the reference math and
against their bytes.

    python bench/int4_rows_cuda.py [--layers 22] [--sweep] [--pdl] [--split-x]
        [--out FILE]

Each figure is a CUDA graph of one call per layer, each layer with its own weights (L2
holds none of them between calls), replayed after warm-up: CUDA events, median of 30
(decode_kernels_cuda.py's method). Bytes: the packed rows and their (scale, offset) pairs.
``--sweep`` also times other (BLOCK_N, BLOCK_G, warps) and prints the fastest per shape.
``--pdl`` also times the default's calls as dependent launches (the ``_gdc`` form, as a
built step starts them: each loads its first tiles, then waits for the call before).
``--split-x``: also the default with the other form of the dot (int4_config's SPLIT_X),
plain and dependent, then the default again (in one process, against the drift of the
card).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_kernels_cuda import SHAPES, graph_ms  # noqa: E402

# (BLOCK_N, BLOCK_G, warps): 8-32 bytes a thread a step, few rows to many
SWEEP = [(2, 16, 4), (4, 8, 4), (4, 16, 4), (4, 16, 8), (8, 4, 4), (8, 8, 8)]


def case(name, n, k, norm, act, res, layers, sweep, pdl=False, split_x=False):
    from targets.aoti.kernels import int4_rows, reference
    from targets.aoti.kernels.int4_triton import int4_config, launch_int4_row_gemv
    dt = dict(device="cuda", dtype=torch.float16)
    rows = 2 * n if act else n
    stored = [int4_rows.pack(torch.randn(rows, k, **dt) * 0.02, 128) for _ in range(layers)]
    x = torch.randn(1, 1, k, **dt)
    nw = torch.rand(k, **dt) + 0.5 if norm else None
    r = torch.randn(1, 1, n, **dt) if res else None
    packed, scales = stored[0]
    want = reference.row_gemv(x, packed, None, nw, r, 1e-5, 0.0, act, scales).float()
    got = launch_int4_row_gemv(x, packed, scales, None, nw, r, 1e-5, 0.0, act).float()
    err = ((got - want).norm() / want.norm()).item()
    nbytes = packed.numel() + scales.numel() * 2
    default = int4_config(n, k, 128, bool(act))
    other = [(*default[:3], not default[3])] if split_x else []
    configs = [default] + ([c for c in SWEEP if c != default[:3]] if sweep else []) + other
    times = {}
    for config in configs:
        try:
            ms = graph_ms([lambda p=p, s=s, c=config: launch_int4_row_gemv(
                x, p, s, None, nw, r, 1e-5, 0.0, act, c) for p, s in stored])
        except Exception as exc:  # noqa: BLE001 - a config that does not compile
            print(f"  {name} {config}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        times[config] = ms * 1000 / layers
    best = min(times, key=times.get)

    def dependent_us(config):
        return graph_ms([lambda p=p, s=s: launch_int4_row_gemv(
            x, p, s, None, nw, r, 1e-5, 0.0, act, config, pdl=True)
            for p, s in stored]) * 1000 / layers
    pdl_us = dependent_us(default) if pdl else None
    unpacked = {}
    for config in other:  # against the default, plain and dependent
        got = launch_int4_row_gemv(x, packed, scales, None, nw, r, 1e-5, 0.0, act, config)
        unpacked[f"split_x {config[3]}"] = {
            "rel_err": ((got.float() - want).norm() / want.norm()).item(),
            "us": times[config], "pdl_us": dependent_us(config) if pdl else None}
    if other:  # the default again, last
        again = graph_ms([lambda p=p, s=s: launch_int4_row_gemv(
            x, p, s, None, nw, r, 1e-5, 0.0, act, default) for p, s in stored])
        unpacked["default again"] = {"us": again * 1000 / layers,
                                     "pdl_us": dependent_us(default) if pdl else None}
    row = {"product": name, "rows": rows, "k": k, "mb": nbytes / 1e6, "rel_err": err,
           "default": list(default), "default_us": times[default],
           "best": list(best), "best_us": times[best],
           "pdl_us": pdl_us, "floor_us_4p8": nbytes / 4.8e12 * 1e6, "other_dot": unpacked}
    print(f"{name:20s} {nbytes / 1e6:6.2f} MB rel.err {err:.1e} default {default} "
          f"{times[default]:6.2f} us {nbytes / times[default] / 1e3:5.0f} GB/s | best {best} "
          f"{times[best]:6.2f} us {nbytes / times[best] / 1e3:5.0f} GB/s"
          + (f" | dependent {pdl_us:6.2f} us" if pdl else ""), flush=True)
    for label, timed in unpacked.items():
        print(f"  {name:18s} {label}: {timed['us']:6.2f} us"
              + (f", dependent {timed['pdl_us']:6.2f} us" if pdl else "")
              + (f", rel.err {timed['rel_err']:.1e}" if "rel_err" in timed else ""),
              flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--pdl", action="store_true")
    parser.add_argument("--split-x", action="store_true", help="see above")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [case(*shape, args.layers, args.sweep, args.pdl, args.split_x)
            for shape in SHAPES]
    if args.out:
        with open(args.out, "a") as fh:
            for row in rows:
                fh.write(json.dumps({"gpu": torch.cuda.get_device_name(), **row}) + "\n")


if __name__ == "__main__":
    main()
