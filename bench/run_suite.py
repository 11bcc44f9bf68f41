"""Benchmark suite: build each model for a target, then time it against eager and
torch.compile(reduce-overhead) in one process.

    python bench/run_suite.py --target cuda --dtype fp16 --json-out build/bench.json
    python bench/run_suite.py --render build/bench.json >> bench/RESULTS.md

Each model's row is appended to the JSON file as soon as it is measured, so a run
cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import read_rows, run_or_render  # noqa: E402


@contextlib.contextmanager
def _stage(name: str):
    start = time.perf_counter()
    yield
    print(f"  {name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def measure(name: str, spec: str, args) -> dict:
    from exporter.benchmark import bench
    from exporter.builder.pipeline import build
    from exporter.settings import BuildSettings

    out = Path(args.work_dir) / f"{name}-{args.target}-{args.dtype}.artifact"
    print(f"{name}:", file=sys.stderr, flush=True)
    start = time.perf_counter()
    settings = BuildSettings(target=args.target, dtype=args.dtype, out=out,
                             autotune=args.autotune)
    built = build(spec, settings, stage=_stage)
    build_s = time.perf_counter() - start
    with _stage("bench"):
        result = bench(out, model=spec, runs=args.runs, warmup=args.warmup)
    return {"model": name, "spec": spec, "build_s": round(build_s, 1),
            "lower_s": built.timings.get("lower (aoti)"),
            "validation_passed": built.manifest.validation["passed"],
            "artifact_mb": round(out.stat().st_size / 1e6, 2), **result}


def run(args) -> None:
    import torch

    from bench.models import SUITE
    names = list(SUITE) if args.models == "all" else args.models.split(",")
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    header = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "python": platform.python_version(),
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "cpu": platform.processor() or platform.machine(), "target": args.target,
              "dtype": args.dtype, "runs": args.runs}
    with open(args.json_out, "a") as sink:
        for name in names:
            try:
                row = {**header, **measure(name, SUITE[name], args)}
            except ImportError as exc:
                row = {**header, "model": name, "skipped": f"{exc}"}
            except Exception as exc:  # one model failing must not lose the others' figures
                row = {**header, "model": name, "error": f"{type(exc).__name__}: {exc}"}
                traceback.print_exc()
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(json.dumps({k: row.get(k) for k in ("model", "build_s", "ratios", "error",
                                                     "skipped")}), flush=True)


def render(paths: list[str]) -> str:
    rows = read_rows(paths)
    if not rows:
        return ""
    head = rows[0]
    lines = [f"\n## {head['date']}: target {head['target']}, {head['dtype']}, "
             f"{head.get('gpu') or head['cpu']}",
             f"torch {head['torch']}, CUDA {head['cuda']}, Python {head['python']}; median over "
             f"{head['runs']} runs after warm-up; the models one after another in one "
             "process, each model's artifact and baselines interleaved.\n",
             "| model | eager ms | compile (reduce-overhead) ms | artifact ms | artifact/compile"
             " | eager/artifact | build s | validated |",
             "|---|---|---|---|---|---|---|---|"]
    vs_compile, speedup = [], []
    for row in rows:
        if "timings" not in row:
            lines.append(f"| {row['model']} | – | – | – | – | – | – | "
                         f"{(row.get('error') or row.get('skipped') or '').splitlines()[0]} |")
            continue
        t = row["timings"]
        art, eager, comp = (t["artifact"]["median_ms"], t["eager"]["median_ms"],
                            t["compile"]["median_ms"])
        vs_compile.append(art / comp)
        speedup.append(eager / art)
        lines.append(f"| {row['model']} | {eager:.3f} | {comp:.3f} | {art:.3f} | "
                     f"{art / comp:.2f} | {eager / art:.2f} | {row['build_s']} | "
                     f"{row['validation_passed']} |")
    if vs_compile:
        geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
        lines.append(f"\nGeometric mean: artifact/compile {geo(vs_compile):.2f} "
                     f"(max {max(vs_compile):.2f}); eager/artifact {geo(speedup):.2f}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--models", default="all")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--autotune", action="store_true")
    run_or_render(parser, run, render, "build/bench/results.jsonl")


if __name__ == "__main__":
    main()
