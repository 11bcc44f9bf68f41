"""Where a decode step's time goes on the GPU (a working tool, not a benchmark table).

    python bench/generation_profile.py ARTIFACT [--context 512]

Prints the decode graph's replay time alone (CUDA events, median of 200 after warm-up),
the whole Python step around it, and the 25 kernels with the most GPU time over 20
replays (torch.profiler), with their counts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    args = parser.parse_args()
    import runtime
    program = runtime.load(args.artifact)
    generator = program.generator
    generator.prefill_prompt(list(range(3, 131)))
    graph = generator._graph
    for position in range(128, 138):
        graph(5, position)
    torch.cuda.synchronize()
    times = []
    for i in range(200):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph(5, 138 + i % 200)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    print(f"decode graph replay: median {statistics.median(times):.3f} ms, "
          f"min {min(times):.3f} ms")
    steps = []
    for i in range(100):
        t = time.perf_counter()
        logits = generator.step(torch.tensor([5]), 140 + i)
        int(logits[-1].argmax())
        steps.append((time.perf_counter() - t) * 1000)
    print(f"python step incl. argmax sync: median {statistics.median(steps):.3f} ms")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(20):
            graph(5, 200 + i)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25,
                                    max_name_column_width=90))


if __name__ == "__main__":
    main()
