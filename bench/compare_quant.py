"""fp32 against int8 on one target: each model built without and with each --quantize
recipe, then all its artifacts timed in one process, interleaved, on the same inputs;
with weight bytes, artifact size and the accuracy-gate figures.

    python bench/compare_quant.py --target cpu --models zoo:encoder,zoo:cnn,bench/models.py:bert_base \
        --json-out build/bench/quant.jsonl
    python bench/compare_quant.py --render build/bench/quant.jsonl >> bench/RESULTS.md

Static recipes calibrate on random inputs here (timing, not accuracy: the gate figures of
random-weight models say little, see the quantization issue).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import append_row, machine_header, read_rows, run_or_render, time_artifacts  # noqa: E402



def build_variants(spec: str, target: str, recipes: list[str], work_dir: Path,
                   min_sqnr_db: float) -> dict:
    from exporter.builder.pipeline import build
    from exporter.report.console import quantization_records
    from exporter.settings import BuildSettings

    built = {}
    for recipe in ["fp32", *recipes]:
        out = work_dir / f"{spec.rsplit(':', 1)[-1]}-{target}-{recipe}.artifact"
        options = {} if recipe == "fp32" else {"quantize": recipe,
                                               "quant_min_sqnr_db": min_sqnr_db}
        if recipe == "int8-static":
            options["calibration"] = "random"
        start = time.perf_counter()
        result = build(spec, BuildSettings(target=target, out=out, **options))
        quant = next(iter(quantization_records(result.manifest)), {})
        rows = result.manifest.validation["outputs"]
        built[recipe] = {
            "path": str(out), "build_s": round(time.perf_counter() - start, 1),
            "artifact_bytes": out.stat().st_size,
            "weight_bytes": quant.get("weight_bytes_after"),
            "weight_bytes_fp32": quant.get("weight_bytes_before"),
            "layers_quantized": len(quant.get("layers_quantized", [])),
            "layers_float": len(quant.get("layers_float", [])),
            "worst_sqnr_db": min((r["sqnr_db"] for r in rows if "sqnr_db" in r), default=None),
            "worst_cosine": min((r["cosine"] for r in rows if "cosine" in r), default=None)}
        print(f"  built {recipe} in {built[recipe]['build_s']} s", file=sys.stderr, flush=True)
    return built


def time_variants(spec: str, built: dict, runs: int, warmup: int, device: str) -> dict:
    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    model = load_spec(spec)
    return time_artifacts({recipe: info["path"] for recipe, info in built.items()},
                          flatten_inputs(model.args, model.kwargs).tensors, runs, warmup,
                          device=device)


def run(args) -> None:
    import torch
    import torchao

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    header = machine_header(torch=torch.__version__, torchao=torchao.__version__,
                            target=args.target)
    if args.target == "cuda":
        header["gpu"] = torch.cuda.get_device_name()
    with open(args.json_out, "a") as sink:
        for spec in args.models.split(","):
            print(f"{spec}:", file=sys.stderr, flush=True)
            built = build_variants(spec, args.target, args.recipes.split(","), work_dir,
                                   args.min_sqnr)
            runs = args.runs_large if "bench/" in spec else args.runs
            timings = time_variants(spec, built, runs, args.warmup,
                                    "cuda" if args.target == "cuda" else "cpu")
            row = {**header, "model": spec, "runs": runs, "variants": built, "timings": timings}
            append_row(sink, row)


def render(paths: list[str]) -> str:
    rows = read_rows(paths)
    head = rows[0]
    where = head.get("gpu") or f"{head['cpu']}, {head['cores']} cores"
    lines = [f"\n## {head['date']}: fp32 vs int8 on target {head['target']}, {where}",
             f"torch {head['torch']}, torchao {head['torchao']}, Python {head['python']}. "
             "`python bench/compare_quant.py`: per model, the fp32 artifact and each int8 "
             "artifact in one process, interleaved, same inputs; median ms (CUDA events on a "
             "GPU, after warm-up). Weights: bytes of "
             "the program's tensors (int8 weights plus the float tensors left, e.g. "
             "embeddings). Gate: worst output over the validation sets, against eager fp32.\n",
             "| model | recipe | median ms | speed-up vs fp32 | weights MB | smaller | "
             "layers quantized / float | worst SQNR dB | worst cosine | default gate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        fp32 = row["timings"]["fp32"]["median_ms"]
        fp32_bytes = next((v["weight_bytes_fp32"] for v in row["variants"].values()
                           if v["weight_bytes_fp32"]), None)
        for recipe, info in row["variants"].items():
            ms = row["timings"][recipe]["median_ms"]
            after = info["weight_bytes"] or fp32_bytes
            size = f"{after / 1e6:.2f}" if after else "–"
            smaller = f"{fp32_bytes / after:.2f}x" if after and fp32_bytes else "–"
            layers = (f"{info['layers_quantized']} / {info['layers_float']}"
                      if recipe != "fp32" else "–")
            sqnr = f"{info['worst_sqnr_db']:.1f}" if info["worst_sqnr_db"] is not None else "–"
            cos = f"{info['worst_cosine']:.5f}" if info["worst_cosine"] is not None else "–"
            gate = "–" if info["worst_sqnr_db"] is None else (
                "passed" if info["worst_sqnr_db"] >= 20 or info["worst_cosine"] >= 0.99
                else "**missed**")
            lines.append(f"| {row['model']} | {recipe} | {ms:.3f} | {fp32 / ms:.2f}x | {size} | "
                         f"{smaller} | {layers} | {sqnr} | {cos} | {gate} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--models", default="zoo:encoder,zoo:cnn,bench/models.py:bert_base")
    parser.add_argument("--recipes", default="int8-dynamic,int8-static")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--runs-large", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--min-sqnr", type=float, default=20.0,
                        help="the build's gate; lower it to time a recipe that misses it on "
                             "random weights (the table shows the SQNR either way)")
    run_or_render(parser, run, render, "build/bench/quant.jsonl")


if __name__ == "__main__":
    main()
