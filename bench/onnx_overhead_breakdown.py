"""Where the time of a tiny onnx artifact's call goes, against plain ONNX Runtime.

    python bench/onnx_overhead_breakdown.py build/mlp-onnx.artifact

Callers of the artifact's own ORT session, interleaved in 40 rounds of 1000 calls (one
process, same input): ``InferenceSession.run(None, feeds)`` with numpy feeds built once
(what a plain-ORT user writes, and `exporter bench`'s baseline); the binding under it
with RunOptions made once (the fastest numpy caller); that plus the torch<->numpy
hand-off both ways; the runtime's executor (IO binding); Program.run. Medians in
microseconds per call, against the first and the second.
"""

from __future__ import annotations

import statistics
import sys
import time

import onnxruntime
import torch

import runtime


def main(path: str, rounds: int = 40, block: int = 1000) -> None:
    torch.set_num_threads(1)
    program = runtime.load(path)
    execute = program._steps[0][0]  # the single partition's executor
    session = execute.session
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    shape = [d if isinstance(d, int) else 2 for d in session.get_inputs()[0].shape]
    x = torch.randn(*shape)
    feeds = {names[0]: x.numpy()}
    binding = session._sess.run
    options = onnxruntime.RunOptions()
    callers = {
        "session.run (numpy feed built once)": lambda: session.run(None, feeds),
        "binding + RunOptions made once": lambda: binding(outputs, feeds, options),
        "  + torch<->numpy": lambda: list(map(
            torch.from_numpy, binding(outputs, {names[0]: x.numpy()}, options))),
        "runtime executor (IO binding)": lambda: execute([x]),
        "Program.run": lambda: program.run([x]),
    }
    for call in callers.values():  # warm-up
        for _ in range(block):
            call()
    samples: dict[str, list[float]] = {name: [] for name in callers}
    for _ in range(rounds):
        for name, call in callers.items():
            start = time.perf_counter()
            for _ in range(block):
                call()
            samples[name].append((time.perf_counter() - start) / block * 1e6)
    public, fastest = (statistics.median(v) for v in list(samples.values())[:2])
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:36s} {median:7.3f} us  {median / public:.3f}x  {median / fastest:.3f}x")


if __name__ == "__main__":
    main(sys.argv[1])
