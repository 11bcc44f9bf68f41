"""Plain ONNX Runtime on one model's `torch.onnx.export` file under session settings that
might pay for a process pinned to a few cores, each against the plain session in one
process, round by round (bench/cpu_choice.py's `paired`): which, if any, is worth a
cpu-target candidate (issue 52, goal 3: ResNet-50 level with plain ORT).

    taskset -c 0,1 env OMP_NUM_THREADS=2 python bench/cpu_choice_ort_options.py \\
        --model hf_resnet50 --work-dir /tmp/w --rounds 10 --runs 10

Settings: ``nospin`` (the pool's threads sleep between parallel regions), ``pinned``
(each pool thread on a core of the process's mask of its own), ``huge`` (the memory the
session holds after its first run collapsed into 2 MiB pages: MADV_COLLAPSE, Linux 6.1+),
``extended`` (ORT_ENABLE_EXTENDED: no NCHWc layout, to see what that layout is worth);
with ``--aoti PACKAGE`` (AOTInductor frozen's, bench/cpu_choice.py's peer) also ``aoti``
(its library as the runtime loads it: aligned copies) and ``aoti-huge`` (those copies
collapsed so).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MADV_COLLAPSE = 25
HUGE = 2 << 20


def anonymous_regions() -> set[tuple[int, int]]:
    """(start, end) of this process's private anonymous mappings (heap included)."""
    found = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[4] == "0" and (len(fields) == 5 or fields[5] == "[heap]"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.add((start, end))
    return found


def collapse(regions: set[tuple[int, int]]) -> dict:
    """MADV_COLLAPSE over each region's whole 2 MiB pages; bytes asked and errors."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    asked, errors = 0, {}
    for start, end in regions:
        first, last = -(-start // HUGE) * HUGE, end // HUGE * HUGE
        if last - first < HUGE:
            continue
        asked += last - first
        if libc.madvise(first, last - first, MADV_COLLAPSE) != 0:
            code = os.strerror(ctypes.get_errno())
            errors[code] = errors.get(code, 0) + 1
    return {"asked_mib": asked >> 20, "errors": errors}


def library(package: Path, setting: str, inputs: list, work: Path):
    """The AOTInductor package's library as the runtime loads it (aligned copies)."""
    import tempfile

    from runtime.executors.aoti import aligned_cpu_runner

    before = anonymous_regions()
    runner = aligned_cpu_runner(package, Path(tempfile.mkdtemp(dir=work, prefix="aligned-")))
    runner.run(inputs)
    note = collapse(anonymous_regions() - before) if setting == "aoti-huge" else {}
    return (lambda: runner.run(inputs)), note


def session(path: Path, threads: int, setting: str, feeds: dict):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if setting == "nospin":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if setting == "pinned":  # ORT numbers processors from 1; the caller's thread is not its
        cpus = sorted(os.sched_getaffinity(0))
        options.add_session_config_entry("session.intra_op_thread_affinities",
                                         ";".join(str(c + 1) for c in cpus[1:threads]))
    if setting == "extended":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    before = anonymous_regions()
    made = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    made.run(None, feeds)
    note = {}
    if setting == "huge":
        note = collapse(anonymous_regions() - before)
    return (lambda: made.run(None, feeds)), note


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="hf_resnet50")
    parser.add_argument("--work-dir", default="build/ort-options")
    parser.add_argument("--settings", default="plain,nospin,pinned,huge,extended")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--aoti", default=None, help="AOTInductor frozen's .pt2")
    args = parser.parse_args()

    import torch

    from bench.common import fix_threads
    from bench.compare_targets import plain_ort
    from bench.cpu_choice import paired
    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    fix_threads(args.threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    spec = load_spec(f"bench/models.py:{args.model}")
    inputs = flatten_inputs(spec.args, spec.kwargs).tensors
    path = work / f"{args.model}-torch-onnx-export.onnx"
    plain_ort(spec.module, spec.args, spec.kwargs, inputs, path, args.threads)  # the file
    import onnxruntime as ort
    names = [i.name for i in ort.InferenceSession(str(path)).get_inputs()]
    feeds = dict(zip(names, (t.numpy() for t in inputs)))
    settings = args.settings.split(",")
    calls, notes = {}, {}
    for setting in settings:
        calls[setting], notes[setting] = session(path, args.threads, setting, feeds)
    if args.aoti:
        for setting in ("aoti", "aoti-huge"):
            calls[setting], notes[setting] = library(Path(args.aoti), setting, inputs, work)
        settings += ["aoti", "aoti-huge"]
    reference = torch.as_tensor(calls["plain"]()[0])
    for setting in settings:
        got = calls[setting]()[0]
        got = got if isinstance(got, torch.Tensor) else torch.as_tensor(got)
        assert (got - reference).abs().max() < 1e-2 * reference.abs().max(), setting
    blocks = {s: [] for s in settings}
    for index in range(args.rounds):
        order = settings[index % len(settings):] + settings[:index % len(settings)]
        for setting in order:
            calls[setting]()  # the switch's settle call, untimed
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                calls[setting]()
                times.append((time.perf_counter() - start) * 1e3)
            blocks[setting].append(statistics.median(times))
    row = {"model": args.model, "torch": torch.__version__, "onnxruntime": ort.__version__,
           "affinity": sorted(os.sched_getaffinity(0)), "notes": notes,
           "median_ms": {s: round(statistics.median(b), 2) for s, b in blocks.items()},
           "vs_plain_by_rounds": {s: paired({"a": {"ms": blocks[s]}, "b": {"ms": blocks["plain"]}}, "a", "b")
                                  for s in settings if s != "plain"},
           "aoti_huge_vs_aoti": paired({"a": {"ms": blocks["aoti-huge"]},
                                        "b": {"ms": blocks["aoti"]}}, "a", "b")
           if args.aoti else None,
           "blocks": blocks}
    print(json.dumps({k: v for k, v in row.items() if k != "blocks"}, indent=1), flush=True)
    if args.json_out:
        with open(args.json_out, "a") as sink:
            sink.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
