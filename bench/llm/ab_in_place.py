"""Decode tokens/s of one onnx generating artifact loaded twice in one process, taking
turns: one generator reading the cache rows the step stored as views (``Program.run``,
the earlier way), the other leaving them out (``Program.run_in_place``, now).

    python bench/llm/ab_in_place.py [ARTIFACT] [--rounds 15]

Prints both medians and the median of each round's ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import runtime  # noqa: E402

DEFAULT = "build/llm/engines-ckpt-300m/artifact-onnx-int4/artifact-onnx-int4.artifact"


def decode_rate(generator, prompt: list[int], new_tokens: int = 128) -> float:
    logits, position = generator.prefill_prompt(prompt), len(prompt)
    started = time.perf_counter()
    for _ in range(new_tokens):
        logits = generator.step(torch.tensor([int(logits.argmax())]), position)[-1]
        position += 1
    return new_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", nargs="?", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    new, old = runtime.load(args.artifact), runtime.load(args.artifact)
    for program in {id(p): p for p in (old.generator.decode, old.generator.prefill)}.values():
        program.run_in_place = program.run  # the views, as before
    prompt = list(range(5, 133))
    decode_rate(new.generator, prompt), decode_rate(old.generator, prompt)  # warm-up
    pairs = [(decode_rate(old.generator, prompt), decode_rate(new.generator, prompt))
             for _ in range(args.rounds)]
    print({"views_tokens_per_s": round(statistics.median(a for a, _ in pairs), 1),
           "in_place_tokens_per_s": round(statistics.median(b for _, b in pairs), 1),
           "paired_in_place_over_views": round(statistics.median(b / a for a, b in pairs), 4)})


if __name__ == "__main__":
    main()
