"""bench/cuda_gap.py's processes: every (model, variant) build and one measuring process per
model started at once, the measuring processes taking the GPU one at a time once every model
is ready. Results travel through files (a pipe would wait for every process that inherited
it: Inductor's compile workers), each process writes its output to its own log, and a run
cut short keeps every row already written."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GAP = Path(__file__).resolve().parent / "cuda_gap.py"


def build_one(job: list, args) -> dict:
    """One (model, variant) build with the whole ``build()``; a failure is its error."""
    name, spec, variant, overrides = job
    out = Path(args.work_dir) / f"{name}-{variant}.artifact"
    start = time.perf_counter()
    tuning = None
    try:
        with (_log_tuning(out.with_suffix(".tuning.jsonl")) if args.device == "cuda"
              else contextlib.nullcontext()) as tuning:
            built = _build(spec, overrides, out, args.device)
    except SameAsTarget as same:  # nothing to time that the target's own build lacks
        return {"same_as_target": str(same), "build_s": round(time.perf_counter() - start, 1)}
    except Exception as exc:  # the other builds are still measured
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "build_s": round(time.perf_counter() - start, 1)}
    finally:
        note(args, {"model": name, "variant": variant, "built_at_s": since(args)})
    return {"path": str(out), "build_s": round(time.perf_counter() - start, 1),
            "lower_s": built.timings.get("lower (aoti)"), "stages_s": built.timings,
            "tuning": tuning and tuning(),
            "validated": built.manifest.validation["passed"]}


@contextlib.contextmanager
def _log_tuning(path: Path):
    """Inductor's coordinate-descent tuning while inside, a line a kernel to ``path`` as
    it is tuned (so a build ended at the barrier still shows it): seconds, configurations
    timed, the starting and best ms, the kernel's size hints. Yields a function giving
    the totals."""
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner
    autotune, rows = CoordescTuner.autotune, []

    def logged(tuner, func, baseline_config, baseline_timing=None):
        begin, times = time.perf_counter(), []

        def timed(config):
            times.append(func(config))
            return times[-1]
        best = autotune(tuner, timed, baseline_config, baseline_timing)
        row = {"kernel": tuner.name, "s": round(time.perf_counter() - begin, 3),
               "configs": len(times),
               "start_ms": baseline_timing if baseline_timing is not None else times[0],
               "best_ms": min([*times, baseline_timing or float("inf")]),
               "sizes": {k: v for k, v in (tuner.size_hints or {}).items()}}
        rows.append(row)
        with open(path, "a") as sink:
            sink.write(json.dumps(row) + "\n")
        return best
    def totals() -> dict:
        from torch._dynamo.utils import compilation_time_metrics as phases
        slowest = sorted(phases.items(), key=lambda kv: -sum(kv[1]))[:10]
        return {"kernels": len(rows), "configs": sum(r["configs"] for r in rows),
                "s": round(sum(r["s"] for r in rows), 1),
                "inductor_s": {k: round(sum(v), 1) for k, v in slowest}}
    CoordescTuner.autotune = logged
    try:
        yield totals
    finally:
        CoordescTuner.autotune = autotune


def _build(spec: str, overrides: dict, out: Path, device: str):
    from exporter.builder.pipeline import build
    from exporter.settings import BuildSettings
    if device == "cpu":  # the process path without a GPU: no Inductor settings to lay over
        if overrides:
            raise ValueError("--device cpu builds the cpu target as it is: variants are {}")
        return build(spec, BuildSettings(target="cpu", dtype="fp32", out=out,
                                         cpu_backend="aoti"))
    from targets.aoti.cuda import CudaTarget
    original = with_variant(overrides)
    try:
        with _unless_changed(overrides), _sdpa_backends(overrides.get("sdpa_backends")):
            return build(spec, BuildSettings(target="cuda", dtype="fp16", out=out))
    finally:
        CudaTarget.inductor_configs, CudaTarget.default_passes = original


def _sdpa_backends(names: list[str] | None):
    """The attention backends a build may choose from (``SDPBackend`` names): capture and
    lowering pick one per attention call from those enabled; None: torch's own choice."""
    if not names:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, name) for name in names])


class SameAsTarget(BaseException):
    """A variant whose added passes changed nothing and whose Inductor settings leave the
    layout decision as it was: its build would be the target's own. Not an Exception:
    the pass pipeline and the build would record one as a failure and go on."""


@contextlib.contextmanager
def _unless_changed(overrides: dict):
    """With ``overrides["unless_same"]``: the build stops at Inductor's layout decision
    (the start of lowering) when no added pass modified the program and the decision is
    what the target's settings give (``force_layout_optimization`` the only setting such a
    variant may lay over)."""
    if not overrides.get("unless_same"):
        yield
        return
    import torch
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering
    decide = GraphLowering.__dict__["decide_layout_opt"]

    def checked(gm, *, is_inference):
        chosen = decide.__func__(gm, is_inference=is_inference)
        with config.patch(force_layout_optimization=False):
            own = decide.__func__(gm, is_inference=is_inference)
        convs = any(n.target is torch.ops.aten.convolution.default for n in gm.graph.nodes)
        if not any(_MODIFIED) and (chosen == own or not convs):
            raise SameAsTarget(f"no added pass changed the program; layout "
                               f"{'channels-last' if own else 'as given'} either way")
        return chosen
    _MODIFIED.clear()
    GraphLowering.decide_layout_opt = staticmethod(checked)
    try:
        yield
    finally:
        GraphLowering.decide_layout_opt = decide


_MODIFIED: list[bool] = []  # each added pass's ``modified``, in this build process


def _recorded(made):
    """An added pass that notes whether it modified the program."""
    def run(program):
        result = made(program)
        _MODIFIED.append(result.modified)
        return result
    run.name, run.required = made.name, made.required
    return run


def with_variant(overrides: dict):
    """The cuda target's Inductor settings with ``overrides`` laid over them, less the
    passes named in ``overrides["skip_passes"]``, plus the candidate passes named in
    ``overrides["add_passes"]`` (targets/aoti/cuda.py CANDIDATE_PASSES, placed before the
    attention-input rewrite, where they ran when on by default), for one build; returns
    the originals."""
    from targets.aoti.cuda import CANDIDATE_PASSES, CudaTarget
    overrides = dict(overrides)
    skipped = set(overrides.pop("skip_passes", ()))
    added = [CANDIDATE_PASSES[name] for name in overrides.pop("add_passes", ())]
    overrides.pop("unless_same", None)
    overrides.pop("sdpa_backends", None)  # not an Inductor setting: _build applies it
    original = CudaTarget.inductor_configs, CudaTarget.default_passes

    def configs(self, options, dynamic=False, data_sizes=False):
        return {**original[0](self, options, dynamic, data_sizes), **overrides}

    def passes(self, options):
        kept = [p for p in original[1](self, options) if p.name not in skipped]
        at = next((i for i, p in enumerate(kept) if p.name == "attention_inputs_as_views"),
                  len(kept))
        return [*kept[:at], *(_recorded(make()) for make in added), *kept[at:]]
    CudaTarget.inductor_configs, CudaTarget.default_passes = configs, passes
    return original


def run_jobs(args, plan: list[tuple[str, dict[str, dict]]]) -> None:
    """Start every build and measuring process of ``plan`` ((model, variants) pairs), echo
    the progress lines as they come, end what is left at ``--deadline-s``."""
    from bench.cuda_models import model_spec
    work = Path(args.work_dir)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    sync = work / "sync"
    sync.mkdir(exist_ok=True)
    for stale in [*sync.iterdir(), *work.glob("*.json")]:
        stale.unlink()
    args.progress = args.progress or str(work / "progress.log")
    Path(args.progress).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(args.compile_threads),
           "PYTHONUNBUFFERED": "1"}
    common = [*sys.argv[1:], "--start", str(start), "--progress", args.progress]
    # builds take the GPUs of --build-gpus in turn (their tuning runs there); the
    # measuring processes the first, one at a time
    gpus = args.build_gpus.split(",") if getattr(args, "build_gpus", None) else [""]
    builds = []
    for name, variants in plan:
        for variant, overrides in variants.items():
            job = [name, model_spec(name), variant, overrides]
            gpu = {"CUDA_VISIBLE_DEVICES": gpus[len(builds) % len(gpus)]} if gpus[0] else {}
            builds.append(_spawn([*common, "--build-one", json.dumps(job), "--json-out",
                                  str(result_file(name, variant, args))],
                                 work / "logs" / f"{name}-{variant}.log", {**env, **gpu}))
    first = {"CUDA_VISIBLE_DEVICES": gpus[0]} if gpus[0] else {}
    procs = builds + [_spawn([*common, "--measure-one", name], work / "logs" / f"{name}.log",
                             {**env, **first}) for name, _ in plan]
    seen = 0
    while any(p.poll() is None for p in procs) and time.time() < start + args.deadline_s:
        time.sleep(2)
        seen = _echo(args.progress, seen)
        if (sync / "open").exists():  # timing began: no build may share the GPU or CPUs
            _end(builds, "ended_at_barrier")
    _end(procs, "ended_at_deadline")
    _echo(args.progress, seen)
    for proc in procs:
        if proc.returncode and proc.returncode != -signal.SIGKILL:  # not one ended above
            print(f"--- {proc.log} (exit {proc.returncode}):\n"
                  + proc.log.read_text()[-1500:], flush=True)


def _end(procs: list[subprocess.Popen], why: str) -> None:
    """Each process still running, with its compile workers (its own session)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(json.dumps({why: proc.args[-1][:80]}), flush=True)


def _spawn(argv: list[str], log: Path, env: dict) -> subprocess.Popen:
    # its own Inductor and Triton caches: processes side by side sharing one can break a
    # build, and one build would load kernels another compiled (a build-time A/B)
    cache = log.parent.parent / "cache" / log.stem
    env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
           "TRITON_CACHE_DIR": str(cache / "triton")}
    with open(log, "w") as sink:  # its own session: the deadline ends its compile workers too
        proc = subprocess.Popen([sys.executable, str(GAP), *argv], stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    proc.log = log
    return proc


def _echo(progress: str, seen: int) -> int:
    path = Path(progress)
    if not path.exists():
        return seen
    lines = path.read_text().splitlines()
    for line in lines[seen:]:
        print(line, flush=True)
    return len(lines)


def result_file(name: str, variant: str, args) -> Path:
    return Path(args.work_dir) / f"{name}-{variant}.json"


def wait_for_build(name: str, variant: str, args) -> dict:
    """The build's result once its process wrote it, or an error at ``--barrier-s``."""
    path = result_file(name, variant, args)
    while not path.exists():
        if since(args) > args.barrier_s:
            return {"error": f"not built {args.barrier_s:.0f} s after the start"}
        time.sleep(1)
    return json.loads(path.read_text())


def write_result(path: str, result: dict) -> None:
    """Whole or not at all: a measuring process polls for the file."""
    part = Path(path + ".part")
    part.write_text(json.dumps(result))
    os.replace(part, path)


@contextlib.contextmanager
def time_on_gpu(name: str, args):
    """Ready; wait until every model is (or ``--barrier-s``); then hold the GPU alone,
    on ``--time-cores`` if given."""
    sync = Path(args.work_dir) / "sync"
    (sync / f"ready-{name}").touch()
    models = len(args.models.split(","))
    while len(list(sync.glob("ready-*"))) < models and since(args) < args.barrier_s:
        time.sleep(1)
    (sync / "open").touch()  # a caller's script may start its CPU work now
    with open(sync / "gpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if args.time_cores:
            pin(cores(args.time_cores))
        note(args, {"model": name, "timing_at_s": since(args)})
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cores(text: str) -> set[int]:
    """'12-15' or '0,2,4-5' as a set of core numbers."""
    chosen = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        chosen |= set(range(int(low), int(high or low) + 1))
    return chosen


def pin(chosen: set[int]) -> None:
    """Every thread of this process onto ``chosen`` (sched_setaffinity(0) moves only one)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), chosen)


def since(args) -> float:
    return round(time.time() - (args.start or time.time()), 1)


def note(args, line: dict, row: dict | None = None) -> None:
    """A progress line (and a result row) appended under a lock: many processes write."""
    print(json.dumps(line), flush=True)
    targets = [(args.progress, line)] + ([(args.json_out, row)] if row is not None else [])
    for path, record in targets:
        if not path:
            continue
        with open(path, "a") as sink:
            fcntl.flock(sink, fcntl.LOCK_EX)
            sink.write(json.dumps(record) + "\n")
            fcntl.flock(sink, fcntl.LOCK_UN)
