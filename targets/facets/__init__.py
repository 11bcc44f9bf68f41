"""A target's optional facets (docs/adding-a-target.md): what the core asks a target
beyond its required part, each a frozen dataclass whose defaults fit a target with
nothing to say. A target sets data by constructing one (``Tooling(colour=...)``) and
behaviour by subclassing one beside it (``class OnnxTooling(Tooling)``)."""

from __future__ import annotations

from targets.facets.generation import STEP_ATTENTION, Generation
from targets.facets.packaging import Packaging
from targets.facets.partitioning import Partitioning
from targets.facets.quantization import Quantization
from targets.facets.tooling import ABSENT, OK, PROBLEM, Baseline, Check, Tooling

__all__ = ["ABSENT", "OK", "PROBLEM", "STEP_ATTENTION", "Baseline", "Check", "Generation",
           "Packaging", "Partitioning", "Quantization", "Tooling"]
