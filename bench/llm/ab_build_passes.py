"""Seconds of the rewrites that used to re-capture the whole program, the earlier way (the
rewrite on ``program.module()``, then ``torch.export`` again) against in place, taking
turns in one process on the program an executorch generating build passes them (so the
machine's load moves both alike).

    python bench/llm/ab_build_passes.py --checkpoint build/llm/ckpt-300m --rounds 3

The build is started as ``exporter build hf:CKPT --task text-generation --target
executorch --quantize int8-dynamic`` would run it, stopped at its pass pipeline: the
passes before the timed ones run once, then each round times RemoveNoOps and
MergeParallelLinears both ways on copies of the program, and after one shared PT2E
quantization, EmbeddingByte both ways; then one ``legalize_graph`` of the final program
(ExecuTorch runs one per delegate it cuts out) against ``legalize_in_place``. One JSON
line: per pass, the medians and the paired ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class _Stop(Exception):
    pass


def _timed(step, program) -> tuple[float, object]:
    start = time.perf_counter()
    result = step(program)
    return time.perf_counter() - start, result.program


def _ways(name: str):
    """(earlier way, in place) for one pass."""
    from passes.cleanup import remove_noops
    from passes.fusion import merge_linears
    from passes.graph.in_place import rewrite_in_place
    from passes.graph.rewrite import rewrite_and_recapture
    from targets.executorch import embedding_byte
    rewrite, figure = {"remove_noops": (remove_noops._remove_all, "nodes_removed"),
                       "merge_parallel_linears": (merge_linears._merge_all, "linears_merged"),
                       "embedding_byte": (embedding_byte._rewrite, "tables")}[name]
    return (lambda p: rewrite_and_recapture(p, rewrite, figure),
            lambda p: rewrite_in_place(p, rewrite, figure))


def ab(program, passes, rounds: int) -> tuple[dict, object]:
    """Run the build's passes, timing the three rewrites both ways, alternately first;
    the figures and the program after all the passes."""
    seconds: dict[str, list[tuple[float, float]]] = {}
    for step in passes:
        if step.name not in ("remove_noops", "merge_parallel_linears", "embedding_byte"):
            program = step(program).program
            continue
        earlier, in_place = _ways(step.name)
        pairs = []
        for index in range(rounds):
            order = [("earlier", earlier), ("in_place", in_place)]
            got = {}
            for label, way in order if index % 2 == 0 else order[::-1]:
                got[label], result = _timed(way, copy.deepcopy(program))
            pairs.append((got["earlier"], got["in_place"]))
        seconds[step.name] = pairs
        program = result
    return {name: {"earlier_s": round(statistics.median(a for a, _ in pairs), 2),
                   "in_place_s": round(statistics.median(b for _, b in pairs), 2),
                   "paired_in_place_over_earlier": round(
                       statistics.median(b / a for a, b in pairs), 4),
                   "each": [[round(a, 2), round(b, 2)] for a, b in pairs]}
            for name, pairs in seconds.items()}, program


def legalize_ab(program, rounds: int) -> dict:
    """Seconds of one ``legalize_graph`` (what ExecuTorch runs per delegate it cuts out)
    against ``legalize_in_place`` on the program's whole graph, each on its own copy."""
    from torch.fx.passes.tools_common import legalize_graph

    from targets.executorch.legalize import legalize_in_place
    pairs = []
    for _ in range(rounds):
        got = {}
        for label, way in (("earlier", legalize_graph), ("in_place", legalize_in_place)):
            module = copy.deepcopy(program.graph_module)
            start = time.perf_counter()
            way(module)
            got[label] = time.perf_counter() - start
        pairs.append((got["earlier"], got["in_place"]))
    return {"nodes": len(program.graph.nodes),
            "earlier_s": round(statistics.median(a for a, _ in pairs), 3),
            "in_place_s": round(statistics.median(b for _, b in pairs), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="build/llm/ckpt-300m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="append the result as one JSON line")
    args = parser.parse_args()
    import exporter
    from bench.common import machine_header
    from exporter.builder import stages
    found = {}

    def intercept(program, passes):
        figures, passed = ab(program, passes, args.rounds)
        found.update(figures, legalize_graph=legalize_ab(passed, args.rounds))
        raise _Stop
    stages.run_pipeline = intercept
    try:
        exporter.build(f"hf:{args.checkpoint}", task="text-generation", target="executorch",
                       max_context=256, prefill_chunk=128, quantize="int8-dynamic",
                       min_top1=0, max_kl=10, validate_artifact=False, out="/tmp/ab-build-passes.artifact")
    except _Stop:
        pass
    row = {**machine_header(), "checkpoint": args.checkpoint, "rounds": args.rounds,
           "passes": found}
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as sink:
            sink.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
