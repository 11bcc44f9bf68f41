"""``python -m runtime``: the device-side command line (argparse: no extra dependency).

    python -m runtime run model.artifact --inputs in.npz [--out out.npz]

``run-cases`` is what the exporter's validation subprocess calls: it runs many
input sets through one load of the artifact and writes the outputs to a
safetensors file. A crash in here stays in this process, and the build reports it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import math
import sys
import traceback
from pathlib import Path

import runtime
from runtime.errors import ToolchainError, UserInputError
from runtime.format.dtypes import name_of
from runtime.host.outfiles import checked_output
from runtime.host.tensorio import MAX_INPUT_BYTES, load_npz, load_tensors, save_npz, save_tensors
from runtime.memory.peak import PeakMemory


def preload(sources: list[str]) -> None:
    """Import the modules that register custom ops a CPU-fallback partition calls
    (like ExecuTorch's kernel registration, the device must have the op's kernel)."""
    for source in sources:
        try:
            _import(source)
        except UserInputError:
            raise
        except Exception as exc:  # a missing module or file, or one that fails to import
            raise UserInputError(f"--preload {source}: cannot import it ({type(exc).__name__}: "
                                 f"{exc})", where=source,
                                 hint="install the package that provides it, or give the "
                                 "path of a FILE.py that registers the op") from exc


def _import(source: str) -> None:
    if not source.endswith(".py"):
        importlib.import_module(source)
        return
    if not Path(source).is_file():
        raise UserInputError(f"--preload {source}: no such file", where=source)
    name = "_preload_" + Path(source).stem
    spec = importlib.util.spec_from_file_location(name, source)
    if spec is None or spec.loader is None:
        raise UserInputError(f"cannot import {source}", where=source)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def run_npz(artifact: str | Path, inputs: str | Path, out: str | Path | None, *,
            cuda_graphs: bool = True, trusted_keys: list = ()) -> tuple[dict, dict]:
    """Load, run on the arrays of ``inputs`` (keys = input names), optionally save outputs.
    Returns the outputs and the backends' load reports."""
    if out is not None:
        checked_output(out, reads=[artifact, inputs])  # refused before the run, not after
    program = runtime.load(artifact, cuda_graphs=cuda_graphs, trusted_keys=trusted_keys)
    outputs = program.run(load_npz(inputs, max_bytes=input_bytes_bound(program.manifest)),
                          output_device="cpu")
    if out is not None:
        save_npz(out, outputs)
    return outputs, program.backend_reports


def backend_lines(reports: dict[str, dict]) -> list[str]:
    """The backends' load reports (Program.backend_reports) as lines a person reads: per
    partition, ONNX Runtime's providers used (and any requested but missing) and how many
    nodes of which op types each runs; other backends' plain facts (TVM's version and
    target)."""
    lines = []
    for name, report in reports.items():
        if "used" in report:
            missing = report.get("missing") or []
            lines.append(f"{name}: providers used: {', '.join(report['used'])}"
                         + (f"; requested but missing: {', '.join(missing)}" if missing else ""))
            for provider, placed in (report.get("placement") or {}).items():
                ops = ", ".join(f"{op} x{count}" for op, count in placed["op_types"].items())
                lines.append(f"  {provider} runs {placed['nodes']} node(s): {ops}")
        else:
            facts = [f"{key} {value}" for key, value in report.items()
                     if isinstance(value, (str, int, float)) and not isinstance(value, bool)]
            lines.append(f"{name}: {', '.join(facts)}")
    return lines


def input_bytes_bound(manifest) -> int:
    """The most bytes an inputs file may hold for this artifact (every dynamic dim at its
    max, 8 bytes an element: a .npz may hold int64 or float32 where the model takes int32
    or bfloat16), within tensorio's general limit."""
    elements = sum(math.prod(d.size if d.size is not None else d.max for d in spec.shape)
                   for spec in manifest.signature.inputs)
    return min(max(elements * 8, 1), MAX_INPUT_BYTES)


class Stage:
    """Where this process is, rewritten as it goes into a file the exporter reads if the
    process dies (a signal leaves no exception to say it): ``--stage-out``."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None

    def __call__(self, text: str) -> None:
        if self.path is not None:
            self.path.write_text(text)


def run_cases(artifact: str, cases_path: str, out_path: str, memory_path: str | None = None,
              stage: Stage = Stage(None)) -> None:
    """Inputs are keyed ``"{case}/{input}"``; outputs are written as ``"{case}/{output}"``.
    With ``memory_path``, the peak memory the runs took beyond the loaded program is
    written there as JSON (see runtime.memory.peak)."""
    stage("loading the artifact")
    program = runtime.load(artifact)
    stage("reading the validation inputs")
    grouped: dict[str, dict] = {}
    for key, tensor in load_tensors(cases_path).items():
        case, _, name = key.partition("/")
        grouped.setdefault(case, {})[name] = tensor
    results = {}
    if grouped:  # one run first, so one-time set-up (code pages, thread pools) is not counted
        first = next(iter(grouped))
        stage(f"running the first (warm-up) run, on case {first!r}")
        program.run(grouped[first], output_device="cpu")
    with PeakMemory(program) as peak:
        for case, inputs in sorted(grouped.items()):
            stage(f"running case {case!r}")
            for name, tensor in program.run(inputs, output_device="cpu").items():
                results[f"{case}/{name}"] = tensor
    stage("writing the outputs")
    save_tensors(out_path, results)
    if memory_path is not None:
        Path(memory_path).write_text(json.dumps(peak.record))


def _generate(args) -> None:
    from runtime.generation import parse_prompt, parse_source
    from runtime.generation.sampling import Sampling

    source = parse_source(args.source, args.source_ids, args.source_features,
                          args.source_audio)
    program = runtime.load(args.artifact, cuda_graphs=not args.no_cuda_graphs,
                           trusted_keys=args.trusted_key)
    prompt = parse_prompt(args.prompt, args.prompt_ids, optional="encode" in program.entry_points)
    stream = None if args.json else (lambda token, piece: print(
        piece if piece is not None else token, end="" if piece is not None else " ", flush=True))
    result = program.generate(prompt, args.max_new_tokens, stop=args.stop,
                              sampling=Sampling(args.temperature, args.top_k, args.top_p,
                                                args.seed),
                              stop_at_eos=not args.ignore_eos, stream=stream,
                              language=args.language, task=args.task,
                              **({"source": source} if source is not None else {}))
    if args.json:
        from runtime.memory.peak import peak_resident_bytes
        peak = peak_resident_bytes()
        print(json.dumps({"json_version": 1, **result.to_json(),
                          "peak_rss_mb": round(peak / 2**20, 1) if peak else None}))
    else:
        print(flush=True)
        print(f"{len(result.tokens)} tokens ({result.stop_reason}); "
              f"decode {result.stats['decode_tokens_per_s'] or '-'} tokens/s", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    """The commands: run, generate, and run-cases, which the exporter's validation calls."""
    parser = argparse.ArgumentParser(prog="python -m runtime")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an artifact on inputs from an .npz")
    run.add_argument("artifact")
    run.add_argument("--inputs", required=True)
    run.add_argument("--out")
    run.add_argument("--no-cuda-graphs", action="store_true")
    run.add_argument("--preload", action="append", default=[],
                     help="FILE.py or module to import first (registers custom ops)")
    run.add_argument("--trusted-key", action="append", default=[],
                     help="require a signature by this Ed25519 public key (PEM)")
    run.add_argument("--quiet", "-q", action="store_true", help="print only errors and outputs")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logs of the runtime")
    gen = sub.add_parser("generate", help="generate text (artifacts built with --task "
                         "text-generation)")
    gen.add_argument("artifact")
    gen.add_argument("--prompt", help="prompt text (needs the 'tokenizers' package)")
    gen.add_argument("--prompt-ids", help="prompt as comma-separated token ids")
    gen.add_argument("--source", help="an encoder-decoder's source text")
    gen.add_argument("--source-ids", help="an encoder-decoder's source as token ids")
    gen.add_argument("--source-features", help="a speech encoder's input features "
                     "(.npy or .safetensors)")
    gen.add_argument("--source-audio", help="a Whisper artifact's audio (PCM WAV at the "
                     "model's rate, 16 kHz)")
    gen.add_argument("--language", help="Whisper: the speech's language code (default: "
                     "detected)")
    gen.add_argument("--task", help="Whisper: transcribe or translate")
    gen.add_argument("--max-new-tokens", "-n", type=int, default=None,
                     help="default: the checkpoint's max_new_tokens, else 128")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[])
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--no-cuda-graphs", action="store_true")
    gen.add_argument("--json", action="store_true", help="one JSON object on stdout")
    gen.add_argument("--preload", action="append", default=[],
                     help="FILE.py or module to import first (registers custom ops)")
    gen.add_argument("--trusted-key", action="append", default=[],
                     help="require a signature by this Ed25519 public key (PEM)")
    cases = sub.add_parser("run-cases", help="(internal) run many input sets, for validation")
    cases.add_argument("artifact")
    cases.add_argument("--cases", required=True)
    cases.add_argument("--out", required=True)
    cases.add_argument("--preload", action="append", default=[])
    cases.add_argument("--memory-out", help="write the measured peak memory here (JSON)")
    cases.add_argument("--stage-out", help="rewrite the stage reached here as it goes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    # the exporter CLI's style: "warning: ...", "error: ..." on stderr; debug logs name the part
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
        logging.addLevelName(level, logging.getLevelName(level).lower())
    logging.basicConfig(level=logging.ERROR if quiet else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s: %(message)s" if not verbose
                        else "%(levelname)s %(name)s: %(message)s")
    if verbose:
        logging.getLogger("runtime").setLevel(logging.DEBUG)
    stage = Stage(getattr(args, "stage_out", None))
    try:
        stage("importing the --preload modules")
        preload(args.preload)
        if args.command == "run":
            outputs, reports = run_npz(args.artifact, args.inputs, args.out,
                                       cuda_graphs=not args.no_cuda_graphs,
                                       trusted_keys=args.trusted_key)
            for line in backend_lines(reports) if not quiet else ():
                print(line, file=sys.stderr)
            for name, tensor in outputs.items():
                print(f"{name}: {name_of(tensor)}{list(tensor.shape)}")
            if not quiet:  # where the values went (run.sh's user looks for them)
                print(f"wrote the outputs to {Path(args.out).resolve()}" if args.out else
                      "outputs not saved: give --out FILE.npz to keep them", file=sys.stderr)
        elif args.command == "generate":
            _generate(args)
        else:
            run_cases(args.artifact, args.cases, args.out, args.memory_out, stage)
    except ToolchainError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        _json_error(args, type(exc).__name__, exc.exit_code, str(exc))
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - generate: a bug of ours, said in one paragraph
        if args.command != "generate":  # the validation's commands report crashes as such
            raise
        return _internal_error(args, exc)
    return 0


def _internal_error(args, exc: BaseException) -> int:
    """Exit 4 with one paragraph (and under --json one object); --debug: the traceback."""
    if args.debug:
        traceback.print_exc()
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    message = (f"internal error in generate: {type(exc).__name__}: {first}. This is a bug in "
               "the runtime, not in your input.\nTry: --debug to see the traceback, and "
               "please report it")
    print(f"error: {message}", file=sys.stderr)
    _json_error(args, "InternalError", 4, message)
    return 4


def _json_error(args, kind: str, code: int, message: str) -> None:
    """Under ``generate --json`` stdout is one JSON object, an error's too (docs/json.md)."""
    if getattr(args, "json", False):
        print(json.dumps({"json_version": 1, "error": {"type": kind, "exit_code": code,
                                                       "message": message}}))


def console() -> None:
    """The ``edge-runtime`` console script of the runtime wheel (``exporter package``)."""
    sys.exit(main())


if __name__ == "__main__":
    console()
