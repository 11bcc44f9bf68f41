"""``exporter build``'s flags, generated from the settings they fill: one flag per field of
``BuildSettings`` and of every registered target's ``Options``, with its type, default and
help from the field. The CLI restates nothing; a new setting or target option is a field.

``SETTINGS_PANELS`` is the one CLI-only fact per setting: its panel in ``--help``. A flag's
name, where it is not ``--field-name``, is also its --config key: ``exporter.config.keys``.
"""

from __future__ import annotations

import enum
import inspect
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from pydantic.fields import FieldInfo

from exporter.config.keys import FLAG_NAMES, option_owners
from exporter.settings import BuildSettings
from runtime.host.platforms import NAMES as PLATFORM_NAMES
from targets.registry import described
from targets.options import flag_name

MODEL, TARGET, QUANT, CHECK, OUTPUT = ("Model", "Target", "Quantization", "Validation",
                                       "Output")
TARGET_PANEL = "Target options (each applies to the targets named in its help)"
PANEL_ORDER = (MODEL, TARGET, TARGET_PANEL, QUANT, CHECK, OUTPUT)
# field -> its panel in --help (its flag's name, where not --field-name: config.keys)
SETTINGS_PANELS: dict[str, str] = {
    "target": TARGET, "platform": TARGET, "cpu_isa": TARGET, "dtype": TARGET, "fallback": TARGET,
    "min_partition_size": TARGET, "fuse": TARGET, "deterministic": TARGET,
    "memory_budget": TARGET,
    "dynamic": MODEL, "task": MODEL, "seq_len": MODEL, "image_size": MODEL,
    "batch_size": MODEL,
    "random_weights": MODEL, "trust_remote_code": MODEL, "max_model_size": MODEL,
    "max_context": MODEL, "prefill_chunk": MODEL, "max_source": MODEL,
    "quantize": QUANT, "calibration": QUANT, "quant_min_sqnr_db": QUANT,
    "quant_min_cosine": QUANT,
    "validate_artifact": CHECK, "inputs": CHECK, "keep_failed": CHECK, "seed": CHECK,
    "validation_timeout_s": CHECK, "min_top1": CHECK, "max_kl": CHECK,
    "out": OUTPUT, "force": OUTPUT,
}
# sizes are parsed by the settings ("64MB"), so the flag takes text
_TEXT_FIELDS = ("memory_budget", "max_model_size")


def with_build_flags(command: Callable) -> Callable:
    """Give ``command`` (which takes ``**flags``) one typer option per setting and per
    target option field, after its own parameters."""
    signature = inspect.signature(command)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    fields = BuildSettings.model_fields
    generated = [_parameter(name, fields[name], panel, FLAG_NAMES.get(name, ()))
                 for name, panel in SETTINGS_PANELS.items()]
    generated += [_parameter(name, field, TARGET_PANEL, (flag_name(name, field),),
                             f"{', '.join(owners)}: ")
                  for name, (field, owners) in option_owners().items()]
    # --help lists panels in the order their first flag comes: the README's order
    rank = {panel: i for i, panel in enumerate(PANEL_ORDER)}
    parameters = sorted(own + generated, key=lambda p: rank.get(
        getattr(p.default, "rich_help_panel", None), -1))
    # typer calls the command by keyword, so every parameter may be keyword-only
    command.__signature__ = signature.replace(
        parameters=[p.replace(kind=p.KEYWORD_ONLY) for p in parameters])
    return command


def given_flags(ctx: typer.Context, values: dict[str, Any]) -> set[str]:
    """The flags the command line gave (the rest are defaults, under --config's values)."""
    return {name for name in values if ctx.get_parameter_source(name).name == "COMMANDLINE"}


def _parameter(name: str, field: FieldInfo, panel: str, decls: tuple[str, ...],
               prefix: str = "") -> inspect.Parameter:
    default = field.get_default(call_default_factory=True)
    if isinstance(default, enum.Enum):
        default = default.value
    decls = decls or ("--" + name.replace("_", "-"),)
    if default is True and "/" not in decls[0]:
        decls = (f"{decls[0]}/--no-{decls[0][2:]}",)
    annotation, choices = _cli_type(name, field.annotation)
    choices_text = f"{' | '.join(choices)}: " if choices else ""  # spaces: rich wraps there
    help_text = prefix + choices_text + (field.description or "")
    # choices are checked by the settings (exit 2, naming them), not by click
    option = typer.Option(default, *decls, rich_help_panel=panel, help=help_text,
                          show_default=not (default is None or default is False or default == []))
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=annotation)


def _cli_type(name: str, annotation: Any) -> tuple[Any, list[str]]:
    """A type typer parses, and the choices for Literal and Enum fields (pydantic checks
    the value again; the targets' names are the registry's)."""
    if name == "target":
        return str, list(described())
    if name == "platform":
        return str, list(PLATFORM_NAMES)
    if name in _TEXT_FIELDS:
        return Optional[str], []
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = type(None) in typing.get_args(annotation)
    inner = args[0] if optional and len(args) == 1 else annotation
    if typing.get_origin(inner) is typing.Literal:
        return (Optional[str] if optional else str), [str(a) for a in typing.get_args(inner)]
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return str, [str(m.value) for m in inner]
    if inner is Path:
        return (Optional[Path] if optional else Path), []
    return annotation, []
