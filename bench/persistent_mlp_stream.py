"""A layer's MLP half (o + residual, RMSNorm + gate/up + SiLU x up, down + residual) as
one persistent Gluon kernel whose weight stream runs on across its grid-wide barriers:
the kernel is bench/stream_mlp_gluon.py, its plan and launch bench/stream_mlp_launch.py,
the math bench/persistent_mlp.py's (three reference.row_gemv calls in a row).

bench/persistent_mlp.py loses about 2 us at each of its two barriers: while a program
spins, its registers hold at most one block of the next product. Here each program owns
a fixed list of weight tiles across the three products and a ring of tiles in shared
memory that the copy engine (TMA) fills in that order, a ring ahead of the sums; so the
next product's first tiles land while the program waits at a barrier, and the first
ones stream during the attention before (a dependent launch issues them before its
wait). gate/up's rows are stored raw (fp32); down's x, SiLU(gate) x up, is made by each
program after the second barrier.

    python bench/persistent_mlp_stream.py                    (no GPU: sm_90a compiles)
    python bench/persistent_mlp_stream.py --check [--rounds N]   (on the GPU machine)

Without ``--check``: each configuration compiled for sm_90a (ptxas's registers, spilled
bytes; shared bytes). ``--check``: one layer at small and real shapes against
reference.row_gemv's math (max abs / rel diff; exit 1 past fp16 tolerance, if repeated
calls differ, or if a barrier gave up), then a 22-layer chain of this kernel alone
against bench/persistent_mlp.py's (outputs within 5e-2 relative of its), CUDA graphs
replayed in turns (medians); each step in a child process under a time limit, so a
barrier that never opens cannot eat the call.
A timing tool, not part of the built library.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.stream_mlp_launch import (STREAM_CONFIGS, launch_stream_mlp, plan,  # noqa: E402
                                     resources)

EPS = 1e-5
TOLERANCE = 8e-3  # of max(1, the largest expected value): a few fp16 steps
CHAIN_TOLERANCE = 5e-2  # the same over 22 layers, against the other kernel's roundings
SMALL = (512, 1536, (8, 8, 64, 4, 8))  # hidden, intermediate, a config that fits them
REPEATS = 20


def _layer(hidden: int, inter: int, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)

    def made(*size, scale=1.0, shift=0.0):
        return (torch.randn(size, generator=generator) * scale + shift).to(
            device="cuda", dtype=torch.float16)
    return dict(attn=made(1, 1, hidden), hidden=made(1, 1, hidden),
                o_weight=made(hidden, hidden, scale=hidden ** -0.5),
                norm_weight=made(hidden, scale=0.1, shift=1.0),
                gate_up_weight=made(2 * inter, hidden, scale=hidden ** -0.5),
                down_weight=made(hidden, inter, scale=inter ** -0.5))


def _expected(layer: dict) -> tuple:
    from targets.aoti.kernels.reference import row_gemv
    o = row_gemv(layer["attn"], layer["o_weight"], None, None, layer["hidden"], EPS, 0.0, 0)
    gated = row_gemv(o, layer["gate_up_weight"], None, layer["norm_weight"], None, EPS,
                     0.0, 1)
    return o, row_gemv(gated, layer["down_weight"], None, None, o, EPS, 0.0, 0)


def _diff(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max |diff|, that over max(1, max |want|))."""
    error = (got.float() - want.float()).abs().max().item()
    return error, error / max(1.0, want.float().abs().max().item())


def check_layer() -> bool:
    """One layer a case against reference.row_gemv; then REPEATS calls on one barrier
    buffer, plain and dependent launches in turn, each bit-equal to the first; the count
    left at two a program a call and no barrier given up."""
    from bench.persistent_mlp import launch_persistent_mlp, persistent_grid
    hidden, inter, small = SMALL
    cases = [("small, 16 programs", hidden, inter, small, 16),
             ("small", hidden, inter, small, None)]
    cases += [(f"real {name}", 2048, 5632, config, None)
              for name, config in STREAM_CONFIGS.items()]
    passed = True
    for seed, (label, width, inner, config, programs) in enumerate(cases):
        layer = _layer(width, inner, seed)
        grid = programs or persistent_grid(torch.device("cuda"), 1)
        sync = torch.zeros(2, dtype=torch.int32, device="cuda")
        want_o, want_out = _expected(layer)
        o, out = launch_stream_mlp(**layer, sync=sync, eps=EPS, config=config,
                                   programs=programs)
        same = all([torch.equal(launch_stream_mlp(
            **layer, sync=sync, eps=EPS, config=config, programs=programs,
            pdl=bool(i % 2))[1], out) for i in range(REPEATS)])
        torch.cuda.synchronize()
        count, gave_up = sync.tolist()
        counted = count % (1 << 32) == 2 * (REPEATS + 1) * grid % (1 << 32)
        (o_abs, o_rel), (abs_, rel) = _diff(o, want_o), _diff(out, want_out)
        ok = o_rel <= TOLERANCE and rel <= TOLERANCE and same and counted and not gave_up
        passed &= ok
        line = (f"layer {label} ({grid} programs, {config}): o max|diff| {o_abs:.2e} "
                f"(rel {o_rel:.2e}), out {abs_:.2e} (rel {rel:.2e}); repeats bit-equal "
                f"{same}; count {count} ({'ok' if counted else 'WRONG'}); barrier gave up "
                f"{bool(gave_up)}")
        if label == "real " + next(iter(STREAM_CONFIGS)):  # the old kernel, for scale
            old_sync = torch.zeros(2, dtype=torch.int32, device="cuda")
            old = launch_persistent_mlp(**layer, sync=old_sync, eps=EPS)[1]
            line += f"; persistent_mlp.py's out {_diff(old, want_out)[0]:.2e}"
        print(("ok   " if ok else "FAIL ") + line, flush=True)
    return passed


def _chain_weights(layers: int, hidden: int = 2048, inter: int = 5632) -> list:
    def w(*size):
        return torch.randn(*size, device="cuda", dtype=torch.float16) * 0.02
    return [(w(hidden, hidden), w(2 * inter, hidden), w(hidden, inter))
            for _ in range(layers)]


def check_chain(rounds: int, layers: int = 22) -> bool:
    """``layers`` kernels in a row (each its own weights, dependent launches): this kernel
    in each configuration against persistent_mlp.py's, graphs replayed in turns."""
    from bench.decode_kernels_microbench import taking_turns
    from bench.persistent_mlp import launch_persistent_mlp
    torch.manual_seed(0)
    made = _chain_weights(layers)
    norm = torch.rand(2048, device="cuda", dtype=torch.float16) + 0.5
    row = torch.randn(1, 1, 2048, device="cuda", dtype=torch.float16)
    syncs = {name: torch.zeros(2, dtype=torch.int32, device="cuda")
             for name in ["old", *STREAM_CONFIGS]}

    def chain(launch, sync, **options):
        h = row
        for wo, wgu, wd in made:
            h = launch(row, h, wo, norm, wgu, wd, sync, EPS, pdl=True, **options)[1]
        return h
    calls = {"persistent_mlp.py (2/SM 8w balanced)":
             lambda: chain(launch_persistent_mlp, syncs["old"])}
    for name, config in STREAM_CONFIGS.items():
        calls[f"stream {name}"] = (lambda config=config, sync=syncs[name]: chain(
            launch_stream_mlp, sync, config=config))
    first = calls["persistent_mlp.py (2/SM 8w balanced)"]()
    agree = True
    for label, call in calls.items():  # 22 layers of roundings apart, not garbage
        error, rel = _diff(call(), first)
        agree &= rel <= CHAIN_TOLERANCE
        print(f"chain output, {label}: max|diff| vs persistent_mlp.py's {error:.2e} "
              f"(rel {rel:.2e})", flush=True)
    turns = taking_turns(calls, rounds)
    weight_bytes = sum(t.numel() * t.element_size() for ws in made for t in ws)
    base = next(iter(turns.values()))
    for label, us in turns.items():
        print(f"chain in turns, {rounds} rounds: {label:38s} {us:8.1f} us  "
              f"{us / layers:6.2f} us a layer  {weight_bytes / us / 1e6:5.2f} TB/s  "
              f"{us / base:.4f}", flush=True)
    gave_up = [name for name, sync in syncs.items() if sync[1].item()]
    print(f"chain barriers given up: {gave_up or 'none'}", flush=True)
    return agree and not gave_up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="on the GPU: a layer, a chain")
    parser.add_argument("--stage", choices=("layer", "chain"), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if args.stage:
        ok = check_layer() if args.stage == "layer" else check_chain(args.rounds)
        sys.exit(0 if ok else 1)
    if not args.check:
        for name, config in STREAM_CONFIGS.items():
            found = plan(2048, 5632, 128, config)
            print(f"{name} {config}: {resources(config)}; turns (o, gate/up, down) "
                  f"{found['o'][2]}, {found['gate_up'][2]}, {found['down'][2]} of "
                  f"{found['o'][3]}, {found['gate_up'][3]}, {found['down'][3]} parts",
                  flush=True)
        return
    for stage, limit in (("layer", 240), ("chain", 300)):
        began = time.monotonic()
        try:
            rc = subprocess.run([sys.executable, __file__, "--stage", stage, "--rounds",
                                 str(args.rounds)], timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        print(f"stage {stage}: rc {rc} in {time.monotonic() - began:.0f} s", flush=True)
        if rc:
            sys.exit(1)


if __name__ == "__main__":
    main()
