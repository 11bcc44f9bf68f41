"""On the GPU machine, under Nsight Compute: one launch of each large product of the ~1.1B
LLaMA shape (gate/up with its norm and SiLU x up, the head with its norm) over int4, int8
and fp16 rows, for a profile of each against the others (int8 rows twice: the general
row kernel's int8 path, which the cuda target runs, then bench/int8_rows_triton.py's).

    ncu --clock-control none --set full -k regex:row_gemv_kernel -o REPORT \\
        python bench/rows_profile_cuda.py [--split-x]

Each product's first launch is the one profiled (Nsight Compute empties the caches before
each of its passes, so the weights come from memory as in the step). Int4 rows take their
default configuration (int4_triton.int4_config), then with ``--split-x`` the other form
of the dot; int8 and fp16 rows the built one (triton_kernels.gemv_config, plain).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_kernels_cuda import SHAPES  # noqa: E402

LARGE = ("gate_up+norm+silu", "lm_head+norm")


def launch_each(split_x: bool) -> None:
    from bench.int8_rows_triton import launch_int8_row_gemv
    from targets.aoti.kernels import int4_rows
    from targets.aoti.kernels.int4_triton import int4_config, launch_int4_row_gemv
    from targets.aoti.kernels.triton_kernels import launch_row_gemv
    dt = dict(device="cuda", dtype=torch.float16)
    for name, n, k, norm, act, res in (s for s in SHAPES if s[0] in LARGE):
        rows = 2 * n if act else n
        weight = torch.randn(rows, k, **dt) * 0.02
        x = torch.randn(1, 1, k, **dt)
        nw = torch.rand(k, **dt) + 0.5 if norm else None
        r = torch.randn(1, 1, n, **dt) if res else None
        packed, scales = int4_rows.pack(weight, 128)
        default = int4_config(n, k, 128, bool(act))
        for config in [default] + [(*default[:3], not default[3])] * split_x:
            print(f"int4 {name} {config}", flush=True)
            launch_int4_row_gemv(x, packed, scales, None, nw, r, 1e-5, 0.0, act, config)
        scale = weight.abs().amax(dim=1).float() / 127
        int8 = torch.round(weight.float() / scale[:, None]).to(torch.int8)
        print(f"int8 {name}", flush=True)
        launch_row_gemv(x, int8, None, nw, r, 1e-5, 0.0, act, None, False, scale.half())
        print(f"int8 rows kernel {name}", flush=True)
        launch_int8_row_gemv(x, int8, scale.half(), None, nw, r, 1e-5, 0.0, act)
        print(f"fp16 {name}", flush=True)
        launch_row_gemv(x, weight, None, nw, r, 1e-5, 0.0, act)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split-x", action="store_true")
    args = parser.parse_args()
    launch_each(args.split_x)


if __name__ == "__main__":
    main()
