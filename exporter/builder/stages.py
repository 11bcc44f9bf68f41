"""The stages every kind of build shares (exporter/kinds.py): the target checked,
the output path checked, one entry point captured, passed and placed, a lowered entry
point's manifest, and the stage clock."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.export import ExportedProgram

from exporter import versions
from exporter.builder.lowering import lower_options
from exporter.builder.placement import enforce_fallback_policy, place
from exporter.builder.preload import defining_module
from exporter.builder.prepared import Prepared
from exporter.builder.quantization import calibration_sets, check_recipe
from exporter.builder.replacing import check_replacing
from exporter.errors import MemoryBudgetError, TargetUnavailableError
from exporter.kinds import BuildKind
from exporter.model.capture import capture
from exporter.model.cast import cast_model, cast_record
from exporter.model.dynamic import parse_dynamic
from exporter.model.spec import ModelSpec
from exporter.progress import StageHook, logged
from exporter.settings import BuildSettings
from exporter.validation.inputs import load_input_file
from passes.base import run_pipeline
from passes.graph.ops import is_custom_op
from plan import memory_plan
from plan.partition import PlannedPartition
from runtime.executors import parse_meta
from runtime.format.manifest import Manifest, Partition
from runtime.host.outfiles import checked_output
from runtime.host.platforms import host_platform
from targets import Lowered, Target, all_targets, get_target
from targets.fallback import FALLBACK_BACKEND

def prepare_captured(target: Target, model: ModelSpec, captured_spec: ModelSpec, out: Path,
                     settings: BuildSettings, timed: Callable, label: str = "", *,
                     shared_weights: bool = False) -> Prepared:
    """Capture ``captured_spec`` (the model as it runs: cast, wrapped) and plan it; ``model``
    is the user's, the float64 reference. ``label`` names the entry point in stage names;
    ``shared_weights``: one of several entry points with one weight store (a generating
    build's): the fallback's tensors go there, and the target's own where it can share
    them, which its passes know from capture on (targets/aoti/cuda.py)."""
    dynamic = parse_dynamic(settings.dynamic)
    with timed(f"capture{label} (torch.export)"):
        captured = capture(captured_spec, dynamic, target.device)
    if settings.inputs is not None:  # checked now, not after minutes of compiling
        load_input_file(captured.signature, settings.inputs)
    calibration, warnings = calibration_sets(settings, captured.signature,
                                             captured.inputs.tensors)
    warnings = model.notes + warnings
    options = lower_options(settings, out, calibration=calibration)
    if shared_weights:
        options = dataclasses.replace(
            options, shared_weights=target.generation.shares_weights(options))
    passes = "passes" if settings.quantize is None else f"passes (quantize {settings.quantize})"
    with timed(passes.replace("passes", f"passes{label}", 1)):
        program, pass_records = run_pipeline(captured.program, target.default_passes(options))
    # passes edit the captured program in place: keep only the result, so weights a pass
    # replaced (merged, quantized) are freed before lowering
    captured.program = program
    if settings.dtype != "fp32":
        pass_records.insert(0, cast_record(model.module, settings.dtype))
    warnings += [f"pass {r['name']} failed on this model and was skipped ({r['skipped']}); "
                 "the build goes on without it" for r in pass_records if r.get("skipped")]
    activations = memory_plan.plan(program)  # planned once: the budget and the manifest
    if settings.memory_budget is not None:
        check_memory_budget(program, activations, settings.memory_budget)
    with timed(f"partition{label}"):
        placement = place(program, target, settings.min_partition_size)
    warnings += enforce_fallback_policy(placement, settings.fallback, target)
    return Prepared(target=target, model=model, captured=captured, program=program,
                    pass_records=pass_records, placement=placement, warnings=warnings, out=out,
                    options=options, calibration=calibration, activations=activations,
                    captured_module=captured_spec.module, shared_store=shared_weights)


def at_dtype(model: ModelSpec, dtype: str) -> ModelSpec:
    """The spec to capture: at fp16/bf16, the model cast as ``model.to(dtype)`` casts it
    (exporter/model/cast.py); the user's float32 model stays the float64 reference."""
    if dtype == "fp32":
        return model
    return dataclasses.replace(model, module=cast_model(model.module, dtype))


def check_memory_budget(program: ExportedProgram, plan: dict, budget: int) -> None:
    """Before anything compiles: the weights (as the passes left them, so quantized) plus
    the activation plan at the dims' upper bounds must fit ``budget``."""
    weights = sum(t.numel() * t.element_size() for t in
                  {id(t): t for t in [*program.state_dict.values(), *program.constants.values()]
                   if isinstance(t, torch.Tensor)}.values())
    total = weights + plan["arena_bytes"]
    if total > budget:
        raise MemoryBudgetError(
            f"the model needs {total / 1e6:.2f} MB, over the --memory-budget of "
            f"{budget / 1e6:.2f} MB by {(total - budget) / 1e6:.2f} MB",
            details=[f"weights: {weights / 1e6:.2f} MB", f"activations (arena, sized at "
                     f"{plan['sized_at']}): {plan['arena_bytes'] / 1e6:.2f} MB, lower bound "
                     f"{plan['lower_bound_bytes'] / 1e6:.2f} MB"],
            hint="quantize the weights (--quantize int8-weight / int8-dynamic), build with "
                 "--dtype fp16, lower the dynamic dims' maxima (--dynamic), or raise the budget")


def stage_timer(timings: dict, stage: StageHook) -> Callable:
    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with logged(stage)(name):
                yield
        except Exception as exc:
            # Which stage broke: the CLI names it when the error is a bug of ours.
            if not hasattr(exc, "exporter_stage"):
                exc.exporter_stage = f"stage '{name}'"
            raise
        timings[name] = round(time.perf_counter() - start, 2)
    return timed


def available_target(settings: BuildSettings, kind: BuildKind) -> Target:
    """The target, if it can build here, with the settings' recipe checked against it
    (and against the kind of build)."""
    name = settings.target
    target = get_target(name)
    availability = target.availability()
    if not availability.ok:
        raise TargetUnavailableError(f"target '{name}' cannot build on this machine: "
                                     f"{availability.reason}", hint="see `exporter targets`")
    _check_platform(target, settings.platform)
    check_recipe(target, settings, kind)
    return target


def _check_platform(target: Target, platform: str) -> None:
    """Refused before any work: a target that compiles native code with this machine's
    compiler cannot build for another platform; say which targets can."""
    if target.packaging.builds_for(platform):
        return
    able = sorted(t.name for t in all_targets().values() if t.packaging.builds_for(platform))
    raise TargetUnavailableError(
        f"target '{target.name}' cannot build for {platform}: it compiles native code for "
        f"this machine's platform only ({host_platform()})",
        hint=f"targets that build for {platform}: {', '.join(able) or 'none'} "
             f"(`exporter build --target {able[0] if able else 'TARGET'} --platform {platform}`)")


def check_output_path(out: Path, spec: str, force: bool, inputs: Path | None = None) -> Path:
    """Refused now, before minutes of compiling: see runtime/host/outfiles.py, a file the
    build reads (the spec's, ``inputs``), and an artifact another spec built (replacing.py)."""
    from exporter.model.spec_names import spec_reads
    out = out.expanduser()
    checked_output(out, reads=[*spec_reads(spec), *([inputs] if inputs else [])])
    check_replacing(out, spec, force)
    return out


def manifest_for(prep: Prepared, settings: BuildSettings,
              lowered: list[tuple[PlannedPartition, Lowered]]) -> Manifest:
    partitions = []
    for plan, low in lowered:
        prefix = f"partitions/{plan.name}/"
        meta = dict(low.meta)
        if not plan.delegated:
            meta["custom_ops"] = sorted({str(n.target).rsplit(".", 1)[0] for n in plan.nodes
                                         if is_custom_op(n.target)})
            meta["custom_op_modules"] = {op: m for op in meta["custom_ops"]
                                         if (m := defining_module(op))}
        partition = Partition(
            name=plan.name, backend=(low.backend or prep.target.backend) if plan.delegated
            else FALLBACK_BACKEND,
            device=prep.target.device if plan.delegated else "cpu",
            files=tuple(prefix + name for name in low.files), inputs=tuple(plan.inputs),
            outputs=tuple(plan.outputs), meta=meta)
        # checked now by its executor kind's typed meta, as a device will check it; its
        # file fields (the package, the model) become full entry names
        typed = parse_meta(partition, where=f"partition '{plan.name}' as lowered")
        partitions.append(dataclasses.replace(partition, meta={
            **meta, **{key: prefix + name for key, name in typed.files().items()}}))
    delegated = [low for plan, low in lowered if plan.delegated]
    requirements = (delegated or [low for _, low in lowered])[0].requirements
    # the platform built for, which a target that cross-compiles is not the host's
    requirements = dataclasses.replace(requirements, platform=settings.platform,
                                       arch=settings.platform.split("-", 1)[1])
    return Manifest(
        target=prep.target.name, signature=prep.captured.signature, partitions=partitions,
        requirements=requirements, created_by=versions.collect(),
        source={**prep.model.details, "spec": prep.model.source,
                "model_class": prep.model.model_class},
        passes=[{k: v for k, v in r.items() if k != "seconds"} for r in prep.pass_records],
        coverage=_coverage(prep, lowered), placement=_placement(prep, lowered),
        memory_plan=_memory_plan(prep, lowered))


def _chosen(prep: Prepared, lowered: list[tuple[PlannedPartition, Lowered]]
            ) -> dict[str, tuple[str, str]]:
    """Partition -> why it runs on another executor kind than its target's (a target that
    chose among several: Lowered.backend)."""
    found = {}
    for plan, low in lowered:
        if plan.delegated and low.backend and low.backend != prep.target.backend:
            by = (low.choice or {}).get("by", "")
            found[plan.name] = (low.backend, "the fastest of its backends here"
                                if by == "measured" else by)
    return found


def _coverage(prep: Prepared, lowered: list[tuple[PlannedPartition, Lowered]]) -> list[dict]:
    """Placement's rows, each op of a partition its target put on another backend under
    that backend, saying why."""
    chosen = _chosen(prep, lowered)
    return [{**row, "backend": chosen[row["partition"]][0],
             "reason": f"{prep.target.name} runs partition {row['partition']} on "
                       f"{chosen[row['partition']][0]} ({chosen[row['partition']][1]})"}
            if row["partition"] in chosen else row for row in prep.placement.coverage]


def _placement(prep: Prepared, lowered: list[tuple[PlannedPartition, Lowered]]) -> dict:
    summary = prep.placement.summary()
    if _chosen(prep, lowered):
        summary["by_backend"] = dict(Counter(f"{row['backend']}@{row['device']}"
                                             for row in _coverage(prep, lowered)))
    return summary


def _memory_plan(prep: Prepared, lowered: list[tuple[PlannedPartition, Lowered]]) -> dict:
    """The whole program's activation plan (the report), and the arenas the runtime
    allocates (only partitions' hand-offs and CPU-fallback insides are ours to place)."""
    parts = [(plan.name, prep.target.device if plan.delegated else "cpu", plan.delegated,
              plan.program, plan.inputs, plan.outputs) for plan, _ in lowered]
    outputs = {s.name for s in prep.captured.signature.outputs}
    return {**prep.activations, "arenas": memory_plan.plan_arenas(parts, outputs)}


