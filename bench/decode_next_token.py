"""On the GPU machine: what the decode graph's greedy tail costs after the head, by way of
writing it (runtime/generation/decode_graph.py takes the logits' argmax as the next token
and advances the position inside the captured step).

    python bench/decode_next_token.py [--vocab 32000] [--rounds 15] [--out FILE]

Each variant is one CUDA graph: the head's product (a [1, 2048] x [vocab, 2048] fp16
linear, so the tail starts after a kernel as it does in a step), then the tail. The graph
of the head alone is timed in the same turns; a variant's cost is its median less that.
Each variant's token is checked against torch.argmax, with a tie placed before the max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.decode_kernels_microbench import graph_time  # noqa: E402


def variants(logits: torch.Tensor, tokens: torch.Tensor, position: torch.Tensor) -> dict:
    """name -> the tail as a call (reads ``logits``, writes ``tokens`` and ``position``)."""
    from runtime.generation.decode_graph import greedy_tail

    def copy_then_add():  # what the decode graph ran before greedy_tail
        tokens.copy_(logits[-1:].argmax(-1))
        position.add_(1)

    def flat_argmax():  # a full reduction (no dim): torch may split it over blocks
        torch.argmax(logits[-1], out=tokens.view(()))
        position.add_(1)

    return {"head only": lambda: None, "argmax, copy, add": copy_then_add,
            "argmax of the flat row, add": flat_argmax,
            "greedy_tail (the runtime's)": lambda: greedy_tail(logits, tokens, position)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(1, args.hidden, device="cuda", dtype=torch.float16)
    w = torch.randn(args.vocab, args.hidden, device="cuda", dtype=torch.float16) * 0.02
    logits = torch.empty(1, args.vocab, device="cuda", dtype=torch.float16)
    tokens = torch.zeros(1, dtype=torch.long, device="cuda")
    position = torch.zeros(1, dtype=torch.long, device="cuda")
    tails = variants(logits, tokens, position)
    for name, tail in tails.items():  # the token each tail takes, on logits with a tie
        logits.copy_(torch.nn.functional.linear(x, w))
        top = int(logits.argmax())
        logits[0, max(0, top - 7)] = logits[0, top]  # an equal value before the max
        tail()
        torch.cuda.synchronize()
        if name != "head only" and int(tokens) != int(logits.argmax()):
            raise SystemExit(f"{name}: token {int(tokens)}, torch.argmax {int(logits.argmax())}")

    def calls(tail):
        return [lambda: torch.nn.functional.linear(x, w, out=logits), tail]

    times = {name: [] for name in tails}
    for _ in range(args.rounds):
        for name, tail in tails.items():
            times[name].append(graph_time(calls(tail), runs=30) * 1000)
    head = statistics.median(times["head only"])
    rows = []
    for name, got in times.items():
        median = statistics.median(got)
        rows.append({"bench": "decode_next_token", "variant": name, "vocab": args.vocab,
                     "graph_us": round(median, 2), "tail_us": round(median - head, 2),
                     "gpu": torch.cuda.get_device_name(), "torch": torch.__version__})
        print(f"{name:32s} graph {median:7.2f} us  tail {median - head:6.2f} us")
    if args.out:
        with args.out.open("a") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
