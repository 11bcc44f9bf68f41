"""The target contract (docs/architecture.md, Contracts -> Target).

The required part, which a new target fills: its name, device, the backend kind that
runs its partitions, its typed options, which ops it supports and why (``supports``),
its default pass pipeline, and how to lower one partition to files + metadata
(``lower``). Everything else the core asks a target is an optional facet with
defaults (targets/facets/): its quantization recipes, how generating builds reach it,
what placement respects at its boundaries, its packages, and what the tools (doctor,
bisect, bench, report) ask it. The core asks; it never names a target.
"""

from __future__ import annotations

import abc
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from passes.base import Pass
from passes.cleanup.dead_code import EliminateDeadCode
from passes.cleanup.global_pool import GlobalAveragePool
from passes.cleanup.shape_mutations import ShapeMutationsAsViews
from passes.quantize.quantize_experts import QuantizeExperts
from runtime.format.manifest import Requirements
from targets.facets import (
    ABSENT,
    OK,
    PROBLEM,
    STEP_ATTENTION,
    Baseline,
    Check,
    Generation,
    Packaging,
    Partitioning,
    Quantization,
    Tooling,
)
from targets.options import LowerOptions, TargetOptions

__all__ = ["ABSENT", "CORE", "FACETS", "OK", "PROBLEM", "STEP_ATTENTION", "Availability",
           "Baseline", "Check", "LowerOptions", "Lowered", "Support", "Target",
           "base_requirements", "pipeline"]


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str


@dataclass(frozen=True)
class Availability:
    """Whether this machine can build for the target, and why not."""

    ok: bool
    reason: str


@dataclass
class Lowered:
    """One lowered partition: files (name relative to the partition folder -> path) and meta."""

    files: dict[str, Path]
    meta: dict
    requirements: Requirements
    notes: list[str] = field(default_factory=list)  # warnings for the user and the manifest
    # how long its steps took: measured, reported, never in the manifest (rebuilds match)
    seconds: dict[str, float] = field(default_factory=dict)
    # With ``LowerOptions.shared_weights``: the tensors the partition reads, by the name its
    # executor asks for them (runtime/memory/shared_weights.py); empty otherwise.
    weights: dict = field(default_factory=dict)
    # The executor kind that runs these files where it is not the target's ``backend``: a
    # target that lowers a partition several ways keeps one (cpu: targets/aoti/choice.py),
    # and ``choice`` records which, why, and each candidate's figures, for the manifest.
    backend: str | None = None
    choice: dict | None = None


# The contract's required part (docs/adding-a-target.md's first table); the test suite
# checks that Target holds exactly these, own_options and the facets.
CORE = ("name", "device", "backend", "description", "Options",
        "availability", "supports", "default_passes", "lower")
FACETS = ("quantization", "generation", "partitioning", "packaging", "tooling")


class Target(abc.ABC):
    name: str
    device: str  # where the delegated partitions run: "cpu" or "cuda"
    backend: str  # the runtime executor kind
    description: str
    Options: type[TargetOptions] = TargetOptions  # its typed options (flags, TOML table)

    @abc.abstractmethod
    def availability(self) -> Availability:
        """Checked before any work starts; `exporter targets` shows it."""

    @abc.abstractmethod
    def supports(self, node: Node) -> Support:
        """Whether one ATen call node can run in this target's partitions, and why."""

    @abc.abstractmethod
    def default_passes(self, options: LowerOptions) -> list[Pass]:
        """The pass pipeline, in order."""

    @abc.abstractmethod
    def lower(self, program: ExportedProgram, options: LowerOptions) -> Lowered:
        """Compile one partition's program into files under options.work_dir."""

    def own_options(self, options: LowerOptions) -> TargetOptions:
        """``options.target``, typed as this target's ``Options`` (their defaults where the
        caller gave none)."""
        return options.target_as(self.Options)

    # Optional facets (targets/facets/), shared defaults: a target replaces what it needs.
    quantization: Quantization = Quantization()
    generation: Generation = Generation()
    partitioning: Partitioning = Partitioning()
    packaging: Packaging = Packaging()
    tooling: Tooling = Tooling()


def base_requirements() -> Requirements:
    """What every artifact built here needs: this machine's architecture and torch."""
    return Requirements(arch=platform.machine(), torch=torch.__version__)


def pipeline(options: LowerOptions, quantize: Pass | None = None,
             fusions: Sequence[Callable[[], Pass]] = ()) -> list[Pass]:
    """A target's pass list, in order: in-place shape changes as views, so partitions
    and backends see what reads them (passes/cleanup/shape_mutations.py); dead-code
    cleanup (PT2E's prepare failed on dead code, and the fusion patterns assume single
    users); a pool whose one window spans its input as the mean it is (backends walk
    the whole window: passes/cleanup/global_pool.py); the target's fusion passes
    (targets.fusion, unless --no-fuse); with --quantize, an MoE's experts
    (passes/quantize/quantize_experts.py), then the quantizer. (--dtype is not a
    pass: the model is cast before capture, exporter/model/cast.py says why.)"""
    passes: list[Pass] = [ShapeMutationsAsViews(), EliminateDeadCode(), GlobalAveragePool()]
    if options.fuse:
        passes += [make() for make in fusions]
    if options.quantize:  # an MoE's experts, on the CPU fallback whatever the target
        passes.append(QuantizeExperts(options.quantize))
    if quantize is not None:
        passes.append(quantize)
    return passes
