"""Typed target options and the fallback policy.

Each target declares its own options as a pydantic model (a subclass of
``TargetOptions``). The build settings carry them as a table, the CLI generates one
flag per field (name, type, default and help from the field), and the TOML config takes
them as a ``[<target>]`` table: one declaration, three readers.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo


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


def flag_name(name: str, field: FieldInfo) -> str:
    extra: Any = field.json_schema_extra or {}
    return extra.get("flag") or "--" + name.replace("_", "-")


def option_fields(options: type[TargetOptions]) -> dict[str, FieldInfo]:
    return dict(options.model_fields)
