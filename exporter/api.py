"""The Python API; the CLI calls these same functions.

    import exporter, runtime
    artifact = exporter.build(model, (x,), target="cpu", out="model.artifact")
    program = runtime.load(artifact.path)
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any

import torch

from exporter.errors import UserInputError
from exporter.builder.pipeline import BuildResult
from exporter.builder.pipeline import build as _build
from exporter.builder.preload import preload_for
from exporter.progress import ProgressCallback, StageHook, callback_stage, quiet_stage
from exporter.settings import BuildSettings
from exporter.model.hf_spec import HfOptions
from exporter.model.spec import ModelSpec, load_spec
from exporter.validation.gates import Tolerance
from exporter.validation.validate import EagerRunner
from exporter.validation.validate import validate as _validate
from exporter.validation.inputs import make_cases
from runtime import read_manifest
from runtime.errors import InputMismatchError
from runtime.program.flat_inputs import flatten_inputs
from runtime.program.torch_program import check_inputs

Artifact = BuildResult


def build(model: str | torch.nn.Module, example_args: tuple | None = None, *,
          example_kwargs: dict | None = None, dynamic_shapes: Any = None,
          progress: ProgressCallback | None = None, **settings: Any) -> Artifact:
    """Build an artifact from a spec string or a module + example args.

    ``settings`` are the fields of ``BuildSettings`` (target, out, dynamic, inputs, ...).
    ``progress`` is called with a ``StageEvent`` as each stage starts and ends; the
    stages are also logged on the ``exporter`` logger (INFO)."""
    built = BuildSettings(**settings)
    if built.task == "text-generation":  # a causal LM: the build makes its own inputs
        return run_build(model, built, stage=callback_stage(progress))
    if isinstance(model, torch.nn.Module):
        if example_args is None:
            raise UserInputError("build(module) needs example_args",
                                 hint="exporter.build(model, (x,), target='cpu')")
        spec: str | ModelSpec = ModelSpec(
            source=f"python:{type(model).__qualname__}", module=model.eval(),
            args=tuple(example_args), kwargs=dict(example_kwargs or {}),
            dynamic_shapes=dynamic_shapes, origin_file=inspect.getsourcefile(type(model)))
    else:
        spec = model
    return run_build(spec, built, stage=callback_stage(progress))


def run_build(spec: str | ModelSpec | torch.nn.Module, settings: BuildSettings, *,
              stage: StageHook = quiet_stage) -> Artifact:
    """The build for the settings' task: a plain forward (exporter/builder/pipeline.py), or
    prefill + decode over a KV cache for ``text-generation`` (exporter/lm/build.py)."""
    if settings.task == "text-generation":
        from exporter.lm.build import build_generating
        return build_generating(spec, settings, stage=stage)
    return _build(spec, settings, stage=stage)


def validate(artifact: str | Path, model: str | ModelSpec | None = None, *,
             inputs_file: Path | None = None, dtype: str = "fp32", seed: int = 0) -> dict:
    """Re-check an existing artifact against eager PyTorch; returns the validation record.
    ``model`` None: the spec the artifact was built from (its manifest's, with the build's
    hf: options). A generating artifact is judged by the generation gate its build used."""
    manifest = read_manifest(artifact)
    if manifest.generation:
        if inputs_file is not None:
            raise UserInputError("--inputs does not apply to a generating artifact: it is "
                                 "judged on generating from its own prompts",
                                 where=str(artifact), hint="leave --inputs out")
        return _validate_generating(Path(artifact), manifest, model, seed)
    settings = manifest.build.get("settings", {})
    if model is None:
        with _recorded_spec(manifest, artifact):
            spec = load_spec(manifest.source["spec"], HfOptions.from_settings(settings))
    else:
        spec = model if isinstance(model, ModelSpec) else load_spec(model)
    device = manifest.partitions[0].device if manifest.partitions else "cpu"
    module = spec.module.to(device)
    inputs = flatten_inputs(spec.args, spec.kwargs)
    if len(inputs.tensors) != len(manifest.signature.inputs):
        raise UserInputError(
            f"the model spec gives {len(inputs.tensors)} input tensors but the artifact takes "
            f"{len(manifest.signature.inputs)}", where=str(artifact),
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
    return _validate(Path(artifact), eager, manifest.signature,
                     cases, gate=Tolerance.for_dtype(dtype), warnings=warnings,
                     preload=preload_for(manifest, spec.origin_file))


@contextlib.contextmanager
def _recorded_spec(manifest, artifact):
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


def _check_same_vocabulary(manifest, lm, artifact: Path) -> None:
    """--model naming another vocabulary than the artifact's: its prompts would index past
    one embedding table or the other (an IndexError in eager, exit 4, before this)."""
    from runtime.generation.layout import vocabulary
    ours, theirs = vocabulary(manifest.signature), lm.model.get_output_embeddings().weight.shape[0]
    if ours != theirs:
        raise UserInputError(f"the artifact's vocabulary has {ours} tokens "
                             f"and the model's {theirs}: it was built from another model",
                             where=str(artifact),
                             hint="give --model the spec the artifact was built from "
                                  f"({manifest.source['spec']!r})")


def _validate_generating(artifact: Path, manifest, model: str | None, seed: int) -> dict:
    from exporter.lm.gate import GenerationGate
    from exporter.lm.source import load_language_model
    from exporter.lm.validate import judge_generation
    if isinstance(model, ModelSpec):
        raise UserInputError("a generating artifact is validated against a transformers "
                             "model spec (hf:PATH or FILE.py:NAME)", where=str(artifact))
    settings = manifest.build.get("settings", {})
    with _recorded_spec(manifest, artifact) if model is None else contextlib.nullcontext():
        lm = load_language_model(model or manifest.source["spec"],
                                 HfOptions.from_settings(settings))
    _check_same_vocabulary(manifest, lm, artifact)
    gate = GenerationGate.for_build(settings.get("dtype") or "fp32", settings.get("quantize"),
                                    min_top1=settings.get("min_top1"),
                                    max_kl=settings.get("max_kl"))
    return judge_generation(artifact, manifest.generation, lm, gate, seed,
                            settings.get("validation_timeout_s"),
                            preload_for(manifest, lm.origin_file))


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
