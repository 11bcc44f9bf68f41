"""On the GPU machine: greedy decode with step k + 1 enqueued before the host reads token k
(runtime/generation/decode_graph.py) against the step-by-step loop it replaced (fill
the token and position, replay, argmax, read), side by side in one process on one
artifact, rounds interleaved.

    python bench/decode_overlap_ab.py --out DIR [--size small|1b] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def step_by_step(graph, token: int, position: int, count: int):
    """The earlier loop: each token read before the next step is launched."""
    for index in range(count):
        token = int(graph(token, position + index)[-1].argmax())
        yield token


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="small")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import exporter
    import runtime
    from bench.generation_cuda import big_checkpoint
    from runtime.generation.decode_graph import DecodeGraph
    args.out.mkdir(parents=True, exist_ok=True)
    folder, artifact = args.out / f"llama-{args.size}", args.out / f"llama-{args.size}.artifact"
    if not folder.exists():
        big_checkpoint(folder, args.size, 0.02)
    if not artifact.exists():
        exporter.build(f"hf:{folder}", task="text-generation", target="cuda", dtype="fp16",
                       max_context=512, prefill_chunk=256, out=artifact,
                       validate_artifact=False)
    program = runtime.load(artifact)
    prompt = list(range(3, 131))
    ahead = DecodeGraph.greedy
    rates: dict[str, list[float]] = {"ahead": [], "step by step": []}
    tokens = {}
    for _ in range(args.rounds + 1):  # the first round warms up, not counted
        for label in rates:
            DecodeGraph.greedy = ahead if label == "ahead" else step_by_step
            result = program.generate(prompt, 128, stop_at_eos=False)
            rates[label].append(result.stats["decode_tokens_per_s"])
            tokens[label] = result.tokens
    DecodeGraph.greedy = ahead
    row = {"what": "decode overlap A/B", "size": args.size, "rounds": args.rounds,
           "same_tokens": tokens["ahead"] == tokens["step by step"],
           **{f"{label} decode tok/s median": statistics.median(values[1:])
              for label, values in rates.items()},
           "rates": rates}
    print(json.dumps(row), flush=True)
    with open(args.out / "overlap.jsonl", "a") as handle:
        handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
