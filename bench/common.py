"""What the benchmark scripts share: the machine's CPU name, the JSONL rows they append,
and their command line (each script adds its own options; these three are common)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
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
                   extra_calls: dict | None = None, device: str = "cpu",
                   rounds: int = 10, stage=None, after=None, wrap=None) -> dict:
    """Every artifact (and ``extra_calls``, e.g. eager) on the same inputs in this one
    process, interleaved by ``exporter.benchmark.time_side_by_side`` (``rounds`` blocks of
    runs/rounds calls per label): medians per label. On
    ``cuda`` the inputs live on the GPU and the timer is CUDA events. ``stage``: its
    stage hook (warm-up per label, then the timed calls); ``after``: called with the
    calls by label once they are timed; ``wrap``: takes the calls by label and gives the
    ones to time (a recorder of each call's time, say)."""
    import torch

    import runtime
    from exporter.benchmark import time_side_by_side
    from exporter.progress import quiet_stage

    inputs = [t.to(device) for t in inputs]
    calls = dict(extra_calls or {})
    for label, path in paths.items():
        program = runtime.load(path)
        calls[label] = (lambda p: lambda: p.run(inputs))(program)
    calls = wrap(calls) if wrap is not None else calls
    with torch.inference_mode():
        timings = time_side_by_side(calls, device, runs, warmup, rounds=rounds,
                                    stage=stage or quiet_stage)
        if after is not None:
            after(calls)
    return timings


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


def fix_threads(threads: int) -> dict:
    """Every engine of this process on ``threads`` threads: torch's intra-op pool (eager and
    AOTInductor) and ExecuTorch's XNNPACK threadpool (its pybindings' own, sized to the cores
    by default); ONNX Runtime's is per session (its default, 0, is one per physical core)."""
    import torch

    torch.set_num_threads(threads)
    fixed = {"torch": torch.get_num_threads()}
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError:
        return fixed
    portable_lib._unsafe_reset_threadpool(threads)
    fixed["xnnpack"] = portable_lib._threadpool_get_thread_count()
    return fixed


def wait_for_quiet(max_load: float, max_wait_s: float) -> dict:
    """Wait until the 1-minute load average is under ``max_load`` (or ``max_wait_s`` ran out):
    the machine is shared, and a measurement taken in someone's build is that build's."""
    start = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - start < max_wait_s:
        time.sleep(10)
    return {"waited_s": round(time.monotonic() - start), "load_before": os.getloadavg()[0]}


class LoadSampler:
    """The 1-minute load average every few seconds while a measurement runs (our own busy
    threads count in it: 2 timed threads add about 2)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self._every, self._stop, self.samples = every_s, threading.Event(), []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self.samples.append(os.getloadavg()[0])
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        return {"min": min(self.samples), "max": max(self.samples),
                "mean": round(sum(self.samples) / len(self.samples), 2)}
