"""One cell, run where an executor puts it: ``exporter build --config CELL.toml --json`` in
its own process with a time limit (then ``exporter bench --json`` when the matrix asks),
exactly as a user runs them. What the build prints (docs/json.md) is the whole record.
With ``warm_start`` (Linux; by default the cells that use no GPU), the process is forked
from a warm worker that imported torch and the targets' compilers once (exporter/matrix/warm.py).

A cell that prints no JSON (a crash, a timeout) is recorded as such: a bug to fix, never a
pass. The build runs in its own process group, so a timeout also stops its compilers, and
on Linux it dies with the process that started it (a Ray worker killed mid-build takes its
build along, and Ray runs the cell again elsewhere).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from exporter.matrix import warm

# Typed outcomes by exit code (docs/json.md); others (crash, timeout, internal-error) are
# not the cell's settled answer and are never cached.
STATUS_BY_EXIT = {0: "ok", 1: "validation-failed", 2: "bad-input", 3: "build-failed",
                  4: "internal-error"}
SETTLED = ("ok", "unvalidated", "validation-failed", "bad-input", "build-failed")


@dataclass(frozen=True)
class Job:
    """What a worker needs to run one cell (small and picklable: Ray ships it)."""
    cell_id: str
    config: str  # the cell's `exporter build --config` file
    artifact: str  # where the build writes (the cache's path for this cell's key)
    running: str  # marker file: who runs the cell now (pids, attempt)
    cwd: str
    timeout: float
    threads: int  # OMP_NUM_THREADS of the cell's processes: the cores over the workers
    bench: dict | None = None  # runs, warmup, baseline
    build: bool = True  # False: only bench the artifact already in the cache
    device: str = "cpu"  # "cuda": the executor gives the cell a GPU
    # the modules a warm worker imports once before forking the cell's processes
    # (exporter/matrix/warm.py); None: each process a fresh `python -m exporter`
    warm_modules: tuple[str, ...] | None = None


_LIVE: set[int] = set()  # the sessions (pids) of cells' processes in flight here


def stop_all() -> None:
    """Kill every cell process this process started (Ctrl-C on the matrix)."""
    for pid in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def run_job(job: Job) -> dict:
    """The cell's measured fields: status, stage, typed error, figures, attempt, worker."""
    start, began_at = time.monotonic(), time.time()
    attempt = _attempt(job)
    row: dict = {"attempts": attempt, "worker": f"{socket.gethostname()}:{os.getpid()}"}
    if job.build:  # what sits at the key's path belongs to no record: not this build's
        Path(job.artifact).unlink(missing_ok=True)
        command = ["build", "--config", job.config, "--out", job.artifact, "--json"]
        code, payload, problem = _exporter(command, job, job.timeout, attempt, row)
        row["build_s"] = round(time.monotonic() - start, 1)
        row.update(problem or {"exit_code": code, **read_build(payload)})
        if Path(job.artifact).is_file():
            row.update(artifact_sha256=file_sha256(job.artifact),
                       artifact_bytes=Path(job.artifact).stat().st_size)
    if job.bench and Path(job.artifact).is_file() and row.get("status", "ok") == "ok":
        row["bench"] = _bench(job, job.timeout - (time.monotonic() - start), attempt)
    # when the worker ran it (epoch seconds; a matrix's timeline: where its wall time went)
    row["ran"] = [round(began_at, 2), round(time.time(), 2)]
    return row


def _exporter(args: list[str], job: Job, timeout: float, attempt: int, row: dict | None = None
              ) -> tuple[int | None, dict, dict]:
    """Run ``exporter ARGS`` for the cell: (exit code, its JSON, {}) or, when it printed
    no JSON, (code, {}, a crash or timeout record). ``row`` gets ``cold_because`` when a
    warm worker had to start the process fresh after all (exporter/matrix/warm.py)."""
    # The cell's share of the cores, for each pool a build starts: OpenMP's, and torch
    # Inductor's compile workers (by default one per core in every build, so parallel
    # cells would oversubscribe the cores and slow each other).
    env = {**os.environ, "OMP_NUM_THREADS": str(job.threads),
           "TORCHINDUCTOR_COMPILE_THREADS": str(job.threads),
           # the cell runs the exporter this process imported, whatever the worker's path
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    mine: list[int] = []

    def started(pid: int) -> None:
        mine.append(pid)
        _LIVE.add(pid)
        _mark_running(job, attempt, pid)

    try:
        if job.warm_modules is not None and warm.AVAILABLE:
            process = warm.process_for(env, job.warm_modules, gpu=job.device == "cuda")
            code, stdout, stderr = process.run(args, job.cwd, max(timeout, 1.0), started)
            if process.cold_because and row is not None:
                row["cold_because"] = process.cold_because
        else:
            code, stdout, stderr = _cold(args, job.cwd, env, max(timeout, 1.0), started)
    except subprocess.TimeoutExpired:
        return None, {}, {"status": "timeout", "exit_code": None,
                          "error": f"exporter {args[0]}: no result after {timeout:.0f} s"}
    except warm.WarmProcessDied as died:
        return None, {}, {"status": "crash", "exit_code": None,
                          "error": f"exporter {args[0]}: {died}"}
    finally:
        _LIVE.difference_update(mine)
    try:
        return code, json.loads(stdout), {}
    except json.JSONDecodeError:
        tail = (stderr.strip().splitlines() or ["(nothing on stderr)"])[-1][:300]
        return code, {}, {"status": "crash", "exit_code": code,
                          "error": f"exporter {args[0]} printed no JSON (exit {code}); "
                                   f"stderr ends: {tail}"}


def _cold(args: list[str], cwd: str, env: dict, timeout: float, started
          ) -> tuple[int, str, str]:
    """``python -m exporter ARGS`` in a fresh interpreter of its own session."""
    command = [sys.executable, "-m", "exporter", *args]
    proc = subprocess.Popen(_die_with_parent(command), cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    started(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, stdout, stderr


# Linux: the build gets SIGKILL when the process that started it dies (prctl
# PR_SET_PDEATHSIG, kept across exec), set in a tiny Python that then execs the command:
# subprocess's preexec_fn is unsafe in a threaded process such as a Ray worker.
_GUARD = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
          "os.getppid() == int(sys.argv[1]) or os._exit(137); os.execv(sys.argv[2], sys.argv[2:])")


def _die_with_parent(command: list[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-c", _GUARD, str(os.getpid()), *command]


def read_build(payload: dict) -> dict:
    """The record's fields from ``exporter build --json``'s object."""
    validation = payload.get("validation") or {}
    if "error" in payload:
        error = payload["error"]
        return {"status": STATUS_BY_EXIT.get(error.get("exit_code"), "failed"),
                "stage": error.get("stage"), "error_type": error.get("type"),
                "error": (error.get("what") or error.get("message") or "")[:400],
                # the lines under it (a validation process's own error, say): the cause
                "error_details": [str(line)[:300] for line in error.get("details") or []][-6:],
                **_validation_figures(validation)}
    placement = payload.get("placement") or {}
    by_backend = placement.get("by_backend") or {}
    memory = payload.get("memory_plan") or {}
    lower = memory.get("lower_bound_bytes") or 0
    passed = validation.get("passed")
    return {"status": "ok" if passed else "unvalidated", "stage": None, "error_type": None,
            "error": None,
            "ops": placement.get("ops"), "partitions": placement.get("partitions"),
            "fallback_ops": sum(v for k, v in by_backend.items() if k.startswith("torch@")),
            "arena_over_lower_bound": round(memory["arena_bytes"] / lower, 3) if lower else None,
            **_validation_figures(validation)}


def _validation_figures(record: dict) -> dict:
    """The worst output: its error over what was allowed, and its absolute error (float
    gates) or its SQNR (quantized builds); a generating build's tokens and top-1."""
    if "tokens_identical" in record:  # a generating build's gate (exporter/lm/gate.py)
        return {"tokens_identical": record["tokens_identical"],
                "top1_agreement": record.get("top1_agreement"), "mean_kl": record.get("mean_kl")}
    rows = record.get("outputs") or []
    ratios = [r["ratio_to_allowed"] for r in rows if r.get("ratio_to_allowed") is not None]
    errors = [r["max_abs_err"] for r in rows if r.get("max_abs_err") is not None]
    sqnrs = [r["sqnr_db"] for r in rows if r.get("sqnr_db") is not None]
    return {"error_ratio": round(max(ratios), 4) if ratios else None,
            "max_abs_err": float(f"{max(errors):.4g}") if errors else None,
            "min_sqnr_db": round(min(sqnrs), 2) if sqnrs else None}


def _bench(job: Job, time_left: float, attempt: int) -> dict:
    settings = job.bench or {}
    code, payload, problem = _exporter(
        ["bench", job.artifact, "--json", "--runs", str(settings["runs"]), "--warmup",
         str(settings["warmup"]), "--baseline", settings["baseline"]], job, time_left, attempt)
    if problem or "error" in payload:
        return {"settings": settings, "error": problem.get("error") if problem
                else payload["error"].get("what")}
    if "engines" in payload:  # a generating artifact: tokens/s (exporter/lm/bench.py)
        return _generation_bench(settings, payload)
    timings = payload["timings"]
    return {"settings": settings, "device": payload.get("device"),
            "latency_ms": round(timings["artifact"]["median_ms"], 4),
            "baselines_ms": {k: round(v["median_ms"], 4) for k, v in timings.items()
                             if k != "artifact"},
            "ratios": {k: round(v, 4) for k, v in payload.get("ratios", {}).items()}}


def _generation_bench(settings: dict, payload: dict) -> dict:
    """Decode tokens/s and time to first token, and the artifact's decode speed over each
    baseline's (above 1: faster; a plain bench's ratios are of latencies)."""
    engines = payload["engines"]
    own = engines["artifact"]
    return {"settings": settings, "device": payload.get("device"),
            "prompt_tokens": payload.get("prompt_tokens"), "new_tokens": payload.get("new_tokens"),
            "decode_tokens_per_s": round(own["decode_tokens_per_s"], 1),
            "ttft_ms": round(own["ttft_s"] * 1e3, 3),
            "baselines_tokens_per_s": {name: round(row["decode_tokens_per_s"], 1)
                                       for name, row in engines.items() if name != "artifact"},
            "decode_ratios": {k: round(v, 4) for k, v in payload.get("ratios", {}).items()}}


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _attempt(job: Job) -> int:
    """1, or one more than the marker a run of this cell left when its worker died (the
    executor clears markers before a matrix starts: only Ray's retry finds one)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads(Path(job.running).read_text())["attempt"]) + 1
    return 1


def _mark_running(job: Job, attempt: int, build_pid: int) -> None:
    """Who runs the cell now, written whole: a test (or a person) can kill the worker."""
    marker = {"cell": job.cell_id, "host": socket.gethostname(), "worker_pid": os.getpid(),
              "build_pid": build_pid, "attempt": attempt, "started": time.time()}
    tmp = Path(f"{job.running}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(marker))
    tmp.replace(job.running)
