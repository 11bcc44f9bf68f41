"""Wall time of one coverage slice: a sequential loop of builds vs `exporter matrix` with
the local executor and on Ray, at several worker counts (the speed-up table).

    python -m bench.coverage.speedup --fast --targets cpu,onnx,tvm --runs loop,local:1,ray:1
    python -m bench.coverage.speedup --fast --targets cpu,onnx,tvm --runs ray:2,ray:8
    python -m bench.coverage.speedup --render build/speedup/speedup.jsonl

``loop`` is the plain way: one ``exporter build --config CELL.toml --json`` after the other,
each with all the cores, over the cells `exporter matrix` would run. ``local:N`` and
``ray:N`` are `exporter matrix` with N workers (Ray: a local cluster of N CPUs), each from
an empty cache, so every cell is built. One JSON row per run is appended to
``--json-out`` as it ends, so the runs may be split over several commands. A matrix
run's row names the cells whose ops on the CPU fallback differ from the loop's builds
(``placement_differs``: then it timed other builds) and why warm cells started fresh
(``cold_because``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import machine_header  # noqa: E402
from bench.coverage.matrix import matrix_toml  # noqa: E402
from bench.coverage.suite import select  # noqa: E402
from exporter.matrix.cache import DURATIONS_FILE  # noqa: E402
from exporter.matrix.cell import read_build  # noqa: E402
from exporter.matrix.folder import claim  # noqa: E402
from exporter.matrix.spec_file import read as read_matrix  # noqa: E402

PLACEMENT_FILE = "fallback_ops.json"  # the loop's builds: each cell's ops on the fallback


def run_loop(matrix: Path, out: Path) -> dict:
    """Every cell's build, one after the other (the cells' configs as the matrix writes
    them, read here without building anything)."""
    from exporter.config import config_file

    cells = read_matrix(matrix).cells
    (out / "cells").mkdir(parents=True, exist_ok=True)
    start, passed, seconds, failed, fallback = time.monotonic(), 0, {}, {}, {}
    for cell in cells:
        config = config_file.write(out / "cells" / f"{cell.id}.toml", cell.spec, cell.settings)
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "exporter", "build", "--config",
                               str(config), "--out", str(out / f"{cell.id}.artifact"),
                               "--json"], cwd=ROOT, capture_output=True, text=True)
        seconds[cell.id] = round(time.monotonic() - began, 1)
        passed += done.returncode == 0
        if done.returncode:
            failed[cell.id] = _failure(done)
        else:
            fallback[cell.id] = read_build(json.loads(done.stdout)).get("fallback_ops")
    (out / DURATIONS_FILE).write_text(json.dumps(seconds, indent=0))
    (out / PLACEMENT_FILE).write_text(json.dumps(fallback, indent=0))
    return {"cells": len(cells), "passed": passed, "wall_s": round(time.monotonic() - start, 1),
            "cell_s": seconds, "failed": failed}


def _failure(done: subprocess.CompletedProcess) -> str:
    """A failed build's typed error, from its --json object (or its last stderr line)."""
    try:
        error = json.loads(done.stdout).get("error") or {}
        return f"exit {done.returncode} {error.get('type')}: {str(error.get('message'))[:200]}"
    except ValueError:
        return f"exit {done.returncode}: " + (done.stderr.strip().splitlines() or [""])[-1][:200]


def run_matrix(matrix: Path, out: Path, executor: str, workers: int,
               known_times: str | None) -> dict:
    """``known_times``: a durations.json's text (the loop's, or an earlier run's) placed
    in the empty cache first, so the matrix starts the longest cells first as it does
    once it has built them before."""
    if known_times is not None:
        claim(out, own_cache=True)  # the matrix's folder: it resumes in it
        (out / "cache" / DURATIONS_FILE).write_text(known_times)
    start, launched_at = time.monotonic(), time.time()
    subprocess.run([sys.executable, "-m", "exporter", "matrix", str(matrix), "--out", str(out),
                    "--executor", executor, "--workers", str(workers), "--quiet"], cwd=ROOT)
    wall = round(time.monotonic() - start, 1)
    data = json.loads((out / "matrix.json").read_text())
    timeline = where_time_went(data, launched_at, wall, workers)
    cells = {f"{c['model']}--{c['column']}": c for c in data["cells"]}  # the cells' ids
    failed = {cell: f"{c['status']} {c.get('error_type')}: {str(c.get('error'))[:200]}"
              + "".join(f" | {line[:200]}" for line in c.get("error_details") or [])
              for cell, c in cells.items() if c["status"] != "ok"}
    return {"cells": data["totals"]["cells"], "passed": data["totals"]["passed"],
            "placement_differs": _placement_differs(out.parent / "loop", cells),
            "built": data["totals"]["built"], "wall_s": wall, "failed": failed,
            "known_times": known_times is not None, "timeline": timeline,
            "warm_start": read_matrix(matrix).warm_start,  # true, false or "auto"
            # cells a warm worker had to start fresh after all (exporter/matrix/warm.py)
            "cold_because": sorted({c["cold_because"] for c in cells.values()
                                    if c.get("cold_because")}),
            "cell_s": {cell: c.get("build_s") for cell, c in cells.items()}}


def _placement_differs(loop: Path, cells: dict[str, dict]) -> dict[str, list]:
    """Cells whose ops on the CPU fallback differ from the loop's builds of them: a run
    that built something else than the loop did (forked onnx cells once ran wholly on
    the fallback, and were timed as if they had been exported)."""
    if not (loop / PLACEMENT_FILE).is_file():
        return {}
    built = json.loads((loop / PLACEMENT_FILE).read_text())
    differs = {cell: [built[cell], c.get("fallback_ops")] for cell, c in cells.items()
               if cell in built and c.get("status") == "ok"
               and c.get("fallback_ops") != built[cell]}
    if differs:
        print(f"warning: {len(differs)} cell(s) placed ops unlike the loop's builds "
              f"(cell: [loop, matrix] ops on the CPU fallback): {differs}", flush=True)
    return differs


def where_time_went(data: dict, launched_at: float, wall: float, workers: int) -> dict:
    """The run's wall time in parts, from the cells' ``ran`` times (epoch seconds):
    ``startup_s`` from launching the command to its first cell running (imports, the
    toolchain digest and cache keys, Ray's start), ``cells_s`` from then to the last cell's
    end, ``after_s`` the rest (the table, Ray's shutdown), and ``idle_share``: the share of
    the workers' time in ``cells_s`` with no cell running (uneven waves, the last cells).
    Start-up in parts: ``launch_s`` to the matrix's start (the command's imports),
    ``plan_s`` (the toolchain digest, cache keys, cell configs), ``executor_s`` (Ray's
    start, or the pool's) and ``pickup_s`` (from the first cell's submission to a worker
    running it)."""
    ran = [c["ran"] for c in data["cells"] if c.get("ran")]
    if not ran:
        return {}
    first, last = min(r[0] for r in ran), max(r[1] for r in ran)
    busy = sum(r[1] - r[0] for r in ran)
    marks = data["marks"]
    return {"startup_s": round(first - launched_at, 1), "cells_s": round(last - first, 1),
            "after_s": round(launched_at + wall - last, 1),
            "launch_s": round(marks["started_at"] - launched_at, 1),
            "plan_s": round(marks["planned_at"] - marks["started_at"], 1),
            "executor_s": round(marks["first_submitted_at"] - marks["planned_at"], 1),
            "pickup_s": round(first - marks["first_submitted_at"], 1),
            "idle_share": round(1 - busy / (workers * (last - first)), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="onnx")
    parser.add_argument("--models", help="comma-separated names (default: the fast slice)")
    parser.add_argument("--fast", action="store_true", help="the suite's fast slice")
    parser.add_argument("--runs", default="loop,local:1,local:2,ray:1,ray:2",
                        help="loop, local:N, ray:N; a -warm or -cold suffix sets the matrix's "
                             "warm_start (default: the matrix's own); comma-separated")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--known-times", nargs="?", const="loop", metavar="RUN",
                        help="matrix runs start from the cell times of RUN (default: the "
                             "loop; or an earlier matrix run such as ray:8, run first): "
                             "longest cells first, as on a matrix's later runs")
    parser.add_argument("--out", default="build/speedup")
    parser.add_argument("--json-out", default="build/speedup/speedup.jsonl")
    parser.add_argument("--render", nargs="*", help="print the markdown table of JSONL files")
    args = parser.parse_args()
    if args.render:
        sys.stdout.write(render(args.render))
        return
    models = select(args.models.split(",") if args.models else None, False)
    models = [m for m in models if m.fast] if args.fast or not args.models else models
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    matrix = out / "slice.toml"
    matrix.write_text(matrix_toml(models, args.targets.split(","), ["fp32"], args.timeout))
    files = {"": matrix}  # runs named ...-warm / ...-cold set warm_start (docs/matrix.md)
    for mode in ("warm", "cold"):
        files[f"-{mode}"] = out / f"slice-{mode}.toml"
        files[f"-{mode}"].write_text(f"warm_start = {str(mode == 'warm').lower()}\n"
                                     + matrix.read_text())
    for run in args.runs.split(","):
        suffix = next((s for s in ("-warm", "-cold") if run.endswith(s)), "")
        executor, _, workers = run.removesuffix(suffix).partition(":")
        folder = out / run.replace(":", "-")
        known = (_durations(out, args.known_times) if args.known_times and executor != "loop"
                 else None)
        subprocess.run(["rm", "-rf", str(folder)], check=True)  # an empty cache: build all
        load_before = os.getloadavg()[0]  # the machine's load as the run starts
        figures = (run_loop(matrix, folder) if executor == "loop"
                   else run_matrix(files[suffix], folder, executor, int(workers), known))
        row = {**machine_header(), "run": run, "targets": args.targets,
               "known_times_from": args.known_times if executor != "loop" else None,
               "models": [m.name for m in models], "load_before": load_before,
               "load_after": os.getloadavg()[0], **figures}
        with open(args.json_out, "a") as sink:
            sink.write(json.dumps(row) + "\n")
        print(json.dumps({k: row[k] for k in ("run", "cells", "passed", "wall_s", "failed")}),
              flush=True)


def _durations(out: Path, run: str) -> str:
    """The cell times RUN recorded: the loop's, or those a matrix run kept in its cache."""
    folder = out / run.replace(":", "-")
    return (folder / DURATIONS_FILE if run == "loop" else folder / "cache" / DURATIONS_FILE
            ).read_text()


def render(paths: list[str]) -> str:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line]
    loop = next((r["wall_s"] for r in rows if r["run"].startswith("loop")), None)
    lines = ["| run | cells | passed | wall (s) | vs the loop | 1-min load average |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['run']}{' (known times)' if r.get('known_times') else ''} | "
              f"{r['cells']} | {r['passed']} | {r['wall_s']:.0f} | "
              + (f"{loop / r['wall_s']:.2f}x" if loop else "-") + f" | {_load(r)} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def _load(row: dict) -> str:
    """The machine's load when the run started (or ended, in rows that say so)."""
    if "load_before" in row:
        return f"{row['load_before']:.1f} before"
    return f"{row['load_after']:.1f} after" if "load_after" in row else "-"


if __name__ == "__main__":
    main()
