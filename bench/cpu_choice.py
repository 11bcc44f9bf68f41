"""The cpu target's backend choice against its own candidates and the peers: each model
built with `--target cpu` (`--cpu-backend auto`: the build times AOTInductor and ONNX
Runtime and keeps the faster, recording both figures in the manifest) and with
`--target onnx`, then the cpu artifact, the onnx artifact, eager torch and a plain ONNX
Runtime session on `torch.onnx.export`'s file timed in one process, interleaved, on the
model's example inputs, everything on ``--threads`` threads.

    taskset -c 0,1 env OMP_NUM_THREADS=2 python bench/cpu_choice.py \
        --models bench/models.py:hf_resnet50 --json-out build/bench/cpu-choice.jsonl
    python bench/cpu_choice.py --render build/bench/cpu-choice.jsonl >> bench/RESULTS.md

The candidates' figures are the build's own (its timing process, on the same CPUs and
threads); the other columns are this script's. Builds run as the CLI, validation
included, cached in ``--work-dir`` (bench/compare_targets.py's ``build_one``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (LoadSampler, append_row, fix_threads, machine_header,  # noqa: E402
                          read_rows, run_or_render, time_artifacts)
from bench.compare_targets import _name, _spec, baselines, build_one  # noqa: E402

VARIANTS = {"cpu": ["--target", "cpu", "--cpu-backend", "auto"], "onnx": ["--target", "onnx"]}


def run(args) -> None:
    import onnxruntime
    import torch

    import runtime

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    threads = fix_threads(args.threads)
    header = machine_header(torch=torch.__version__, onnxruntime=onnxruntime.__version__,
                            runs=args.runs, threads=threads,
                            affinity=sorted(os.sched_getaffinity(0)), argv=" ".join(sys.argv))
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json_out, "a") as sink:
        for model in args.models.split(","):
            start = time.perf_counter()
            extra = ["--no-validate"] if args.no_validate else []
            built = {label: build_one(label, _spec(model), flags + extra, work_dir,
                                      _name(model))
                     for label, flags in VARIANTS.items()
                     if label in args.variants.split(",")}
            paths = {k: v["path"] for k, v in built.items() if "path" in v}
            choice = (runtime.read_manifest(paths["cpu"]).build.get("backend_choice")
                      if "cpu" in paths else None)
            inputs, calls = baselines(model, args.baselines.split(","), work_dir, args.threads)
            with LoadSampler() as load:
                timings = time_artifacts(paths, inputs, args.runs, args.warmup,
                                         extra_calls=calls)
            append_row(sink, {**header, "model": _name(model), "spec": _spec(model),
                              "timings": timings, "backend_choice": choice,
                              "build_s": {k: v["build_s"] for k, v in built.items()},
                              "errors": {k: v["error"] for k, v in built.items()
                                         if "error" in v},
                              "load": load.summary(), "validated": not args.no_validate,
                              "wall_s": round(time.perf_counter() - start, 1)})


def render(paths: list[str]) -> str:
    rows = read_rows(paths)
    head = rows[0]
    lines = [f"| model | cpu chose | its build's figures (ms) | cpu | onnx target | eager | "
             f"plain ORT | cpu / best peer | cpu / onnx target | build s (cpu, onnx) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        t = {k: v["median_ms"] for k, v in row["timings"].items()}
        record = next(iter((row.get("backend_choice") or {}).values()), {})
        figures = ", ".join(f"{name} {c['median_ms']:.4g}" if "median_ms" in c
                            else f"{name} dropped" for name, c in
                            record.get("candidates", {}).items())
        peers = [t[k] for k in ("eager", "ort") if k in t]
        cells = [f"{t[k]:.4g}" if k in t else row.get("errors", {}).get(k, "-")[:40]
                 for k in ("cpu", "onnx", "eager", "ort")]
        vs_peer = f"{t['cpu'] / min(peers):.2f}" if "cpu" in t and peers else "-"
        vs_onnx = f"{t['cpu'] / t['onnx']:.2f}" if "cpu" in t and "onnx" in t else "-"
        build = row.get("build_s", {})
        lines.append(f"| {row['model']} | {record.get('chosen', '-')} "
                     f"({record.get('by', '-')}) | {figures or '-'} | " + " | ".join(cells)
                     + f" | {vs_peer} | {vs_onnx} | {build.get('cpu')}, {build.get('onnx')} |")
    intro = (f"\n{head['cpu']}, {head['cores']} cores in the affinity mask, threads "
             f"{head['threads']}; torch {head['torch']}, onnxruntime {head['onnxruntime']}; "
             f"median ms over {head['runs']} interleaved calls per engine, batch 1.\n")
    return intro + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="bench/models.py:hf_resnet50")
    parser.add_argument("--variants", default="cpu,onnx", help="cpu (auto) and/or onnx")
    parser.add_argument("--baselines", default="ort", help="ort (eager always)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-validate", action="store_true",
                        help="build without the validation process (a short machine lease)")
    run_or_render(parser, run, render, "build/bench/cpu-choice.jsonl")


if __name__ == "__main__":
    main()
