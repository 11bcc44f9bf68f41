"""Decode tokens/s of several engines in ONE process, taking turns: the ratio between
them, which the shared machine's load moves far less than it moves each engine's own
figure (``bench.llm.compare`` runs each engine in a fresh process, one after the other,
for its peak memory, and two of its runs of one engine can differ widely).

    python -m bench.llm.interleave --engine-module bench.llm.engines_artifact \\
        --engines artifact-onnx-int4,ortgenai-int4 --rounds 7

Engines must be prepared first (``bench.llm.compare --prepare-only``). Same protocol as
the comparison (bench/llm/protocol.py: 128-token prompt, 128 new tokens, greedy, eos
masked); one warm-up call each, then ``--rounds`` rounds of one call per engine. The
ratios to the first engine are given twice: of the medians, and the median of each
round's ratio (paired, the steadier one on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import LoadSampler, fix_threads, machine_header, wait_for_quiet  # noqa: E402
from bench.llm.engine import EngineRequest  # noqa: E402
from bench.llm.protocol import prompt_ids, time_call  # noqa: E402
from bench.llm.registry import get_engine, import_engine_modules  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", required=True)
    parser.add_argument("--engine-module", action="append", default=[])
    parser.add_argument("--checkpoint", default="build/llm/ckpt-300m")
    parser.add_argument("--work-dir", default="build/llm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--warmup-tokens", type=int,
                        help="new tokens of each engine's warm-up call (default: --new-tokens)")
    parser.add_argument("--out", help="append the result as one JSON line")
    parser.add_argument("--max-load", type=float, default=1e9,
                        help="wait before timing until the 1-minute load average is below")
    parser.add_argument("--max-wait", type=float, default=600.0, help="seconds, at most")
    parser.add_argument("--no-ballast", dest="ballast", action="store_false",
                        help="time the first engine as the process's first load")
    parser.add_argument("--pairs", default="",
                        help="also the paired ratio of each A/B given (comma-separated), "
                             "e.g. artifact-onnx-int8/llamacpp-q8_0")
    parser.add_argument("--alternate", action="store_true",
                        help="reverse the engines' order every other round (each engine "
                             "runs as often after as before each other one)")
    args = parser.parse_args()
    import_engine_modules(args.engine_module)
    threads = fix_threads(args.threads)  # torch's pool and ExecuTorch's XNNPACK pool
    checkpoint = Path(args.checkpoint).resolve()
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    prompt = prompt_ids(vocab)
    work = Path(args.work_dir).resolve() / f"engines-{checkpoint.name}"
    loaded, names = {}, args.engines.split(",")
    pairs = [pair.split("/") for pair in filter(None, args.pairs.split(","))]
    if any(len(pair) != 2 or not set(pair) <= set(names) for pair in pairs):
        parser.error(f"--pairs takes A/B of engines in --engines, not {args.pairs!r}")
    requests = {name: EngineRequest(checkpoint, work / name, args.threads,
                                    max_tokens=len(prompt) + args.new_tokens)
                for name in names}
    # The first ONNX Runtime session a process loads decodes slower than any loaded after
    # it, so whichever engine came first lost. A copy of the first engine is loaded and
    # kept, untimed, so no timed engine is the first.
    ballast = get_engine(names[0]).load(requests[names[0]]) if args.ballast else None
    for name in names:
        loaded[name] = get_engine(name).load(requests[name])
        time_call(loaded[name].generate, prompt, args.warmup_tokens or args.new_tokens)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in loaded}
    quiet = wait_for_quiet(args.max_load, args.max_wait)
    with LoadSampler() as load:
        for round_ in range(args.rounds):
            order = list(loaded.items())
            for name, engine in order[::-1] if args.alternate and round_ % 2 else order:
                call = time_call(engine.generate, prompt, args.new_tokens)
                rates[name].append((args.new_tokens - 1) / call.decode_s)
    medians = {name: round(statistics.median(r), 2) for name, r in rates.items()}
    first = next(iter(medians))
    row = {**machine_header(), "threads": args.threads, "pools": threads, "rounds": args.rounds,
           "alternate": args.alternate,
           "warmup_tokens": args.warmup_tokens or args.new_tokens,
           "ballast": bool(ballast), "quiet": quiet, "load": load.summary(),
           "decode_tokens_per_s": medians,
           "each": {name: [round(x, 1) for x in r] for name, r in rates.items()},
           "ratio_to_" + first: {name: round(m / medians[first], 3)
                                 for name, m in medians.items()},
           # the median over rounds of each round's own ratio: the load moves within a
           # round far less than across rounds, so this is the steadier figure
           "paired_ratio_to_" + first: {name: paired(rates, name, first) for name in rates},
           "paired": {"/".join(pair): paired(rates, *pair) for pair in pairs}}
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as sink:
            sink.write(json.dumps(row) + "\n")


def paired(rates: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of engine ``a``'s rate over ``b``'s in the same round."""
    return round(statistics.median(x / y for x, y in zip(rates[a], rates[b])), 3)


if __name__ == "__main__":
    main()
