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

On a loaded machine whole turns stall: an OpenMP team waits at each barrier for a thread
the scheduler put off, and every call of the turn takes 10-1,000x its usual time. Such a
turn says nothing about the candidate (the same library runs at its usual speed in the
next round), and enough of them outvoted a median of rounds. So a round in which any
turn took ``STALL`` times that candidate's fastest turn is left out of the shares, and
rounds are added until ``CLEAN_ROUNDS`` are clean (``MAX_ROUNDS`` in all). A candidate
stalled through every round is told from a slow one only by the rounds after its stall.

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
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves

from runtime.host.tensorio import load_tensors, save_tensors
from runtime.program.flat_inputs import flatten_inputs

log = logging.getLogger(__name__)

WARMUP = 2
ROUNDS = 7
ROUND_S = 0.25  # each candidate's share of a round, in seconds
TURN_CALLS = 3  # timed calls a turn at least, after its untimed one
# A turn this many times its candidate's fastest is stalled: a busy machine's rounds
# spread by up to about 2x, stalled turns by 10x and more
STALL = 3.0
CLEAN_ROUNDS = 5  # rounds without a stalled turn wanted for the shares
MAX_ROUNDS = 3 * ROUNDS  # at most, stalled ones included
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
    results.update(summarized(interleaved(ready, inputs)))
    figures = {"threads": torch.get_num_threads(), "candidates": results}
    (folder / "figures.json").write_text(json.dumps(figures))


def summarized(timed: dict[str, list[list[float]]]) -> dict[str, dict]:
    """Each candidate's figures from its turns (seconds per call, turn by turn): the median
    and p10 of all its calls, each turn's median, its round share where there is one, and
    the rounds left out of the shares as stalled."""
    turn_medians = {name: [statistics.median(t) for t in turns] for name, turns in timed.items()}
    shares = round_shares(turn_medians)
    left_out = sorted(stalled_rounds(turn_medians))
    results = {}
    for name, turns in timed.items():
        ordered = sorted(t for turn in turns for t in turn)
        results[name] = {"median_ms": round(statistics.median(ordered) * 1e3, 3),
                         "p10_ms": round(ordered[len(ordered) // 10] * 1e3, 3),
                         "calls": len(ordered),  # each turn's median: the spread of rounds
                         "turn_ms": [round(m * 1e3, 3) for m in turn_medians[name]],
                         **({"round_share": round(shares[name], 4),
                             "stalled_rounds": left_out} if name in shares else {})}
    return results


def interleaved(runs: dict, inputs: list, clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, list[list[float]]]:
    """Seconds per call of each run, turn by turn, in rotating rounds after a warm-up;
    each turn an untimed call, then calls for about ``ROUND_S`` (``TURN_CALLS`` at least,
    and no more once a turn has run twice that long: a stalled turn ends early). Two
    runs or more: rounds go on past ``ROUNDS`` while ``_more_rounds``, ``MAX_ROUNDS`` at
    most."""
    if not runs:  # every candidate was dropped: nothing to time
        return {}
    share = {}
    for name, run in runs.items():
        for _ in range(WARMUP):  # a first call's one-time work stays out of the sizing
            run(list(inputs))
        start = clock()
        run(list(inputs))
        share[name] = max(TURN_CALLS, int(ROUND_S / max(clock() - start, 1e-6)))
    times: dict[str, list[list[float]]] = {name: [] for name in runs}
    names = list(runs)
    round_ = 0
    while round_ < ROUNDS or (len(names) > 1 and round_ < MAX_ROUNDS
                              and _more_rounds(times)):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            runs[name](list(inputs))  # settles the cores after the previous candidate
            times[name].append(_turn(runs[name], inputs, share[name], clock))
        round_ += 1
    return times


def _turn(run, inputs: list, calls: int, clock) -> list[float]:
    turn, begun = [], clock()
    while len(turn) < calls and (len(turn) < TURN_CALLS or clock() - begun < 2 * ROUND_S):
        start = clock()
        run(list(inputs))
        turn.append(clock() - start)
    return turn


def _more_rounds(times: dict[str, list[list[float]]]) -> bool:
    """Whether fewer than ``CLEAN_ROUNDS`` rounds are clean, or each clean one has a turn
    ``STALL`` times another's: a candidate stalled in every round so far looks like a slow
    one, and only rounds after its stall show which it is."""
    turns = {name: [statistics.median(t) for t in done] for name, done in times.items()}
    stalled = stalled_rounds(turns)
    clean = [r for r in range(min(len(t) for t in turns.values())) if r not in stalled]
    return len(clean) < CLEAN_ROUNDS or all(
        max(t[r] for t in turns.values()) > STALL * min(t[r] for t in turns.values())
        for r in clean)


def stalled_rounds(turns: dict[str, list[float]]) -> set[int]:
    """The rounds in which some candidate's turn (its median, by round) took more than
    ``STALL`` times its fastest turn."""
    rounds = min((len(t) for t in turns.values()), default=0)
    return {r for r in range(rounds) for t in turns.values() if t[r] > STALL * min(t)}


def round_shares(turns: dict[str, list[float]]) -> dict[str, float]:
    """Each candidate's median over rounds of its turn against the round's geometric mean
    of turns (two candidates or more): a round's turns run within a second or two, so the
    machine's slower minutes (a neighbour's build) weigh on a round's turns alike and
    cancel here, where the median of all calls keeps them. Stalled rounds are left out;
    where every round stalled, each candidate's fastest turn stands for its rounds."""
    rounds = min((len(t) for t in turns.values()), default=0)
    if len(turns) < 2 or rounds == 0:
        return {}
    kept = [r for r in range(rounds) if r not in stalled_rounds(turns)]
    if not kept:
        turns, kept = {name: [min(t)] for name, t in turns.items()}, [0]
    means = {r: math.exp(statistics.fmean(math.log(t[r]) for t in turns.values()))
             for r in kept}
    return {name: statistics.median(t[r] / means[r] for r in kept)
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
