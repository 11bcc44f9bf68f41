"""What is said about a target without importing its backend, or torch: its card.

``exporter --help``, ``targets``, ``doctor`` and the build settings read a target's
name, device, backend, description, typed options, recipe and baseline names and
whether it works here; a command that needs none of its lowering starts in a fraction of
a second rather than the seconds torch takes to import. The registry pairs each card with
the ``Target`` that implements it (targets/registry.py) and checks that both agree.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from targets.options import TargetOptions

if TYPE_CHECKING:
    from runtime.format.manifest import Partition

DISTRIBUTION = "edge-exporter"  # this project's name on pip (pyproject.toml)


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
class TargetCard:
    name: str
    device: str  # where its partitions run: "cpu" or "cuda"
    backend: str  # the runtime executor kind
    description: str
    Options: type[TargetOptions] = TargetOptions
    recipes: tuple[str, ...] = ()  # its --quantize recipes (the Target's quantization facet)
    baselines: tuple[str, ...] = ()  # its `exporter bench` baselines (its tooling facet)
    # whether this machine can build for it: (ok, why), as Target.availability() says it
    check: Callable[[], tuple[bool, str]] = lambda: (True, "")
    # For `exporter inspect` and the report, read from a partition's meta alone: where the
    # backend placed the ops inside it, and the memory it plans itself beside our plan
    placement_lines: Callable[[Partition], list[str]] = lambda partition: []
    memory_lines: Callable[[Partition], list[str]] = lambda partition: []
    # chatty third-party loggers the CLI quiets (its tooling facet's): read without
    # importing the backend, so a command that runs an artifact need not load every target
    loggers_to_quiet: tuple[str, ...] = ()


def card_of(target) -> TargetCard:
    """The card of a target known only by its implementation (a plug-in, a test's)."""
    def check() -> tuple[bool, str]:
        found = target.availability()
        return found.ok, found.reason
    return TargetCard(target.name, target.device, target.backend, target.description,
                      target.Options, tuple(target.quantization.recipes),
                      tuple(target.tooling.baselines()), check,
                      loggers_to_quiet=tuple(target.tooling.loggers_to_quiet))


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def install_command(extra: str) -> str:
    """How to install one of this project's extras, in a form that works from any folder:
    the clone's own path where this runs from a source checkout (``pip install '.[x]'``
    works only in its root), the distribution's name otherwise."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "targets").is_dir():
        return f"pip install '{root}[{extra}]'"
    return f"pip install '{DISTRIBUTION}[{extra}]'"
