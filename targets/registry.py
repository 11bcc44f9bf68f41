"""The one registry of targets. A target is a folder (``targets/<name>/``) and one line
here; a package outside this repository registers through the entry-point group
``edge_exporter.targets`` (``name = "package.module:TargetClass"``), or a test calls
``register``. The exporter asks this module; it never names a target."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging

from runtime.errors import UserInputError
from targets.base import Target

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "edge_exporter.targets"
BUILTIN = (
    "targets.aoti.cpu:CpuTarget",
    "targets.aoti.cuda:CudaTarget",
    "targets.executorch.target:ExecutorchTarget",
    "targets.onnx.target:OnnxTarget",
    "targets.tvm.target:TvmTarget",
)

# Where a build goes when no target is named: the host's own CPU, which every machine has.
DEFAULT_TARGET = "cpu"

_TARGETS: dict[str, Target] = {}


def register(target: Target) -> Target:
    """Add a target (a plug-in's, or a test's); a second one under a taken name is refused.
    Its ``packaging.runtime_modules`` are imported, so its executor kind is known in this
    process too: one call is all a new target needs."""
    known = _targets()
    if target.name in known and type(known[target.name]) is not type(target):
        raise ValueError(f"a target named '{target.name}' is already registered")
    for module in target.packaging.runtime_modules:
        importlib.import_module(module)
    known[target.name] = target
    return target


def unregister(name: str) -> None:
    _targets().pop(name, None)


def all_targets() -> dict[str, Target]:
    return dict(_targets())


def get_target(name: str) -> Target:
    known = _targets()
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, known, n=1)
    raise UserInputError(f"unknown target '{name}'", where="--target",
                         hint=(f"did you mean '{close[0]}'? " if close else "")
                         + f"the targets are: {', '.join(known)}")


def for_backend(backend: str) -> Target | None:
    """The first registered target whose partitions run on executor kind ``backend``."""
    return next((t for t in _targets().values() if t.backend == backend), None)


def _targets() -> dict[str, Target]:
    if not _TARGETS:
        for line in BUILTIN:
            target = _load(line)
            _TARGETS[target.name] = target
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                target = _load(entry.value)
            except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the rest
                log.warning("target plug-in %s (%s) failed to load: %s: %s", entry.name,
                            entry.value, type(exc).__name__, exc)
                continue
            _TARGETS.setdefault(target.name, target)
    return _TARGETS


def _load(line: str) -> Target:
    module, _, cls = line.partition(":")
    return getattr(importlib.import_module(module), cls)()
