"""Run the coverage suite through `exporter matrix`: every suite model x target (x dtype).

    python -m bench.coverage.matrix --targets cpu,onnx,tvm --out build/coverage
    python -m bench.coverage.matrix --targets cuda --dtypes fp32,fp16,bf16 --jobs 8
    python -m bench.coverage.matrix --targets onnx --fast --executor ray --jobs 2
    python -m bench.coverage.matrix --render build/coverage/matrix.json   # markdown

The selection is written as a matrix file, ``OUT/coverage.toml`` (one model per suite
entry, grouped by family; one target column per target and dtype), and `exporter matrix`
runs it: each cell is ``exporter build --json`` in its own process with a time limit, as
a user runs it, and a cell that prints no JSON (a crash, a timeout) is recorded as such.
Settled cells are cached, so an interrupted run goes on where it stopped when run again.
The table is OUT/matrix.json, .csv and .html; ``--render`` prints it as markdown.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.coverage.suite import Model, select  # noqa: E402
from exporter.matrix.folder import claim  # noqa: E402

UNIT_SCALE = ROOT / "bench" / "coverage" / "unit_scale.py"
MULTI_DTYPE = ("cpu", "cuda")  # fp16/bf16 only where a target runs them (AOTInductor)


def matrix_toml(models: list[Model], targets: list[str], dtypes: list[str],
                timeout: float) -> str:
    lines = [f"# python -m bench.coverage.matrix (the coverage suite, {len(models)} models)",
             f"timeout = {timeout!r}", "", "[models]"]
    # The factories import unit_scale.py: in every cache key, so editing it rebuilds.
    depends = json.dumps([str(UNIT_SCALE)])
    lines += [f'{m.name} = {{ spec = {json.dumps(str(ROOT / m.spec))}, group = "{m.family}"'
              + (f", depends = {depends}" if m.needs == "any" else "") + " }"
              for m in models]
    for target in targets:
        for dtype in dtypes if target in MULTI_DTYPE else ["fp32"]:
            name = target if dtype == "fp32" else f"{target}-{dtype}"
            lines += ["", f"[targets.{name}]", f'target = "{target}"', f'dtype = "{dtype}"']
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    claim(out, own_cache=True)  # the matrix's folder, so coverage.toml may live in it
    names = args.models.split(",") if args.models else None
    models = select(names, importlib.util.find_spec("torchvision") is not None)
    if names:  # in the order given, so a short run does what matters first
        models.sort(key=lambda m: names.index(m.name))
    if args.fast:
        models = [m for m in models if m.fast]
    matrix = out / "coverage.toml"
    matrix.write_text(matrix_toml(models, args.targets.split(","), args.dtypes.split(","),
                                  args.timeout))
    command = [sys.executable, "-m", "exporter", "matrix", str(matrix), "--out", str(out),
               "--executor", args.executor]
    command += ["--workers", str(args.jobs)] if args.jobs else []
    command += ["--ray-address", args.ray_address] if args.ray_address else []
    command += ["--rebuild"] if args.rebuild else []
    code = subprocess.run(command, cwd=ROOT).returncode
    return 0 if code in (0, 1) else code  # 1: some cells failed, which the table shows


def render(paths: list[str]) -> str:
    """Markdown from matrix.json files; a cell in several files counts once, the last
    file's (a rerun, or the other machine's half) winning."""
    from exporter.matrix.results import totals
    from exporter.matrix.tables import markdown

    datas = [_read_jsonl(Path(p)) if p.endswith(".jsonl") else json.loads(Path(p).read_text())
             for p in paths]
    cells = {(c["model"], c["column"]): c for data in datas for c in data["cells"]}
    merged = {**datas[-1], "cells": list(cells.values()),
              "models": list(dict.fromkeys(m for d in datas for m in d["models"])),
              "columns": list(dict.fromkeys(c for d in datas for c in d["columns"]))}
    merged["totals"] = totals(merged["cells"], sum(d["totals"]["built"] for d in datas))
    return markdown(merged)


def _read_jsonl(path: Path) -> dict:
    """A results.jsonl of the runner before `exporter matrix` (bench/coverage/results/),
    as matrix.json: one cell per row, a column per target and dtype."""
    cells = [{**row, "group": row.get("family"), "column": row["target"] if row["dtype"] ==
              "fp32" else f"{row['target']}-{row['dtype']}", "artifact_bytes": None}
             for row in map(json.loads, path.read_text().splitlines()) if row]
    return {"cells": cells, "models": list(dict.fromkeys(c["model"] for c in cells)),
            "columns": list(dict.fromkeys(c["column"] for c in cells)),
            "totals": {"built": len(cells)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="cpu,onnx,tvm")
    parser.add_argument("--dtypes", default="fp32", help="cpu/cuda only, e.g. fp32,fp16,bf16")
    parser.add_argument("--models", help="comma-separated names (default: the whole suite)")
    parser.add_argument("--fast", action="store_true", help="only the suite's fast slice")
    parser.add_argument("--out", default="build/coverage")
    parser.add_argument("--jobs", type=int, help="cells at a time (exporter matrix --workers)")
    parser.add_argument("--executor", default="local", choices=("local", "ray"))
    parser.add_argument("--ray-address", help="join this Ray cluster (--executor ray)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    parser.add_argument("--rebuild", action="store_true", help="ignore the build cache")
    parser.add_argument("--render", nargs="*", help="print markdown from matrix.json files")
    args = parser.parse_args()
    if args.render:
        sys.stdout.write(render(args.render))
    else:
        sys.exit(run(args))


if __name__ == "__main__":
    main()
