"""Where each op runs and why: partition planning, the coverage table, the fallback policy.

The same table goes to ``exporter build --dry-run``, the manifest and ``exporter inspect``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram

from exporter.errors import UserInputError
from exporter.model.source_lines import source_line
from passes.graph.cost import op_costs
from passes.graph.ops import op_label
from plan.partition import PlannedPartition, is_shape_node, plan_partitions
from targets import FallbackPolicy, Support, Target
from targets.fallback import FALLBACK_BACKEND


class UnsupportedOpsError(UserInputError):
    """--fallback forbid and some ops would run on the CPU fallback."""


@dataclass
class Placement:
    plans: list[PlannedPartition]
    coverage: list[dict]
    transfers: int

    @property
    def fallback_rows(self) -> list[dict]:
        return [row for row in self.coverage if row["backend"] == FALLBACK_BACKEND]

    def summary(self) -> dict:
        totals = Counter(f"{row['backend']}@{row['device']}" for row in self.coverage)
        return {"ops": len(self.coverage), "by_backend": dict(totals),
                "partitions": len(self.plans),
                "delegated_partitions": sum(p.delegated for p in self.plans),
                "fallback_partitions": sum(not p.delegated for p in self.plans),
                "device_transfers": self.transfers}


def place(program: ExportedProgram, target: Target, min_partition_size: int,
          failed: dict[str, str] | None = None) -> Placement:
    """``failed``: node name -> why, for ops the target claimed but then failed to
    compile (the build moves them to the CPU fallback and lowers again)."""
    failed = failed or {}
    supports = {n: Support(False, failed[n.name]) if n.name in failed else target.supports(n)
                for n in program.graph.nodes
                if n.op == "call_function" and not is_shape_node(n)}
    plans = plan_partitions(program, lambda n: supports[n].ok, min_partition_size)
    while not target.partitioning.complex_boundaries and (crossing := _complex_crossings(plans)):
        for node in crossing:  # each round moves ops to the fallback: it ends
            supports[node] = Support(False, f"a complex value it takes or makes would cross "
                                            f"between {target.name} and the CPU fallback, and "
                                            f"{target.name} has no complex tensors")
        plans = plan_partitions(program, lambda n: supports[n].ok, min_partition_size)
    owner = {node: plan for plan in plans for node in plan.nodes}
    costs = op_costs(program)  # FLOPs and weight bytes per op, for the report
    coverage = []
    for node, support in supports.items():
        plan = owner[node]
        if plan.delegated:
            backend, device, reason = target.backend, target.device, support.reason
        elif support.ok:
            backend, device = FALLBACK_BACKEND, "cpu"
            reason = (f"{target.name} supports it, but its island is smaller than "
                      f"--min-partition-size {min_partition_size}")
        else:
            backend, device, reason = FALLBACK_BACKEND, "cpu", support.reason
        coverage.append({"node": node.name, "op": op_label(node.target), "partition": plan.name,
                         "backend": backend, "device": device, "supported": support.ok,
                         "reason": reason, "source": source_line(node),
                         **costs.get(node.name, {})})
    return Placement(plans, coverage, _transfers(plans, target.device))


def _complex_crossings(plans: list[PlannedPartition]) -> set:
    """Ops on the target whose complex input or output is on the other side of a
    boundary with the CPU fallback (DeepSeek-V2's complex rotary: torch.onnx hands such a
    value over as real pairs, and the fallback's program refused their shape)."""
    delegated = {node: plan.delegated for plan in plans for node in plan.nodes}
    moving = set()
    for node, on_target in delegated.items():
        value = node.meta.get("val")
        if not (isinstance(value, torch.Tensor) and value.is_complex()):
            continue
        across = [user for user in node.users if delegated.get(user, on_target) != on_target]
        if on_target and across:  # made on the target, read on the fallback
            moving.add(node)
        elif not on_target:  # made on the fallback, read on the target
            moving.update(across)
    return moving


def _transfers(plans: list[PlannedPartition], device: str) -> int:
    """Tensors that cross between partitions running on different devices."""
    where = {}
    for plan in plans:
        for node in plan.nodes:
            where[node.name] = device if plan.delegated else "cpu"
    count = 0
    for plan in plans:
        here = device if plan.delegated else "cpu"
        for node in plan.nodes:
            count += sum(1 for arg in node.all_input_nodes
                         if arg.name in where and where[arg.name] != here
                         and arg not in plan.nodes)
    return count


def mostly_fallback(placement: Placement, target: Target) -> str | None:
    """One line when most of the model's ops run on the CPU fallback, not on the target
    asked for (the placement table says so too, but a build that "passed" on torch read
    as one that ran on the target), with the commonest reasons; None otherwise."""
    rows = placement.fallback_rows
    if not rows or 2 * len(rows) <= len(placement.coverage):
        return None
    reasons = Counter(_short(row["reason"]) for row in rows).most_common(2)
    why = "; ".join(f"{reason} ({count} op{'s' if count > 1 else ''})"
                    for reason, count in reasons)
    return (f"{len(rows)} of {len(placement.coverage)} ops run on the CPU fallback, not "
            f"{target.name}: {why} (`exporter inspect` lists each op)")


def _short(reason: str, limit: int = 160) -> str:
    return reason if len(reason) <= limit else reason[:limit - 3] + "..."


def enforce_fallback_policy(placement: Placement, policy: FallbackPolicy | str,
                            target: Target) -> list[str]:
    """Raise for 'forbid' listing every unsupported op; return warnings for 'warn'."""
    try:
        policy = FallbackPolicy(policy)
    except ValueError:
        raise UserInputError(f"unknown --fallback '{policy}'", hint="choose one of: " + ", ".join(
            p.value for p in FallbackPolicy)) from None
    rows = placement.fallback_rows
    if not rows or policy == FallbackPolicy.ALLOW:
        return []
    lines = [f"{row['op']} ({row['node']}): {row['reason']}"
             + (f" at {row['source']}" if row["source"] else "") for row in rows]
    if policy == FallbackPolicy.FORBID:
        raise UnsupportedOpsError(
            f"{len(rows)} op(s) cannot run on target '{target.name}' and --fallback forbid "
            "does not allow the CPU fallback", details=lines,
            hint="allow the fallback (--fallback warn), rewrite those ops, or pick a target "
                 "that supports them (`exporter build --dry-run` shows the placement)")
    return [f"{len(rows)} op(s) run on the CPU fallback instead of '{target.name}':"] + \
        [f"  {line}" for line in lines]
