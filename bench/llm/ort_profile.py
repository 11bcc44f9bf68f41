"""Where an onnx generating artifact's CPU decode step goes, per op (a working tool, not a
benchmark table).

    OMP_NUM_THREADS=2 python -m bench.llm.ort_profile ARTIFACT [--steps 64]

Loads the artifact through the runtime with ONNX Runtime's profiler on in every session,
feeds a 128-token prompt, runs ``--warmup`` decode steps and then ``--steps`` timed ones,
and prints each op type's share of the timed steps' kernel time (the profiler inflates
times; the shares are the figure), the ORT runs' own time and the whole Python step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def profiled_sessions(prefix: str) -> list:
    """Every ORT session the runtime opens from now on profiles into ``prefix``*; the list
    collects them."""
    import onnxruntime as ort

    opened, plain = [], ort.InferenceSession

    class Profiled(plain):
        def __init__(self, path, sess_options=None, *args, **kwargs):
            sess_options = sess_options or ort.SessionOptions()
            sess_options.enable_profiling = True
            sess_options.profile_file_prefix = prefix
            super().__init__(path, sess_options, *args, **kwargs)
            opened.append(self)

    ort.InferenceSession = Profiled
    return opened


def op_times(trace: list[dict], skip_runs: int) -> tuple[dict, float, int]:
    """({op type: [kernel us, calls]}, the kept runs' total us, how many runs were kept)
    over the ``model_run`` events after the first ``skip_runs``."""
    runs = sorted((e for e in trace if e.get("name") == "model_run"), key=lambda e: e["ts"])
    kept = runs[skip_runs:]
    windows = [(r["ts"], r["ts"] + r["dur"]) for r in kept]
    ops: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for event in trace:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        if any(lo <= event["ts"] <= hi for lo, hi in windows):
            entry = ops[event["args"].get("op_name", "?")]
            entry[0] += event["dur"]
            entry[1] += 1
    return dict(ops), float(sum(r["dur"] for r in kept)), len(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--json", help="write the per-op figures here too")
    parser.add_argument("--rows", action="store_true",
                        help="our own kernels on an artifact built with --no-own-kernels "
                             "(an int8/int4-weight build has them already)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        opened = profiled_sessions(str(Path(tmp) / "ort"))
        import torch

        import runtime
        from bench.llm.rows import opened_with_rows
        with opened_with_rows() if args.rows else contextlib.nullcontext():
            program = runtime.load(args.artifact)
        generator = program.generator
        logits = generator.prefill_prompt(list(range(3, 131)))
        position, token, started = 128, int(logits.argmax()), 0.0
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                started = time.perf_counter()
            token = int(generator.step(torch.tensor([token]), position)[-1].argmax())
            position += 1
        step_us = (time.perf_counter() - started) / args.steps * 1e6
        traces = [json.loads(Path(s.end_profiling()).read_text()) for s in opened]
    decode = max(traces, key=len)  # the session that ran the decode steps the most
    ops, runs_us, kept = op_times(decode, len([e for e in decode if e.get("name") == "model_run"])
                                  - args.steps)
    total = sum(us for us, _ in ops.values())
    print(f"{kept} decode runs: whole Python step {step_us:.0f} us, ORT run "
          f"{runs_us / kept:.0f} us (profiled), kernels {total / kept:.0f} us")
    for name, (us, calls) in sorted(ops.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:32s} {100 * us / total:5.1f}%  {us / kept:8.0f} us/step  "
              f"{calls // kept:4d} calls/step")
    if args.json:
        Path(args.json).write_text(json.dumps({"step_us": step_us, "run_us": runs_us / kept,
                                               "ops": ops, "steps": kept}))


if __name__ == "__main__":
    main()
