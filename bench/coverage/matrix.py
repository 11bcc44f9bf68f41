"""Run the coverage matrix: every suite model x target (x dtype), one build per process.

    python -m bench.coverage.matrix --targets cpu,onnx,tvm --out build/coverage
    python -m bench.coverage.matrix --targets cuda --dtypes fp32,fp16,bf16 --jobs 8
    python -m bench.coverage.matrix --render build/coverage/results.jsonl   # markdown

Each cell is ``exporter build SPEC --target T --dtype D --json`` in its own process with a
time limit, as a user runs it; what it prints on stdout (one JSON object, docs/json.md)
is the whole record: pass/fail, the stage and typed error of a failure, build seconds,
ops on the CPU fallback, the validation error against its allowance, and the memory
plan's arena over its lower bound. A cell that prints no JSON (a crash, a timeout) is
recorded as such: that is a bug to fix, never a pass. Rows are appended to
``results.jsonl`` as cells finish, so an interrupted run keeps what it measured and
``--resume`` skips the cells already there.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_name, read_rows  # noqa: E402
from bench.coverage.suite import Model, select  # noqa: E402

FIELDS = ("model", "family", "target", "dtype", "status", "stage", "error_type", "error",
          "exit_code", "build_s", "fallback_ops", "ops", "partitions", "error_ratio",
          "arena_over_lower_bound")


def cell_command(model: Model, target: str, dtype: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "exporter", "build", model.spec, "--target", target,
            "--dtype", dtype, "--out", str(out), "--json"]


_LIVE: set[subprocess.Popen] = set()  # builds in flight, stopped if the matrix is stopped


def _stop_all(signum, frame) -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def run_cell(model: Model, target: str, dtype: str, work: Path, timeout: float) -> dict:
    """One build in its own process group (so a timeout also stops its compilers)."""
    out = work / f"{model.name}-{target}-{dtype}.artifact"
    row = {"model": model.name, "family": model.family, "target": target, "dtype": dtype}
    start = time.perf_counter()
    proc = subprocess.Popen(cell_command(model, target, dtype, out), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    _LIVE.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {**row, "status": "timeout", "stage": None, "exit_code": None,
                "error": f"no result after {timeout:.0f} s", "build_s": round(timeout, 1)}
    finally:
        _LIVE.discard(proc)
    row["build_s"] = round(time.perf_counter() - start, 1)
    row["exit_code"] = proc.returncode
    out.unlink(missing_ok=True)  # the matrix keeps figures, not artifacts
    try:
        payload = json.loads(stdout)
    except json.JSONDecodeError:
        tail = (stderr.strip().splitlines() or ["(nothing on stderr)"])[-1][:300]
        return {**row, "status": "crash", "error": f"no JSON on stdout; stderr ends: {tail}"}
    return {**row, **_read_payload(payload)}


def _read_payload(payload: dict) -> dict:
    if "error" in payload:
        error = payload["error"]
        status = {1: "validation-failed", 2: "bad-input", 3: "build-failed",
                  4: "internal-error"}.get(error.get("exit_code"), "failed")
        return {"status": status, "stage": error.get("stage"), "error_type": error.get("type"),
                "error": (error.get("what") or error.get("message") or "")[:400],
                **_validation_figures(payload.get("validation") or {})}
    placement = payload.get("placement") or {}
    by_backend = placement.get("by_backend") or {}
    memory = payload.get("memory_plan") or {}
    lower = memory.get("lower_bound_bytes") or 0
    return {"status": "ok" if (payload.get("validation") or {}).get("passed") else "unvalidated",
            "stage": None, "ops": placement.get("ops"),
            "fallback_ops": sum(v for k, v in by_backend.items() if k.startswith("torch@")),
            "partitions": placement.get("partitions"),
            "arena_over_lower_bound": round(memory["arena_bytes"] / lower, 3) if lower else None,
            **_validation_figures(payload.get("validation") or {})}


def _validation_figures(record: dict) -> dict:
    ratios = [row.get("ratio_to_allowed") for row in record.get("outputs", [])
              if row.get("ratio_to_allowed") is not None]
    return {"error_ratio": round(max(ratios), 4) if ratios else None}


def cells(models: list[Model], targets: list[str], dtypes: list[str]) -> list[tuple]:
    """fp16/bf16 only where a target runs them (the AOTInductor targets)."""
    return [(m, t, d) for m in models for t in targets
            for d in (dtypes if t in ("cpu", "cuda") else ["fp32"])]


def run(args: argparse.Namespace) -> None:
    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results = work / "results.jsonl"
    done = _done(results) if args.resume else set()
    if not args.resume:
        results.write_text("")
    names = args.models.split(",") if args.models else None
    models = select(names, _has_torchvision())
    if names:  # in the order given, so a short run does what matters first
        models.sort(key=lambda m: names.index(m.name))
    if args.fast:
        models = [m for m in models if m.fast]
    todo = [c for c in cells(models, args.targets.split(","), args.dtypes.split(","))
            if (c[0].name, c[1], c[2]) not in done]
    print(f"{len(todo)} cells ({len(done)} already in {results}), {args.jobs} at a time, "
          f"{args.timeout:.0f} s each at most", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _stop_all)
    signal.signal(signal.SIGINT, _stop_all)
    deadline = time.monotonic() + args.budget if args.budget else None

    def cell(m: Model, t: str, d: str) -> dict | None:
        # past --budget, cells not yet started are left for a --resume run
        if deadline is not None and time.monotonic() + args.timeout > deadline:
            return None
        return run_cell(m, t, d, work, args.timeout)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(cell, m, t, d) for m, t, d in todo]
        for future in concurrent.futures.as_completed(futures):
            if future.result() is None:
                continue
            row = {**future.result(), **_machine()}
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{row['model']:>24} {row['target']:>5} {row['dtype']} {row['status']:>17}"
                  f" {row['build_s']:6.1f}s {row.get('stage') or ''} "
                  f"{(row.get('error') or '')[:120]}", file=sys.stderr, flush=True)
    _write_csv(results, work / "results.csv")


def _done(results: Path) -> set:
    if not results.exists():
        return set()
    return {(r["model"], r["target"], r["dtype"]) for r in read_rows([results])}


def _write_csv(results: Path, path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(read_rows([results]))


def _has_torchvision() -> bool:
    import importlib.util
    return importlib.util.find_spec("torchvision") is not None


def _machine() -> dict:
    import torch
    return {"machine": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "date": datetime.date.today().isoformat()}


def render(paths: list[str]) -> str:
    """Markdown: totals per target, a model x target table, then every failure. A cell
    measured in several files counts once: the last file's row (a rerun) wins."""
    rows = list({(r["model"], r["target"], r["dtype"]): r for r in read_rows(paths)}.values())
    columns = sorted({(r["target"], r["dtype"]) for r in rows},
                     key=lambda c: (["cpu", "onnx", "tvm", "cuda"].index(c[0])
                                    if c[0] in ("cpu", "onnx", "tvm", "cuda") else 9, c[1]))
    by_cell = {(r["model"], r["target"], r["dtype"]): r for r in rows}
    models = [m for m in dict.fromkeys(r["model"] for r in rows)]
    lines = ["| target | built and validated | failed | slowest build (s) | worst arena/lower bound |",
             "|---|---|---|---|---|"]
    for target, dtype in columns:
        mine = [r for r in rows if (r["target"], r["dtype"]) == (target, dtype)]
        ok = [r for r in mine if r["status"] == "ok"]
        arenas = [r["arena_over_lower_bound"] for r in ok if r.get("arena_over_lower_bound")]
        lines.append(f"| {target} {dtype} | {len(ok)} of {len(mine)} "
                     f"({100 * len(ok) / max(1, len(mine)):.0f}%) | {len(mine) - len(ok)} | "
                     f"{max((r['build_s'] for r in mine), default=0):.0f} | "
                     f"{max(arenas, default=0):.3f} |")
    lines += ["", "| model | family | " + " | ".join(f"{t} {d}" for t, d in columns) + " |",
              "|---|---|" + "---|" * len(columns)]
    for model in models:
        family = next(r["family"] for r in rows if r["model"] == model)
        cells_ = [_mark(by_cell.get((model, t, d))) for t, d in columns]
        lines.append(f"| {model} | {family} | " + " | ".join(cells_) + " |")
    failures = [r for r in rows if r["status"] != "ok"]
    if failures:
        lines += ["", "Failures (stage, typed error, first line):", ""]
        lines += [f"- {r['model']} on {r['target']} {r['dtype']}: {r['status']} in "
                  f"{r.get('stage') or '?'} ({r.get('error_type') or '-'}): "
                  f"{(r.get('error') or '').splitlines()[0] if r.get('error') else ''}"
                  for r in failures]
    return "\n".join(lines) + "\n"


def _mark(row: dict | None) -> str:
    if row is None:
        return ""
    if row["status"] == "ok":
        fallback = f", {row['fallback_ops']} on CPU" if row.get("fallback_ops") else ""
        return f"ok {row['build_s']:.0f}s{fallback}"
    return f"**{row['status']}**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="cpu,onnx,tvm")
    parser.add_argument("--dtypes", default="fp32", help="cpu/cuda only, e.g. fp32,fp16,bf16")
    parser.add_argument("--models", help="comma-separated names (default: the whole suite)")
    parser.add_argument("--fast", action="store_true", help="only the suite's fast slice")
    parser.add_argument("--out", default="build/coverage")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per build")
    parser.add_argument("--resume", action="store_true", help="keep results.jsonl's cells")
    parser.add_argument("--budget", type=float, help="seconds: start no cell that could "
                        "end later than this (the rest waits for --resume)")
    parser.add_argument("--render", nargs="*", help="print markdown from results.jsonl files")
    args = parser.parse_args()
    if args.render:
        sys.stdout.write(render(args.render))
    else:
        run(args)


if __name__ == "__main__":
    main()
