"""Fused against unfused, per target: each model built with and without the target's
fusion passes (``--no-fuse``), both artifacts timed in one process, interleaved, on the
same inputs.

    python bench/compare_fusion.py --targets onnx,tvm --models zoo:encoder,zoo:cnn \
        --json-out build/bench/fusion.jsonl
    python bench/compare_fusion.py --render build/bench/fusion.jsonl >> bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append_row, machine_header, read_rows, run_or_render, time_artifacts  # noqa: E402


def build_pair(spec: str, target: str, work_dir: Path) -> tuple[dict, dict]:
    from exporter.builder.pipeline import build
    from exporter.settings import BuildSettings

    paths, passes = {}, {}
    for label, fuse in (("unfused", False), ("fused", True)):
        out = work_dir / f"{spec.rsplit(':', 1)[-1]}-{target}-{label}.artifact"
        result = build(spec, BuildSettings(target=target, out=out, fuse=fuse))
        paths[label] = str(out)
        passes[label] = {r["name"]: r["info"] for r in result.manifest.passes if r["modified"]}
    return paths, passes


def run(args) -> None:
    import onnxruntime
    import torch
    import tvm

    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    header = machine_header(torch=torch.__version__, onnxruntime=onnxruntime.__version__,
                            tvm=tvm.__version__)
    with open(args.json_out, "a") as sink:
        for target in args.targets.split(","):
            for spec in args.models.split(","):
                paths, passes = build_pair(spec, target, work_dir)
                model = load_spec(spec)
                timings = time_artifacts(paths, flatten_inputs(model.args, model.kwargs).tensors,
                                         args.runs, args.warmup)
                append_row(sink, {**header, "target": target, "model": spec, "runs": args.runs,
                                  "passes": passes["fused"], "timings": timings})


def render(paths: list[str]) -> str:
    rows = read_rows(paths)
    head = rows[0]
    lines = [f"\n## {head['date']}: fused vs unfused on onnx and tvm, {head['cpu']}, "
             f"{head['cores']} cores",
             f"torch {head['torch']}, onnxruntime {head['onnxruntime']}, tvm {head['tvm']}, "
             f"Python {head['python']}. `python bench/compare_fusion.py`: per target and model, "
             "the artifact built with `--no-fuse` and the default (fused) one, in one process, "
             f"interleaved, same inputs, {head['runs']} calls each; median ms.\n",
             "| target | model | unfused ms | fused ms | fused speed-up | what the passes did |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        unfused, fused = (row["timings"][k]["median_ms"] for k in ("unfused", "fused"))
        did = "; ".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in info.items())
                        for name, info in row["passes"].items() if name != "eliminate_dead_code")
        lines.append(f"| {row['target']} | {row['model']} | {unfused:.3f} | {fused:.3f} | "
                     f"{unfused / fused:.2f}x | {did or '–'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", default="onnx,tvm")
    parser.add_argument("--models", default="zoo:encoder,zoo:cnn")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    run_or_render(parser, run, render, "build/bench/fusion.jsonl")


if __name__ == "__main__":
    main()
