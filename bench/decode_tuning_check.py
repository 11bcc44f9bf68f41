"""On the GPU machine: does the block-size choice of coordinate-descent tuning depend on
the host? (a working tool for the cuda decode goal)

    python bench/decode_tuning_check.py [--repeats 1] [--busy 12]

Each trial compiles, in a fresh process with an empty Inductor cache, the 1.1B decode
step's down projection (SiLU(gate) * up folded into the reduction's loads, as the cuda
target builds it) and its gate/up projection, with coordinate-descent tuning, then times
them in a CUDA graph of 22 layers (each its own weights). Trials vary how Inductor times
a candidate (its own event pairs; its profiler benchmarker where this torch has one;
targets/aoti/kernel_timing.py's queued timing) and whether the host is busy (N processes
spinning on the CPU while it compiles). Prints one JSON line per trial with the times
and the block sizes chosen.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("inductor", "profiler", "queued")


def trial(mode: str) -> dict:
    import importlib.util

    import torch
    import torch._inductor.config as inductor
    import torch.nn.functional as F

    from bench.decode_kernels_microbench import graph_time
    spec = importlib.util.spec_from_file_location(
        "kernel_timing", ROOT / "targets" / "aoti" / "kernel_timing.py")
    timing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timing)

    def down(gate_up, w):
        gate, up = gate_up.split(5632, -1)
        row = (F.silu(gate) * up).float()
        return (row * w.float()).sum(-1).to(gate_up.dtype)

    def gate_up_proj(x, w):
        return (x.float() * w.float()).sum(-1).to(x.dtype)

    layers = 22
    downs = [torch.randn(2048, 5632, device="cuda", dtype=torch.float16) * 0.02
             for _ in range(layers)]
    gate_ups = [torch.randn(11264, 2048, device="cuda", dtype=torch.float16) * 0.02
                for _ in range(layers)]
    gate_up = torch.randn(1, 11264, device="cuda", dtype=torch.float16)
    x = torch.randn(1, 2048, device="cuda", dtype=torch.float16)
    swap = (timing.host_independent_kernel_timing() if mode == "queued"
            else _nothing())
    with swap as swapped, inductor.patch(coordinate_descent_tuning=True):
        down_c = torch.compile(down, dynamic=False)
        gate_c = torch.compile(gate_up_proj, dynamic=False)
        down_c(gate_up, downs[0])
        gate_c(x, gate_ups[0])
    down_us = graph_time([lambda w=w: down_c(gate_up, w) for w in downs]) / layers * 1000
    gate_us = graph_time([lambda w=w: gate_c(x, w) for w in gate_ups]) / layers * 1000
    configs = [json.loads(path.read_text())
               for path in Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.best_config")]
    return {"mode": mode, "swapped": swapped, "down_us": round(down_us, 2),
            "gate_up_us": round(gate_us, 2), "configs": configs}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--busy", type=int, default=12, help="spinning processes")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--trial", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(trial(args.trial)), flush=True)
        return
    import torch._inductor.runtime.benchmarking as benchmarking
    print(json.dumps({"torch_profiler_benchmarker":
                      hasattr(benchmarking, "TorchProfilerBenchmarker")}), flush=True)
    for busy in (0, args.busy):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(busy)]
        try:
            for _ in range(args.repeats):
                for mode in args.modes.split(","):
                    _run_trial(mode, busy)
        finally:
            for spinner in spinners:
                spinner.kill()


def _run_trial(mode: str, busy: int) -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache,
               "TORCHINDUCTOR_USE_TORCH_PROFILER_BENCHMARKER": str(int(mode == "profiler"))}
        done = subprocess.run([sys.executable, __file__, "--trial", mode], env=env,
                              capture_output=True, text=True, cwd=ROOT)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            print(json.dumps({"mode": mode, "busy": busy, "error": done.stderr[-600:]}))
            return
        row = json.loads(lines[-1])
        print(json.dumps({**row, "busy": busy}), flush=True)


if __name__ == "__main__":
    main()
