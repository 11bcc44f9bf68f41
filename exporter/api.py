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

from exporter.builder.pipeline import BuildResult
from exporter.builder.pipeline import build as _build
from exporter.builder import caller_state
from exporter.builder.plain import PlainBuild
from exporter.errors import UserInputError
from exporter.kinds import GENERATING, BuildKind, kind_name, kind_name_of
from exporter.model.given_module import factories_left_as_given, left_as_given
from exporter.model.spec import ModelSpec
from exporter.progress import ProgressCallback, StageHook, callback_stage, quiet_stage
from exporter.settings import BuildSettings, settings_from
from runtime import read_manifest

Artifact = BuildResult


def build_kind(settings: BuildSettings) -> BuildKind:
    """The kind of build the settings ask for (exporter/kinds.py)."""
    return _kind(kind_name(settings))


def kind_of(manifest) -> BuildKind:
    """The kind of build that made an artifact."""
    return _kind(kind_name_of(manifest))


def _kind(name: str) -> BuildKind:
    if name == GENERATING:  # imported only here: a plain build needs no transformers
        from exporter.lm.build import GeneratingBuild
        return GeneratingBuild()
    return PlainBuild()


def build(model: str | torch.nn.Module, example_args: tuple | None = None, *,
          example_kwargs: dict | None = None, dynamic_shapes: Any = None,
          progress: ProgressCallback | None = None, **settings: Any) -> Artifact:
    """Build an artifact from a spec string or a module + example args.

    ``settings`` are the fields of ``BuildSettings`` (target, out, dynamic, inputs, ...).
    ``progress`` is called with a ``StageEvent`` as each stage starts and ends; the
    stages are also logged on the ``exporter`` logger (INFO)."""
    built = settings_from(settings)
    kind = build_kind(built)
    with _given(model), factories_left_as_given(), \
            caller_state.left_alone(quantizes=built.quantize is not None):
        if not isinstance(model, torch.nn.Module):
            return _build(model, built, stage=callback_stage(progress), kind=kind)
        return _build_module(model, example_args, example_kwargs, dynamic_shapes, built,
                             kind, progress)


def _given(spec: Any) -> contextlib.AbstractContextManager:
    """A caller's module, or a ModelSpec holding one, left as given (exporter/model/
    given_module.py); a spec string's module is the build's own, unless the caller is in
    ``factories_left_as_given`` (the Python API's build and validate are)."""
    module = spec.module if isinstance(spec, ModelSpec) else spec
    return (left_as_given(module) if isinstance(module, torch.nn.Module)
            else contextlib.nullcontext())


def _build_module(model: torch.nn.Module, example_args: tuple | None,
                  example_kwargs: dict | None, dynamic_shapes: Any, built: BuildSettings,
                  kind: BuildKind, progress: ProgressCallback | None) -> Artifact:
    if not kind.makes_own_inputs:
        if example_args is None:
            raise UserInputError("build(module) needs example_args",
                                 hint="exporter.build(model, (x,), target='cpu')")
        spec: str | ModelSpec | torch.nn.Module = ModelSpec(
            source=f"python:{type(model).__qualname__}", module=model.eval(),
            args=tuple(example_args), kwargs=dict(example_kwargs or {}),
            dynamic_shapes=dynamic_shapes, origin_file=inspect.getsourcefile(type(model)))
    else:
        spec = model
    return _build(spec, built, stage=callback_stage(progress), kind=kind)


def run_build(spec: str | ModelSpec | torch.nn.Module, settings: BuildSettings, *,
              stage: StageHook = quiet_stage) -> Artifact:
    """The build of the settings' kind: a plain forward (exporter/builder/plain.py), or
    prefill + decode over a KV cache (exporter/lm/build.py), through one pipeline."""
    with _given(spec), caller_state.left_alone(quantizes=settings.quantize is not None):
        return _build(spec, settings, stage=stage, kind=build_kind(settings))


def validate(artifact: str | Path, model: str | ModelSpec | None = None, *,
             inputs_file: Path | None = None, dtype: str = "fp32", seed: int = 0) -> dict:
    """Re-check an existing artifact against eager PyTorch; returns the validation record.
    ``model`` None: the spec the artifact was built from (its manifest's, with the build's
    hf: options). A generating artifact is judged by the generation gate its build used."""
    manifest = read_manifest(artifact)
    with _given(model), factories_left_as_given(), caller_state.left_alone():
        return kind_of(manifest).revalidate(Path(artifact), manifest, model, inputs_file,
                                            dtype, seed)
