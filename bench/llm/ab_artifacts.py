"""Decode tokens/s of two generating artifacts loaded in one process, each twice (BEFORE,
AFTER, AFTER, BEFORE), taking turns (the machine is shared: only paired figures compare).

    python bench/llm/ab_artifacts.py BEFORE AFTER [--rounds 15] [--threads 2]

Prints each one's median, the median of each round's AFTER/BEFORE ratio, and how much
resident memory loading each added (peak memory is better read in fresh processes:
`python -m runtime generate ... --json`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import runtime  # noqa: E402
from bench.llm.ab_in_place import decode_rate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompt = list(range(5, 133))
    # Loaded in the order BEFORE, AFTER, AFTER, BEFORE: a session loaded later in a process
    # decodes faster, so each side takes one early and one late place and a trend in load
    # order cancels out of the pair.
    order = [args.before, args.after, args.after, args.before]
    process, programs, resident = psutil.Process(), [], []
    for path in order:
        start = process.memory_info().rss
        programs.append(runtime.load(path))
        decode_rate(programs[-1].generator, prompt, 8)  # warm-up: touches the weights
        resident.append((process.memory_info().rss - start) / 2**20)
    rounds = [[decode_rate(p.generator, prompt) for p in programs] for _ in range(args.rounds)]
    pairs = [((r[0] * r[3]) ** 0.5, (r[1] * r[2]) ** 0.5) for r in rounds]
    print({"before": str(args.before), "after": str(args.after), "rounds": args.rounds,
           "before_tokens_per_s": round(statistics.median(a for a, _ in pairs), 1),
           "after_tokens_per_s": round(statistics.median(b for _, b in pairs), 1),
           "paired_after_over_before": round(statistics.median(b / a for a, b in pairs), 4),
           "resident_mb_added_in_load_order": [round(r) for r in resident],
           "file_mb": [round(p.stat().st_size / 2**20, 1) for p in (args.before, args.after)]})


if __name__ == "__main__":
    main()
