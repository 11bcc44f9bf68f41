"""Our `onnx` artifact against plain ONNX Runtime on `torch.onnx.export`'s file of the same
model: what ORT makes of each graph, and paired timings in one process.

    taskset -c 0,1 python bench/onnx_vs_plain_ort.py --work-dir build/bench-et \
        --models hf_resnet50,bert_base --json-out build/ortgap/pairs.jsonl
    python bench/onnx_vs_plain_ort.py --work-dir build/bench-et --models bert_base --graphs

Files are compare_targets.py's: ``NAME-onnx.artifact`` and ``NAME-torch-onnx-export.onnx``
in ``--work-dir`` (its ``--variants onnx --baselines ort`` makes both).

Timing (default): three candidates on the same inputs, blocks of ``--per`` calls, the
order rotated each round: ``plain`` (a session with ``intra_op_num_threads = --threads``,
``session.run`` on numpy feeds, as compare_targets.py's baseline), ``ours_ort_default``
(the artifact through the runtime with the session's pool left at ORT's default, 0, as
the executor had it) and ``ours`` (the artifact as the runtime loads it now). Outputs are
compared with plain's first. Per-round ratios, their median, and the load.

``--single-thread``: every candidate on one thread (``OMP_NUM_THREADS=1`` for ours), timed
by the calling thread's CPU clock: the work itself, free of the scheduler on a shared box.

``--graphs``: node counts by op type of both files, as written and after ORT's optimizer
at ``--levels`` (files under ``--work-dir``/graphs).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def files(work_dir: Path, name: str) -> tuple[Path, Path]:
    return work_dir / f"{name}-onnx.artifact", work_dir / f"{name}-torch-onnx-export.onnx"


def example_arrays(session) -> list:
    """Seeded inputs by the session's signature: token ids, a mask of ones, floats."""
    import numpy as np

    rng, arrays = np.random.default_rng(0), []
    for arg in session.get_inputs():
        if "int64" in arg.type:  # the first int input is ids, later ones masks
            arrays.append(np.ones(arg.shape, np.int64) if arrays
                          else rng.integers(0, 1000, arg.shape).astype(np.int64))
        else:
            arrays.append(rng.standard_normal(arg.shape).astype(np.float32))
    return arrays


def plain_session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def load_artifact(path: Path, ort_default_pool: bool):
    """The artifact through the runtime; ``ort_default_pool``: its sessions' pool left at
    ORT's 0, as the executor had it before runtime/executors/ort_threads.py."""
    import runtime
    import runtime.executors.onnxruntime as executor

    counted = executor.intra_op_threads
    if ort_default_pool:
        executor.intra_op_threads = lambda: 0
    try:
        return runtime.load(path)
    finally:
        executor.intra_op_threads = counted


def candidates(artifact: Path, plain_file: Path, threads: int, single: bool) -> tuple:
    """({label: call}, {label: outputs equal plain's})."""
    import numpy as np
    import torch

    plain = plain_session(plain_file, threads)
    arrays = example_arrays(plain)
    feeds = dict(zip([i.name for i in plain.get_inputs()], arrays))
    tensors = [torch.from_numpy(a) for a in arrays]
    calls = {"plain": lambda: plain.run(None, feeds)}
    programs = {"ours": load_artifact(artifact, False)}
    if not single:
        programs["ours_ort_default"] = load_artifact(artifact, True)
    reference = plain.run(None, feeds)
    equal = {}
    for label, program in programs.items():
        calls[label] = (lambda p: lambda: p.run(tensors))(program)
        got = program.run(tensors).values()
        equal[label] = all(np.array_equal(np.asarray(a), b) for a, b in zip(got, reference))
    return calls, equal


def timed(calls: dict, rounds: int, per: int, warmup: int, clock) -> tuple[dict, list]:
    """Samples (ms) per label and each round's medians, the order rotated per round."""
    samples = {label: [] for label in calls}
    per_round = []
    for call in calls.values():
        for _ in range(warmup):
            call()
    labels = list(calls)
    for index in range(rounds):
        shift = index % len(labels)
        medians = {}
        for label in labels[shift:] + labels[:shift]:
            values = []
            for _ in range(per):
                start = clock()
                calls[label]()
                values.append((clock() - start) * 1e3)
            samples[label] += values
            medians[label] = statistics.median(values)
        per_round.append(medians)
    return samples, per_round


def measure(args, name: str) -> dict:
    import onnxruntime as ort
    import torch

    artifact, plain_file = files(Path(args.work_dir), name)
    single = args.single_thread
    threads = 1 if single else args.threads
    torch.set_num_threads(threads)
    calls, equal = candidates(artifact, plain_file, threads, single)
    loads = [os.getloadavg()[0]]
    clock = time.thread_time if single else time.perf_counter
    with torch.inference_mode():
        samples, per_round = timed(calls, args.rounds, args.per, args.warmup, clock)
    loads.append(os.getloadavg()[0])
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {f"{k}/plain": round(statistics.median(r[k] / r["plain"] for r in per_round), 3)
              for k in calls if k != "plain"}
    return {"model": name, "mode": "single-thread cpu time" if single else "wall",
            "threads": threads, "affinity": sorted(os.sched_getaffinity(0)),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "onnxruntime": ort.__version__, "torch": torch.__version__,
            "load_1min": [round(min(loads), 2), round(max(loads), 2)],
            "outputs_equal_plain": equal, "calls": len(samples["plain"]),
            "median_ms": {k: round(v, 2) for k, v in medians.items()},
            "median_of_round_ratios": ratios}


def op_counts(path: Path) -> collections.Counter:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return collections.Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type
                               for n in model.graph.node)


def optimized(path: Path, out: Path, level: str) -> collections.Counter:
    """The graph ORT runs: its optimizer's output at ``level`` (basic, extended, all)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                               f"ORT_ENABLE_{level.upper()}")
    options.optimized_model_filepath = str(out)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", out.name + ".data")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return op_counts(out)


def graphs(args, name: str) -> str:
    import zipfile

    artifact, plain_file = files(Path(args.work_dir), name)
    folder = Path(args.work_dir) / "graphs" / name
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(artifact) as archive:  # single-partition artifacts: p0's model
        ours = Path(archive.extract("partitions/p0/model.onnx", folder))
    columns = {}
    for label, path in (("ours", ours), ("plain", plain_file)):
        columns[f"{label} as written"] = op_counts(path)
        for level in args.levels.split(","):
            columns[f"{label} {level}"] = optimized(path, folder / f"{label}-{level}.onnx",
                                                    level)
    ops = sorted(set().union(*columns.values()))
    lines = [f"{name}:", "| op | " + " | ".join(columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {op} | " + " | ".join(str(c.get(op, 0)) for c in columns.values()) + " |"
              for op in ops]
    lines.append("| total | " + " | ".join(str(sum(c.values())) for c in columns.values())
                 + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="build/bench-et")
    parser.add_argument("--models", default="hf_resnet50,bert_base")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per", type=int, default=5, help="calls per block")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--single-thread", action="store_true")
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--levels", default="extended,all")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.single_thread:
        os.environ["OMP_NUM_THREADS"] = "1"  # before the runtime sizes its sessions' pools
    for name in args.models.split(","):
        if args.graphs:
            print(graphs(args, name), flush=True)
            continue
        row = measure(args, name)
        print(json.dumps(row), flush=True)
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.json_out, "a") as sink:
                sink.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
