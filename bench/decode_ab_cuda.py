"""On the GPU machine: generating builds timed against each other in one process, run by
run, each artifact loaded once.

    python bench/decode_ab_cuda.py --engine NAME=ARTIFACT [--engine ...]
        [--runs 9] [--out FILE.jsonl]

Each run is ``exporter bench``'s decode (the same 128-token prompt of random ids, 128 new
tokens, greedy, eos ignored); after one warm-up each, the engines take turns, every other
round in reverse order, and each engine's median decode tokens/s is reported with every
run's figure, its decode graph's replay (CUDA events: one call at a time, median of 200,
and back to back as greedy decoding runs it), whether its tokens equal the first
engine's, and whether each is the argmax of its step's logits (the tokens fed back
step by step, teacher-forced: the decode graph's greedy token, which a step may take
inside its head's kernel, checked against the logits it came from). Separate processes a minute apart see the GPU's clocks
and the host in another state; taking turns in one process does not.
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


def replay_ms(program) -> tuple:
    """(one call at a time, back to back) ms a replay of the decode graph, or Nones."""
    from bench.decode_step_cuda import replay_back_to_back_ms, replay_median_ms
    graph = program.generator._graph
    if graph is None:
        return None, None
    return replay_median_ms(graph), replay_back_to_back_ms(graph)


def argmax_tokens(program, prompt: list, tokens: list) -> bool:
    """Whether each greedy token but the last is the argmax of the logits before it,
    those logits recomputed with the tokens fed back one step at a time."""
    kept = tokens[:-1]  # the last is never fed back: it may lie past the context
    logits = program.generator.forced_logits(prompt, kept)
    return logits.argmax(-1).tolist() == kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", action="append", required=True,
                        metavar="NAME=ARTIFACT")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from bench.common import machine_header
    from exporter.lm.bench import fitted_lengths
    import runtime
    engines = {}
    for spec in args.engine:
        name, _, path = spec.partition("=")
        engines[name] = {"artifact": path, "program": runtime.load(path), "runs": []}
    first = next(iter(engines.values()))["program"].generator
    prompt_tokens, new_tokens = fitted_lengths(None, None, first.max_context)
    prompt = torch.randint(0, first.vocab, (prompt_tokens,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    tokens = {}
    for round_ in range(args.runs + 1):  # the first round warms up, not counted
        order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
        for name in order:
            result = engines[name]["program"].generate(prompt, new_tokens, stop_at_eos=False)
            tokens[name] = list(result.tokens)
            if round_:
                engines[name]["runs"].append(result.stats["decode_tokens_per_s"])
    header = machine_header(torch=torch.__version__)
    if torch.cuda.is_available():
        header["gpu"] = torch.cuda.get_device_name()
    base, rows = None, []
    print("| engine | decode tok/s (median) | min | max | replay, ms (one / back to back) "
          "| vs first | tokens as first | tokens are argmax |\n|---|---|---|---|---|---|---|---|")
    for name, engine in engines.items():
        median = statistics.median(engine["runs"])
        base = base or median
        row = {**header, "what": "decode A/B", "engine": name, "artifact": engine["artifact"],
               "prompt_tokens": prompt_tokens,
               "new_tokens": new_tokens, "decode_tok_s": median, "runs": engine["runs"],
               **dict(zip(("replay_ms", "replay_back_to_back_ms"),
                          replay_ms(engine["program"]))),
               "tokens_as_first": tokens[name] == tokens[next(iter(engines))],
               "tokens_are_argmax": argmax_tokens(engine["program"], prompt, tokens[name])}
        rows.append(row)
        replay = (f"{row['replay_ms']:.3f} / {row['replay_back_to_back_ms']:.3f}"
                  if row["replay_ms"] is not None else "-")
        print(f"| {name} | {median:.1f} | {min(engine['runs']):.1f} | "
              f"{max(engine['runs']):.1f} | {replay} | {median / base:.3f} | "
              f"{row['tokens_as_first']} | {row['tokens_are_argmax']} |", flush=True)
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
