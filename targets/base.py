"""The target contract (docs/architecture.md, Contracts -> Target).

A target declares, as data: its name, device, the backend kind that runs its
partitions, its typed options, which ops it supports and why (``supports``), its
default pass pipeline, and how to lower one partition to files + metadata (``lower``);
and, as hooks with defaults, what the core would otherwise hard-code about it: the
packages it needs to build and to run, what ``exporter doctor`` checks, which values bisect
can read inside one of its partitions, the extra baselines ``exporter bench`` can time, and the
colour the report draws it in. The core asks; it never names a target.
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
from passes.quantize.quantize import QuantizePT2E
from passes.quantize.quantize_experts import QuantizeExperts
from passes.quantize.quantize_weight_only import QuantizeWeightOnly
from runtime.manifest import Partition, Requirements
from targets.options import FallbackPolicy, TargetOptions


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
class Check:
    """One row of ``exporter doctor``: ``ok`` / ``problem`` / ``absent`` (an optional part
    not installed), what was found, and the fix."""

    name: str
    status: str
    found: str
    fix: str = ""


OK, PROBLEM, ABSENT = "ok", "problem", "absent"


@dataclass(frozen=True)
class LowerOptions:
    """What the build settings say to a target. Defaults live in exporter.settings; the
    target's own options arrive typed, as its ``Options`` model."""

    work_dir: Path
    target: TargetOptions = field(default_factory=TargetOptions)
    cpu_isa: str = "auto"
    dtype: str = "fp32"
    fuse: bool = True
    quantize: str | None = None
    calibration: Sequence = ()  # int8-static input sets
    fallback: FallbackPolicy = FallbackPolicy.WARN
    deterministic: bool = False
    partition: str | None = None  # the partition being lowered (names logs and errors)
    log_dir: Path | None = None  # where compiler logs go on failure (kept after the build)
    # Weights stay out of the partition's files: the lowering returns them in
    # ``Lowered.weights`` and the build stores them once for every partition that reads
    # them (a generating artifact's prefill and decode share one copy).
    shared_weights: bool = False

    @property
    def logs(self) -> Path:
        return self.log_dir or self.work_dir


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
    # executor asks for them (runtime/shared_weights.py); empty otherwise.
    weights: dict = field(default_factory=dict)


# A bench baseline: (artifact's Program, flat inputs) -> a callable timed like the artifact.
Baseline = Callable[[object, list], Callable[[], object]]


STEP_ATTENTION = ("grouped", "fused", "sdpa")  # Target.step_attention's values


class Target(abc.ABC):
    name: str
    device: str  # where the delegated partitions run: "cpu" or "cuda"
    backend: str  # the runtime executor kind
    description: str
    Options: type[TargetOptions] = TargetOptions  # its typed options (flags, TOML table)
    # --quantize recipes this target runs -> how (the report says it); none by default
    quant_recipes: dict[str, str] = {}
    # (distribution, pip extra of this project) the build needs beyond torch: doctor lists them
    build_packages: tuple[tuple[str, str], ...] = ()
    # (extra name, requirements) a device needs to run its partitions: the runtime wheel
    runtime_extra: tuple[str, tuple[str, ...]] | None = None
    # modules that register this backend's executor (plug-ins): the validation process
    # imports them, as a device does through the entry point
    runtime_modules: tuple[str, ...] = ()
    loggers_to_quiet: tuple[str, ...] = ()  # chatty third-party loggers (the CLI quiets them)
    # the heavy modules its lowering imports: `exporter matrix` imports them once in each
    # warm worker, not once per cell (exporter/matrix/warm.py); none must start threads
    build_modules: tuple[str, ...] = ()
    # how a generating step's attention reaches this target (exporter/lm/attention.py):
    # "grouped": the cache read in place by plain matmuls (no repeated heads, no concat);
    # "fused": full-attention layers as runtime/generation/attention_op.py's op, which
    # the target lowers to one kernel; "sdpa": one SDPA call over concat(past, new) with
    # the query heads grouped by its enable_gqa (GPU attention kernels)
    step_attention: str = "grouped"  # one of STEP_ATTENTION
    # A generating build's one-token step is its prefill program (a length of 1 to the
    # chunk) rather than a program of its own: where a second program would cost a second
    # copy of the weights at run time and the fixed length buys nothing measurable
    # (exporter/lm/build.py, onnx).
    decode_on_prefill: bool = False
    # Whether its partitions exchange complex tensors with the CPU fallback as torch
    # does: ONNX has no complex type (torch.onnx carries one as real pairs, [..., 2]), so
    # a complex value must not cross between an onnx partition and the fallback
    # (exporter/builder/placement.py keeps the ops on either side together).
    complex_boundaries: bool = True
    colour: str = "#868e96"  # the report's colour for ops placed here

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
        given = options.target
        if isinstance(given, self.Options):
            return given
        if type(given) is TargetOptions:
            return self.Options()
        raise TypeError(f"target {self.name} got {type(given).__name__}, not "
                        f"{self.Options.__name__}")

    def shares_weights(self, options: LowerOptions) -> bool:
        """Whether partitions built with these options can take their weights from the
        artifact's one shared copy (``LowerOptions.shared_weights``), as a generating
        artifact's two entry points want; False where the lowering must own them."""
        return True

    def nondeterminism(self, options: LowerOptions) -> list[str]:
        """What can make two builds of one spec differ in bytes (the manifest says so)."""
        return []

    def doctor_checks(self) -> list[Check]:
        """Rows for `exporter doctor` beyond its packages and availability."""
        return []

    def runtime_packages(self, partition: Partition) -> dict[str, str | None]:
        """Distributions (and the versions it was built with) a device needs to run one
        of this target's partitions, beyond torch, numpy and safetensors: the bundle's lock."""
        return {}

    def intermediate_values(self, folder: Path, partition: Partition,
                            wanted: dict[str, torch.dtype], inputs: list,
                            shared: dict[str, torch.Tensor] | None = None
                            ) -> list[tuple[str, str, torch.Tensor]]:
        """For bisect, once it has blamed one of this target's partitions (its files
        extracted under ``folder``): ``(backend op, value name, value)`` for the values of
        ``wanted`` (node name of the partition's program -> dtype) the backend can expose,
        run on ``inputs``, in its own graph order. ``shared``: the tensors the partition
        reads from the artifact's shared store, by the names its meta gives them. Empty
        where it cannot say; the exporter compares them with eager's."""
        return []

    def op_times(self, folder: Path, partition: Partition, inputs: list, runs: int
                 ) -> list[dict]:
        """For `exporter bench`: each node's time inside one of this target's partitions
        (its files extracted under ``folder``), from the backend's own profiler, over
        ``runs`` calls on ``inputs``: rows ``{node, op, median_ms, calls}`` and, where the
        backend says, ``provider``. Empty where it cannot say (bench then skips the copy)."""
        return []

    def graph_nodes(self, read: Callable[[str], bytes], partition: Partition, limit: int
                    ) -> list[dict] | None:
        """For `exporter report`: the graph one of this target's partitions runs, read from
        its files (``read(entry name) -> bytes``, verified), as at most ``limit`` rows
        ``{name, op, inputs, outputs, origin}`` (tensors as ``{name, type, weight}``;
        ``origin`` the ATen node it came from, or ""). None where the files hold no
        readable graph (a compiled library): the report lists the ATen ops instead."""
        return None

    def baselines(self) -> dict[str, Baseline]:
        """Extra `exporter bench` baselines this target's artifacts can be timed against."""
        return {}

    def quantizer(self, recipe: str) -> object:
        """The torchao PT2E quantizer for one of ``quant_recipes`` (weight-only recipes
        use torchao's tensor subclasses instead, the same on every target)."""
        raise NotImplementedError(f"target {self.name} declares no quantizer")

    def quantize_pass(self, options: LowerOptions) -> Pass | None:
        recipe = options.quantize
        if not recipe:
            return None
        if recipe not in self.quant_recipes:  # the pipeline checks first; this is a bug guard
            raise ValueError(f"target {self.name} cannot run recipe {recipe}")
        how = self.quant_recipes[recipe]
        if recipe in QuantizeWeightOnly.recipes:
            return QuantizeWeightOnly(recipe, how, self.device)
        return QuantizePT2E(recipe, lambda: self.quantizer(recipe), list(options.calibration),
                            how)

    def base_requirements(self) -> Requirements:
        return Requirements(arch=platform.machine(), torch=torch.__version__)


def pipeline(options: LowerOptions, quantize: Pass | None = None,
             fusions: Sequence[Callable[[], Pass]] = ()) -> list[Pass]:
    """A target's pass list, in order: dead-code cleanup first (PT2E's prepare failed on
    dead code, and the fusion patterns assume single users); the target's fusion passes
    (targets.fusion, unless --no-fuse); with --quantize, an MoE's experts
    (passes/quantize/quantize_experts.py), then the quantizer. (--dtype is not a
    pass: the model is cast before capture, exporter/model/cast.py says why.)"""
    passes: list[Pass] = [EliminateDeadCode()]
    if options.fuse:
        passes += [make() for make in fusions]
    if options.quantize:  # an MoE's experts, on the CPU fallback whatever the target
        passes.append(QuantizeExperts(options.quantize))
    if quantize is not None:
        passes.append(quantize)
    return passes
