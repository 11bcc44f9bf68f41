"""``exporter build``: flags and --config into BuildSettings, then the Python API."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from exporter.cli.common import (DEBUG, QUIET, VERBOSE, app, guarded, out_console, print_json,
                                 stage_printer, warn)
from exporter.cli.target_flags import given_target_flags, with_target_flags
from runtime.errors import ToolchainError
from targets import FallbackPolicy, all_targets


@app.command()
@with_target_flags
def build(
    ctx: typer.Context,
    spec: Optional[str] = typer.Argument(None, help="FILE.py:NAME, package.module:NAME, "
                                         "zoo:NAME or hf:PATH (a local Hugging Face "
                                         "checkpoint); or `spec` in --config"),
    target: str = typer.Option("cpu", "--target", "-t", help="|".join(all_targets())
                               + " (`exporter targets` says which work here)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="artifact path"),
    dynamic: list[str] = typer.Option([], "--dynamic", help="INPUT:DIM=MIN..MAX, repeatable"),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help=".npz of inputs to validate on"),
    no_validate: bool = typer.Option(False, "--no-validate", help="skip validation (not advised)"),
    keep_failed: bool = typer.Option(False, "--keep-failed",
                                     help="keep an artifact that fails validation, renamed"),
    cpu_isa: str = typer.Option("auto", "--cpu-isa", help="auto|avx512|avx2|generic"),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32|fp16|bf16: math precision "
                              "(inputs and outputs keep their dtypes)"),
    fallback: str = typer.Option("warn", "--fallback", help="|".join(
        p.value for p in FallbackPolicy) + ": ops no target claims run on the CPU fallback"),
    min_partition_size: int = typer.Option(1, "--min-partition-size",
                                           help="smaller delegated islands stay on the CPU"),
    fuse: bool = typer.Option(True, "--fuse/--no-fuse", help="graph fusion passes, for the "
                              "targets that run them (batch-norm folding, QKV merge, no-ops)"),
    quantize: Optional[str] = typer.Option(None, "--quantize", help="int8-dynamic|int8-static|"
                                           "int8-weight|int4-weight (per target: `exporter "
                                           "targets`)"),
    calibration: Optional[str] = typer.Option(None, "--calibration",
                                              help="int8-static: FILE.npz of representative "
                                                   "inputs, or 'random' (warned)"),
    min_sqnr: float = typer.Option(20.0, "--min-sqnr", help="quantized builds: per-output "
                                   "SQNR gate in dB (an output passes on SQNR or cosine)"),
    min_cosine: float = typer.Option(0.99, "--min-cosine",
                                     help="quantized builds: per-output cosine gate"),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="fail when "
                                                "weights plus planned activations exceed this "
                                                "size (e.g. 64MB, 1.5GiB)"),
    task: Optional[str] = typer.Option(None, "--task", help="hf:PATH specs: feature-extraction"
                                       "|text-classification|causal-lm|image-classification"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="hf: text example length"),
    image_size: Optional[int] = typer.Option(None, "--image-size",
                                             help="hf: image example size"),
    random_weights: bool = typer.Option(False, "--random-weights", help="hf: build even "
                                        "where the checkpoint lacks weights (random)"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="hf: run the "
                                           "checkpoint's own Python code (auto_map)"),
    max_model_size: Optional[str] = typer.Option(None, "--max-model-size", help="hf: refuse "
                                                 "larger configs (default: half the memory)"),
    deterministic: bool = typer.Option(False, "--deterministic", help="turn off on-device "
                                       "kernel timing so rebuilds give the same bytes"),
    config: Optional[Path] = typer.Option(None, "--config", help="exporter.toml: spec and "
                                          "settings (flags given here win)"),
    save_config: Optional[Path] = typer.Option(None, "--save-config", help="write the spec "
                                               "and settings used, to replay with --config"),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="show where each op would run; compile nothing"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object (docs/json.md)"),
    quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG,
    **target_flags,
) -> None:
    """Capture, lower, package and validate a model into one artifact file."""
    def action() -> int:
        spec_used, settings = _build_settings(ctx, spec, config, save_config, dict(
            target=target, out=out, dynamic=dynamic, inputs=inputs,
            validate_artifact=not no_validate, keep_failed=keep_failed, cpu_isa=cpu_isa,
            dtype=dtype, fallback=fallback, min_partition_size=min_partition_size,
            fuse=fuse, quantize=quantize, calibration=calibration, quant_min_sqnr_db=min_sqnr,
            quant_min_cosine=min_cosine, memory_budget=memory_budget,
            deterministic=deterministic, task=task,
            seq_len=seq_len, image_size=image_size, random_weights=random_weights,
            trust_remote_code=trust_remote_code, max_model_size=max_model_size,
            **given_target_flags(ctx, target_flags)))
        if dry_run:
            return _dry_run(spec_used, settings, as_json)
        return _run_build(spec_used, settings, as_json)
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json)


def _run_build(spec: str, settings, as_json: bool) -> int:
    from exporter.cli.common import style
    from exporter.builder.pipeline import build as run_build
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
        print_build(out_console, result)
        for warning in result.warnings:
            warn(warning)
    return 0


def _build_settings(ctx: typer.Context, spec: str | None, config: Path | None,
                    save_config: Path | None, fields: dict):
    """The spec and BuildSettings: the flags' values, under them --config's, over both
    the flags the command line actually gave; written to --save-config if asked."""
    from exporter.cli import config_file

    given = {field for field, param in _FIELD_PARAMS.items()
             if ctx.get_parameter_source(param or field).name == "COMMANDLINE"}
    given |= {name for name in fields if name not in _FIELD_PARAMS}  # target flags given
    spec_used, merged = config_file.merge(spec, fields, given, config)
    settings = _settings(**merged)
    if save_config is not None:
        config_file.write(save_config, spec_used, settings)
    return spec_used, settings


# BuildSettings fields whose flag's parameter is named otherwise (None: the same name)
_FIELD_PARAMS = {name: None for name in (
    "target", "out", "dynamic", "inputs", "keep_failed", "cpu_isa", "dtype",
    "fallback", "min_partition_size", "fuse", "quantize",
    "calibration", "memory_budget", "deterministic", "task", "seq_len", "image_size",
    "random_weights", "trust_remote_code", "max_model_size")} | {
    "validate_artifact": "no_validate", "quant_min_sqnr_db": "min_sqnr",
    "quant_min_cosine": "min_cosine"}


def _dry_run(spec: str, settings, as_json: bool) -> int:
    from exporter.builder.pipeline import dry_run
    from exporter.report.console import print_placement

    prep = dry_run(spec, settings, stage=stage_printer())
    if as_json:
        print_json({"target": prep.target.name, "placement": prep.placement.summary(),
                     "signature": prep.captured.signature.to_json(),
                     "coverage": prep.placement.coverage, "warnings": prep.warnings})
    else:
        print_placement(out_console, prep.placement.coverage, prep.placement.summary())
        for warning in prep.warnings:
            warn(warning)
    return 0


def _settings(**fields):
    """BuildSettings from CLI values; a bad value is a usage error (exit 2), not a traceback."""
    import pydantic

    from exporter.errors import UserInputError
    from exporter.settings import BuildSettings
    try:
        return BuildSettings(**fields)
    except pydantic.ValidationError as exc:
        problems = [(f"--{'.'.join(map(str, e['loc'])).replace('_', '-')}: " if e["loc"] else "")
                    + e["msg"].removeprefix("Value error, ") for e in exc.errors()]
        raise UserInputError("invalid build options", details=problems) from None

