"""The target contract (DESIGN.md, Contracts -> Target).

A target declares, as data: its name, device, the backend kind that runs its
partitions, which ops it supports and why (``supports``), its default pass
pipeline, and how to lower one partition to files + metadata (``lower``).
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
from passes.dead_code import EliminateDeadCode
from passes.quantize import QuantizePT2E
from passes.quantize_weight_only import QuantizeWeightOnly
from runtime.manifest import Requirements


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str


@dataclass(frozen=True)
class Availability:
    """Whether this machine can build for the target, and why not."""

    ok: bool
    reason: str


@dataclass(frozen=True)
class LowerOptions:
    """What the build settings say to a target. Defaults live in exporter.settings."""

    work_dir: Path
    cpu_isa: str = "auto"
    dtype: str = "fp32"
    autotune: bool = False
    log_dir: Path | None = None  # where compiler logs go on failure (kept after the build)
    extra: dict = field(default_factory=dict)


@dataclass
class Lowered:
    """One lowered partition: files (name relative to the partition folder -> path) and meta."""

    files: dict[str, Path]
    meta: dict
    requirements: Requirements
    notes: list[str] = field(default_factory=list)  # warnings for the user and the manifest


class Target(abc.ABC):
    name: str
    device: str  # where the delegated partitions run: "cpu" or "cuda"
    backend: str  # the runtime executor kind
    description: str
    # --quantize recipes this target runs -> how (the report says it); none by default
    quant_recipes: dict[str, str] = {}

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

    def nondeterminism(self, options: LowerOptions) -> list[str]:
        """What can make two builds of one spec differ in bytes (the manifest says so)."""
        return []

    def quantizer(self, recipe: str) -> object:
        """The torchao PT2E quantizer for one of ``quant_recipes`` (weight-only recipes
        use torchao's tensor subclasses instead, the same on every target)."""
        raise NotImplementedError(f"target {self.name} declares no quantizer")

    def quantize_pass(self, options: LowerOptions) -> Pass | None:
        recipe = options.extra.get("quantize")
        if not recipe:
            return None
        if recipe not in self.quant_recipes:  # the pipeline checks first; this is a bug guard
            raise ValueError(f"target {self.name} cannot run recipe {recipe}")
        how = self.quant_recipes[recipe]
        if recipe in QuantizeWeightOnly.recipes:
            return QuantizeWeightOnly(recipe, how)
        return QuantizePT2E(recipe, lambda: self.quantizer(recipe),
                            options.extra.get("calibration") or [], how)

    def base_requirements(self) -> Requirements:
        return Requirements(arch=platform.machine(), torch=torch.__version__)


def pipeline(options: LowerOptions, quantize: Pass | None = None,
             fusions: Sequence[Callable[[], Pass]] = ()) -> list[Pass]:
    """A target's pass list, in order: dead-code cleanup first (PT2E's prepare failed on
    dead code, and the fusion patterns assume single users); the target's fusion passes
    (targets.fusion, unless --no-fuse); the quantizer if --quantize. (--dtype is not a
    pass: the model is cast before capture, exporter/model/cast.py says why.)"""
    passes: list[Pass] = [EliminateDeadCode()]
    if options.extra.get("fuse", True):
        passes += [make() for make in fusions]
    if quantize is not None:
        passes.append(quantize)
    return passes
