"""The cpu target's backend choice against its own candidates and the peers: each model
built with `--target cpu` (`--cpu-backend auto`: the build times AOTInductor and ONNX
Runtime and keeps the faster, recording both figures in the manifest) and, if asked, with
`--target onnx`; then those artifacts, eager torch, a plain ONNX Runtime session on
`torch.onnx.export`'s file and AOTInductor frozen (`aoti_compile_and_package` with
freezing) timed in one process, interleaved, on the model's example inputs, everything on
``--threads`` threads.

    taskset -c 0,1 env OMP_NUM_THREADS=2 python bench/cpu_choice.py \
        --models bench/models.py:hf_resnet50 --json-out build/bench/cpu-choice.jsonl
    python bench/cpu_choice.py --render build/bench/cpu-choice.jsonl >> bench/RESULTS.md

``--stage`` splits that into steps (build, peers, time) so that no timing runs beside a
build: bench/cpu_choice_pinned.py runs each model's steps on its own cores. The
candidates' figures are the build's own (its timing process, on the same CPUs and
threads); the other columns are this script's. Builds run as the CLI, cached in
``--work-dir`` (bench/compare_targets.py's ``build_one``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (LoadSampler, append_row, fix_threads, machine_header,  # noqa: E402
                          read_rows, run_or_render, time_artifacts)
from bench.compare_targets import _name, _spec, baselines, build_one  # noqa: E402

VARIANTS = {"cpu": ["--target", "cpu", "--cpu-backend", "auto"], "onnx": ["--target", "onnx"]}


def run(args) -> None:
    import onnxruntime
    import torch

    import runtime

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    threads = fix_threads(args.threads)
    header = machine_header(torch=torch.__version__, onnxruntime=onnxruntime.__version__,
                            transformers=_version("transformers"), runs=args.runs,
                            threads=threads, affinity=sorted(os.sched_getaffinity(0)),
                            argv=" ".join(sys.argv))
    baseline_names = args.baselines.split(",")
    for model in args.models.split(","):
        start = time.perf_counter()
        if args.stage in ("all", "build"):
            for label, record in _built(model, args, work_dir).items():
                if "path" in record:  # the choice's figures, in the log of a call cut short
                    _said(start, f"{label} built: " + json.dumps(runtime.read_manifest(
                        record["path"]).build.get("backend_choice")))
        if args.stage in ("peers", "all"):  # makes their files (export, compile) if missing
            baselines(model, baseline_names, work_dir, args.threads)
            _said(start, "peers made")
        if args.stage not in ("all", "time"):
            continue
        built = _built(model, args, work_dir, made_only=args.stage == "time")
        paths = {k: v["path"] for k, v in built.items() if "path" in v}
        inputs, calls = baselines(model, baseline_names, work_dir, args.threads,
                                  made_only=args.stage == "time")
        _said(start, f"timing {', '.join([*paths, *calls])}")
        together = (Together(Path(args.together), args.together_count, _name(model))
                    if args.together else None)
        blocks = Blocks(args.runs, args.rounds, together.stage if together else None)
        with LoadSampler() as load:
            timings = time_artifacts(paths, inputs, args.runs, args.warmup, extra_calls=calls,
                                     rounds=args.rounds, stage=blocks.stage, wrap=blocks.wrap,
                                     after=together.keep_busy if together else None)
        choice = (runtime.read_manifest(paths["cpu"]).build.get("backend_choice")
                  if "cpu" in paths else None)
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json_out, "a") as sink:
            append_row(sink, {**header, "model": _name(model), "spec": _spec(model),
                              "timings": timings, "backend_choice": choice,
                              "build_s": {k: v.get("build_s") for k, v in built.items()},
                              "errors": {k: v["error"] for k, v in built.items()
                                         if "error" in v},
                              "missing": sorted(set(baseline_names) - set(calls)),
                              "rounds": args.rounds, "blocks": blocks.summary(),
                              "load": load.summary(), "validated": not args.no_validate,
                              "cpu_backend": args.cpu_backend,
                              **({"together": together.record} if together else {}),
                              "wall_s": round(time.perf_counter() - start, 1)})


class Together:
    """Timing processes of several models (bench/cpu_choice_pinned.py, all at once) that
    start their timed calls together, after every one has loaded and warmed up, and go on
    calling their engines, untimed, until the last is done, so that a model's neighbours
    stay the same through its timing. Without it, small models were timed while the large
    ones still loaded, and the large ones partly after the small ones had finished; with
    a matmul loop after instead, the large ones' later rounds had neighbours other
    than their first rounds'."""

    def __init__(self, folder: Path, count: int, name: str, limit_s: float = 120.0) -> None:
        self.folder, self.count, self.name, self.limit_s = folder, count, name, limit_s
        self.record: dict = {"count": count}

    @contextlib.contextmanager
    def stage(self, label: str):
        """time_side_by_side's stage hook: waits before its timed calls."""
        if label.startswith("time "):
            self.record["waited_s"], self.record["all_ready"] = self._wait("ready", None)
        yield

    def keep_busy(self, calls: dict) -> None:
        """time_artifacts' ``after``: this process's engines in turn until all are done."""
        engines = itertools.cycle(list(calls.values()))
        self.record["busy_after_s"], self.record["all_done"] = self._wait(
            "done", lambda: next(engines)())

    def _wait(self, kind: str, busy) -> tuple[float, bool]:
        """Marks this process ``kind``, then sleeps (or calls ``busy``) until ``count``
        processes have, or ``limit_s`` ran out."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{kind}-{self.name}").touch()
        start = time.monotonic()
        while (len(list(self.folder.glob(f"{kind}-*"))) < self.count
               and time.monotonic() - start < self.limit_s):
            busy() if busy else time.sleep(0.02)
        return (round(time.monotonic() - start, 1),
                len(list(self.folder.glob(f"{kind}-*"))) >= self.count)


class Blocks:
    """Each engine's timed calls in the order the interleaving made them: the time of
    each (seconds from the first) and its ms, in blocks of one untimed call and
    runs/rounds timed ones (exporter.benchmark.time_side_by_side's). One round's blocks
    run seconds apart, so two engines' blocks of one round divided leave out what the
    machine did over longer times (a large model's two modes), which medians over all
    calls keep: render's paired column."""

    def __init__(self, runs: int, rounds: int, stage=None) -> None:
        self.per_round = max(1, runs // rounds)
        self.inner = stage
        self.recording = False
        self.calls: dict[str, list[tuple[float, float]]] = {}

    @contextlib.contextmanager
    def stage(self, label: str):
        """time_side_by_side's stage hook (the inner one's, if any): records in "time"."""
        with self.inner(label) if self.inner else contextlib.nullcontext():
            self.recording = label.startswith("time ")
            try:
                yield
            finally:
                self.recording = False

    def wrap(self, calls: dict) -> dict:
        return {label: self._recorded(label, call) for label, call in calls.items()}

    def _recorded(self, label: str, call):
        record = self.calls.setdefault(label, [])

        def recorded():
            if not self.recording:
                return call()
            start = time.perf_counter()
            out = call()
            record.append((start, time.perf_counter() - start))
            return out
        return recorded

    def summary(self) -> dict:
        """{"per_round": n, label: {"ms": [block medians], "at_s": [block starts],
        "calls": [[at_s, ms], ...]}}: the blocks without their untimed first call, the
        calls with it."""
        first = min((c[0][0] for c in self.calls.values() if c), default=0.0)
        found: dict = {"per_round": self.per_round}
        for label, calls in self.calls.items():
            size = self.per_round + 1
            chunks = [calls[i + 1:i + size] for i in range(0, len(calls), size)]
            chunks = [c for c in chunks if c]
            found[label] = {"ms": [round(statistics.median(ms for _, ms in c) * 1e3, 3)
                                   for c in chunks],
                            "at_s": [round(c[0][0] - first, 2) for c in chunks],
                            "calls": [[round(at - first, 3), round(ms * 1e3, 3)]
                                      for at, ms in calls]}
        return found


def paired(blocks: dict, ours: str, peer: str) -> float | None:
    """Median over rounds of our block's median over the peer's in that round."""
    if not blocks or ours not in blocks or peer not in blocks:
        return None
    ratios = [a / b for a, b in zip(blocks[ours]["ms"], blocks[peer]["ms"]) if b > 0]
    return statistics.median(ratios) if ratios else None


def _said(start: float, what: str) -> None:
    print(f"[{time.perf_counter() - start:.1f} s] {what}", file=sys.stderr, flush=True)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _built(model: str, args, work_dir: Path, made_only: bool = False) -> dict:
    """{variant: build_one's record}; ``made_only``: those an earlier step built, no more."""
    extra = ["--no-validate"] if args.no_validate else []
    labels = [label for label in args.variants.split(",") if label in VARIANTS]
    if made_only:
        labels = [label for label in labels if _sidecar(work_dir, model, label).exists()]
    return {label: build_one(label, _spec(model), _flags(label, args) + extra, work_dir,
                             _name(model)) for label in labels}


def _flags(label: str, args) -> list[str]:
    """The variant's build flags; the cpu variant's backend pinned by ``--cpu-backend``
    (default auto: the build chooses)."""
    flags = list(VARIANTS[label])
    if label == "cpu":
        flags[flags.index("--cpu-backend") + 1] = args.cpu_backend
    return flags


def _sidecar(work_dir: Path, model: str, label: str) -> Path:
    return work_dir / f"{_name(model)}-{label}.build.json"  # build_one's record


PEERS = {"eager": "eager", "ort": "plain ORT", "aoti": "AOTInductor frozen"}
# columns that are not peers: our artifacts, and the peer's library loaded as ours are
OURS = {"cpu": "cpu target ms (p10-p90)", "onnx": "onnx target ms (p10-p90)",
        "aoti-aligned": "AOTI frozen, constants aligned as the runtime's (not a peer)"}


def render(paths: list[str]) -> str:
    rows = read_rows(paths)
    head = rows[0]
    peers = [k for k in PEERS if any(k in row["timings"] for row in rows)]
    ours = ["cpu", *[k for k in OURS if k != "cpu"
                     and any(k in row["timings"] for row in rows)]]
    lines = ["| model | cpu chose (build's figures, ms) | "
             + " | ".join(OURS[k] for k in ours) + " | "
             + " | ".join(PEERS[k] for k in peers) + " | best peer | **cpu / best peer** "
             "| paired (median of rounds) |",
             "|---|---|" + "---|" * (len(ours) + len(peers)) + "---|---|---|"]
    ratios, pairs = [], []
    for row in rows:
        t = row["timings"]
        record = next(iter((row.get("backend_choice") or {}).values()), {})
        figures = ", ".join(f"{name} {c['median_ms']:.4g}" if "median_ms" in c
                            else f"{name} dropped" for name, c in
                            record.get("candidates", {}).items())
        timed = [k for k in peers if k in t]
        best = min(timed, key=lambda k: t[k]["median_ms"]) if timed else None
        ratio = t["cpu"]["median_ms"] / t[best]["median_ms"] if "cpu" in t and best else None
        ratios += [ratio] if ratio else []
        pair = paired(row.get("blocks"), "cpu", best) if best else None
        pairs += [pair] if pair else []
        cells = [_cell(t[k]) if k in t else "-" for k in [*ours, *peers]]
        lines.append(f"| {row['model']} | {record.get('chosen', '-')} ({figures or '-'}) | "
                     + " | ".join(cells) + f" | {PEERS.get(best, '-')} | "
                     + (f"**{ratio:.3f}** |" if ratio else "- |")
                     + (f" {pair:.3f} |" if pair else " - |"))
    geomean, paired_mean = _geomean(ratios), _geomean(pairs)
    intro = (f"\n{head['cpu']}, {head['cores']} cores in each process's mask, threads "
             f"{head['threads']}; torch {head['torch']}, onnxruntime {head['onnxruntime']}; "
             f"median ms (p10-p90) over {head['runs']} interleaved calls per engine, batch 1."
             f" Geometric mean cpu / best peer **{geomean:.3f}**; of the paired rounds "
             f"{paired_mean:.3f}.\n\n")
    return intro + "\n".join(lines) + "\n" + _paired_table(rows, [*ours, *peers])


def _paired_table(rows: list[dict], labels: list[str]) -> str:
    """Round by round, each of our columns against each peer but eager: the median
    ratio and in how many rounds ours was the faster (rows with blocks only)."""
    pairs = [(a, b) for a in labels if a in OURS for b in labels if b in PEERS
             and b != "eager"]
    found = [row for row in rows if row.get("blocks")]
    if not found or not pairs:
        return ""
    lines = ["\nPaired by rounds (median of the rounds' ratios; rounds ours was faster):\n",
             "| model | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |",
             "|---|" + "---|" * len(pairs)]
    for row in found:
        cells = []
        for a, b in pairs:
            blocks = row["blocks"]
            ratio = paired(blocks, a, b)
            wins = (sum(x < y for x, y in zip(blocks[a]["ms"], blocks[b]["ms"]))
                    if ratio else 0)
            rounds = min(len(blocks[a]["ms"]), len(blocks[b]["ms"])) if ratio else 0
            cells.append(f"{ratio:.3f} ({wins}/{rounds})" if ratio else "-")
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def _cell(timing: dict) -> str:
    return f"{timing['median_ms']:.4g} ({timing['p10_ms']:.4g}-{timing['p90_ms']:.4g})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="bench/models.py:hf_resnet50")
    parser.add_argument("--variants", default="cpu,onnx", help="cpu (auto) and/or onnx")
    parser.add_argument("--baselines", default="ort,aoti",
                        help="ort (plain ONNX Runtime), aoti (AOTInductor frozen), "
                             "aoti-aligned (its library loaded as the runtime loads ours: "
                             "not a peer); eager always")
    parser.add_argument("--stage", default="all", choices=("all", "build", "peers", "time"),
                        help="build: the variants; peers: the baselines' files; time: "
                             "what those made, nothing built (bench/cpu_choice_pinned.py)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10,
                        help="blocks per engine (runs/rounds calls each, after one untimed)")
    parser.add_argument("--together", default=None, metavar="DIR",
                        help="time with --together-count processes that share DIR: start "
                             "together, keep the cores busy until all are done")
    parser.add_argument("--together-count", type=int, default=1)
    parser.add_argument("--cpu-backend", default="auto",
                        help="the cpu variant's --cpu-backend: auto (the build times its "
                             "candidates), or one pinned (a build without that timing)")
    parser.add_argument("--no-validate", action="store_true",
                        help="build without the validation process (a short machine lease)")
    run_or_render(parser, run, render, "build/bench/cpu-choice.jsonl")


if __name__ == "__main__":
    main()
