"""The matrix's result: one object (matrix.json, and ``exporter matrix --json``), the
same cells flat in matrix.csv, and the table as a page (matrix.html, exporter/matrix/tables.py).

Each cell is one row: who (model, group, column, target, dtype, quantize, spec, key),
the outcome (status, stage, error_type, error, exit_code), the build (build_s,
artifact, artifact_bytes, ops, partitions, fallback_ops, arena_over_lower_bound), the
validation (error_ratio: the worst output's error over what it was allowed,
max_abs_err, min_sqnr_db for quantized builds; a generating build's tokens_identical,
top1_agreement, mean_kl), the bench when asked (latency_ms, baselines_ms, ratios; a
generating artifact's decode_tokens_per_s, ttft_ms, decode_ratios), and how it ran (cached, attempts, worker, and ``ran``: when its
worker began and ended it, epoch seconds, beside the run's own ``marks``: started_at,
planned_at, first_submitted_at).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import platform
from pathlib import Path

from exporter.matrix import tables
from exporter.versions import JSON_VERSION
from runtime.host.hostinfo import cpu_model, usable_cores
from runtime.host.outfiles import written_whole

CSV_FIELDS = ("model", "group", "column", "target", "dtype", "quantize", "status", "stage",
              "error_type", "error", "exit_code", "build_s", "artifact_bytes", "ops",
              "partitions", "fallback_ops", "error_ratio", "max_abs_err", "min_sqnr_db",
              "tokens_identical", "top1_agreement", "mean_kl",
              "arena_over_lower_bound", "latency_ms", "ratio_to_eager", "decode_tokens_per_s",
              "decode_vs_eager", "ttft_ms", "cached", "attempts",
              "worker", "artifact", "spec", "key")


def table(matrix, rows: list[dict], *, executor: str, workers: int | None, wall_s: float,
          marks: dict[str, float], built: int, versions: dict) -> dict:
    return {"json_version": JSON_VERSION, "matrix": str(matrix.path),
            "date": datetime.date.today().isoformat(),
            "executor": executor, "workers": workers, "wall_s": round(wall_s, 1),
            "marks": {name: round(at, 2) for name, at in marks.items()},
            "machine": {"cpu": cpu_model() or platform.machine(), "cores": usable_cores(),
                        "platform": platform.platform()},
            "versions": {k: v for k, v in versions.items() if k not in ("packages", "gpu")},
            "models": matrix.models, "columns": matrix.columns, "cells": rows,
            "recipes": matrix.recipes,
            "totals": totals(rows, built)}


def totals(rows: list[dict], built: int) -> dict:
    passed = sum(r["status"] == "ok" for r in rows)
    not_run = sum(r["status"] == "not-run" for r in rows)
    # built as asked with `validate = false`: neither a pass nor a failure
    unvalidated = sum(r["status"] == "unvalidated" for r in rows)
    return {"cells": len(rows), "passed": passed,
            "failed": len(rows) - passed - not_run - unvalidated, "unvalidated": unvalidated,
            "not_run": not_run, "built": built, "cached": sum(bool(r.get("cached")) for r in rows)}


def write_all(out: Path, data: dict) -> dict:
    """matrix.json, matrix.csv and matrix.html in ``out``, each written whole."""
    files = {kind: str(out / f"matrix.{kind}") for kind in ("json", "csv", "html")}
    data["files"] = files
    texts = {"json": json.dumps(data, indent=1, sort_keys=True) + "\n",
             "csv": _csv(data["cells"]), "html": tables.html(data)}
    for kind, text in texts.items():
        with written_whole(files[kind], flag="--out") as partial:
            partial.write_text(text, encoding="utf-8")
    return files


def flat(row: dict) -> dict:
    """A cell with its bench figures as columns (latency_ms, ratio_to_eager; a generating
    artifact's decode_tokens_per_s, decode_vs_eager, ttft_ms)."""
    bench = row.get("bench") or {}
    return {**row, "latency_ms": bench.get("latency_ms"),
            "ratio_to_eager": (bench.get("ratios") or {}).get("artifact/eager"),
            "decode_tokens_per_s": bench.get("decode_tokens_per_s"),
            "decode_vs_eager": (bench.get("decode_ratios") or {}).get("artifact/hf-eager"),
            "ttft_ms": bench.get("ttft_ms")}


def _csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: csv_cell(v) for k, v in flat(r).items()} for r in rows)
    return buffer.getvalue()


# A spreadsheet reads a cell that starts with one of these as a formula (OWASP's CSV
# injection page): user text (a model name, an error message) must stay text.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """``value`` as matrix.csv writes it: numbers (and None, an empty cell) as they are,
    text that a spreadsheet would run as a formula behind a ``'``."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text

