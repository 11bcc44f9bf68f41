"""What the build knows before it lowers (``--dry-run`` reports it): a module of its own
so the stages that take it (lowering, validation) need not import the pipeline back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.export import ExportedProgram

from exporter.builder.placement import Placement
from exporter.model.capture import Captured
from exporter.model.spec import ModelSpec
from targets import LowerOptions, Target


@dataclass(kw_only=True)
class Prepared:
    """Everything up to lowering: what ``--dry-run`` reports (built by name: a dozen
    fields in a row are easy to swap)."""

    target: Target
    model: ModelSpec
    captured: Captured
    program: ExportedProgram
    pass_records: list[dict]
    placement: Placement
    warnings: list[str]
    out: Path
    options: LowerOptions  # what the settings say to the target (per partition: replaced)
    calibration: list = field(default_factory=list)  # --quantize int8-static input sets
    activations: dict = field(default_factory=dict)  # memory_plan.plan of the program
    captured_module: torch.nn.Module | None = None  # what was captured (the cast model)
    # The artifact keeps one weight store for several programs (a generating build's entry
    # points): the CPU-fallback partitions put their tensors there, whether or not the
    # target's own partitions can (options.shared_weights; the cpu target's int8 recipes
    # pack theirs into each library, but an MoE's experts on the fallback need not).
    shared_store: bool = False
