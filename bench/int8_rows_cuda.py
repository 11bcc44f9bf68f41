"""On the GPU machine: row_gemv over int8 rows, the general row kernel's int8 path
(targets/aoti/kernels/triton_kernels.py, HAS_SCALE: what the cuda target runs) against
bench/int8_rows_triton.py's kernel (bytes read as fp32 subnormals, x in the rows' own
layout), for the ~1.1B LLaMA shape's five products with their folds.

    python bench/int8_rows_cuda.py [--layers 22] [--configs B,W,WARPS;...] [--out FILE]

Each figure is a CUDA graph of one call per layer, each layer with its own weights (L2
holds none of them between calls), replayed after warm-up: CUDA events, median of 30
(decode_kernels_cuda.py's method), plain and as dependent launches (the ``_gdc`` forms,
as a built step starts them). In one process, in turns: the general kernel, the other
kernel's default, each ``--configs`` entry (BLOCK_N, BLOCK_W, warps), the general kernel
again. Bytes: the rows and their fp16 scales.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_kernels_cuda import SHAPES, graph_ms  # noqa: E402


def _timed(launch, stored, layers: int) -> tuple[float, float]:
    """(plain, dependent) us a call."""
    return tuple(graph_ms([lambda w=w, s=s, p=pdl: launch(w, s, p) for w, s in stored])
                 * 1000 / layers for pdl in (False, True))


def case(name, n, k, norm, act, res, layers, configs) -> dict:
    from bench.int8_rows_triton import int8_config, launch_int8_row_gemv
    from targets.aoti.kernels import reference
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    dt = dict(device="cuda", dtype=torch.float16)
    rows = 2 * n if act else n
    stored = [(torch.randint(-128, 128, (rows, k), device="cuda", dtype=torch.int8),
               torch.rand(rows, **dt) * 2e-4 + 1e-4) for _ in range(layers)]
    x = torch.randn(1, 1, k, **dt)
    nw = torch.rand(k, **dt) + 0.5 if norm else None
    r = torch.randn(1, 1, n, **dt) if res else None
    fold = (None, nw, r, 1e-5, 0.0, act)

    def general(w, s, pdl):
        return launch_row_gemv(x, w, *fold, None, pdl, s)

    def ours(config):
        return lambda w, s, pdl: launch_int8_row_gemv(x, w, s, *fold, config, pdl)
    default = int8_config(n, k, bool(act))
    want = reference.row_gemv(x, stored[0][0], *fold, stored[0][1]).float()
    variants = [("general", general), (f"int8 {default}", ours(default))]
    variants += [(f"int8 {c}", ours(c)) for c in configs if c != default]
    variants += [("general again", general)]
    nbytes = rows * k + rows * 2
    row = {"product": name, "rows": rows, "k": k, "mb": nbytes / 1e6, "default": default,
           "variants": {}}
    for label, launch in variants:
        got = launch(*stored[0], False).float()
        err = ((got - want).norm() / want.norm()).item()
        try:
            plain, dependent = _timed(launch, stored, layers)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile
            print(f"  {name} {label}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        row["variants"][label] = {"rel_err": err, "us": plain, "pdl_us": dependent}
        print(f"{name:18s} {nbytes / 1e6:6.2f} MB {label:24s} rel.err {err:.1e} "
              f"plain {plain:6.2f} us {nbytes / plain / 1e3:5.0f} GB/s | dependent "
              f"{dependent:6.2f} us {nbytes / dependent / 1e3:5.0f} GB/s", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--configs", default="", help="BLOCK_N,BLOCK_W,WARPS;...")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";") if c]
    rows = [case(*shape, args.layers if shape[0] != "lm_head+norm" else 2, configs)
            for shape in SHAPES]
    if args.out:
        with open(args.out, "a") as fh:
            for row in rows:
                fh.write(json.dumps({"gpu": torch.cuda.get_device_name(), **row}) + "\n")


if __name__ == "__main__":
    main()
