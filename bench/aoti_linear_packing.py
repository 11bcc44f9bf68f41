"""AOTInductor's float32 linears packed for oneDNN (its AOT default under freezing) against
left on ATen's GEMM (MKL; targets/aoti/linear_packing.py, the cpu target's setting), beside
eager, plain ONNX Runtime and AOTInductor without freezing, in one process, interleaved:
each round every engine runs one untimed call then ``--per`` timed ones, the order rotating.

    OMP_NUM_THREADS=1 taskset -c 0 python bench/aoti_linear_packing.py \\
        --model bench/models.py:bert_base --work-dir build/linear-packing --threads 1

With one thread the clock is the thread's CPU time (what a busy shared machine leaves
honest); with more, wall time. Packages and the ONNX file are cached in ``--work-dir``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare_targets import _name, _spec, baselines, plain_aoti  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bench/models.py:bert_base")
    parser.add_argument("--work-dir", default="build/linear-packing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per", type=int, default=3)
    args = parser.parse_args()

    import torch

    from exporter.model.spec import load_spec
    from targets.aoti.linear_packing import float32_linears_unpacked

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    _, calls = baselines(args.model, ["ort", "aoti"], work, args.threads)
    spec = load_spec(_spec(args.model))
    module, inputs, named = spec.module, spec.args, spec.kwargs
    calls["aoti-mkl-linears"] = plain_aoti(module, inputs, named,
                                           work / f"{_name(args.model)}-aoti-mkl.pt2",
                                           while_compiling=float32_linears_unpacked())
    calls["aoti-unfrozen"] = plain_aoti(module, inputs, named,
                                        work / f"{_name(args.model)}-aoti-unfrozen.pt2",
                                        freezing=False)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    with torch.inference_mode():
        for call in calls.values():
            call()
        for turn in range(args.rounds):
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                calls[name]()  # untimed: the previous engine's threads may still spin
                for _ in range(args.per):
                    start = clock()
                    calls[name]()
                    times[name].append(clock() - start)
    row = {"model": _name(args.model), "threads": args.threads, "torch": torch.__version__,
           "clock": clock.__name__, "median_ms": {k: round(statistics.median(v) * 1e3, 2)
                                                 for k, v in times.items()},
           "min_ms": {k: round(min(v) * 1e3, 2) for k, v in times.items()}}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
