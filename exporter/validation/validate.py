"""Validation: the packaged artifact, loaded by the real runtime in another process,
against eager PyTorch (docs/architecture.md, "Validation is part of the build").

What counts as a match is the gate's (exporter/validation/gates.py): ``Tolerance`` for
float builds, ``QuantGate`` for --quantize builds. This module runs both sides and
assembles the manifest's validation record.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves

from exporter.errors import BuildError
from exporter.model.given_module import converted_copy
from exporter.validation.crash import KEEP_IT, crash_error, read_stage
from exporter.ship.archive_writer import write_artifact
from exporter.validation.process import Child
from exporter.validation.gates import FLOAT32_REFERENCE_FLOOR, Gate, error_text, nonfinite_text
from exporter.validation.inputs import Case
from runtime.format.manifest import Signature
from runtime.host import scratch
from runtime.host.tensorio import load_tensors, save_tensors

log = logging.getLogger(__name__)

RUN_CASES = ("runtime", "run-cases")  # the real runtime, in its own process


class ArtifactRun:
    """``python -m runtime run-cases`` on every case (or another ``command``: the module
    and the words before the artifact), started in the background so the build computes
    the eager references meanwhile; a crash there is a BuildError. The process is forked
    from a template that imported torch already (exporter/validation/process.py)."""

    def __init__(self, artifact: Path, cases: list[Case] | dict[str, torch.Tensor], *,
                 timeout: float = 900, preload: list[str] = (),
                 command: tuple[str, ...] = RUN_CASES) -> None:
        self.artifact, self.timeout = artifact, timeout
        self._tmp = scratch.make_dir("exporter-validate-")
        cases_path = self._tmp / "cases.safetensors"
        self._out_path = self._tmp / "out.safetensors"
        self._memory_path = self._tmp / "memory.json"
        self._stage_path = self._tmp / "stage.txt"  # where it is, should it die (crash.py)
        self.memory: dict = {}  # the peak the child measured (runtime/memory/peak.py)
        save_tensors(cases_path, cases if isinstance(cases, dict) else
                     {f"{c.name}/{k}": v for c in cases for k, v in c.inputs.items()})
        argv = [*command, str(artifact), "--cases", str(cases_path),
                "--out", str(self._out_path), "--stage-out", str(self._stage_path)]
        if command == RUN_CASES:
            argv += ["--memory-out", str(self._memory_path)]
        argv += [arg for source in preload for arg in ("--preload", source)]
        self._start = time.perf_counter()
        self._child = Child(argv, _child_env(), self._tmp)

    def results(self) -> dict[str, dict[str, torch.Tensor]]:
        """Wait for the child; its outputs as {case: {output name: tensor}}."""
        try:
            remaining = max(0.0, self.timeout - (time.perf_counter() - self._start))
            try:
                code = self._child.wait(remaining)
            except subprocess.TimeoutExpired as exc:
                self._child.close()
                raise BuildError(f"the artifact did not finish running the validation inputs "
                                 f"in {self.timeout:g} s", where=str(self.artifact),
                                 hint="a slow model may need more: validation_timeout_s in "
                                      "--config (seconds)") from exc
            if code != 0:
                raise crash_error(code, *self._child.output(), self.artifact,
                                  read_stage(self._stage_path))
            flat = load_tensors(self._out_path)
            if self._memory_path.exists():
                self.memory = json.loads(self._memory_path.read_text())
        finally:
            self.close()
        results: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in flat.items():
            case, _, name = key.partition("/")
            results.setdefault(case, {})[name] = tensor
        return results

    def close(self) -> None:
        self._child.close()  # e.g. the eager side raised: do not leave it running
        scratch.remove(self._tmp)


def _child_env() -> dict:
    # The child imports `runtime` from this same tree, installed or not.
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONFAULTHANDLER"] = "1"  # a fatal signal prints the Python frame it stopped
    return env


class EagerRunner:
    """Eager PyTorch on flat inputs, at the artifact's dtype and (if it allows) float64.

    ``same_dtype``, when given, is the model as the build captured it at fp16/bf16
    (exporter/model/cast.py), called like the model; otherwise the model itself is used."""

    def __init__(self, module: torch.nn.Module, rebuild: Callable,
                 same_dtype: torch.nn.Module | None = None) -> None:
        self.module, self.rebuild, self.same_dtype = module, rebuild, same_dtype
        self.device = _device_of(same_dtype or module)
        self._module64: torch.nn.Module | None = None

    def run(self, inputs: list[torch.Tensor], *, float64: bool = False) -> list[torch.Tensor]:
        module = self.module if float64 or self.same_dtype is None else self.same_dtype
        if float64:
            if self._module64 is None:
                self._module64 = converted_copy(self.module, self.device, torch.float64)
            module = self._module64
        # copies: a forward that writes into its inputs must not change the case's
        cast = [t.to(self.device, torch.float64 if float64 and t.is_floating_point()
                     else None, copy=True) for t in inputs]
        args, kwargs = self.rebuild(cast)
        with torch.no_grad():
            out = module(*args, **kwargs)
        return [t.detach().cpu() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def _device_of(module: torch.nn.Module) -> torch.device:
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def validate(artifact: Path, eager: EagerRunner, signature: Signature, cases: list[Case],
             *, gate: Gate, warnings: list[str] | None = None, preload: list[str] = (),
             timeout: float = 900, command: tuple[str, ...] | None = None) -> dict:
    """Run the artifact out of process and compare with eager, output by output, as
    ``gate`` judges; returns the manifest record. ``command``: the process that runs it,
    where not the Python runtime here (a cross build's: native_cases.py)."""
    start = time.perf_counter()
    run = ArtifactRun(artifact, cases, preload=preload, timeout=timeout,
                      command=command or RUN_CASES)
    try:
        references = [_references(eager, case, float64=gate.float64_reference)
                      for case in cases]
    except BaseException:
        run.close()
        raise
    eager_s = time.perf_counter() - start
    results = run.results()
    subprocess_s = time.perf_counter() - start
    reference_dtype = ("float64" if gate.float64_reference
                       and all(r[2] is None for r in references) else "float32")
    ref_note = next((r[2] for r in references if r[2] is not None), None)
    judges = [gate if note is None else gate.without_float64() for _, _, note in references]
    rows = []
    for case, judge, (same_dtype, ref, _) in zip(cases, judges, references):
        got = _ordered(results, case, signature)
        for spec, g, r, e in zip(signature.outputs, got, ref, same_dtype):
            rows.append({"case": case.name, "output": spec.name, **judge.judge(g, r, e)})
    passed = all(row["passed"] for row in rows)
    constant = constant_passes(signature, references, judges)
    warnings = list(warnings or []) + ([constant_warning(constant)] if constant else [])
    return {"passed": passed, "policy": gate.describe(),
            "reference_dtype": reference_dtype,
            "reference_note": ref_note, "cases": [c.describe() for c in cases],
            "outputs": rows, "warnings": warnings,
            # outputs the check cannot tell from a constant (constant_passes)
            "constant_would_pass": list(constant),
            # varies run to run: the build moves it out of the manifest (reproducible bytes)
            "measured": {"seconds": round(time.perf_counter() - start, 2),
                         "artifact_subprocess_seconds": round(subprocess_s, 2),
                         "eager_reference_seconds": round(eager_s, 2), "memory": run.memory}}


def constant_passes(signature: Signature, references: list[tuple], judges: list[Gate]
                    ) -> dict[str, str]:
    """The float outputs whose check proves (almost) nothing: zeros pass the gate in every
    case, or (over more than one value) one constant does, the midpoint of eager's values
    over the cases; so an artifact that returns it passes too. Random weights do this (a
    conv stack whose signal vanished to 1e-30). Output name -> what its values are."""
    found = {}
    for index, spec in enumerate(signature.outputs):
        pairs = [(ref[index], same[index]) for same, ref, _ in references]
        finite = [r[torch.isfinite(r)].double() for r, _ in pairs if r.is_floating_point()]
        if len(finite) < len(pairs) or not all(f.numel() for f in finite):
            continue  # integer/bool outputs match exactly; all NaN/Inf: nothing to judge
        low, high = min(float(f.min()) for f in finite), max(float(f.max()) for f in finite)
        values = f"largest |value| {max(abs(low), abs(high)):.3g}, spread {high - low:.3g}"
        for kind, fill in (("zeros", 0.0), ("one constant", (low + high) / 2)):
            if kind != "zeros" and sum(f.numel() for f in finite) < 2:
                continue  # one value: any check of it is against "a constant"
            if all(judge.judge(torch.full_like(e, fill), r, e)["passed"]
                   for judge, (r, e) in zip(judges, pairs)):
                found[spec.name] = f"{spec.name} ({values}: {kind} would pass)"
                break
    return found


def constant_warning(constant: dict[str, str]) -> str:
    """One warning for the outputs constant_passes found."""
    shown = "; ".join(list(constant.values())[:3]) + (
        f"; and {len(constant) - 3} more" if len(constant) > 3 else "")
    return (f"validation cannot tell {len(constant)} output(s) from a constant, so an "
            f"artifact returning one would pass as well: {shown}. Random or untrained "
            "weights often do this: validate with inputs or weights that make these outputs "
            "vary (--inputs, or the trained model)")


def _references(eager: EagerRunner, case: Case, *, float64: bool = True
                ) -> tuple[list, list, str | None]:
    """(eager at the artifact's dtype, float64 reference, note if float64 was not possible).
    Without ``float64`` the reference is eager at the artifact's dtype itself."""
    flat_in = list(case.inputs.values())
    same_dtype = eager.run(flat_in)
    if not float64:
        return same_dtype, same_dtype, None
    try:
        return same_dtype, eager.run(flat_in, float64=True), None
    except Exception as exc:  # some kernels have no float64 version: fall back, say so
        return same_dtype, same_dtype, (f"float64 reference failed ({type(exc).__name__}: "
                                        f"{exc}); used float32, with a floor of "
                                        f"{FLOAT32_REFERENCE_FLOOR:g} x max(1, max|ref|)")


def _ordered(results: dict, case: Case, signature: Signature) -> list[torch.Tensor]:
    got = results.get(case.name, {})
    return [got[spec.name] for spec in signature.outputs]


def summarize_failure(record: dict) -> list[str]:
    lines = []
    for row in record["outputs"]:
        if row["passed"]:
            continue
        if "problem" in row:
            lines.append(f"{row['case']} / {row['output']}: {row['problem']}")
        elif row["criterion"] == "quantized":
            lines.append(f"{row['case']} / {row['output']}: SQNR {row['sqnr_db']:.1f} dB, "
                         f"{row['min_sqnr_db'] - row['sqnr_db']:.1f} dB short of "
                         f"{row['min_sqnr_db']:g}; cosine {row['cosine']:.4f}, "
                         f"{row['min_cosine'] - row['cosine']:.4f} short of {row['min_cosine']:g}")
        elif row["criterion"] == "exact":
            lines.append(f"{row['case']} / {row['output']}: {row['mismatches']} elements differ "
                         "from eager (integer output, must match exactly)")
        else:
            lines.append(f"{row['case']} / {row['output']}: {error_text(row)}; eager "
                         f"float32's own error {row['eager_max_abs_err']:.3g}; "
                         f"{nonfinite_text(row)}")
    return lines


def keep_failed(out: Path, manifest, files: dict) -> Path:
    """--keep-failed (a plain or a generating build): the artifact that failed validation,
    beside ``out`` under a name that says so, for `exporter inspect` or a run by hand."""
    failed = out.with_name(f"{out.stem}.FAILED-VALIDATION{out.suffix}")
    write_artifact(failed, manifest.to_dict(), files)
    return failed


def crashed(error: BuildError, out: Path, manifest, files: dict, keep: bool) -> BuildError:
    """The validation process's crash, said of ``out`` (not the staging file), the
    artifact kept first with --keep-failed."""
    kept = keep_failed(out, manifest, files) if keep else None
    hint = error.hint or ""
    if kept:
        hint = f"the artifact was kept at {kept}; " + hint.replace(f", or {KEEP_IT}", "")
    return BuildError(error.what, where=str(kept or out), details=error.details, hint=hint)
