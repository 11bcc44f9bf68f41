"""A plain build: one forward pass, one entry point (exporter/kinds.py's stages).

    load model -> capture -> passes -> partition -> lower -> manifest
    -> validate against eager (subprocess; a mismatch is bisected to a partition)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from exporter.builder.lowering import lower_with_fallback
from exporter.builder.preload import preload_for
from exporter.builder.prepared import Prepared
from exporter.builder.stages import (at_dtype, available_target, check_output_path,
                                     manifest_for, prepare_captured)
from exporter.errors import BuildError, UserInputError, ValidationFailedError
from exporter.kinds import PLAIN, BuildKind, DryRunReport
from exporter.model.dynamic import parse_dynamic
from exporter.model.example_dims import fit_examples
from exporter.model.hf_spec import HfOptions
from exporter.model.spec import ModelSpec, load_spec
from exporter.model.spec_names import default_stem
from exporter.settings import NOT_RECORDED, BuildSettings
from exporter.ship.archive_writer import stage_artifact
from exporter.validation.bisect import bisect, bisect_lines
from exporter.validation.gates import QuantGate, Tolerance, Verdict
from exporter.validation.inputs import Case, make_cases
from exporter.validation.native_cases import command_for
from exporter.validation.validate import (EagerRunner, crashed, keep_failed, summarize_failure,
                                          validate)
from runtime.errors import InputMismatchError
from runtime.format.manifest import Manifest
from runtime.host import scratch
from runtime.program.flat_inputs import flatten_inputs
from runtime.program.torch_program import check_inputs

log = logging.getLogger(__name__)


class PlainBuild(BuildKind):
    name = PLAIN

    def prepare(self, spec: str | ModelSpec, settings: BuildSettings,
                timed: Callable) -> Prepared:
        target = available_target(settings, self)
        source = spec.source if isinstance(spec, ModelSpec) else (spec or "").strip()
        # before the model loads: its default name needs only the spec
        out = check_output_path(settings.output_path(default_stem(source)), source,
                                settings.force, settings.inputs)
        with timed("load model"):
            model = spec if isinstance(spec, ModelSpec) else load_spec(
                spec, HfOptions.from_settings(settings))
            model = fit_examples(model, parse_dynamic(settings.dynamic))
        return prepare_captured(target, model, at_dtype(model, settings.dtype), out, settings,
                                timed)

    def output(self, prepared: Prepared) -> Path:
        return prepared.out

    def lower(self, prepared: Prepared, settings: BuildSettings, work_dir: Path,
              timed: Callable) -> list:
        with timed(f"lower ({prepared.target.backend})"):
            return lower_with_fallback(prepared, settings, work_dir)

    def manifest(self, prepared: Prepared, lowered: list, settings: BuildSettings,
                 work_dir: Path) -> tuple[Manifest, dict[str, Path], dict]:
        prep = prepared
        manifest = manifest_for(prep, settings, lowered)
        files = {f"partitions/{plan.name}/{name}": path
                 for plan, low in lowered for name, path in low.files.items()}
        notes = [note for _, low in lowered for note in low.notes]
        manifest.build = {"settings": settings_used(settings, prep.model),
                          "notes": prep.warnings + notes,
                          "nondeterminism": prep.target.packaging.nondeterminism(prep.options)}
        # a target that lowers a partition several ways: which it kept, why, the figures
        chosen = {plan.name: low.choice for plan, low in lowered if low.choice}
        if chosen:
            manifest.build["backend_choice"] = chosen
        measured = {"pass_seconds": {r["name"]: r["seconds"] for r in prep.pass_records},
                    "lower_seconds": {p.name: low.seconds for p, low in lowered}}
        return manifest, files, measured

    def gate(self, settings: BuildSettings) -> Verdict:
        if settings.quantize:
            return QuantGate(settings.quant_min_sqnr_db, settings.quant_min_cosine,
                             settings.quantize)
        return Tolerance.for_dtype(settings.dtype)

    def validate(self, prepared: Prepared, manifest: Manifest, files: dict[str, Path],
                 settings: BuildSettings) -> dict:
        """Package to a staging file beside the output, validate that file, then discard
        it. On a mismatch the gate deems a bug (not a quantized build's drift), bisect it to
        a partition first."""
        prep, out = prepared, prepared.out
        eager = eager_runner(prep, settings)
        preload = preload_for(manifest, prep.model.origin_file)
        captured = prep.captured
        cases, warnings = make_cases(captured.signature, captured.inputs.tensors,
                                     settings.inputs, settings.seed)
        staging = scratch.record(out.with_name(f".{out.name}.validating-{os.getpid()}"))
        command = command_for(manifest)  # a cross build runs in its platform's native runner
        staged = stage_artifact(staging, manifest.to_dict(), files)
        passed = False
        try:
            gate = self.gate(settings)
            try:
                record = validate(staging, eager, captured.signature, cases, gate=gate,
                                  warnings=warnings, preload=preload,
                                  timeout=settings.validation_timeout_s, command=command)
                if command is not None:  # say where it ran: not this machine's runtime
                    record["runner"] = (f"native edge-run for {settings.platform}, "
                                        "under qemu-user")
            except BuildError as exc:  # the artifact crashed the validation process
                raise crashed(exc, out, manifest, files, settings.keep_failed) from exc
            if not record["passed"]:
                # bisecting runs partitions in the Python runtime: not another platform's
                found = (PlainBisect(prep, cases, eager, settings.dtype)(staging, manifest,
                                                                         record)
                         if gate.bisects and command is None else None)
                if found is not None:
                    record["bisect"] = found
                manifest.validation = record
                kept = keep_failed(out, manifest, files) if settings.keep_failed else None
                raise ValidationFailedError(
                    gate.failure(), record=record, where=str(kept or out),
                    details=summarize_failure(record) + (bisect_lines(found) if found else []),
                    hint=f"the failed artifact was kept at {kept}" if kept else "no new "
                         "artifact was written (a file at the output is left as it was); "
                         "--keep-failed keeps it")
            passed = True
            return {**record, "staged": staged}  # the pipeline's package stage finishes it
        finally:
            if not passed:
                scratch.remove(staging)

    def dry_run_report(self, prepared: Prepared) -> DryRunReport:
        prep = prepared
        return DryRunReport(
            as_json={"target": prep.target.name, "placement": prep.placement.summary(),
                     "signature": prep.captured.signature.to_json(),
                     "coverage": prep.placement.coverage, "warnings": prep.warnings},
            placements=[(None, prep.placement.coverage, prep.placement.summary())],
            warnings=prep.warnings, model_details=prep.model.details)

    def revalidate(self, artifact: Path, manifest: Manifest, model: str | ModelSpec | None,
                   inputs_file: Path | None, dtype: str, seed: int) -> dict:
        settings = manifest.build.get("settings", {})
        if model is None:
            with recorded_spec(manifest, artifact):
                spec = load_spec(manifest.source["spec"], HfOptions.from_settings(settings))
        else:
            spec = model if isinstance(model, ModelSpec) else load_spec(model)
        device = manifest.partitions[0].device if manifest.partitions else "cpu"
        module = spec.module.to(device)
        inputs = flatten_inputs(spec.args, spec.kwargs)
        if len(inputs.tensors) != len(manifest.signature.inputs):
            raise UserInputError(
                f"the model spec gives {len(inputs.tensors)} input tensors but the artifact "
                f"takes {len(manifest.signature.inputs)}", where=str(artifact),
                hint="pass the spec the artifact was built from (`exporter inspect` shows it)")
        try:  # the wrong model is a usage error, said before its forward fails on our inputs
            check_inputs(manifest.signature.inputs, inputs.tensors, where=str(artifact))
        except InputMismatchError as exc:
            raise UserInputError(f"the model spec's example inputs do not fit the artifact: "
                                 f"{exc.what}", where=str(artifact), details=exc.details,
                                 hint="pass the spec the artifact was built from (`exporter "
                                      "inspect` shows it)") from None
        eager = EagerRunner(module, inputs.rebuild)
        _check_outputs(manifest.signature.outputs, eager.run(list(inputs.tensors)), artifact)
        cases, warnings = make_cases(manifest.signature, inputs.tensors, inputs_file, seed)
        return validate(Path(artifact), eager, manifest.signature,
                        cases, gate=Tolerance.for_dtype(dtype), warnings=warnings,
                        preload=preload_for(manifest, spec.origin_file))


@dataclass
class PlainBisect:
    """The first failing case bisected to a partition (validation/bisect.py's
    ``Bisector``). It helps read a failure and must never replace it: if the bisect itself
    breaks, the build says so and reports the mismatch as it is."""

    prep: Prepared
    cases: list[Case]
    eager: EagerRunner
    dtype: str

    def __call__(self, artifact: Path, manifest: Manifest, record: dict) -> dict | None:
        failing = next(row["case"] for row in record["outputs"] if not row["passed"])
        case = next(c for c in self.cases if c.name == failing)
        prep = self.prep
        try:
            with torch.no_grad():
                eager_outputs = self.eager.run(list(case.inputs.values()))
                return bisect(artifact, manifest, prep.program, case, eager_outputs,
                              self.dtype, prep.target.device,
                              {plan.name: plan.program for plan in prep.placement.plans})
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            log.warning("could not bisect the mismatch (%s: %s)", type(exc).__name__, exc)
            log.debug("the bisect's traceback", exc_info=True)
            return None


def eager_runner(prep: Prepared, settings: BuildSettings) -> EagerRunner:
    """The float64 reference is always the user's model; at fp16/bf16 the same-dtype
    comparison point is the cast model the build captured (``model.to(dtype)``)."""
    return EagerRunner(prep.model.module, prep.captured.inputs.rebuild,
                       same_dtype=prep.captured_module if settings.dtype != "fp32" else None)


def settings_used(settings: BuildSettings, model: ModelSpec) -> dict:
    """The settings as given, with what the loader chose where they left it open (hf: the
    task read from the config, the default --seq-len), so the manifest says what was built."""
    used = settings.model_dump(mode="json", exclude=NOT_RECORDED)
    for key, value in model.details.items():
        if key in used and used[key] is None:
            used[key] = value
    return used


@contextlib.contextmanager
def recorded_spec(manifest: Manifest, artifact: str | Path):
    """The manifest's spec is as the build was given it, often relative to where it ran:
    from elsewhere it names nothing, and the error says so and what to give instead."""
    try:
        yield
    except UserInputError as exc:
        exc.hint = (f"the artifact records the spec it was built from, "
                    f"{manifest.source['spec']!r}, as given to the build (relative paths "
                    f"are from where it ran); give --model with the model's spec from here "
                    f"(or run this from the build's folder)")
        exc.where = exc.where or str(artifact)
        raise


def _check_outputs(specs, outputs: list[torch.Tensor], artifact: str | Path) -> None:
    """The model must give the artifact's outputs (count, rank, static sizes): another
    model that happens to take the same inputs is a usage error, not a failed artifact."""
    if len(outputs) != len(specs):
        problems = [f"the model gives {len(outputs)} output tensor(s), the artifact "
                    f"{len(specs)} ({', '.join(s.name for s in specs)})"]
    else:
        problems = [f"output '{spec.name}': the artifact gives {spec.describe().split(': ')[1]}"
                    f", the model {str(out.dtype).removeprefix('torch.')}{list(out.shape)}"
                    for spec, out in zip(specs, outputs)
                    if out.dim() != len(spec.shape) or any(
                        d.size is not None and d.size != got for d, got in zip(spec.shape,
                                                                              out.shape))]
    if problems:
        raise UserInputError("the model spec's outputs do not fit the artifact: it was built "
                             "from another model", where=str(artifact), details=problems,
                             hint="pass the spec the artifact was built from (`exporter "
                                  "inspect` shows it)")
