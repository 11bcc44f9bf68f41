"""The build pipeline: spec -> capture -> passes -> lower -> package -> validate -> artifact.

Each stage is a short function; ``build`` reads top to bottom as the pipeline in
docs/architecture.md. The output path only ever receives a complete, validated artifact
(atomic rename); a failed build leaves the previous file in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.export import ExportedProgram

from exporter import versions
from exporter.builder.lowering import lower_options, lower_with_fallback
from exporter.builder.placement import enforce_fallback_policy, place
from exporter.builder.preload import defining_module, preload_for
from exporter.builder.prepared import Prepared
from exporter.builder.quantization import calibration_sets, check_recipe
from exporter.leftovers import sweep
from exporter.progress import StageHook, logged, quiet_stage
from exporter.errors import (
    BuildError,
    MemoryBudgetError,
    TargetUnavailableError,
    ValidationFailedError,
)
from exporter.model.capture import capture
from exporter.model.cast import cast_model, cast_record
from exporter.model.dynamic import parse_dynamic
from exporter.model.hf_spec import HfOptions
from exporter.model.spec import ModelSpec, load_spec
from exporter.settings import BuildSettings
from exporter.ship.archive_writer import write_artifact
from exporter.validation.bisect import bisect, bisect_lines
from exporter.validation.gates import QuantGate, Tolerance
from exporter.validation.inputs import load_input_file, make_cases
from exporter.validation.validate import (EagerRunner, crashed, keep_failed, summarize_failure,
                                          validate)
from passes.base import run_pipeline
from passes.graph.ops import is_custom_op
from plan import memory_plan
from plan.partition import PlannedPartition
from runtime.executors import parse_meta
from runtime.format.manifest import Manifest, Partition
from runtime.host import scratch
from runtime.host.outfiles import checked_output
from targets import Lowered, Target, for_backend, get_target
from targets.fallback import FALLBACK_BACKEND

log = logging.getLogger(__name__)



@dataclass
class BuildResult:
    artifact: Path
    manifest: Manifest
    timings: dict[str, float] = field(default_factory=dict)
    # What varies between two builds of one spec (seconds, measured memory): reported,
    # never written into the manifest, so rebuilding gives the same bytes.
    measured: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.artifact

    def __repr__(self) -> str:
        """One line for a REPL: what was built and whether it passed (``.manifest`` has
        the rest; the dataclass default printed all of it)."""
        signature, record = self.manifest.signature, self.manifest.validation or {}
        verdict = {True: "passed", False: "FAILED", None: "skipped"}[record.get("passed")]
        return (f"<Artifact {str(self.artifact)!r} target={self.manifest.target} "
                f"inputs=[{', '.join(s.describe() for s in signature.inputs)}] "
                f"outputs=[{', '.join(s.describe() for s in signature.outputs)}] "
                f"validation={verdict} warnings={len(self.warnings)}>")

    @property
    def warnings(self) -> list[str]:
        from exporter.report.console import float_layer_notes
        return (list(self.manifest.build.get("notes", [])) + float_layer_notes(self.manifest)
                + list((self.manifest.validation or {}).get("warnings", [])))

    def to_json(self) -> dict:
        return {"artifact": str(self.artifact), "target": self.manifest.target,
                "validation": self.manifest.validation or {"passed": None},
                "signature": self.manifest.signature.to_json(),
                "timings_s": self.timings, "measured": self.measured,
                "warnings": self.warnings, "placement": self.manifest.placement,
                "memory_plan": {k: self.manifest.memory_plan.get(k) for k in
                                ("arena_bytes", "lower_bound_bytes", "naive_bytes")}}


def prepare(spec: str | ModelSpec, settings: BuildSettings, timed: Callable) -> Prepared:
    target = available_target(settings)
    with timed("load model"):
        model = spec if isinstance(spec, ModelSpec) else load_spec(
            spec, HfOptions.from_settings(settings))
    out = check_output_path(settings.output_path(model_name(model)))
    return prepare_captured(target, model, _at_dtype(model, settings.dtype), out, settings,
                            timed)


def prepare_captured(target: Target, model: ModelSpec, captured_spec: ModelSpec, out: Path,
                     settings: BuildSettings, timed: Callable, label: str = "") -> Prepared:
    """Capture ``captured_spec`` (the model as it runs: cast, wrapped) and plan it; ``model``
    is the user's, the float64 reference. ``label`` names the entry point in stage names."""
    dynamic = parse_dynamic(settings.dynamic)
    with timed(f"capture{label} (torch.export)"):
        captured = capture(captured_spec, dynamic, target.device)
    if settings.inputs is not None:  # checked now, not after minutes of compiling
        load_input_file(captured.signature, settings.inputs)
    calibration, warnings = calibration_sets(settings, captured.signature,
                                             captured.inputs.tensors)
    warnings = model.notes + warnings
    options = lower_options(settings, out, calibration=calibration)
    passes = "passes" if settings.quantize is None else f"passes (quantize {settings.quantize})"
    with timed(passes.replace("passes", f"passes{label}", 1)):
        program, pass_records = run_pipeline(captured.program, target.default_passes(options))
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
    return Prepared(target, model, captured, program, pass_records, placement, warnings, out,
                    options, calibration, activations, captured_spec.module)


def _at_dtype(model: ModelSpec, dtype: str) -> ModelSpec:
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


def dry_run(spec: str | ModelSpec, settings: BuildSettings, *,
            stage: StageHook = quiet_stage) -> Prepared:
    """Capture, run the passes and plan the partitions; compile nothing."""
    return prepare(spec, settings, stage_timer({}, stage))


def build(spec: str | ModelSpec, settings: BuildSettings, *, stage: StageHook = quiet_stage
          ) -> BuildResult:
    timings: dict[str, float] = {}
    timed = stage_timer(timings, stage)
    prep = prepare(spec, settings, timed)
    sweep()  # what killed builds left (only what they recorded)
    work_dir = scratch.make_dir("exporter-build-")
    try:
        with timed(f"lower ({prep.target.backend})"):
            lowered = lower_with_fallback(prep, settings, work_dir)
        manifest = manifest_for(prep, settings, lowered)
        files = {f"partitions/{plan.name}/{name}": path
                 for plan, low in lowered for name, path in low.files.items()}
        notes = [note for _, low in lowered for note in low.notes]
        manifest.build = {"settings": _settings_used(settings, prep.model),
                          "notes": prep.warnings + notes,
                          "nondeterminism": prep.target.packaging.nondeterminism(prep.options)}
        measured = {"pass_seconds": {r["name"]: r["seconds"] for r in prep.pass_records},
                    "lower_seconds": {p.name: low.seconds for p, low in lowered}}
        if settings.validate_artifact:
            with timed("validate (subprocess)"):
                eager = _eager_runner(prep, settings)
                record = _validate(prep.out, manifest, files, eager, prep, settings,
                                   preload_for(manifest, prep.model.origin_file))
            measured.update(record.pop("measured"))
            manifest.validation = record
        else:
            manifest.validation = {"passed": None, "skipped": True,
                                   "warnings": ["validation skipped (--no-validate)"]}
        with timed("package"):
            write_artifact(prep.out, manifest.to_dict(), files)
    finally:
        scratch.remove(work_dir)
    return BuildResult(prep.out, manifest, timings, measured)


def _settings_used(settings: BuildSettings, model: ModelSpec) -> dict:
    """The settings as given, with what the loader chose where they left it open (hf: the
    task read from the config, the default --seq-len), so the manifest says what was built."""
    used = settings.model_dump(mode="json", exclude={"out"})
    for key, value in model.details.items():
        if key in used and used[key] is None:
            used[key] = value
    return used


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


def available_target(settings: BuildSettings) -> Target:
    """The target, if it can build here, with the settings' recipe checked against it."""
    name = settings.target
    target = get_target(name)
    availability = target.availability()
    if not availability.ok:
        raise TargetUnavailableError(f"target '{name}' cannot build on this machine: "
                                     f"{availability.reason}", hint="see `exporter targets`")
    check_recipe(target, settings)
    return target


def model_name(model: ModelSpec) -> str:
    """The default artifact's stem: the factory's name, or for hf:FOLDER the folder's
    (``hf:./tiny-bert`` -> ``tiny-bert``, not ``__tiny-bert``; ``hf:.`` -> the folder's)."""
    tail = model.source.rsplit(":", 1)[-1].rstrip("/\\")
    tail = (Path(tail).expanduser().resolve() if model.source.startswith("hf:")
            else Path(tail)).name
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in tail) or "model"


def check_output_path(out: Path) -> Path:
    """Refused now, before minutes of compiling: see runtime/host/outfiles.py."""
    out = out.expanduser()
    checked_output(out)
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
            name=plan.name, backend=prep.target.backend if plan.delegated else FALLBACK_BACKEND,
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
    return Manifest(
        target=prep.target.name, signature=prep.captured.signature, partitions=partitions,
        requirements=requirements, created_by=versions.collect(),
        source={**prep.model.details, "spec": prep.model.source,
                "model_class": prep.model.model_class},
        passes=[{k: v for k, v in r.items() if k != "seconds"} for r in prep.pass_records],
        coverage=prep.placement.coverage,
        placement=prep.placement.summary(), memory_plan=_memory_plan(prep, lowered))


def _memory_plan(prep: Prepared, lowered: list[tuple[PlannedPartition, Lowered]]) -> dict:
    """The whole program's activation plan (the report), and the arenas the runtime
    allocates (only partitions' hand-offs and CPU-fallback insides are ours to place)."""
    parts = [(plan.name, prep.target.device if plan.delegated else "cpu", plan.delegated,
              plan.program, plan.inputs, plan.outputs) for plan, _ in lowered]
    outputs = {s.name for s in prep.captured.signature.outputs}
    return {**prep.activations, "arenas": memory_plan.plan_arenas(parts, outputs)}


def _eager_runner(prep: Prepared, settings: BuildSettings) -> EagerRunner:
    """The float64 reference is always the user's model; at fp16/bf16 the same-dtype
    comparison point is the cast model the build captured (``model.to(dtype)``)."""
    return EagerRunner(prep.model.module, prep.captured.inputs.rebuild,
                       same_dtype=prep.captured_module if settings.dtype != "fp32" else None)


def _validate(out: Path, manifest: Manifest, files: dict, eager: EagerRunner,
              prep: Prepared, settings: BuildSettings, preload: list[str]) -> dict:
    """Package to a staging file beside ``out``, validate that file, then discard it.
    On a mismatch the gate deems a bug (not a quantized build's drift), bisect it to a
    partition first."""
    captured = prep.captured
    cases, warnings = make_cases(captured.signature, captured.inputs.tensors, settings.inputs,
                                 settings.seed)
    staging = scratch.record(out.with_name(f".{out.name}.validating-{os.getpid()}"))
    write_artifact(staging, manifest.to_dict(), files)
    try:
        gate = (QuantGate(settings.quant_min_sqnr_db, settings.quant_min_cosine,
                          settings.quantize)
                if settings.quantize else Tolerance.for_dtype(settings.dtype))
        try:
            record = validate(staging, eager, captured.signature, cases, gate=gate,
                              warnings=warnings, preload=preload,
                              timeout=settings.validation_timeout_s)
        except BuildError as exc:  # the artifact crashed the validation process
            raise crashed(exc, out, manifest, files, settings.keep_failed) from exc
        if not record["passed"]:
            found = _bisect(staging, manifest, prep, cases, record, eager,
                            settings.dtype) if gate.bisects else None
            if found is not None:
                record["bisect"] = found
            manifest.validation = record
            kept = keep_failed(out, manifest, files) if settings.keep_failed else None
            raise ValidationFailedError(
                gate.failure(), record=record, where=str(kept or out),
                details=summarize_failure(record) + (bisect_lines(found) if found else []),
                hint=f"the failed artifact was kept at {kept}" if kept else "no new artifact "
                     "was written (a file at the output is left as it was); --keep-failed keeps it")
        return record
    finally:
        scratch.remove(staging)


def _bisect(staging: Path, manifest: Manifest, prep: Prepared, cases: list, record: dict,
            eager: EagerRunner, dtype: str) -> dict | None:
    """Bisect the first failing case. It helps read a failure and must never replace it:
    if the bisect itself breaks, the build says so and reports the mismatch as it is."""
    failing = next(row["case"] for row in record["outputs"] if not row["passed"])
    case = next(c for c in cases if c.name == failing)
    try:
        with torch.no_grad():
            eager_outputs = eager.run(list(case.inputs.values()))
            return bisect(staging, manifest, prep.program, case, eager_outputs, dtype,
                          prep.target.device,
                          {plan.name: plan.program for plan in prep.placement.plans})
    except Exception as exc:
        log.warning("could not bisect the mismatch (%s: %s)", type(exc).__name__, exc)
        log.debug("the bisect's traceback", exc_info=True)
        return None
