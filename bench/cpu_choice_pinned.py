"""bench/cpu_choice.py for several models at once, each on its own cores, in two phases
so that no timing runs beside a build or a compile:

1. every model's `--target cpu` build (whose own choice timing runs there too) on its
   cores; the peers' files (`torch.onnx.export`, AOTInductor frozen), one job a model,
   and its other ``--variants`` (`--target onnx`), one job each, are taken from one queue
   by the spare cores (``--peer-cores``, two a worker) at once and by each model's cores
   once its build is done;
2. when all of phase 1 is done, or at ``--barrier-s`` (what still runs is ended and
   named), every built model's timing process on its cores, all at once, their timed
   calls started together and the cores kept busy until the last is done (``--alone``:
   one after another; ``--lanes N``: N at a time), until ``--deadline-s``.

    python bench/cpu_choice_pinned.py --models hf_mobilenet_v2,hf_resnet50 \\
        --work-dir build/cpu-pinned --peer-cores 12-15 --barrier-s 200 --deadline-s 300

Rows go to ``--json-out`` (one per model, bench/cpu_choice.py's), then its table.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "bench" / "cpu_choice.py")


class Slot(threading.Thread):
    """Runs its commands one after another, pinned to ``cores``, then takes commands from
    ``shared`` (a queue other slots take from too) until it is empty; ``end()`` stops the
    one running and the rest."""

    def __init__(self, name: str, cores: str, commands: list[list[str]], log: Path,
                 threads: int, shared: queue.SimpleQueue | None = None) -> None:
        super().__init__(daemon=True)
        self.label, self.cores, self.commands, self.log = name, cores, commands, log
        self.shared = shared
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        self.process: subprocess.Popen | None = None
        self.ended = False
        self.failed: list[int] = []
        self.seconds: float | None = None

    def run(self) -> None:
        start = time.monotonic()
        with open(self.log, "a") as log:
            for command in self._commands():
                if self.ended:
                    return
                log.write(f"$ {' '.join(command)}\n")
                log.flush()  # a new session: end() stops its compile workers too
                self.process = subprocess.Popen(["taskset", "-c", self.cores, *command],
                                                cwd=ROOT, env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT,
                                                start_new_session=True)
                if self.process.wait() != 0 and not self.ended:
                    self.failed.append(self.process.returncode)
        self.seconds = round(time.monotonic() - start, 1)

    def _commands(self):
        yield from self.commands
        while self.shared is not None and not self.ended:
            try:
                yield self.shared.get_nowait()
            except queue.Empty:
                return

    def end(self) -> None:
        self.ended = True
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)


def run_slots(slots: list[Slot], until: float) -> list[str]:
    """Starts every slot, waits until all are done or the monotonic time ``until``; ends
    what still runs and returns those slots' names."""
    for slot in slots:
        slot.start()
    for slot in slots:
        slot.join(max(0.0, until - time.monotonic()))
    late = [slot for slot in slots if slot.is_alive()]
    for slot in late:
        slot.end()
        slot.join()
    return [slot.label for slot in late]


def run_timers(timers: list[Slot], until: float, lanes: int = 0) -> list[str]:
    """The timing processes all at once (each on its cores, the issue's protocol), or in
    ``lanes`` lanes at once, each lane's one after another (``timers[i::lanes]``): fewer
    timings share the machine's memory and caches at a time (1: none); what still runs
    at ``until`` is ended and named."""
    if lanes <= 0 or lanes >= len(timers):
        return run_slots(timers, until)
    ended: list[list[str]] = [[] for _ in range(lanes)]

    def lane(index: int) -> None:
        ended[index] = [name for timer in timers[index::lanes]
                        for name in run_slots([timer], until)]

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [name for names in ended for name in names]


def peer_jobs(baselines: str, split: bool) -> list[str]:
    """The ``--baselines`` of each peers job of a model: one job, or one per peer file
    (``split``: ONNX Runtime's export beside AOTInductor's compile, a shorter phase 1);
    the aligned load reads AOTInductor's file, so it goes in that job."""
    names = baselines.split(",")
    if not split:
        return [baselines]
    jobs = [[n] for n in names if n not in ("aoti", "aoti-aligned")]
    compiled = [n for n in names if n in ("aoti", "aoti-aligned")]
    return [",".join(job) for job in jobs + ([compiled] if compiled else [])]


def cores_of(first: int, per: int, index: int) -> str:
    return ",".join(str(first + per * index + k) for k in range(per))


def _cpus(text: str) -> list[str]:
    """'12-15' or '12,13' -> ['12', '13', '14', '15']."""
    out = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out += [str(c) for c in range(int(low), int(high or low) + 1)]
    return out


def _pairs(cpus: list[str]) -> list[tuple[str, str | None]]:
    return [(cpus[i], cpus[i + 1] if i + 1 < len(cpus) else None)
            for i in range(0, len(cpus), 2)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", required=True,
                        help="zoo names, FILE.py:FUNCTION, or names in bench/models.py")
    parser.add_argument("--work-dir", default="build/cpu-pinned")
    parser.add_argument("--json-out", default=None, help="default: WORK_DIR/rows.jsonl")
    parser.add_argument("--variants", default="cpu")
    parser.add_argument("--baselines", default="ort,aoti")
    parser.add_argument("--threads", type=int, default=2, help="and cores per model")
    parser.add_argument("--first-core", type=int, default=0)
    parser.add_argument("--peer-cores", default="",
                        help="e.g. 12-15; default: none (the models' cores after their builds)")
    parser.add_argument("--cpu-backend", default="auto",
                        help="the cpu builds' --cpu-backend (default auto: they choose)")
    parser.add_argument("--split-peers", action="store_true",
                        help="each peer's file its own job (export and compile at once)")
    parser.add_argument("--barrier-s", type=float, default=240.0)
    parser.add_argument("--deadline-s", type=float, default=330.0)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10,
                        help="blocks per engine; fewer, longer blocks for models of a few ms")
    parser.add_argument("--alone", action="store_true",
                        help="phase 2 times one model at a time (default: all at once)")
    parser.add_argument("--lanes", type=int, default=0,
                        help="phase 2 times LANES models at a time, models i, i+LANES, ... "
                             "one after another (--alone: 1)")
    args = parser.parse_args()

    start = time.monotonic()
    work = Path(args.work_dir).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    json_out = Path(args.json_out or work / "rows.jsonl").resolve()
    models = [m if ":" in m else f"bench/models.py:{m}" for m in args.models.split(",")]
    common = ["--work-dir", str(work), "--threads", str(args.threads),
              "--cpu-backend", args.cpu_backend]

    def step(model: str, stage: str, *extra: str) -> list[str]:
        return [sys.executable, SCRIPT, "--models", model, "--stage", stage, *common, *extra]

    # The peers' files go to a queue that the spare cores take from at once and each
    # model's cores after its build; the largest models last in --models, first here.
    # Variants other than cpu (the onnx target) build there too: no choice timing runs
    # in them, and the cpu build, the longest, stays alone on its model's cores.
    peers = queue.SimpleQueue()
    others = [v for v in args.variants.split(",") if v != "cpu"]
    for model in reversed(models):
        for names in peer_jobs(args.baselines, args.split_peers):
            peers.put(step(model, "peers", "--baselines", names))
        for variant in others:
            peers.put(step(model, "build", "--variants", variant, "--no-validate"))
    spare = [f"{a},{b}" if b else a for a, b in _pairs(_cpus(args.peer_cores))]
    slots = [Slot(f"spare {cores}", cores, [], work / "logs" / f"spare-{i}.log",
                  args.threads, peers) for i, cores in enumerate(spare)]
    for index, model in enumerate(models):
        name, cores = model.rsplit(":", 1)[-1], cores_of(args.first_core, args.threads, index)
        slots.append(Slot(name, cores, [step(model, "build", "--variants", "cpu",
                                             "--no-validate")],
                          work / "logs" / f"{name}-build.log", args.threads, peers))
    ended = run_slots(slots, start + args.barrier_s)
    phase1 = round(time.monotonic() - start, 1)
    print(f"phase 1 (builds, peers) {phase1} s; ended at the barrier: {ended or 'none'}; "
          f"failed: {[(s.label, s.failed) for s in slots if s.failed] or 'none'}; "
          + ", ".join(f"{s.label} {s.seconds} s" for s in slots), flush=True)

    sys.path.insert(0, str(ROOT))
    from bench.cpu_choice import _sidecar, render
    built = [(index, model) for index, model in enumerate(models)
             if _sidecar(work, model, "cpu").exists()]  # else nothing of ours to time
    lanes = 1 if args.alone else args.lanes
    # all at once: timed calls start together and every core stays busy until the last
    # is done (cpu_choice.Together), so each model's neighbours do not change meanwhile
    together = ([] if 0 < lanes < len(built) else
                ["--together", str(work / f"together-{os.getpid()}-{time.time_ns()}"),
                 "--together-count", str(len(built))])
    timers = []
    for index, model in built:
        name = model.rsplit(":", 1)[-1]
        rows = work / f"rows-{name}.jsonl"
        rows.unlink(missing_ok=True)
        timers.append(Slot(name, cores_of(args.first_core, args.threads, index),
                           [step(model, "time", "--variants", args.variants, "--baselines",
                                 args.baselines, "--runs", str(args.runs), "--warmup",
                                 str(args.warmup), "--rounds", str(args.rounds),
                                 "--json-out", str(rows), *together)],
                           work / "logs" / f"{name}-time.log", args.threads))
    ended = run_timers(timers, start + args.deadline_s, lanes)
    print(f"phase 2 (timing, {lanes or len(timers)} model(s) at a time) "
          f"{round(time.monotonic() - start - phase1, 1)} s; ended: "
          f"{ended or 'none'}; " + ", ".join(f"{s.label} {s.seconds} s" for s in timers),
          flush=True)
    found = [work / f"rows-{m.rsplit(':', 1)[-1]}.jsonl" for m in models]
    found = [p for p in found if p.exists() and p.read_text().strip()]
    with open(json_out, "a") as sink:
        for path in found:
            sink.write(path.read_text())
    if found:
        print(render([str(p) for p in found]), flush=True)


if __name__ == "__main__":
    main()
