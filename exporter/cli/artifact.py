"""Commands on built artifacts: run, validate, bench, inspect, report, sign, package."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from exporter.cli.common import (DEBUG, JSON, PRELOAD, QUIET, VERBOSE, app, guarded, print_json,
                                 result, say, stage_printer, warn, wrote)

ARTIFACT = typer.Argument(..., help="artifact file")


@app.command()
def run(
    artifact: Path = ARTIFACT,
    inputs: Path = typer.Option(..., "--inputs", help=".npz whose keys are the input names"),
    out: Optional[Path] = typer.Option(None, "--out", help="write outputs to this .npz"),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs",
                                        help="run GPU partitions without CUDA-graph replay"),
    preload: list[str] = PRELOAD,
    trusted_key: list[Path] = typer.Option([], "--trusted-key", help="require a signature by "
                                           "this public key (repeatable; `exporter keygen`)"),
    as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG,
) -> None:
    """Run an artifact on inputs from an .npz file."""
    def action() -> int:
        from runtime.__main__ import backend_lines, run_npz
        from runtime.format.dtypes import name_of
        from runtime.__main__ import preload as preload_modules

        preload_modules(preload)
        outputs, reports = run_npz(artifact, inputs, out, cuda_graphs=not no_cuda_graphs,
                                   trusted_keys=trusted_key)
        summary = {name: {"dtype": name_of(t), "shape": list(t.shape)}
                   for name, t in outputs.items()}
        if as_json:
            print_json({"outputs": summary, "out": str(out) if out else None,
                        "backends": reports})
            return 0
        for line in backend_lines(reports):  # where ONNX Runtime put the nodes: never silent
            say(line)
        for name, info in summary.items():
            result(f"{name}: {info['dtype']}{info['shape']}")
        if out:
            wrote(out)
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json)


@app.command()
def validate(
    artifact: Path = ARTIFACT,
    model: Optional[str] = typer.Option(None, "--model", help="the spec to compare with "
                                        "(default: the one the artifact was built from)"),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help=".npz of inputs"),
    as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG,
) -> None:
    """Check an existing artifact against eager PyTorch (exit 1 on mismatch); a generating
    artifact against transformers' generate, by the gate its build used."""
    def action() -> int:
        from exporter.api import validate as validate_api
        from exporter.cli.common import style
        from exporter.report.console import validation_lines

        record = validate_api(artifact, model, inputs_file=inputs)
        if as_json:
            print_json({"validation": record})
        else:
            for line in validation_lines(record, style.verbose):
                result(line)
            for line in _failure_lines(record):  # what failed, output by output
                result("  " + line)
            for warning in record.get("warnings", []):
                warn(warning)
        return 0 if record["passed"] else 1
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json)


def _failure_lines(record: dict) -> list[str]:
    """A plain record's failing outputs; a generating one's first divergence and the
    judgements that failed (its figures are in validation_lines already)."""
    if record.get("kind") == "generation":
        from exporter.lm.gate import summary_lines
        return summary_lines(record)[1:]
    from exporter.validation.validate import summarize_failure
    return summarize_failure(record)


def _baseline_help() -> list[str]:
    from targets.registry import described
    return ["eager", "compile"] + [f"{name} ({card.name} artifacts: their backend, bare)"
                                   for card in described().values()
                                   for name in card.baselines] + [
        "for generating artifacts hf-eager (transformers' generate; also 'eager') and "
        "hf-static (its static cache + torch.compile; also 'compile')"]


@app.command()
def bench(
    artifact: Path = ARTIFACT,
    baseline: str = typer.Option("eager", "--baseline", help="comma list of "
                                 + ", ".join(_baseline_help())),
    compile_: bool = typer.Option(False, "--compile", help="also time torch.compile "
                                  "(reduce-overhead; its warm-up compiles for about a minute)"),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help=".npz of arrays named as the "
                                          "artifact's inputs (default: the model's example)"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="time this batch: "
                                             "the inputs' rows repeated along a dynamic dim 0"),
    model: Optional[str] = typer.Option(None, "--model", help="spec for baselines and inputs "
                                        "(default: the one in the manifest)"),
    runs: Optional[int] = typer.Option(None, "--runs", help="timed calls per candidate "
                                       "(medians, p90; default 100, generations 5)"),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="untimed calls first, per "
                                         "candidate (default 20, generations 1)"),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", min=1, help="generating "
                                                "artifacts: the prompt's length (default 128, "
                                                "or half the context)"),
    new_tokens: Optional[int] = typer.Option(None, "--new-tokens", min=2, help="generating "
                                             "artifacts: tokens generated per run (default "
                                             "128, or what the context has left)"),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs",
                                        help="run GPU partitions without CUDA-graph replay"),
    as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG,
) -> None:
    """Time the artifact against eager (and torch.compile with --compile), in one process
    (a generating artifact: time to first token and tokens/s against transformers)."""
    def action() -> int:
        _check_counts(runs, warmup)
        names = _baseline_names(baseline, compile_)
        if _generates(artifact, inputs, batch_size, prompt_tokens, new_tokens):
            return _bench_generation(artifact, names, runs or 5, 1 if warmup is None
                                     else warmup, prompt_tokens, new_tokens,
                                     not no_cuda_graphs, as_json)
        return _bench_forward(artifact, names, model, runs or 100,
                              20 if warmup is None else warmup, not no_cuda_graphs, inputs,
                              batch_size, as_json)
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json)


def _baseline_names(baseline: str, compile_: bool) -> tuple[str, ...]:
    names = tuple(b.strip() for b in baseline.split(",") if b.strip())
    return names + (("compile",) if compile_ and "compile" not in names else ())


def _check_counts(runs: int | None, warmup: int | None) -> None:
    from exporter.errors import UserInputError
    wrong = []
    if runs is not None and runs < 1:
        wrong.append(f"--runs {runs}")
    if warmup is not None and warmup < 0:
        wrong.append(f"--warmup {warmup}")
    if wrong:
        raise UserInputError(f"{' and '.join(wrong)} cannot be timed",
                             hint="give --runs 1 or more and --warmup 0 or more")


def _generates(artifact: Path, inputs: Path | None, batch_size: int | None,
               prompt_tokens: int | None, new_tokens: int | None) -> bool:
    """Whether the artifact generates; UserInputError for the other kind's flags."""
    from exporter.errors import UserInputError
    generates = runtime_generates(artifact)
    if generates and (inputs is not None or batch_size is not None):
        raise UserInputError("--inputs and --batch-size apply to artifacts that run a "
                             "plain forward pass; this one generates", where=str(artifact),
                             hint="give --prompt-tokens and --new-tokens instead")
    if not generates and (prompt_tokens is not None or new_tokens is not None):
        raise UserInputError("--prompt-tokens and --new-tokens apply to generating "
                             "artifacts; this one runs a plain forward pass",
                             where=str(artifact), hint="drop them (the inputs come from "
                             "the signature, or --model's example)")
    return generates


def _bench_forward(artifact: Path, names: tuple[str, ...], model: str | None, runs: int,
                   warmup: int, cuda_graphs: bool, inputs: Path | None,
                   batch_size: int | None, as_json: bool) -> int:
    from exporter.benchmark import bench as bench_api
    timed = bench_api(artifact, model=model, baselines=names, runs=runs, warmup=warmup,
                      cuda_graphs=cuda_graphs, inputs=inputs, batch_size=batch_size,
                      stage=stage_printer())
    if as_json:
        print_json(timed)
    else:
        _print_forward(artifact, timed)
    return 0


def _print_forward(artifact: Path, timed: dict) -> None:
    from exporter.report.speed import phrase
    shapes = ", ".join(f"{i['name']} {i['dtype']}{list(i['shape'])}" for i in timed["inputs"])
    say(f"{artifact}: {timed['device']} {timed['dtype']}, {timed['runs']} runs, "
        f"{timed['timer']}; inputs {shapes}")
    for name, timing in timed["timings"].items():
        result(f"  {name:>9}: median {timing['median_ms']:.3f} ms, "
               f"p90 {timing['p90_ms']:.3f} ms")
    for name, speedup in timed["speedups"].items():
        result(f"  artifact: {phrase(speedup, name)}")
    for warning in timed["warnings"]:
        warn(warning)
    for name, timing in timed["partitions"].items():
        result(f"  partition {name} ({timing['backend']} @ {timing['device']}): median "
               f"{timing['median_ms']:.3f} ms")
    host = timed["machine"]
    say(f"on {host['cpu']}, {host['cores']} cores, threads "
        + ", ".join(f"{k} {v or 'default'}" for k, v in host["threads"].items())
        + (f", {host['gpu']}" if host["gpu"] else "") + "; "
        + ", ".join(f"{k} {v}" for k, v in host.get("versions", {}).items()))


def runtime_generates(artifact: Path) -> bool:
    import runtime
    from exporter.kinds import GENERATING, kind_name_of
    return kind_name_of(runtime.read_manifest(artifact)) == GENERATING


def _bench_generation(artifact: Path, names: tuple[str, ...], runs: int, warmup: int,
                      prompt_tokens: int | None, new_tokens: int | None, cuda_graphs: bool,
                      as_json: bool) -> int:
    from exporter.lm.bench import bench_generation
    from exporter.report.speed import phrase
    aliases = {"eager": "hf-eager", "compile": "hf-static"}  # the plain bench's names
    timed = bench_generation(artifact, baselines=tuple(aliases.get(n, n) for n in names),
                             prompt_tokens=prompt_tokens, new_tokens=new_tokens, runs=runs,
                             warmup=warmup, cuda_graphs=cuda_graphs, stage=stage_printer())
    if as_json:
        print_json(timed)
        return 0
    recipe = f" {timed['quantize']}" if timed.get("quantize") else ""
    say(f"{artifact}: {timed['device']} {timed['dtype']}{recipe}, {timed['prompt_tokens']}-token "
        f"prompt, {timed['new_tokens']} new tokens, {timed['threads']} threads, median of "
        f"{timed['runs']} runs; {timed['file_bytes'] / 1e6:.1f} MB file, KV cache "
        f"{timed['cache_bytes'] / 1e6:.1f} MB")
    for name, row in timed["engines"].items():
        memory = row.get("peak_gpu_mb") or row.get("peak_rss_mb")
        result(f"  {name:>10}: first token {row['ttft_s'] * 1000:.1f} ms, prefill "
               f"{row['prefill_tokens_per_s']:.1f} tokens/s, decode "
               f"{row['decode_tokens_per_s']:.1f} tokens/s"
               + (f", peak {memory:.0f} MB" if memory else ""))
    for name, speedup in timed["speedups"].items():
        result(f"  artifact decodes {phrase(speedup, name)}")
    return 0


@app.command()
def inspect(artifact: Path = ARTIFACT,
            plot: Optional[Path] = typer.Option(None, "--plot", help="draw the memory plan "
                                                "(live bytes per step, the arena) to FILE.png"),
            as_json: bool = typer.Option(False, "--json", help="print the whole manifest in "
                                         "one JSON object (docs/json.md)"),
            trusted_key: list[Path] = typer.Option([], "--trusted-key", help="check the "
                                                   "signature against this public key"),
            quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG) -> None:
    """Verify an artifact's hashes and summarise its manifest (and, with --trusted-key,
    its signature)."""
    def action() -> int:
        import runtime
        from runtime.format.archive import ArtifactReader
        from runtime.format.signing import describe_signature, signature_status
        from runtime.host.outfiles import checked_output

        if plot is not None:
            checked_output(plot, flag="--plot", reads=[artifact])
        with ArtifactReader.open(artifact) as reader:
            raw, signature = reader.manifest, signature_status(reader, trusted_key)
        from exporter.report.console import printable
        manifest = runtime.Manifest.from_dict(printable(raw), where=str(artifact))
        from runtime.format.manifest import reading_reports
        if plot is not None:
            from exporter.report.memory_plot import plot_memory
            with reading_reports(str(artifact)):
                plot_memory(manifest, plot)
            wrote(plot, "the memory plan")
        elif as_json:
            from runtime.program.requires import loads_on
            print_json({"artifact": str(artifact), "signature": signature,
                        "signed_by": signature["key_id"], "loads_on": loads_on(manifest),
                        "manifest": raw})
        else:
            from exporter.cli.common import out_console, style
            from exporter.report.console import print_manifest
            with reading_reports(str(artifact)):
                print_manifest(out_console, manifest, str(artifact), style.verbose)
            result(describe_signature(signature))
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json,
            uses_torch=False)


@app.command()
def report(artifacts: list[Path] = typer.Argument(..., help="artifact file; several (builds "
                                                  "of one model) make a comparison page"),
           html: Path = typer.Option(..., "--html", help="write the page to this file"),
           bench_file: list[Path] = typer.Option([], "--bench", help="`exporter bench "
                                                 "ARTIFACT --json` output: the latency chart, "
                                                 "time per partition and per node (once per "
                                                 "artifact)"),
           as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE,
           debug: bool = DEBUG) -> None:
    """Write one self-contained HTML page about an artifact (placement, errors, latency,
    FLOPs, graphs...), or comparing several builds of one model."""
    def action() -> int:
        from exporter.report.html import write_report

        write_report(artifacts, html, bench_file)
        if as_json:
            print_json({"html": str(html), "artifact": str(artifacts[0]),
                        "artifacts": [str(a) for a in artifacts]})
        else:
            wrote(html, "open it in a browser; it loads nothing from the network")
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json)


@app.command()
def sign(artifact: Path = typer.Argument(..., help="artifact file, signed in place"),
         key: Path = typer.Option(..., "--key", help="signing.key from `exporter keygen`"),
         as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE,
         debug: bool = DEBUG) -> None:
    """Sign an artifact's manifest (which pins every entry's hash) with an Ed25519 key."""
    def action() -> int:
        from exporter.errors import UserInputError
        from runtime.format.archive import ArtifactReader
        from exporter.ship.archive_writer import write_signed
        from runtime.format.signing import signature_for, signer_key_id

        try:
            key_pem = key.read_bytes()
        except OSError as exc:
            raise UserInputError(f"cannot read the key ({exc.strerror})", where=str(key)) from None
        with ArtifactReader.open(artifact) as reader:  # verified before it is signed
            signature = signature_for(reader.manifest_bytes, key_pem, where=str(key))
            write_signed(artifact, reader, signature)
        key_id = signer_key_id(signature)
        if as_json:
            print_json({"artifact": str(artifact), "key_id": key_id})
        else:
            wrote(artifact, f"signed with key {key_id}")
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json,
            uses_torch=False)


@app.command()
def package(artifacts: list[Path] = typer.Argument(..., help="artifact files"),
            out: Path = typer.Option(..., "--out", "-o", help="bundle.tar.gz to write"),
            platform: Optional[str] = typer.Option(
                None, "--platform", help="linux-x86_64 | linux-aarch64: the device's "
                "platform, whose wheels the bundle carries (default: this machine's)"),
            native: bool = typer.Option(
                False, "--native", help="the native runner and the libraries it needs "
                "instead of Python (artifacts whose partitions all run natively)"),
            as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE,
            debug: bool = DEBUG) -> None:
    """Bundle artifacts with a runtime wheel, a version lock and run scripts for a device."""
    def action() -> int:
        if native:
            return _package_native(artifacts, out, platform, as_json)
        from exporter.ship.bundle import package as package_api

        packed = package_api(artifacts, out, platform)
        if as_json:
            print_json(packed)
            return 0
        for note in packed["notes"]:
            warn(note)
        wrote(out, f"{len(artifacts)} artifact(s) for {packed['platform']}, {packed['wheel']}, "
                   f"{packed['packages']} locked packages, each wheel inside; see README.txt")
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json,
            uses_torch=False)


def _package_native(artifacts: list[Path], out: Path, platform: str | None,
                    as_json: bool) -> int:
    from exporter.ship.native_bundle import package_native

    packed = package_native(artifacts, out, platform)
    if as_json:
        print_json(packed)
    else:
        wrote(out, f"{len(artifacts)} artifact(s) for {packed['platform']}, native runner with "
                   f"{', '.join(packed['backends'])} and {len(packed['libraries'])} "
                   f"libraries, {packed['installed_bytes'] / 2**20:.1f} MiB installed; "
                   "no Python needed; see README.txt")
    return 0
