"""On the GPU machine: where the greedy decode loop's time goes beyond its graph's replays,
and loops that read the token another way, side by side in one process, rounds
interleaved, medians.

    python bench/greedy_loop_cuda.py [--kernels 240] [--numel 1048576] [--count 128]
        [--rounds 9] [--artifact PATH] [--out FILE.jsonl]

The graph is a stand-in for the decode step (``--kernels`` dependent elementwise kernels
over ``--numel`` fp16, then the next token from the last and the position advanced, as
runtime/generation/decode_graph.py's tail does), or with ``--artifact`` a decode
artifact's own step. Per token, for ``--count`` tokens from one position:
``wall``: first token read to last, as decode tokens/s counts it; ``gpu``: CUDA events
around the whole loop. The loops:

- ``back to back``: the graph replayed ``count`` times, nothing read (the floor);
- ``runtime greedy`` (``--artifact`` only): DecodeGraph.greedy on the artifact's graph;
- ``copy engine``: the runtime's earlier loop: replay, the token copied into a pinned
  two-slot host buffer (cudaMemcpyAsync: the copy engine, between two graphs), an event;
- ``copy engine, 2 ahead``: the same, three slots, the host two steps ahead;
- ``kernel write``: replay, then a kernel writes the token into pinned host memory
  through its device address (no copy engine), an event;
- ``in graph, by position``: the graph itself writes the token into pinned host memory
  at its position (a slot per position: never rewritten while the host may read it), as
  the runtime's loop now does;
- ``in graph, by parity``: the same into two slots chosen by the position's parity (one
  more kernel in the graph);
- ``in graph, memcpy node``: the copy engine's copy captured into the graph, one fixed
  slot (timing only: step k + 1 rewrites the slot the host may not have read yet).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.generation.decode_graph import device_view  # noqa: E402

VOCAB = 32000


class Stand:
    """The state a decode step reads and writes: the token, the position, and the step
    (``step()``, in capture: the work, then the next token and position)."""

    def __init__(self, kernels: int, numel: int) -> None:
        self.tokens = torch.zeros(1, dtype=torch.long, device="cuda")
        self.position = torch.zeros(1, dtype=torch.long, device="cuda")
        self.buffer = torch.ones(numel, dtype=torch.float16, device="cuda")
        self.kernels = kernels
        self.size = 4096  # slots by position

    def step(self) -> None:
        for _ in range(self.kernels):
            torch.mul(self.buffer, 1.0, out=self.buffer)
        # a token that depends on the last and the position, as greedy's would
        self.tokens.mul_(31).add_(self.position).remainder_(VOCAB)
        self.position.add_(1)

    def reset(self, token: int, position: int) -> None:
        self.tokens.fill_(token)
        self.position.fill_(position)


class Artifact(Stand):
    """A decode artifact's own step (its generator's, with the greedy tail)."""

    def __init__(self, path: str) -> None:
        from bench.decode_step_cuda import graph_of
        self.program, self.graph = graph_of(path)
        self.generator = self.program.generator
        self.tokens, self.position = self.graph._tokens, self.graph._position
        self.size = self.generator.max_context + 1

    def step(self) -> None:
        from runtime.generation.decode_graph import greedy_tail
        logits, token = self.generator.run_step_token(self.tokens, self.position)
        if not self.graph._advances:  # else the step fed its own inputs back
            greedy_tail(logits, self.tokens, self.position, token)


def capture(stand: Stand, extra=None, pool=None) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            stand.step()
            if extra:
                extra()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        stand.step()
        if extra:
            extra()
    return graph


class Loops:
    """The loops under test, each over the same state from the same start."""

    def __init__(self, stand: Stand) -> None:
        self.stand = stand
        self.read = torch.zeros(3, dtype=torch.long, pin_memory=True)
        self.slots = torch.zeros(stand.size, dtype=torch.long, pin_memory=True)
        self.parity = torch.zeros(2, dtype=torch.long, pin_memory=True)
        self.fixed = torch.zeros(1, dtype=torch.long, pin_memory=True)
        self.read_view, self.slots_view = device_view(self.read), device_view(self.slots)
        self.parity_view = device_view(self.parity)
        self.done = [torch.cuda.Event() for _ in range(3)]
        self.plain = capture(stand)
        pool = self.plain.pool()
        self.by_position = capture(stand, lambda: self.slots_view.index_copy_(
            0, stand.position, stand.tokens), pool)
        self.by_parity = capture(stand, lambda: self.parity_view.index_copy_(
            0, torch.remainder(stand.position, 2), stand.tokens), pool)
        try:  # timing only; a capture that refuses it loses the row, not the run
            self.memcpy_node = capture(stand, lambda: self.fixed.copy_(
                stand.tokens, non_blocking=True), pool)
        except RuntimeError as error:
            print(f"no memcpy node: {error}")
            self.memcpy_node = None

    def table(self) -> dict:
        runtime = {"runtime greedy": self.runtime} if isinstance(self.stand, Artifact) else {}
        return {**runtime, "back to back": self.back_to_back, "copy engine": self.copy_engine,
                "copy engine, 2 ahead": self.two_ahead, "kernel write": self.kernel_write,
                "in graph, by position": self.in_graph_position,
                "in graph, by parity": self.in_graph_parity,
                **({"in graph, memcpy node": self.in_graph_memcpy} if self.memcpy_node else {})}

    def runtime(self, count: int):
        """The runtime's own loop (DecodeGraph.greedy) on the artifact's own graph."""
        return self.stand.graph.greedy(5, self.start, count)

    def back_to_back(self, count: int):
        for _ in range(count):
            self.plain.replay()
        return iter(())

    def _ahead(self, count: int, enqueue, read, ahead: int = 1):
        """Tokens with the host ``ahead`` steps in front of the token it reads."""
        for index in range(min(ahead, count)):
            enqueue(index)
        for index in range(count):
            if index + ahead < count:
                enqueue(index + ahead)
            self.done[index % (ahead + 1)].synchronize()
            yield read(index)

    def copy_engine(self, count: int, slots: int = 2):
        def enqueue(index: int) -> None:
            slot = index % slots
            self.plain.replay()
            self.read[slot:slot + 1].copy_(self.stand.tokens, non_blocking=True)
            self.done[slot].record()
        return self._ahead(count, enqueue, lambda i: int(self.read[i % slots]), slots - 1)

    def two_ahead(self, count: int):
        return self.copy_engine(count, 3)

    def kernel_write(self, count: int):
        def enqueue(index: int) -> None:
            slot = index % 2
            self.plain.replay()
            torch.add(self.stand.tokens, 0, out=self.read_view[slot:slot + 1])
            self.done[slot].record()
        return self._ahead(count, enqueue, lambda i: int(self.read[i % 2]))

    def _in_graph(self, graph, count: int, read):
        def enqueue(index: int) -> None:
            graph.replay()
            self.done[index % 2].record()
        return self._ahead(count, enqueue, read)

    def in_graph_position(self, count: int):
        start = self.start
        return self._in_graph(self.by_position, count, lambda i: int(self.slots[start + 1 + i]))

    def in_graph_parity(self, count: int):
        start = self.start
        return self._in_graph(self.by_parity, count,
                              lambda i: int(self.parity[(start + 1 + i) % 2]))

    def in_graph_memcpy(self, count: int):
        return self._in_graph(self.memcpy_node, count, lambda i: int(self.fixed[0]))


def timed(loops: Loops, name: str, count: int, start: int) -> dict:
    """One loop's run from ``start``: per token wall (first read to last) and GPU time."""
    loops.stand.reset(5, start)
    loops.start = start
    for buffer in (loops.read, loops.slots, loops.parity, loops.fixed):
        buffer.fill_(-1)  # a token read before it is written shows as -1
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    tokens, stamps = [], []
    for token in loops.table()[name](count):
        stamps.append(time.perf_counter())
        tokens.append(token)
    end.record()
    end.synchronize()
    wall = (stamps[-1] - stamps[0]) / (count - 1) * 1e3 if stamps else None
    return {"gpu_ms": begin.elapsed_time(end) / count, "wall_ms": wall, "tokens": tokens}


def measure(loops: Loops, count: int, rounds: int, start: int) -> dict:
    names = list(loops.table())
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(rounds + 1):  # the first round warms up, not counted
        for name in (names if round_ % 2 else names[::-1]):
            row = timed(loops, name, count, start)
            if round_:
                runs[name].append(row)
    reference = runs["copy engine"][0]["tokens"]
    out = {}
    for name, rows in runs.items():
        walls = [r["wall_ms"] for r in rows if r["wall_ms"] is not None]
        out[name] = {"gpu_ms": statistics.median(r["gpu_ms"] for r in rows),
                     "wall_ms": statistics.median(walls) if walls else None,
                     "same_tokens": all(r["tokens"] == reference for r in rows)
                     if rows[0]["tokens"] else None,
                     "gpu_ms_all": [round(r["gpu_ms"], 5) for r in rows]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", type=int, default=240)
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--count", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--artifact")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    stand = Artifact(args.artifact) if args.artifact else Stand(args.kernels, args.numel)
    start = 128 if args.artifact else 100
    loops = Loops(stand)
    result = measure(loops, args.count, args.rounds, start)
    row = {"what": "greedy loop", "graph": args.artifact or
           f"stand-in {args.kernels} x mul over {args.numel} fp16", "count": args.count,
           "rounds": args.rounds, "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "loops": result}
    floor = result["back to back"]["gpu_ms"]
    print(f"{row['graph']}, {args.count} tokens, {args.rounds} rounds")
    print("| loop | gpu ms/token | wall ms/token | - back to back, us | same tokens |")
    print("|---|---|---|---|---|")
    for name, r in result.items():
        wall = f"{r['wall_ms']:.4f}" if r["wall_ms"] is not None else "-"
        print(f"| {name} | {r['gpu_ms']:.4f} | {wall} | {(r['gpu_ms'] - floor) * 1e3:.1f} | "
              f"{r['same_tokens']} |")
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
