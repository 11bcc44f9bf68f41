"""CPU targets side by side: each zoo model built for ``cpu``, ``onnx`` and ``tvm`` (and,
where asked, ``tvm`` with static shapes untuned and with ``--tune N``), then every artifact and eager timed in one process,
interleaved, on the model's example inputs.

    python bench/compare_targets.py --models mlp,cnn,encoder,decoder --tune encoder:64 \
        --json-out build/bench/targets.jsonl
    python bench/compare_targets.py --render build/bench/targets.jsonl >> bench/RESULTS.md

All runtimes live in one process, as a service embedding several would: ONNX Runtime's
and TVM's thread pools spin briefly after a call, which the interleaving (blocks of
runs/10 calls per candidate, ten rounds) spreads over all candidates alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append_row, machine_header, read_rows, run_or_render, time_artifacts  # noqa: E402

TARGETS = ("cpu", "onnx", "tvm")


def build_all(name: str, tune: int, work_dir: Path) -> dict[str, dict]:
    """{label: {"path", "build_s"}} for each target (and the tuned tvm build)."""
    from exporter.builder.pipeline import build
    from exporter.settings import BuildSettings

    variants = [(t, f"zoo:{name}", {"target": t}) for t in TARGETS]
    if tune:  # MetaSchedule tunes static shapes only: static builds, untuned and tuned
        static = f"{ROOT}/bench/static_zoo.py:{name}"
        variants += [("tvm-static", static, {"target": "tvm"}),
                     (f"tvm-static-tune{tune}", static, {"target": "tvm", "tune": tune})]
    built = {}
    for label, spec, options in variants:
        out = work_dir / f"{name}-{label}.artifact"
        start = time.perf_counter()
        result = build(spec, BuildSettings(out=out, **options))
        assert result.manifest.validation["passed"], f"{label} failed validation"
        built[label] = {"path": out, "build_s": round(time.perf_counter() - start, 1)}
        print(f"  built {label} in {built[label]['build_s']} s", file=sys.stderr, flush=True)
    return built


def time_all(name: str, built: dict[str, dict], runs: int, warmup: int) -> dict:
    from exporter.model.zoo import ZOO
    from runtime.program.flat_inputs import flatten_inputs

    module, args, _ = ZOO[name]()
    return time_artifacts({label: info["path"] for label, info in built.items()},
                          flatten_inputs(args, {}).tensors, runs, warmup,
                          extra_calls={"eager": lambda: module(*args)})


def run(args) -> None:
    import torch
    import tvm

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tune = dict(item.split(":") for item in args.tune.split(",") if item)
    header = machine_header(torch=torch.__version__, tvm=tvm.__version__,
                            onnxruntime=__import__("onnxruntime").__version__, runs=args.runs)
    with open(args.json_out, "a") as sink:
        for name in args.models.split(","):
            print(f"{name}:", file=sys.stderr, flush=True)
            built = build_all(name, int(tune.get(name, 0)), work_dir)
            timings = time_all(name, built, args.runs, args.warmup)
            row = {**header, "model": name, "timings": timings,
                   "build_s": {k: v["build_s"] for k, v in built.items()}}
            append_row(sink, row)


def render(paths: list[str]) -> str:
    rows = read_rows(paths)
    head = rows[0]
    labels = list(dict.fromkeys(label for row in rows for label in row["timings"]
                                if label != "eager"))  # every column, in first-seen order
    lines = [f"\n## {head['date']}: CPU targets side by side, {head['cpu']}, {head['cores']} cores",
             f"torch {head['torch']}, onnxruntime {head['onnxruntime']}, apache-tvm "
             f"{head['tvm']}, Python {head['python']}. `python bench/compare_targets.py`: "
             f"per model, every artifact and eager in one process, interleaved; median ms over "
             f"{head['runs']} calls at the example batch (2).\n",
             "| model | eager | " + " | ".join(labels) + " | tvm/eager | tvm/cpu |",
             "|---|" + "---|" * (len(labels) + 3)]
    for row in rows:
        t = {k: v["median_ms"] for k, v in row["timings"].items()}
        cells = [f"{t[label]:.3f}" if label in t else "–" for label in labels]
        lines.append(f"| {row['model']} | {t['eager']:.3f} | " + " | ".join(cells)
                     + f" | {t['tvm'] / t['eager']:.2f} | {t['tvm'] / t['cpu']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cnn,encoder,decoder")
    parser.add_argument("--tune", default="", help="MODEL:TRIALS,... for tvm --tune")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    run_or_render(parser, run, render, "build/bench/targets.jsonl")


if __name__ == "__main__":
    main()
