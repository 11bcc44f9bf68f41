"""What the benchmark scripts share: the machine's CPU name, the JSONL rows they append,
and their command line (each script adds its own options; these three are common)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Callable

from runtime.host.hostinfo import cpu_model


def read_rows(paths: list[str]) -> list[dict]:
    return [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line]


def run_or_render(parser: argparse.ArgumentParser, run: Callable, render: Callable,
                  json_out: str) -> None:
    """``--render FILE...`` prints a markdown table; otherwise measure into ``--json-out``."""
    parser.add_argument("--work-dir", default="build/bench")
    parser.add_argument("--json-out", default=json_out)
    parser.add_argument("--render", nargs="*", help="print a markdown table from JSON files")
    args = parser.parse_args()
    if args.render:
        sys.stdout.write(render(args.render))
    else:
        run(args)


def time_artifacts(paths: dict[str, str], inputs: list, runs: int, warmup: int,
                   extra_calls: dict | None = None, device: str = "cpu") -> dict:
    """Every artifact (and ``extra_calls``, e.g. eager) on the same inputs in this one
    process, interleaved by ``exporter.benchmark.time_side_by_side``: medians per label. On
    ``cuda`` the inputs live on the GPU and the timer is CUDA events."""
    import torch

    import runtime
    from exporter.benchmark import time_side_by_side

    inputs = [t.to(device) for t in inputs]
    calls = dict(extra_calls or {})
    for label, path in paths.items():
        program = runtime.load(path)
        calls[label] = (lambda p: lambda: p.run(inputs))(program)
    with torch.inference_mode():
        return time_side_by_side(calls, device, runs, warmup)


def machine_header(**versions: str) -> dict:
    """Date, machine and versions, repeated on every row a run appends."""
    import datetime
    import os

    return {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "cores": len(os.sched_getaffinity(0)), "cpu": cpu_model() or platform.machine(), **versions}


def append_row(sink, row: dict) -> None:
    """One measured model to the JSONL file (flushed: a run cut short keeps it) and, short,
    to stdout."""
    sink.write(json.dumps(row) + "\n")
    sink.flush()
    print(json.dumps({k: round(v["median_ms"], 4) for k, v in row["timings"].items()}),
          flush=True)
