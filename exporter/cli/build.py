"""``exporter build``: flags and --config into BuildSettings, then the Python API."""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import Optional

import typer

from exporter.cli.build_flags import OUTPUT, given_flags, with_build_flags
from exporter.cli.common import (
    DEBUG,
    QUIET,
    VERBOSE,
    app,
    guarded,
    out_console,
    print_json,
    quiet_torch_logs,
    stage_printer,
    warn,
)
from exporter.config.keys import option_owners
from runtime.errors import ToolchainError


@app.command()
@with_build_flags
def build(
    ctx: typer.Context,
    spec: Optional[str] = typer.Argument(None, help="FILE.py:NAME, package.module:NAME, "
                                         "zoo:NAME or hf:PATH (a local Hugging Face "
                                         "checkpoint); or `spec` in --config"),
    config: Optional[Path] = typer.Option(None, "--config", rich_help_panel=OUTPUT,
                                          help="exporter.toml: spec and settings (flags given "
                                               "here win)"),
    save_config: Optional[Path] = typer.Option(None, "--save-config", rich_help_panel=OUTPUT,
                                               help="write the spec and settings used, to "
                                                    "replay with --config"),
    dry_run: bool = typer.Option(False, "--dry-run", rich_help_panel=OUTPUT,
                                 help="show where each op would run; compile nothing"),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=OUTPUT,
                                 help="print one JSON object (docs/json.md)"),
    quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG,
    **flags,
) -> None:
    """Capture, lower, package and validate a model into one artifact file."""
    def action() -> int:
        spec_used, settings = _build_settings(spec, config, save_config, flags,
                                              given_flags(ctx, flags))
        quiet_torch_logs()  # after the flags are checked: a typo is told without torch
        if dry_run:
            return _dry_run(spec_used, settings, as_json)
        return _run_build(spec_used, settings, as_json)
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json,
            uses_torch=False)


def _run_build(spec: str, settings, as_json: bool) -> int:
    from exporter.api import run_build
    from exporter.cli.common import style
    from exporter.report.console import print_build

    try:
        result = run_build(spec, settings, stage=stage_printer())
    except ToolchainError as exc:
        # --json: the error object also carries what the failed validation measured
        exc.json_extra = {"artifact": None, "target": settings.target,
                          "validation": getattr(exc, "record", None)}
        raise
    if as_json:
        print_json(result.to_json())
    elif style.quiet:
        print(result.artifact)
    else:
        print_build(out_console, result, verbose=style.verbose)
        for warning in shown_warnings(result.warnings, style.verbose):
            warn(warning)
    return 0


LISTED = 3  # lines of a warning's list shown without --verbose


def shown_warnings(warnings: list[str], verbose: bool) -> list[str]:
    """The warnings as printed: a list under a warning (its lines indented: one per op on
    the CPU fallback, hundreds where most of a model fell back) is cut to its first
    LISTED lines and a count, unless --verbose."""
    if verbose:
        return list(warnings)
    shown: list[str] = []
    for listed, group in groupby(warnings, key=lambda line: line.startswith("  ")):
        lines = list(group)
        if listed and len(lines) > LISTED + 1:
            lines = lines[:LISTED] + [f"  ... and {len(lines) - LISTED} more (--verbose "
                                      "lists them; `exporter inspect ARTIFACT` too)"]
        shown.extend(lines)
    return shown


def _build_settings(spec: str | None, config: Path | None, save_config: Path | None,
                    flags: dict, given: set[str]):
    """The spec and BuildSettings: the flags' defaults, over them --config's values, over
    both the flags the command line actually gave; written to --save-config if asked.
    Target options go only where given (another target's default would be refused)."""
    from exporter.config import config_file

    options = option_owners()
    fields = {k: v for k, v in flags.items() if k not in options or k in given}
    spec_used, merged = config_file.merge(spec, fields, given, config)
    from targets.registry import DEFAULT_TARGET, check_target_name
    check_target_name(str(merged.get("target") or DEFAULT_TARGET))  # before torch imports
    from exporter.model.spec_names import check_spec_file
    check_spec_file(spec_used)  # a misspelled file too, with its near name
    settings = _settings(**merged)
    if save_config is not None:
        from exporter.model.spec_names import spec_reads
        from runtime.host.outfiles import checked_output
        checked_output(save_config, flag="--save-config", reads=[
            *spec_reads(spec_used), *([settings.inputs] if settings.inputs else [])])
        config_file.write(save_config, spec_used, settings)
    return spec_used, settings


def _dry_run(spec: str, settings, as_json: bool) -> int:
    """Each entry point's placement (a generating build's prefill first); compile nothing."""
    from exporter.api import build_kind
    from exporter.builder.pipeline import dry_run
    from exporter.cli.common import style
    from exporter.report.console import model_line, print_placement

    kind = build_kind(settings)
    report = kind.dry_run_report(dry_run(spec, settings, stage=stage_printer(), kind=kind))
    if as_json:
        print_json(report.as_json)
        return 0
    line = model_line(report.model_details)
    if line:
        out_console.print(line, markup=False, highlight=False, soft_wrap=True)
    for title, coverage, summary in report.placements:
        if title:
            out_console.print(title, markup=False, highlight=False)
        print_placement(out_console, coverage, summary)
    for warning in shown_warnings(report.warnings, style.verbose):
        warn(warning)
    return 0


def _near_choice(error: dict) -> str:
    """`` (did you mean 'int8-dynamic'?)`` for a value that misses one of its choices."""
    import re

    from runtime.errors import did_you_mean
    if error["type"] not in ("literal_error", "enum") or not isinstance(error["input"], str):
        return ""
    return did_you_mean(error["input"], re.findall(r"'([^']*)'", error["ctx"]["expected"]))


def _settings(**fields):
    """BuildSettings from CLI values; a bad value is a usage error (exit 2), not a traceback."""
    import pydantic

    from exporter.errors import UserInputError
    from exporter.settings import BuildSettings
    try:
        return BuildSettings(**fields)
    except pydantic.ValidationError as exc:
        problems = [(f"--{'.'.join(map(str, e['loc'])).replace('_', '-')}: " if e["loc"] else "")
                    + e["msg"].removeprefix("Value error, ") + _near_choice(e)
                    for e in exc.errors()]
        raise UserInputError("invalid build options", details=problems) from None

