"""Typed target options, the fallback policy, and what the build says to a target
(``LowerOptions``).

Each target declares its own options as a pydantic model (a subclass of
``TargetOptions``). The build settings carry them as a table, the CLI generates one
flag per field (name, type, default and help from the field), and the TOML config takes
them as a ``[<target>]`` table: one declaration, three readers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

from runtime.host.platforms import host_platform


class FallbackPolicy(str, enum.Enum):
    """What the build does with ops no target claims: run them on the CPU fallback
    (allow), do so and warn (warn), or refuse the build listing every one (forbid)."""

    ALLOW = "allow"
    WARN = "warn"
    FORBID = "forbid"


class TargetOptions(BaseModel):
    """Base of every target's options. Field metadata the CLI reads: ``description``
    (the help) and, in ``json_schema_extra``, ``flag`` (the flag's name where it differs
    from ``--field-name``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def measured_choices(self) -> list[str]:
        """Flags set here that keep whatever measured fastest on this machine (on-device
        tuning): ``--deterministic`` refuses them."""
        return []

    def unused_with(self, quantize: str | None) -> list[str]:
        """Flags set away from their defaults that a build with this ``--quantize``
        recipe (None: float) would not read, each with what it applies to: the settings
        refuse them rather than build something the user did not ask for."""
        return []


T = TypeVar("T", bound=TargetOptions)


@dataclass(frozen=True)
class LowerOptions:
    """What the build settings say to a target. Defaults live in exporter.settings; the
    target's own options arrive typed, as its ``Options`` model."""

    work_dir: Path
    target: TargetOptions = field(default_factory=TargetOptions)
    cpu_isa: str = "auto"
    # the platform the artifact runs on (runtime/host/platforms.py), not always this one
    platform: str = field(default_factory=host_platform)
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

    def target_as(self, options: type[T]) -> T:
        """``target``, typed as a target's ``options`` model (its defaults where the
        caller gave none)."""
        given = self.target
        if isinstance(given, options):
            return given
        if type(given) is TargetOptions:
            return options()
        raise TypeError(f"target options are {type(given).__name__}, not {options.__name__}")


def flag_name(name: str, field: FieldInfo) -> str:
    extra: Any = field.json_schema_extra or {}
    return extra.get("flag") or "--" + name.replace("_", "-")


def option_fields(options: type[TargetOptions]) -> dict[str, FieldInfo]:
    return dict(options.model_fields)
