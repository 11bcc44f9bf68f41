"""The one registry of targets. A target is a folder (``targets/<name>/``) and one line
here: its card (targets/card.py: what --help, ``exporter targets`` and the settings read,
without torch) and its implementation, imported only when a build, bench or report asks
for it. A package outside this repository registers through the entry-point group
``edge_exporter.targets`` (``name = "package.module:TargetClass"``; its card is read from
the class, so it is imported with the registry), or a test calls ``register``. The
exporter asks this module; it never names a target."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from typing import TYPE_CHECKING

from runtime.errors import UserInputError, did_you_mean
from targets.card import TargetCard, card_of

if TYPE_CHECKING:
    from targets.base import Target

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "edge_exporter.targets"
BUILTIN = (  # (its card, its implementation)
    ("targets.aoti.card:CPU", "targets.aoti.cpu:CpuTarget"),
    ("targets.aoti.card:CUDA", "targets.aoti.cuda:CudaTarget"),
    ("targets.executorch.card:EXECUTORCH", "targets.executorch.target:ExecutorchTarget"),
    ("targets.onnx.card:ONNX", "targets.onnx.target:OnnxTarget"),
    ("targets.tvm.card:TVM", "targets.tvm.target:TvmTarget"),
)

# Where a build goes when no target is named: the host's own CPU, which every machine has.
DEFAULT_TARGET = "cpu"

_CARDS: dict[str, TargetCard] = {}
_LINES: dict[str, str] = {}  # name -> "module:Class" of a builtin not imported yet
_TARGETS: dict[str, Target] = {}


def register(target: Target) -> Target:
    """Add a target (a plug-in's, or a test's); a second one under a taken name is refused.
    Its ``packaging.runtime_modules`` are imported, so its executor kind is known in this
    process too: one call is all a new target needs."""
    if target.name in _cards() and type(_target(target.name)) is not type(target):
        raise ValueError(f"a target named '{target.name}' is already registered")
    for module in target.packaging.runtime_modules:
        importlib.import_module(module)
    _TARGETS[target.name] = target
    _CARDS[target.name] = card_of(target)
    return target


def unregister(name: str) -> None:
    _cards()
    for table in (_CARDS, _LINES, _TARGETS):
        table.pop(name, None)


def described() -> dict[str, TargetCard]:
    """Every target's card, by name, importing no backend (nor torch)."""
    return dict(_cards())


def all_targets() -> dict[str, Target]:
    """Every target's implementation (imports each backend's lowering)."""
    return {name: _target(name) for name in _cards()}


def get_target(name: str) -> Target:
    check_target_name(name)
    return _target(name)


def check_target_name(name: str) -> None:
    """Refuse an unknown target, naming the near one (``ONNX``: 'onnx')."""
    known = _cards()
    if name not in known:
        raise UserInputError(f"unknown target '{name}'{did_you_mean(name, known)}",
                             where="--target",
                             hint=f"the targets are: {', '.join(known)} (`exporter targets` "
                                  "says which work here)")


def for_backend(backend: str) -> Target | None:
    """The first registered target whose partitions run on executor kind ``backend``."""
    return next((_target(c.name) for c in _cards().values() if c.backend == backend), None)


def card_for_backend(backend: str) -> TargetCard | None:
    """The card of the first target whose partitions run on ``backend`` (no torch)."""
    return next((c for c in _cards().values() if c.backend == backend), None)


def _target(name: str) -> Target:
    if name not in _TARGETS:
        target = _load(_LINES[name])
        card = _CARDS[name]
        if _core(target) != _core(card):  # our bug: two declarations drifted
            raise TypeError(f"target '{name}': its card {_core(card)} and its "
                            f"implementation {_core(target)} disagree")
        _TARGETS[name] = target
    return _TARGETS[name]


def _core(target: Target | TargetCard) -> tuple:
    """What a card and its implementation both declare (a card's loggers are its own, an
    implementation's its tooling facet's)."""
    loggers = tuple(getattr(target, "tooling", target).loggers_to_quiet)
    return (target.name, target.device, target.backend, target.description, target.Options,
            loggers)


def _cards() -> dict[str, TargetCard]:
    if not _CARDS:
        for card_line, line in BUILTIN:
            card = _load(card_line)
            _CARDS[card.name], _LINES[card.name] = card, line
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                target = _load(entry.value)
            except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the rest
                log.warning("target plug-in %s (%s) failed to load: %s: %s", entry.name,
                            entry.value, type(exc).__name__, exc)
                continue
            if target.name not in _CARDS:
                _CARDS[target.name], _TARGETS[target.name] = card_of(target), target
    return _CARDS


def _load(line: str):
    module, _, name = line.partition(":")
    found = getattr(importlib.import_module(module), name)
    return found() if isinstance(found, type) else found
