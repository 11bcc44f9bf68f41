"""Memory planning over a program's ATen graph: tensor lifetimes, an arena layout by
greedy best fit, and the two figures to judge it by.

    naive        every intermediate its own buffer (no reuse)
    lower bound  the most bytes alive at any one step (no layout can use less)
    arena        offsets from "greedy by size" (Pisarchyk & Lee, 2020, as TFLite's
                 ArenaPlanner does): largest buffers first, each at the lowest offset
                 where no buffer with an overlapping lifetime sits

Written here, not taken from torch: Inductor plans inside its own kernels only, and the
ExecuTorch planner is not installable on its own; the algorithm is 40 lines.

Views (reshape, transpose, split, ...) share their base's storage and extend its
lifetime instead of allocating. Symbolic sizes are taken at the example inputs' sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import ExportedProgram


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int  # bytes, aligned
    start: int  # step of the node that writes it
    end: int  # last step that reads it (the graph's end for outputs)


def plan(program: ExportedProgram, alignment: int = 64) -> dict:
    """The plan as the manifest stores it: figures, and each buffer's offset."""
    buffers = lifetimes(program.graph, alignment)
    offsets = best_fit(buffers)
    arena = max((offsets[b.name] + b.size for b in buffers), default=0)
    return {"alignment": alignment, "buffers": len(buffers), "arena_bytes": arena,
            "naive_bytes": sum(b.size for b in buffers),
            "lower_bound_bytes": lower_bound(buffers),
            "offsets": {b.name: [offsets[b.name], b.size, b.start, b.end] for b in buffers}}


def lifetimes(graph: torch.fx.Graph, alignment: int) -> list[Buffer]:
    nodes = list(graph.nodes)
    step = {n: i for i, n in enumerate(nodes)}
    storage: dict[torch.fx.Node, torch.fx.Node] = {}  # node -> the node that allocated it
    last_use: dict[torch.fx.Node, int] = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        base = _aliased_input(node)
        if base is not None and base not in storage:
            continue  # a view of an input or a weight (w.T): not an activation, no buffer
        storage[node] = storage[base] if base is not None else node
        for used in node.all_input_nodes:
            owner = storage.get(used)
            if owner is not None:
                last_use[owner] = max(last_use.get(owner, 0), step[node])
    end = len(nodes)
    for output in graph.find_nodes(op="output"):
        for used in output.all_input_nodes:
            if used in storage:
                last_use[storage[used]] = end
    buffers = []
    for owner in set(storage.values()):
        size = _bytes(owner)
        if size:
            buffers.append(Buffer(owner.name, -(-size // alignment) * alignment, step[owner],
                                  last_use.get(owner, step[owner])))
    return sorted(buffers, key=lambda b: b.start)


def best_fit(buffers: list[Buffer]) -> dict[str, int]:
    offsets: dict[str, int] = {}
    placed: list[Buffer] = []
    for buf in sorted(buffers, key=lambda b: (-b.size, b.start)):
        taken = sorted((offsets[p.name], offsets[p.name] + p.size) for p in placed
                       if p.start <= buf.end and buf.start <= p.end)
        best, best_gap, cursor = None, None, 0
        for low, high in taken:  # gaps between live neighbours; the smallest that fits
            gap = low - cursor
            if gap >= buf.size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, high)
        offsets[buf.name] = best if best is not None else cursor
        placed.append(buf)
    return offsets


def lower_bound(buffers: list[Buffer]) -> int:
    events = sorted({b.start for b in buffers})
    return max((sum(b.size for b in buffers if b.start <= t <= b.end) for t in events),
               default=0)


def _aliased_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input whose storage ``node``'s output is a view of, if any."""
    if node.target.__module__ == "_operator":  # getitem of split/unbind: a view of it
        return node.args[0] if isinstance(node.args[0], torch.fx.Node) else None
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns or schema.returns[0].alias_info is None:
        return None
    first = node.args[0] if node.args else None
    return first if isinstance(first, torch.fx.Node) else None


def _bytes(node: torch.fx.Node) -> int:
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            numel = 1
            for size in v.shape:
                numel *= size.node.hint if isinstance(size, torch.SymInt) else int(size)
            total += numel * v.element_size()
    return total
