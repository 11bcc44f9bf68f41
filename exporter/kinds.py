"""Build kinds: what one pipeline (exporter/builder/pipeline.py's ``build``) runs.

    prepare (load, capture, passes, partition: each entry point) -> lower -> manifest
    -> validate (its gate; on a miss its bisect) -> package

A plain build (exporter/builder/plain.py) has one entry point, a forward pass; a
generating build (exporter/lm/build.py) has prefill and decode over one KV cache. Which
kind a build is, and which kind an artifact was built by, is said here only:
``kind_name`` and ``kind_name_of`` (exporter/api.py's ``build_kind`` and ``kind_of`` give
the kind itself). This module imports nothing, so every room, and the settings' own
checks, can ask it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

PLAIN, GENERATING = "plain", "generating"
GENERATING_TASK = "text-generation"  # the --task that builds a generating artifact


def kind_name(settings: Any) -> str:
    """The kind of build the settings ask for (``BuildSettings.task``)."""
    return GENERATING if settings.task == GENERATING_TASK else PLAIN


def kind_name_of(manifest: Any) -> str:
    """The kind of build that made an artifact: a generating one has a generation section."""
    return GENERATING if manifest.generation is not None else PLAIN


@dataclass
class DryRunReport:
    """What ``--dry-run`` shows: each entry point's placement, the main one first."""

    as_json: dict
    placements: list[tuple[str | None, dict, list]]  # (entry point title, coverage, summary)
    warnings: list[str]
    model_details: dict = field(default_factory=dict)  # the loader's choices, one line


class BuildKind(ABC):
    """The stages a kind of build fills in; the pipeline runs them in order, times them,
    gives them a scratch folder and writes the artifact only once it passed."""

    name: ClassVar[str]
    # whether a weight-only --quantize keeps the activations at --dtype (a decoder's
    # memory-bound steps run so) or, as every other recipe, needs fp32 math
    weight_only_keeps_dtype: ClassVar[bool] = False
    # whether the build makes its own example inputs (a module needs no example args)
    makes_own_inputs: ClassVar[bool] = False
    validate_stage: ClassVar[str] = "validate (subprocess)"

    @abstractmethod
    def prepare(self, spec: Any, settings: Any, timed: Callable) -> Any:
        """Load, capture, run the passes and partition each entry point (no compiling)."""

    @abstractmethod
    def output(self, prepared: Any) -> Path:
        """Where the artifact goes (checked while preparing)."""

    @abstractmethod
    def lower(self, prepared: Any, settings: Any, work_dir: Path, timed: Callable) -> Any:
        """Each partition to files, in ``work_dir``."""

    @abstractmethod
    def manifest(self, prepared: Any, lowered: Any, settings: Any, work_dir: Path
                 ) -> tuple[Any, dict[str, Path], dict]:
        """The manifest (validation left to fill in), the artifact's files by entry name,
        and what was measured (reported, never written into the manifest)."""

    @abstractmethod
    def gate(self, settings: Any) -> Any:
        """The accuracy judge (exporter/validation/gates.py's ``Verdict``)."""

    @abstractmethod
    def validate(self, prepared: Any, manifest: Any, files: dict[str, Path],
                 settings: Any) -> dict:
        """The validation record of the staged artifact, which passed; a miss raises
        ``ValidationFailedError`` with the bisect's finding where its gate bisects. The
        record's ``staged`` (exporter/ship/archive_writer.py's ``Staged``), where given,
        is the validated file the package stage finishes, so the bytes shipped are the
        bytes checked."""

    @abstractmethod
    def dry_run_report(self, prepared: Any) -> DryRunReport:
        """What ``prepare`` decided, as ``--dry-run`` shows it."""

    @abstractmethod
    def revalidate(self, artifact: Path, manifest: Any, model: Any, inputs_file: Path | None,
                   dtype: str, seed: int) -> dict:
        """``exporter validate``: an existing artifact against eager PyTorch."""
