"""An AOTInductor CPU library's constants where its own load puts them (one malloc block,
16-byte aligned) against aligned copies (runtime/executors/aoti.py, aligned_cpu_runner):
the same package, interleaved, on linears packed for oneDNN (Inductor's default) and on
the cpu target's MKL form.

    OMP_NUM_THREADS=1 taskset -c 1 python bench/aoti_constant_alignment.py \\
        --work-dir build/aoti-align --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.executors.aoti import aligned_cpu_runner  # noqa: E402
from targets.aoti.linear_packing import float32_linears_unpacked  # noqa: E402


def package(path: Path, program, mkl: bool) -> Path:
    if not path.exists():
        with torch.no_grad(), (float32_linears_unpacked() if mkl else contextlib.nullcontext()):
            torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                     inductor_configs={"freezing": True})
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work-dir", default="build/aoti-align")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=197)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.Linear(3072, 768)).eval()
    x = torch.randn(args.rows, 768)
    program = torch.export.export(model, (x,))
    calls = {}
    for form, mkl in (("onednn", False), ("mkl", True)):
        path = package(work / f"{form}-{args.rows}.pt2", program, mkl)
        aligned = aligned_cpu_runner(path, work / f"{form}-{args.rows}")
        library = next((work / f"{form}-{args.rows}").rglob("*.so"))
        own = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1)
        offsets = sorted({t.data_ptr() % 64 for t in own.extract_constants_map(False).values()
                          if t.layout == torch.strided})
        calls[f"{form}, its own load (constants at {offsets} mod 64)"] = \
            (lambda r: lambda: r.run([x]))(own)
        calls[f"{form}, aligned"] = (lambda r: lambda: r.run([x]))(aligned)
    torch.set_num_threads(args.threads)
    times = {name: [] for name in calls}
    with torch.no_grad():
        for round_ in range(args.rounds):
            names = list(calls)[round_ % len(calls):] + list(calls)[:round_ % len(calls)]
            for name in names:
                calls[name]()  # untimed: the previous one's pool lets go of the cores
                for _ in range(5):
                    start = time.perf_counter()
                    calls[name]()
                    times[name].append(time.perf_counter() - start)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rows}x768x3072 and back, "
          f"{len(times[name])} calls each, median ms:")
    for name, values in times.items():
        print(f"  {name}: {statistics.median(values) * 1e3:.2f}")


if __name__ == "__main__":
    main()
