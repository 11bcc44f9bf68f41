"""Targets, one module each. ``TARGETS`` is the registry the exporter reads."""

from __future__ import annotations

from runtime.errors import UserInputError
from targets.base import Availability, Lowered, LowerOptions, Support, Target
from targets.cpu import CpuTarget
from targets.cuda import CudaTarget
from targets.onnx import OnnxTarget
from targets.tvm import TvmTarget

TARGETS: dict[str, Target] = {t.name: t for t in (CpuTarget(), CudaTarget(), OnnxTarget(),
                                                       TvmTarget())}

__all__ = ["Availability", "Lowered", "LowerOptions", "Support", "TARGETS", "Target",
           "get_target"]


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UserInputError(f"unknown target '{name}'",
                             hint=f"choose one of: {', '.join(TARGETS)}") from None
