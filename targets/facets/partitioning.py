"""What placement respects at a target's partition boundaries, beyond which ops it
supports (exporter/builder/placement.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Partitioning:
    # Whether its partitions exchange complex tensors with the CPU fallback as torch
    # does: ONNX has no complex type (torch.onnx carries one as real pairs, [..., 2]), so
    # a complex value must not cross between an onnx partition and the fallback
    # (placement keeps the ops on either side together).
    complex_boundaries: bool = True
