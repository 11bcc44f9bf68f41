"""Which op of a partition its backend failed on, when the backend did not say.

torch.onnx finding no overload for one ``aten.sub``, TVM's importer refusing one Concat:
the backend fails the whole partition and names nothing, and moving the whole partition
to the CPU fallback left a model "built for onnx" with every op on torch. Instead the
partition's prefixes (in run order) are lowered, halving each time: the first op whose
prefix fails is the one to move (with the ops shaped like it: the same op on the same
kinds of arguments, which fail the same way), and the rest stays on the target.

    before: [linear, relu, sub*, linear] fails          -> all four on the fallback
    after:  [linear, relu] lowers, [.., sub] fails      -> sub alone on the fallback

A prefix of a partition's nodes in run order is convex (every path between two of its
nodes runs through earlier nodes of the partition), so each cuts out as a partition does.
"""

from __future__ import annotations

import logging
import operator
from pathlib import Path
from typing import Callable

import torch
from torch.fx import Node

from exporter.builder.prepared import Prepared
from plan.partition import PartitionError, PlannedPartition, materialize
from runtime.host import scratch
from targets import LoweringError

log = logging.getLogger(__name__)
# lowerings one search spends at most (each a backend compile of a prefix): halving, that
# pins one op among 1,024; a longer partition moves the window it narrowed to
MAX_PROBES = 10


def isolate_failure(prep: Prepared, plan: PlannedPartition, work_dir: Path,
                    lower: Callable[[PlannedPartition, Path], object]) -> list[Node] | None:
    """The ops of ``plan`` to move to the fallback: the first whose prefix ``lower``
    fails on and the program's ops shaped like it (the ops still undecided after
    MAX_PROBES lowerings); None where the search cannot tell (a single op, or a probe
    that failed in a way moving ops does not help)."""
    compute = [n for n in plan.nodes if n.target is not operator.getitem]
    if len(compute) < 2:
        return None
    lowers, fails = 0, len(compute)  # the whole partition failed: that is known
    for _ in range(MAX_PROBES):
        if fails - lowers <= 1:
            break
        middle = (lowers + fails) // 2
        outcome = _probe(prep, plan, compute[:middle], work_dir / f"probe-{middle}", lower)
        if outcome is None:
            return None
        lowers, fails = (middle, fails) if outcome else (lowers, middle)
    if fails - lowers > 1:  # out of probes: the ops not yet told apart move together
        log.info("%s: %s fails within %d ops, %d probes spent", plan.name, prep.target.name,
                 fails - lowers, MAX_PROBES)
        return compute[lowers:fails]
    culprit = compute[fails - 1]
    alike = [n for n in prep.program.graph.nodes if n is not culprit
             and n.op == "call_function" and _shape_of_call(n) == _shape_of_call(culprit)]
    log.info("%s: %s fails on %s (%d op(s) like it)", plan.name, prep.target.name,
             culprit.name, len(alike))
    return [culprit, *alike]


def _probe(prep: Prepared, plan: PlannedPartition, prefix: list[Node], folder: Path,
           lower: Callable) -> bool | None:
    """Whether the backend lowers ``prefix`` (True), fails on it (False), or failed in a
    way that moving ops does not mend (None)."""
    members = set(prefix)
    getitems = [n for n in plan.nodes if n.target is operator.getitem
                and n.args[0] in members]  # a multi-output op keeps its getitems
    order = {node: i for i, node in enumerate(plan.nodes)}
    probe = PlannedPartition(f"{plan.name}-probe", True,
                             sorted([*prefix, *getitems], key=order.__getitem__))
    signature = prep.captured.signature
    try:
        materialize(prep.program, [probe], [s.name for s in signature.inputs],
                    [s.name for s in signature.outputs], prep.captured.inputs.tensors)
    except PartitionError:
        return False  # cannot be cut out here: count it as failing, so the search looks earlier
    folder.mkdir(parents=True)
    try:
        lower(probe, folder)
    except LoweringError as exc:
        for path in exc.kept:  # a probe's log is not the user's
            scratch.remove(path)
        return False if exc.movable else None
    return True


def _shape_of_call(node: Node) -> tuple:
    """The op and what kind of thing each argument is (a tensor's dtype and rank, a
    size, a constant's type): ops alike in this fail alike in a backend's import."""
    return (node.target, tuple(_kind(a) for a in node.args),
            tuple(sorted((k, _kind(v)) for k, v in node.kwargs.items())))


def _kind(value) -> object:
    if isinstance(value, Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return ("tensor", str(val.dtype), val.dim())
        return ("value", type(val).__name__)
    if isinstance(value, (list, tuple)):
        return tuple(_kind(v) for v in value)
    return ("constant", type(value).__name__)

