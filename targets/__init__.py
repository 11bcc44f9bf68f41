"""Targets, one folder each (targets/aoti/, targets/onnx/, targets/tvm/); the exporter
reaches them only through ``targets.registry``."""

from __future__ import annotations

from targets.base import (
                          ABSENT,
                          OK,
                          PROBLEM,
                          Availability,
                          Check,
                          Lowered,
                          LowerOptions,
                          Support,
                          Target,
                          base_requirements,
)
from targets.errors import LoweringError, TargetOptionError
from targets.facets import Generation, Packaging, Partitioning, Quantization, Tooling
from targets.options import FallbackPolicy, TargetOptions
from targets.registry import all_targets, for_backend, get_target, register

__all__ = ["ABSENT", "OK", "PROBLEM", "Availability", "Check", "FallbackPolicy", "Generation",
           "Lowered", "LowerOptions", "LoweringError", "Packaging", "Partitioning",
           "Quantization", "Support", "Target", "TargetOptionError", "TargetOptions",
           "Tooling", "all_targets", "base_requirements", "for_backend", "get_target",
           "register"]
