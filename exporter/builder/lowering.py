"""Lowering every partition, with the retry that moves what a backend failed on to the
CPU fallback (docs/architecture.md: "CPU fallback for every op a target does not support").

Split from exporter/builder/pipeline.py, which calls ``lower_with_fallback`` as one stage.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from exporter.builder.isolate import isolate_failure
from exporter.builder.placement import mostly_fallback, place
from exporter.builder.prepared import Prepared
from exporter.settings import BuildSettings
from plan.partition import PartitionError, PlannedPartition, materialize
from runtime.errors import ToolchainError
from runtime.host import scratch
from targets import FallbackPolicy, Lowered, LoweringError, LowerOptions
from targets.fallback import lower_fallback

log = logging.getLogger(__name__)


def lower_options(settings: BuildSettings, out: Path, work_dir: Path | None = None, *,
                  calibration: list | None = None) -> LowerOptions:
    """What the settings say to the target; built once per build (exporter/builder/
    pipeline.py), each partition's lowering replaces ``work_dir`` and ``partition``."""
    return LowerOptions(work_dir=work_dir or out.parent, target=settings.options(),
                        cpu_isa=settings.cpu_isa, platform=settings.platform,
                        dtype=settings.dtype, fuse=settings.fuse,
                        quantize=settings.quantize, calibration=tuple(calibration or ()),
                        fallback=settings.fallback, deterministic=settings.deterministic,
                        partition=work_dir.name if work_dir else None, log_dir=out.parent)


def _lower_all(prep: Prepared, settings: BuildSettings, work_dir: Path
               ) -> list[tuple[PlannedPartition, Lowered]]:
    plans = prep.placement.plans
    if len(plans) == 1 and plans[0].delegated:
        plans[0].program = prep.program  # the whole program: no re-capture needed
        plans[0].inputs = [s.name for s in prep.captured.signature.inputs]
        plans[0].outputs = [s.name for s in prep.captured.signature.outputs]
    else:
        try:
            materialize(prep.program, plans, [s.name for s in prep.captured.signature.inputs],
                        [s.name for s in prep.captured.signature.outputs],
                        prep.captured.inputs.tensors)
        except PartitionError as exc:
            if exc.plan is None or not exc.plan.delegated:
                raise
            # a delegated island torch.export cannot cut out: run its ops on the fallback
            raise LoweringError(exc.what, nodes=[n.name for n in exc.plan.nodes
                                                 if n.op == "call_function"],
                                hint=exc.hint) from exc
    lowered = []
    for plan in plans:
        part_dir = work_dir / plan.name
        part_dir.mkdir()
        if plan.delegated:
            low = _lower_delegated(prep, settings, plan, part_dir)
        else:
            low = lower_fallback(plan.program, part_dir,
                                 shared=prep.shared_store or prep.options.shared_weights)
        lowered.append((plan, low))
    return lowered


def _lower_delegated(prep: Prepared, settings: BuildSettings, plan: PlannedPartition,
                     part_dir: Path) -> Lowered:
    """One delegated partition. Whatever the backend raises becomes a LoweringError that
    names the ops to move to the CPU fallback: those the backend named, else all of the
    partition's (a backend crash tells us no more than that)."""
    ops = [n.name for n in plan.nodes if n.op == "call_function"]
    options = dataclasses.replace(prep.options, work_dir=part_dir, partition=plan.name)
    try:
        return prep.target.lower(plan.program, options)
    except LoweringError as exc:
        if exc.movable:
            exc.nodes = exc.nodes or ops
        raise
    except (ToolchainError, OSError):
        raise  # the user's options, the machine or its disk: moving ops would not help
    except Exception as exc:  # noqa: BLE001 - a backend's own failure on this partition
        raise LoweringError(f"{prep.target.name} failed on partition '{plan.name}' "
                            f"({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]})",
                            nodes=ops, hint="the partition's ops move to the CPU fallback "
                                            "unless --fallback forbid") from exc


MAX_LOWERING_RETRIES = 6  # each retry moves at least one more op (isolate.py)


def lower_with_fallback(prep: Prepared, settings: BuildSettings, work_dir: Path
                         ) -> list[tuple[PlannedPartition, Lowered]]:
    """Lower every partition. When a backend fails on ops it had claimed (``exc.nodes``:
    those it named, else the one op of the failing partition it fails on, isolate.py),
    and the fallback policy allows it, those ops move to the CPU fallback, the partitions
    are planned again and lowering starts over."""
    failed: dict[str, str] = {}
    for attempt in range(MAX_LOWERING_RETRIES + 1):
        attempt_dir = work_dir / f"attempt{attempt}"
        attempt_dir.mkdir()
        try:
            lowered = _lower_all(prep, settings, attempt_dir)
        except LoweringError as exc:
            if not exc.movable or attempt == MAX_LOWERING_RETRIES:
                raise
            nodes = [n for n in _to_move(prep, settings, exc, attempt_dir) if n not in failed]
            if settings.fallback == FallbackPolicy.FORBID:
                raise _naming(exc, prep, nodes)
            if not nodes:
                raise
            _move_to_fallback(prep, settings, exc, nodes, failed)
            continue
        if (line := mostly_fallback(prep.placement, prep.target)) is not None:
            prep.warnings.insert(0, line)
        return lowered
    raise AssertionError("unreachable")


def _to_move(prep: Prepared, settings: BuildSettings, exc: LoweringError,
             attempt_dir: Path) -> list[str]:
    """The ops the backend named; where it named none (the whole partition), the ones
    it fails on, found by lowering the partition's prefixes (isolate.py)."""
    whole = next((plan for plan in prep.placement.plans if plan.delegated
                  and set(exc.nodes) == {n.name for n in plan.nodes if n.op == "call_function"}),
                 None)
    if whole is None:
        return exc.nodes
    found = isolate_failure(prep, whole, attempt_dir / f"isolate-{whole.name}",
                            lambda plan, folder: _lower_delegated(prep, settings, plan, folder))
    return exc.nodes if found is None else [n.name for n in found]


def _naming(exc: LoweringError, prep: Prepared, nodes: list[str]) -> LoweringError:
    """With --fallback forbid the build stops at the failure; where the backend named no
    op, the error names those the search found (a compiler's internal error names none)."""
    if not exc.details:
        targets = {n.name: n.target for n in prep.program.graph.nodes}
        exc.details = [f"{name}: {targets.get(name, '?')}" for name in nodes]
    return exc


NAMED = 6  # ops a fallback warning names; the placement table has them all


def named(nodes: list[str]) -> str:
    """The first NAMED of ``nodes`` and a count of the rest (LongT5 on tvm: 69 names)."""
    rest = len(nodes) - NAMED
    return ", ".join(nodes[:NAMED]) + (
        f" and {rest} more (`exporter inspect ARTIFACT` lists them)" if rest > 0 else "")


def _move_to_fallback(prep: Prepared, settings: BuildSettings, exc: LoweringError,
                      nodes: list[str], failed: dict[str, str]) -> None:
    for path in exc.kept:  # the build goes on: no log of it left beside the output
        scratch.remove(path)
    reason = f"{prep.target.name} failed to compile it: {exc.what}"
    failed.update({name: reason for name in nodes})
    log.warning("moving %d op(s) to the CPU fallback after a lowering failure (%s): %s",
                len(nodes), exc.what, ", ".join(nodes))
    prep.placement = place(prep.program, prep.target, settings.min_partition_size, failed)
    prep.warnings.append(f"{len(nodes)} op(s) moved to the CPU fallback after "
                         f"{prep.target.name} failed on them: {named(nodes)} "
                         f"({exc.what}; --fallback forbid stops there instead and "
                         "keeps the backend's log)")
