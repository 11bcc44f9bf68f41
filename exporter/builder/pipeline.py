"""The build pipeline: one for every kind of build (exporter/kinds.py).

    prepare (load, capture, passes, partition) -> lower -> manifest -> validate -> package

``build`` reads top to bottom as the pipeline in docs/architecture.md; the kind fills in
each stage. The output path only ever receives a complete, validated artifact (atomic
rename); a failed build leaves the previous file in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from exporter.builder.plain import PlainBuild
from exporter.builder.replacing import check_replacing
from exporter.builder.stages import stage_timer
from exporter.kinds import BuildKind
from exporter.leftovers import sweep
from exporter.progress import StageHook, quiet_stage
from exporter.settings import BuildSettings
from exporter.ship.archive_writer import write_artifact
from exporter.validation import native_cases
from runtime.executors import holds_native_code
from runtime.format.manifest import Manifest
from runtime.host import scratch
from runtime.host.platforms import host_platform


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
                "backend_choice": self.manifest.build.get("backend_choice"),
                "memory_plan": {k: self.manifest.memory_plan.get(k) for k in
                                ("arena_bytes", "lower_bound_bytes", "naive_bytes")}}


def prepare(spec: Any, settings: BuildSettings, timed: Callable, kind: BuildKind | None = None
            ) -> Any:
    """Load, capture, run the passes and partition each entry point of ``kind`` (plain
    when not given)."""
    return (kind or PlainBuild()).prepare(spec, settings, timed)


def dry_run(spec: Any, settings: BuildSettings, *, stage: StageHook = quiet_stage,
            kind: BuildKind | None = None) -> Any:
    """Capture, run the passes and plan the partitions; compile nothing."""
    return prepare(spec, settings, stage_timer({}, stage), kind)


def build(spec: Any, settings: BuildSettings, *, stage: StageHook = quiet_stage,
          kind: BuildKind | None = None) -> BuildResult:
    """Any kind of build (plain when not given), top to bottom."""
    kind = kind or PlainBuild()
    timings: dict[str, float] = {}
    timed = stage_timer(timings, stage)
    prepared = kind.prepare(spec, settings, timed)
    out = kind.output(prepared)
    sweep()  # what killed builds left (only what they recorded)
    work_dir = scratch.make_dir("exporter-build-")
    staged = None
    try:
        lowered = kind.lower(prepared, settings, work_dir, timed)
        manifest, files, measured = kind.manifest(prepared, lowered, settings, work_dir)
        foreign = foreign_native_code(manifest)
        if settings.validate_artifact and not foreign:
            with timed(kind.validate_stage):
                record = kind.validate(prepared, manifest, files, settings)
            measured.update(record.pop("measured", {}))
            # the artifact it validated (exporter/ship/archive_writer.py's Staged), if kept
            staged = record.pop("staged", None)
            manifest.validation = record
        else:
            manifest.validation = {"passed": None, "skipped": True, "warnings": [
                foreign or "validation skipped (--no-validate)"]}
        with timed("package"):
            # again: another build (of another spec) may have written it meanwhile
            check_replacing(out, manifest.source.get("spec", ""), settings.force)
            if staged is not None:  # its entries copied as validated, not read and hashed again
                staged.finish(out, manifest.to_dict())
            else:
                write_artifact(out, manifest.to_dict(), files)
    finally:
        if staged is not None:
            scratch.remove(staged.path)
        scratch.remove(work_dir)
    return BuildResult(out, manifest, timings, measured)


def foreign_native_code(manifest: Manifest) -> str | None:
    """Why this machine cannot validate the artifact: native code built for another
    platform (a cross build), which its validation process could not load; else None."""
    built_for, host = manifest.requirements.platform_name, host_platform()
    native = [p.name for p in manifest.all_partitions() if holds_native_code(p)]
    if built_for == host or not native:
        return None
    why = native_cases.why_not(manifest)  # None: its native runner validates it under qemu
    if why is None:
        return None
    return (f"validation skipped: partition {', '.join(native[:3])} holds native code for "
            f"{built_for}, which this machine ({host}) cannot run ({why}); check it there, "
            "or under qemu-user with the native runner (`exporter package --native`)")
