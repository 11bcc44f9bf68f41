"""Each candidate lowering of a partition timed in a child process, as the artifact will
run it: loaded by the runtime's own executors, with the thread pools this machine gives
a process (the child inherits the build's environment and CPU affinity), on the
partition's example inputs. Before timing, each candidate's outputs are compared with
the partition's own (eager) outputs: one that runs wrong is dropped, not timed.

Timing: a warm-up, then rounds in which every candidate runs for about ``ROUND_S`` in
turn (the order rotating), so a machine that gets busier weighs on all alike; the figure
is the median call. Each turn starts with an untimed call: the previous candidate's
thread pool (ONNX Runtime's spinning workers, OpenMP's) still holds the cores for a
while, and turns of one timed call would time only that, against the candidate whose
pool is slower to let go of them.

    python -m targets.aoti.timing FOLDER   # job.json, inputs and reference in FOLDER
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves

from runtime.host.tensorio import load_tensors, save_tensors
from runtime.program.flat_inputs import flatten_inputs

log = logging.getLogger(__name__)

WARMUP = 2
ROUNDS = 7
ROUND_S = 0.25  # each candidate's share of a round, in seconds
TURN_CALLS = 3  # timed calls a turn at least, after its untimed one
TIMEOUT_S = 900.0
# An output off by more than this share of its largest value runs wrong: the build's
# validation judges the kept one closely; this only keeps a broken one from being timed
TOLERANCE = 1e-2


def time_candidates(candidates: dict, program, folder: Path) -> dict:
    """``candidates``: name -> (executor kind, Lowered). Returns {"threads": n,
    "candidates": {name: {"median_ms", "p10_ms", "calls"} or {"dropped": why}}}, or
    {"error": why} where nothing could be timed."""
    if program.example_inputs is None:
        return {"error": "the partition kept no example inputs to time on"}
    args, kwargs = program.example_inputs
    inputs = flatten_inputs(args, kwargs).tensors
    with torch.no_grad():  # the partition's outputs, flat, in the order its executors give
        reference = [t for t in tree_leaves(program.module()(*args, **kwargs))
                     if isinstance(t, torch.Tensor)]
    folder.mkdir(parents=True, exist_ok=True)
    save_tensors(folder / "inputs.safetensors", {str(i): t for i, t in enumerate(inputs)})
    save_tensors(folder / "reference.safetensors",
                 {str(i): t for i, t in enumerate(reference)})
    job = {name: {"backend": kind, "meta": low.meta, "files": sorted(low.files),
                  "dir": str(_files_dir(low))}
           for name, (kind, low) in candidates.items()}
    (folder / "job.json").write_text(json.dumps(job))
    root = str(Path(__file__).resolve().parents[2])  # the child imports this same tree
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(folder)],
                              env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"the timing process ran past {TIMEOUT_S:.0f} s"}
    figures = folder / "figures.json"
    if done.returncode != 0 or not figures.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {"error": f"the timing process failed (exit {done.returncode}: {last})"}
    return json.loads(figures.read_text())


def _files_dir(lowered) -> Path:
    """The folder the lowering's file names are relative to."""
    name, path = next(iter(lowered.files.items()))
    return Path(path).parents[len(Path(name).parts) - 1]


def main(folder: Path) -> None:
    from runtime.executors import create_executor
    from runtime.format.manifest import Partition

    job = json.loads((folder / "job.json").read_text())
    inputs = _listed(load_tensors(folder / "inputs.safetensors"))
    reference = _listed(load_tensors(folder / "reference.safetensors"))
    ready, results = {}, {}
    for name, spec in job.items():
        partition = Partition(name=name, backend=spec["backend"], device="cpu",
                              files=tuple(spec["files"]),
                              inputs=tuple(f"input{i}" for i in range(len(inputs))),
                              outputs=tuple(f"output{i}" for i in range(len(reference))),
                              meta=spec["meta"])
        try:
            run = create_executor(partition, Path(spec["dir"]), where=f"candidate {name}")
            problem = mismatch(run(list(inputs)), reference)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is dropped
            results[name] = {"dropped": f"failed to run: {type(exc).__name__}: "
                                        f"{(str(exc).strip().splitlines() or [''])[0][:200]}"}
            continue
        if problem:
            results[name] = {"dropped": f"failed validation: {problem}"}
            continue
        ready[name] = run
    timed = interleaved(ready, inputs)
    shares = round_shares({name: [statistics.median(t) for t in turns]
                           for name, turns in timed.items()})
    for name, turns in timed.items():
        ordered = sorted(t for turn in turns for t in turn)
        results[name] = {"median_ms": round(statistics.median(ordered) * 1e3, 3),
                         "p10_ms": round(ordered[len(ordered) // 10] * 1e3, 3),
                         "calls": len(ordered),  # each turn's median: the spread of rounds
                         "turn_ms": [round(statistics.median(t) * 1e3, 3) for t in turns],
                         **({"round_share": round(shares[name], 4)} if name in shares
                            else {})}
    figures = {"threads": torch.get_num_threads(), "candidates": results}
    (folder / "figures.json").write_text(json.dumps(figures))


def interleaved(runs: dict, inputs: list) -> dict[str, list[list[float]]]:
    """Seconds per call of each run, turn by turn, in rotating rounds after a warm-up;
    each turn an untimed call, then calls for about ``ROUND_S``, ``TURN_CALLS`` at least."""
    share = {}
    for name, run in runs.items():
        for _ in range(WARMUP):  # a first call's one-time work stays out of the sizing
            run(list(inputs))
        start = time.perf_counter()
        run(list(inputs))
        share[name] = max(TURN_CALLS, int(ROUND_S / max(time.perf_counter() - start, 1e-6)))
    times: dict[str, list[list[float]]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(ROUNDS):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            runs[name](list(inputs))  # settles the cores after the previous candidate
            turn = []
            for _ in range(share[name]):
                start = time.perf_counter()
                runs[name](list(inputs))
                turn.append(time.perf_counter() - start)
            times[name].append(turn)
    return times


def round_shares(turns: dict[str, list[float]]) -> dict[str, float]:
    """Each candidate's median over rounds of its turn against the round's geometric mean
    of turns (two candidates or more): a round's turns run within a second or two, so the
    machine's slower minutes (a neighbour's build) weigh on a round's turns alike and
    cancel here, where the median of all calls keeps them."""
    rounds = min((len(t) for t in turns.values()), default=0)
    if len(turns) < 2 or rounds == 0:
        return {}
    means = [math.exp(statistics.fmean(math.log(t[r]) for t in turns.values()))
             for r in range(rounds)]
    return {name: statistics.median(t[r] / means[r] for r in range(rounds))
            for name, t in turns.items()}


def mismatch(outputs: list, reference: list) -> str | None:
    """Why ``outputs`` are not the reference's, or None."""
    if len(outputs) != len(reference):
        return f"{len(outputs)} outputs, not {len(reference)}"
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        if tuple(out.shape) != tuple(ref.shape):
            return f"output {i} has shape {list(out.shape)}, not {list(ref.shape)}"
        if not ref.is_floating_point():
            if not torch.equal(out.to(ref.dtype), ref):
                return f"output {i} differs"
            continue
        out, ref = out.double(), ref.double()
        if not torch.equal(torch.isnan(out), torch.isnan(ref)):
            return f"output {i} has NaN where eager has none, or none where it has"
        finite = torch.isfinite(ref) & torch.isfinite(out)
        scale = ref[finite].abs().max().item() if finite.any() else 0.0
        error = (out - ref)[finite].abs().max().item() if finite.any() else 0.0
        if error > TOLERANCE * max(scale, 1e-6):
            return f"output {i} off by {error:.3g} (largest value {scale:.3g})"
    return None


def _listed(tensors: dict) -> list:
    return [tensors[str(i)] for i in range(len(tensors))]


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(Path(sys.argv[1]))
