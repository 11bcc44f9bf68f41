"""The memory plan against what runs: per model, the planned activations (at the dynamic
dims' upper bounds) beside the peak measured while the build validated the artifact; and
the CPU-fallback arena against the allocator, timed side by side.

    python bench/compare_memory.py --models zoo:mlp,zoo:cnn --json-out build/bench/memory.jsonl
    python bench/compare_memory.py --render build/bench/memory.jsonl >> bench/RESULTS.md

Each model is built twice on onnx: as is (the plan and ONNX Runtime's measured peak),
and with every op on the CPU fallback (``--min-partition-size`` above the op count), which
is then loaded with and without its arena and timed in one process, interleaved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append_row, machine_header, read_rows, run_or_render  # noqa: E402

ALL_ON_FALLBACK = 1_000_000  # --min-partition-size: no delegated island is that large


def run(args) -> None:
    import onnxruntime
    import torch

    import runtime
    from exporter.benchmark import time_side_by_side
    from exporter.builder.pipeline import build
    from exporter.settings import BuildSettings
    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    header = machine_header(torch=torch.__version__, onnxruntime=onnxruntime.__version__)
    with open(args.json_out, "a") as sink:
        for spec in args.models.split(","):
            stem = spec.rsplit(":", 1)[-1]
            onnx = build(spec, BuildSettings(target="onnx", out=work_dir / f"{stem}-mem.artifact"))
            fallback = build(spec, BuildSettings(target="onnx", min_partition_size=ALL_ON_FALLBACK,
                                                 out=work_dir / f"{stem}-fallback.artifact"))
            model = load_spec(spec)
            inputs = flatten_inputs(model.args, model.kwargs).tensors
            calls = {}
            for label, arenas in (("allocator", False), ("arena", True)):
                program = runtime.load(fallback.artifact, arenas=arenas)
                calls[label] = (lambda p: lambda: p.run(inputs))(program)
            with torch.inference_mode():
                timings = time_side_by_side(calls, "cpu", args.runs, args.warmup)
            plan = onnx.manifest.memory_plan
            arena = fallback.manifest.memory_plan["arenas"].get("cpu", {})
            append_row(sink, {**header, "model": spec, "runs": args.runs,
                              "plan": {k: plan[k] for k in ("buffers", "naive_bytes",
                                                            "lower_bound_bytes", "arena_bytes",
                                                            "sized_at")},
                              "measured_onnx": onnx.measured["memory"],
                              "fallback_arena_bytes": arena.get("arena_bytes", 0),
                              "fallback_slots": len(arena.get("slots", {})),
                              "fallback_buffers": fallback.manifest.memory_plan["buffers"],
                              "measured_fallback": fallback.measured["memory"],
                              "timings": timings})


def render(paths: list[str]) -> str:
    rows = read_rows(paths)
    head = rows[0]
    kb = lambda n: f"{n / 1e3:.1f}"  # noqa: E731
    lines = [f"\n## {head['date']}: memory plan against what runs, {head['cpu']}, "
             f"{head['cores']} cores",
             f"torch {head['torch']}, onnxruntime {head['onnxruntime']}, Python "
             f"{head['python']}. `python bench/compare_memory.py`. Plan: activations at the "
             "dynamic dims' upper bounds (KB). Measured: resident-set growth of the validation "
             "subprocess while it ran the three validation inputs after one warm-up run (KB). "
             "Fallback: the same model with every op on the CPU fallback, whose intermediates "
             f"run in the arena (`out=` overloads) or from the allocator (`runtime.load(..., "
             f"arenas=False)`), {head['runs']} calls each, interleaved, median ms.\n",
             "| model | buffers | naive | lower bound | arena | arena / bound | measured, onnx "
             "| fallback: arena KB (tensors placed) | measured, fallback | allocator ms | "
             "arena ms | arena speed-up |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        plan, t = row["plan"], row["timings"]
        slow, fast = t["allocator"]["median_ms"], t["arena"]["median_ms"]
        lines.append(
            f"| {row['model']} | {plan['buffers']} | {kb(plan['naive_bytes'])} | "
            f"{kb(plan['lower_bound_bytes'])} | {kb(plan['arena_bytes'])} | "
            f"{plan['arena_bytes'] / max(plan['lower_bound_bytes'], 1):.3f}x | "
            f"{kb(row['measured_onnx'].get('cpu_peak_bytes', 0))} | "
            f"{kb(row['fallback_arena_bytes'])} ({row['fallback_slots']} of "
            f"{row['fallback_buffers']}) | {kb(row['measured_fallback'].get('cpu_peak_bytes', 0))} "
            f"| {slow:.3f} | {fast:.3f} | {slow / fast:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="zoo:mlp,zoo:cnn,zoo:encoder,zoo:decoder,"
                                            "tests/models/hf_bert.py:tiny_bert")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    run_or_render(parser, run, render, "build/bench/memory.jsonl")


if __name__ == "__main__":
    main()
