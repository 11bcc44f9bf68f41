"""``exporter``: the command line. It only builds settings and calls the Python API.

Exit codes: 0 ok, 1 validation failed, 2 bad usage or input, 3 build failed.
A ToolchainError prints one paragraph; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer
from rich.console import Console

from runtime.errors import ToolchainError, UserInputError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Export PyTorch models to validated, self-contained device artifacts.")
err_console = Console(stderr=True)
out_console = Console()
_state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="show tracebacks on errors"),
          verbose: bool = typer.Option(False, "--verbose", "-v", help="log more")) -> None:
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        # torch 2.13 warns about its own use of a deprecated pytree class while it
        # lowers; nothing a user can act on.
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        # torch.export logs graph dumps and guard warnings at WARNING; our own error
        # paragraph already says what matters, so keep the terminal readable.
        import torch._logging
        torch._logging.set_logs(all=logging.ERROR)
        logging.getLogger("onnxscript").setLevel(logging.ERROR)  # constant-folding chatter


def _guarded(action: Callable[[], int | None]) -> None:
    """Run a command body; turn ToolchainErrors into a paragraph and an exit code."""
    try:
        code = action() or 0
    except ToolchainError as exc:
        if _state["debug"]:
            err_console.print_exception()
        # markup off: messages quote user code, which may contain [brackets]
        err_console.print("error: " + str(exc), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("interrupted: nothing was written (an artifact is replaced whole or "
                          "not at all; the next build removes this one's temporary files)")
        raise typer.Exit(130) from None
    except OSError as exc:
        if exc.errno not in _DISK_ERRORS:
            raise
        if _state["debug"]:
            err_console.print_exception()
        err_console.print(f"error: cannot write {exc.filename or 'a file'}: {exc.strerror}. "
                          "Nothing was replaced.\nTry: free disk space, or choose another --out",
                          highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


# A full disk, a quota, a file-size limit or a read-only file system: the user's to fix.
_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _print_json(data: dict) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def _stage_printer(enabled: bool):
    @contextlib.contextmanager
    def stage(name: str) -> Iterator[None]:
        if not enabled:
            yield
            return
        start = time.perf_counter()
        with err_console.status(f"{name}..."):
            yield
        err_console.print(f"[green]✓[/green] {name} [dim]{time.perf_counter() - start:.1f}s[/dim]")
    return stage


@app.command()
def build(
    ctx: typer.Context,
    spec: Optional[str] = typer.Argument(None, help="FILE.py:NAME, package.module:NAME, "
                                         "zoo:NAME or hf:PATH (a local Hugging Face "
                                         "checkpoint); or `spec` in --config"),
    target: str = typer.Option("cpu", "--target", "-t", help="see `exporter targets`"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="artifact path"),
    dynamic: list[str] = typer.Option([], "--dynamic", help="INPUT:DIM=MIN..MAX, repeatable"),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help=".npz of inputs to validate on"),
    no_validate: bool = typer.Option(False, "--no-validate", help="skip validation (not advised)"),
    keep_failed: bool = typer.Option(False, "--keep-failed",
                                     help="keep an artifact that fails validation, renamed"),
    cpu_isa: str = typer.Option("auto", "--cpu-isa", help="auto|avx512|avx2|generic"),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32|fp16|bf16: math precision "
                              "(inputs and outputs keep their dtypes)"),
    autotune: bool = typer.Option(False, "--autotune", help="Inductor max-autotune (slow)"),
    fallback: str = typer.Option("warn", "--fallback",
                                 help="allow|warn|forbid ops running on the CPU fallback"),
    min_partition_size: int = typer.Option(1, "--min-partition-size",
                                           help="smaller delegated islands stay on the CPU"),
    ep: str = typer.Option("cpu", "--ep", help="onnx: execution providers in order, "
                           "e.g. cuda,cpu"),
    tvm_target: Optional[str] = typer.Option(None, "--tvm-target",
                                             help="tvm: TVM target string (default: llvm for "
                                                  "the --cpu-isa level)"),
    tune: int = typer.Option(0, "--tune", help="tvm: MetaSchedule trials (slow; 0 = off)"),
    fuse: bool = typer.Option(True, "--fuse/--no-fuse", help="onnx, tvm: graph fusion passes "
                              "(batch-norm folding, QKV merge, attention to SDPA, no-ops)"),
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
    compile_timeout: int = typer.Option(1800, "--compile-timeout", help="cpu, cuda: seconds "
                                        "one C++ compiler run may take (0: no limit)"),
    deterministic: bool = typer.Option(False, "--deterministic", help="turn off on-device "
                                       "kernel timing so rebuilds give the same bytes"),
    config: Optional[Path] = typer.Option(None, "--config", help="exporter.toml: spec and "
                                          "settings (flags given here win)"),
    save_config: Optional[Path] = typer.Option(None, "--save-config", help="write the spec "
                                               "and settings used, to replay with --config"),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="show where each op would run; compile nothing"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON only"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only errors and the path"),
) -> None:
    """Capture, lower, package and validate a model into one artifact file."""
    def action() -> int:
        spec_used, settings = _build_settings(ctx, spec, config, save_config, dict(
            target=target, out=out, dynamic=dynamic, inputs=inputs,
            validate_artifact=not no_validate, keep_failed=keep_failed, cpu_isa=cpu_isa,
            dtype=dtype, autotune=autotune, fallback=fallback,
            min_partition_size=min_partition_size, ep=ep, tvm_target=tvm_target, tune=tune,
            fuse=fuse, quantize=quantize, calibration=calibration, quant_min_sqnr_db=min_sqnr,
            quant_min_cosine=min_cosine, memory_budget=memory_budget,
            deterministic=deterministic, compile_timeout_s=compile_timeout, task=task,
            seq_len=seq_len, image_size=image_size))
        if dry_run:
            return _dry_run(spec_used, settings, as_json)
        return _run_build(spec_used, settings, as_json, quiet)
    _guarded(action)


def _run_build(spec: str, settings, as_json: bool, quiet: bool) -> int:
    from exporter.pipeline import build as run_build
    from exporter.report import print_build

    try:
        result = run_build(spec, settings, stage=_stage_printer(not as_json and not quiet))
    except ToolchainError as exc:
        record = getattr(exc, "record", None)
        if as_json and record is not None:
            _print_json({"artifact": None, "target": settings.target, "validation": record,
                         "error": str(exc)})
        raise
    if as_json:
        _print_json(result.to_json())
    elif quiet:
        print(result.artifact)
    else:
        print_build(out_console, result)
    return 0


def _build_settings(ctx: typer.Context, spec: str | None, config: Path | None,
                    save_config: Path | None, fields: dict):
    """The spec and BuildSettings: the flags' values, under them --config's, over both
    the flags the command line actually gave; written to --save-config if asked."""
    from exporter import config_file

    given = {field for field, param in _FIELD_PARAMS.items()
             if ctx.get_parameter_source(param or field).name == "COMMANDLINE"}
    spec_used, merged = config_file.merge(spec, fields, given, config)
    settings = _settings(**merged)
    if save_config is not None:
        config_file.write(save_config, spec_used, settings)
    return spec_used, settings


# BuildSettings fields whose flag's parameter is named otherwise (None: the same name)
_FIELD_PARAMS = {name: None for name in (
    "target", "out", "dynamic", "inputs", "keep_failed", "cpu_isa", "dtype", "autotune",
    "fallback", "min_partition_size", "ep", "tvm_target", "tune", "fuse", "quantize",
    "calibration", "memory_budget", "deterministic", "task", "seq_len", "image_size")} | {
    "validate_artifact": "no_validate", "quant_min_sqnr_db": "min_sqnr",
    "quant_min_cosine": "min_cosine", "compile_timeout_s": "compile_timeout"}


def _dry_run(spec: str, settings, as_json: bool) -> int:
    from exporter.pipeline import dry_run
    from exporter.report import print_placement

    prep = dry_run(spec, settings, stage=_stage_printer(not as_json))
    if as_json:
        _print_json({"target": prep.target.name, "placement": prep.placement.summary(),
                     "signature": prep.captured.signature.to_json(),
                     "coverage": prep.placement.coverage, "warnings": prep.warnings})
    else:
        print_placement(out_console, prep.placement.coverage, prep.placement.summary())
        for warning in prep.warnings:
            err_console.print("warning: " + warning, markup=False, highlight=False)
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


@app.command()
def bench(
    artifact: Path = typer.Argument(..., help="artifact file"),
    baseline: str = typer.Option("eager,compile", "--baseline",
                                 help="comma list of eager, compile, onnxruntime (onnx "
                                 "artifacts: the same model in a plain ORT session)"),
    model: Optional[str] = typer.Option(None, "--model", help="spec for baselines and inputs "
                                        "(default: the one in the manifest)"),
    runs: int = typer.Option(100, "--runs"),
    warmup: int = typer.Option(20, "--warmup"),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Time the artifact against eager and torch.compile(reduce-overhead), in one process."""
    def action() -> int:
        from exporter.bench import bench as bench_api

        names = tuple(b.strip() for b in baseline.split(",") if b.strip())
        result = bench_api(artifact, model=model, baselines=names, runs=runs, warmup=warmup,
                           cuda_graphs=not no_cuda_graphs)
        if as_json:
            _print_json(result)
            return 0
        out_console.print(f"{artifact}: {result['device']} {result['dtype']}, "
                          f"{result['runs']} runs, {result['timer']}")
        for name, timing in result["timings"].items():
            out_console.print(f"  {name:>9}: median {timing['median_ms']:.3f} ms, "
                              f"p90 {timing['p90_ms']:.3f} ms")
        for name, ratio in result["ratios"].items():
            out_console.print(f"  {name}: {ratio:.3f}x")
        return 0
    _guarded(action)


@app.command()
def run(
    artifact: Path = typer.Argument(..., help="artifact file"),
    inputs: Path = typer.Option(..., "--inputs", help=".npz whose keys are the input names"),
    out: Optional[Path] = typer.Option(None, "--out", help="write outputs to this .npz"),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs",
                                        help="run GPU partitions without CUDA-graph replay"),
    preload: list[str] = typer.Option([], "--preload", help="FILE.py or module defining custom "
                                      "ops the artifact's CPU fallback calls"),
    trusted_key: list[Path] = typer.Option([], "--trusted-key", help="require a signature by "
                                           "this public key (repeatable; `exporter keygen`)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run an artifact on inputs from an .npz file."""
    def action() -> int:
        from runtime.__main__ import preload as preload_modules
        from runtime.__main__ import run_npz

        preload_modules(preload)
        outputs, reports = run_npz(artifact, inputs, out, cuda_graphs=not no_cuda_graphs,
                                   trusted_keys=trusted_key)
        summary = {name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                   for name, t in outputs.items()}
        if as_json:
            _print_json({"outputs": summary, "out": str(out) if out else None,
                         "backends": reports})
        else:
            for name, report in reports.items():
                used = ", ".join(report.get("used") or [])
                missing = ", ".join(report.get("missing") or [])
                err_console.print(f"{name}: providers used: {used}"
                                  + (f"; requested but missing: {missing}" if missing else "")
                                  + f"; nodes: {report.get('placement')}",
                                  markup=False, highlight=False)
            for name, info in summary.items():
                out_console.print(f"{name}: {info['dtype']}{info['shape']}")
            if out:
                out_console.print(f"wrote {out}")
        return 0
    _guarded(action)


@app.command()
def validate(
    artifact: Path = typer.Argument(..., help="artifact file"),
    model: str = typer.Option(..., "--model", help="the spec the artifact was built from"),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help=".npz of inputs"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Check an existing artifact against eager PyTorch (exit 1 on mismatch)."""
    def action() -> int:
        from exporter.api import validate as validate_api
        from exporter.report import validation_lines

        record = validate_api(artifact, model, inputs_file=inputs)
        if as_json:
            _print_json(record)
        else:
            for line in validation_lines(record):
                out_console.print(line)
            for warning in record.get("warnings", []):
                err_console.print(f"[yellow]warning:[/yellow] {warning}")
        return 0 if record["passed"] else 1
    _guarded(action)


@app.command()
def inspect(artifact: Path = typer.Argument(..., help="artifact file"),
            as_json: bool = typer.Option(False, "--json", help="print the whole manifest"),
            plot: Optional[Path] = typer.Option(None, "--plot", help="draw the memory plan "
                                                "(live bytes per step, the arena) to FILE.png")
            ) -> None:
    """Verify an artifact and summarise its manifest."""
    def action() -> int:
        import runtime
        from runtime.archive import ArtifactReader

        with ArtifactReader.open(artifact) as reader:
            raw = reader.manifest
        if plot is not None:
            from exporter.memory_plot import plot_memory
            plot_memory(runtime.Manifest.from_dict(raw, where=str(artifact)), plot)
            out_console.print(f"drew the memory plan to {plot}")
            return 0
        if as_json:
            _print_json(raw)
            return 0
        from exporter.report import print_manifest
        print_manifest(out_console, runtime.Manifest.from_dict(raw), str(artifact))
        return 0
    _guarded(action)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json")) -> None:
    """What this machine can build and run (torch, GPU, C++ compiler, ONNX Runtime, TVM,
    torchao...), and the fix for each problem."""
    def action() -> int:
        from exporter.doctor import PROBLEM, as_json as doctor_json, run_checks

        checks = run_checks()
        if as_json:
            _print_json(doctor_json(checks))
            return 0
        from rich.table import Table
        table = Table(show_edge=False)
        for column in ("check", "status", "found", "fix"):
            table.add_column(column)
        colour = {"ok": "green", "problem": "red", "absent": "yellow"}
        for check in checks:
            table.add_row(check.name, f"[{colour[check.status]}]{check.status}[/]",
                          check.found, check.fix)
        out_console.print(table)
        problems = sum(c.status == PROBLEM for c in checks)
        out_console.print(f"{problems} problem(s)" if problems else "no problems found")
        return 0
    _guarded(action)


@app.command()
def keygen(out_dir: Path = typer.Option(..., "--out-dir", help="directory for signing.key "
                                        "(private) and signing.pub")) -> None:
    """Make an Ed25519 key pair for `exporter sign`."""
    def action() -> int:
        from runtime.signing import generate_keys

        if not out_dir.is_dir():
            raise UserInputError(f"the directory {out_dir} does not exist",
                                 hint="create it first")
        key, pub = generate_keys(out_dir)
        out_console.print(f"wrote {key} (private: keep it secret) and {pub} (give it to devices)")
        return 0
    _guarded(action)


@app.command()
def sign(artifact: Path = typer.Argument(..., help="artifact file, signed in place"),
         key: Path = typer.Option(..., "--key", help="signing.key from `exporter keygen`")) -> None:
    """Sign an artifact's manifest (which pins every entry's hash) with an Ed25519 key."""
    def action() -> int:
        from runtime.archive import ArtifactReader
        from runtime.archive_writer import write_signed
        from runtime.signing import signature_for

        try:
            key_pem = key.read_bytes()
        except OSError as exc:
            raise UserInputError(f"cannot read the key ({exc.strerror})", where=str(key)) from None
        with ArtifactReader.open(artifact) as reader:  # verified before it is signed
            signature = signature_for(reader.manifest_bytes, key_pem, where=str(key))
            write_signed(artifact, reader, signature)
        out_console.print(f"signed {artifact} (key {json.loads(signature)['key_id']})")
        return 0
    _guarded(action)


@app.command()
def targets(as_json: bool = typer.Option(False, "--json")) -> None:
    """List targets and whether each can build and run on this machine."""
    def action() -> int:
        from targets import TARGETS

        rows = []
        for target in TARGETS.values():
            availability = target.availability()
            rows.append({"name": target.name, "device": target.device,
                         "backend": target.backend, "available": availability.ok,
                         "reason": availability.reason, "description": target.description})
        if as_json:
            _print_json({"targets": rows})
            return 0
        from rich.table import Table
        table = Table(show_edge=False)
        for column in ("target", "device", "backend", "here", "why"):
            table.add_column(column)
        for row in rows:
            table.add_row(row["name"], row["device"], row["backend"],
                          "[green]yes[/green]" if row["available"] else "[red]no[/red]",
                          row["reason"])
        out_console.print(table)
        return 0
    _guarded(action)


def main() -> None:
    app()
