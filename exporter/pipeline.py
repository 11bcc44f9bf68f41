"""The build pipeline: spec -> capture -> passes -> lower -> package -> validate -> artifact.

Each stage is a short function; ``build`` reads top to bottom as the pipeline in
DESIGN.md. The output path only ever receives a complete, validated artifact
(atomic rename); a failed build leaves the previous file in place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from exporter import versions
from exporter.capture import Captured, capture
from exporter.dynamic import parse_dynamic
from exporter.errors import TargetUnavailableError, UserInputError, ValidationFailedError
from exporter.settings import BuildSettings
from exporter.spec import ModelSpec, load_spec
from exporter.validate import EagerRunner, summarize_failure, validate
from exporter.validate_inputs import make_cases
from passes.base import run_pipeline
from runtime.archive import write_artifact
from runtime.manifest import Manifest, Partition
from targets import LowerOptions, Target, get_target

log = logging.getLogger(__name__)

StageHook = Callable[[str], contextlib.AbstractContextManager]


@dataclass
class BuildResult:
    artifact: Path
    manifest: Manifest
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        notes = list(self.manifest.build.get("notes", []))
        return notes + list((self.manifest.validation or {}).get("warnings", []))

    def to_json(self) -> dict:
        return {"artifact": str(self.artifact), "target": self.manifest.target,
                "validation": self.manifest.validation or {"passed": None},
                "signature": self.manifest.signature.to_json(),
                "timings_s": self.timings, "warnings": self.warnings}


@contextlib.contextmanager
def _quiet_stage(name: str) -> Iterator[None]:
    yield


def build(spec: str | ModelSpec, settings: BuildSettings, *, stage: StageHook = _quiet_stage
          ) -> BuildResult:
    timings: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        with stage(name):
            yield
        timings[name] = round(time.perf_counter() - start, 2)

    target = _available_target(settings.target)
    dynamic = parse_dynamic(settings.dynamic)
    with timed("load model"):
        model = spec if isinstance(spec, ModelSpec) else load_spec(spec)
    out = _check_output_path(settings.output_path(_model_name(model)))
    with timed("capture (torch.export)"):
        captured = capture(model, dynamic, target.device)
    work_dir = Path(tempfile.mkdtemp(prefix="exporter-build-"))
    try:
        options = LowerOptions(work_dir=work_dir / "p0", cpu_isa=settings.cpu_isa,
                               dtype=settings.dtype, autotune=settings.autotune,
                               log_dir=out.parent)
        options.work_dir.mkdir()
        with timed("passes"):
            program, pass_records = run_pipeline(captured.program, target.default_passes(options))
        with timed(f"lower ({target.backend})"):
            lowered = target.lower(program, options)
        manifest = _manifest(model, settings, target, captured, program, pass_records, lowered)
        files = {f"partitions/p0/{name}": path for name, path in lowered.files.items()}
        manifest.build = {"settings": settings.model_dump(mode="json"), "timings_s": timings,
                          "notes": lowered.notes}
        if settings.validate_artifact:
            with timed("validate (subprocess)"):
                eager = _eager_runner(model, captured, program, settings)
                manifest.validation = _validate(out, manifest, files, eager, captured, settings)
        else:
            manifest.validation = {"passed": None, "skipped": True,
                                   "warnings": ["validation skipped (--no-validate)"]}
        with timed("package"):
            write_artifact(out, manifest.to_dict(), files)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return BuildResult(out, manifest, timings)


def _available_target(name: str) -> Target:
    target = get_target(name)
    availability = target.availability()
    if not availability.ok:
        raise TargetUnavailableError(f"target '{name}' cannot build on this machine: "
                                     f"{availability.reason}", hint="see `exporter targets`")
    return target


def _model_name(model: ModelSpec) -> str:
    tail = model.source.rsplit(":", 1)[-1]
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in tail) or "model"


def _check_output_path(out: Path) -> Path:
    out = out.expanduser()
    if out.is_dir():
        raise UserInputError(f"the output path {out} is a directory",
                             hint="give a file name, e.g. --out model.artifact")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserInputError(f"the output directory {parent} does not exist",
                             hint="create it first or choose another --out")
    if not os.access(parent, os.W_OK):
        raise UserInputError(f"the output directory {parent} is not writable",
                             hint="choose another --out")
    return out


def _manifest(model: ModelSpec, settings: BuildSettings, target: Target, captured: Captured,
              program, pass_records: list[dict], lowered) -> Manifest:
    partition = Partition(
        name="p0", backend=target.backend, device=target.device,
        files=tuple(f"partitions/p0/{name}" for name in lowered.files),
        inputs=tuple(s.name for s in captured.signature.inputs),
        outputs=tuple(s.name for s in captured.signature.outputs),
        meta={**lowered.meta, "package": f"partitions/p0/{lowered.meta['package']}"})
    return Manifest(
        target=target.name, signature=captured.signature, partitions=[partition],
        requirements=lowered.requirements, created_by=versions.collect(),
        source={"spec": model.source, "model_class": type(model.module).__qualname__},
        passes=pass_records, coverage=_coverage(program, target))


def _coverage(program, target: Target) -> list[dict]:
    """Where each ATen op runs and why (one partition until partitioning lands)."""
    rows = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        support = target.supports(node)
        rows.append({"node": node.name, "op": str(node.target), "partition": "p0",
                     "backend": target.backend, "device": target.device,
                     "supported": support.ok, "reason": support.reason})
    return rows


def _eager_runner(model: ModelSpec, captured: Captured, program, settings: BuildSettings
                  ) -> EagerRunner:
    """The float64 reference is always the user's model. At fp16/bf16, the same-dtype
    comparison point is the cast program run eagerly op by op (``model.half()`` itself
    can fail on models that build float32 masks)."""
    same_dtype = None if settings.dtype == "fp32" else program.module()
    return EagerRunner(model.module, captured.inputs.rebuild, same_dtype_flat=same_dtype)


def _validate(out: Path, manifest: Manifest, files: dict, eager: EagerRunner,
              captured: Captured, settings: BuildSettings) -> dict:
    """Package to a staging file beside ``out``, validate that file, then discard it."""
    cases, warnings = make_cases(captured.signature, captured.inputs.tensors, settings.inputs,
                                 settings.seed)
    staging = out.with_name(f".{out.name}.validating-{os.getpid()}")
    write_artifact(staging, manifest.to_dict(), files)
    try:
        record = validate(staging, eager, captured.signature, cases, dtype=settings.dtype,
                          warnings=warnings)
        if not record["passed"]:
            manifest.validation = record
            kept = _keep_failed(out, manifest, files) if settings.keep_failed else None
            raise ValidationFailedError(
                "the artifact does not match eager PyTorch on the validation inputs",
                record=record, where=str(kept or out), details=summarize_failure(record),
                hint="no artifact was written; --keep-failed keeps it beside the output for "
                     "inspection" if kept is None else f"the failed artifact was kept at {kept}")
        return record
    finally:
        staging.unlink(missing_ok=True)


def _keep_failed(out: Path, manifest: Manifest, files: dict) -> Path:
    failed = out.with_name(f"{out.stem}.FAILED-VALIDATION{out.suffix}")
    write_artifact(failed, manifest.to_dict(), files)
    return failed
