"""Targets, one folder each (targets/aoti/, targets/onnx/, targets/tvm/); the exporter
reaches them only through ``targets.registry``.

Names are imported on first use (PEP 562): ``from targets import described`` reads the
targets' cards without importing torch, which ``targets.base`` (the contract) imports.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    **dict.fromkeys(("ABSENT", "OK", "PROBLEM", "Availability", "Check", "Lowered",
                     "LowerOptions", "Support", "Target", "base_requirements"), "targets.base"),
    **dict.fromkeys(("LoweringError", "TargetOptionError"), "targets.errors"),
    **dict.fromkeys(("Generation", "Packaging", "Partitioning", "Quantization", "Tooling"),
                    "targets.facets"),
    **dict.fromkeys(("FallbackPolicy", "TargetOptions"), "targets.options"),
    **dict.fromkeys(("all_targets", "described", "for_backend", "get_target", "register"),
                    "targets.registry"),
    "TargetCard": "targets.card",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'targets' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
