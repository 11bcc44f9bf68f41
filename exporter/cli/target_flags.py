"""``exporter build``'s target flags, generated from the registered targets' ``Options``
models: one flag per field, its type, default and help from the field, the targets that
take it in the help. A target's new option is a field; no CLI edit."""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable, Optional

import typer
from pydantic.fields import FieldInfo

from targets import all_targets
from targets.options import flag_name

PANEL = "Target options (each applies to the targets named in its help)"


def option_owners() -> dict[str, tuple[FieldInfo, list[str]]]:
    """Field name -> (its declaration, the targets that take it). Targets sharing a field
    (cpu and cuda share AOTInductor's) must declare it alike: one flag serves both."""
    found: dict[str, tuple[FieldInfo, list[str]]] = {}
    for target in all_targets().values():
        for name, field in target.Options.model_fields.items():
            if name in found:
                first, owners = found[name]
                if (first.annotation, first.default) != (field.annotation, field.default):
                    raise TypeError(f"targets {owners[0]} and {target.name} declare option "
                                    f"'{name}' differently")
                owners.append(target.name)
            else:
                found[name] = (field, [target.name])
    return found


def with_target_flags(command: Callable) -> Callable:
    """Give ``command`` (which takes ``**target_flags``) one typer option per target
    option field, after its own parameters."""
    signature = inspect.signature(command)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    generated = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                   default=_option(name, field, owners),
                                   annotation=_cli_type(field.annotation))
                 for name, (field, owners) in option_owners().items()]
    command.__signature__ = signature.replace(parameters=own + generated)
    return command


def given_target_flags(ctx: typer.Context, values: dict[str, Any]) -> dict[str, Any]:
    """Only the target flags the command line gave: the rest come from --config or from
    the target's own defaults (another target's flag default would be refused)."""
    return {name: value for name, value in values.items()
            if ctx.get_parameter_source(name).name == "COMMANDLINE"}


def _option(name: str, field: FieldInfo, owners: list[str]):
    flag = flag_name(name, field)
    decls = [f"{flag}/--no-{flag[2:]}"] if field.default is True else [flag]
    return typer.Option(field.default, *decls, rich_help_panel=PANEL,
                        help=f"{', '.join(owners)}: {field.description or ''}")


def _cli_type(annotation: Any) -> Any:
    """A type typer can parse: Optional[X] stays; Literal[...] becomes str (pydantic
    checks the value and lists the choices)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return str
    if len(args) == 1 and type(None) in typing.get_args(annotation):
        return Optional[_cli_type(args[0])]
    return annotation
