"""Language-model engines side by side on one random-weight checkpoint (issue 23's
measuring protocol: a 128-token prompt, 128 new tokens, greedy, a fixed thread count).

    python -m bench.llm.compare --size 300m --threads 2 \\
        --engines hf-eager,hf-static-compile,llamacpp-q8_0,llamacpp-q4_0,ortgenai-int4 \\
        --out build/llm-bench.jsonl
    python -m bench.llm.compare --render build/llm-bench.jsonl

Each engine runs in processes of its own: ``prepare`` (conversion, timed as prepare_s),
then a fresh one that loads and measures (bench.llm.run_engine), so its ru_maxrss is that
engine's peak. Rows are appended as engines finish; an engine that fails leaves a row with
its error and the others go on. ``prefix`` is how many leading generated ids an engine
shares with ``--reference`` (hf-eager: this run's row, else the newest in ``--out`` for the
same size, seed, threads and lengths): the float engines should agree
for many tokens, quantized ones for few (random weights); it is reported, never a failure.
"""

from __future__ import annotations

import platform
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from runtime.host.hostinfo import cpu_model
from bench.llm.checkpoint import param_count
from bench.llm.protocol import common_prefix

DEFAULT_ENGINES = ("hf-eager,hf-static-compile,llamacpp-f32,llamacpp-q8_0,llamacpp-q4_0,"
                   "ortgenai-fp32,ortgenai-int8,ortgenai-int4")
PACKAGES = ("torch", "transformers", "llama_cpp_python", "onnxruntime", "onnxruntime-genai")


def versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def ensure_checkpoint(args) -> Path:
    path = Path(args.checkpoint or Path(args.work_dir) / f"ckpt-{args.size}")
    subprocess.run([sys.executable, "-m", "bench.llm.checkpoint", "--size", args.size,
                    "--out", str(path), "--seed", str(args.seed)], check=True)
    return path


def engine_argv(args, engine: str, checkpoint: Path, phase: str) -> list[str]:
    argv = [sys.executable, "-m", "bench.llm.run_engine", "--engine", engine,
            "--phase", phase, "--checkpoint", str(checkpoint),
            "--work-dir", str(Path(args.work_dir) / f"engines-{checkpoint.name}"),
            "--threads", str(args.threads), "--device", args.device,
            "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens),
            "--repeats", str(args.repeats), "--seed", str(args.seed)]
    for module in args.engine_module:
        argv += ["--engine-module", module]
    return argv


def thread_env(threads: int) -> dict:
    """Every library's thread pool at the same size (torch reads OMP_NUM_THREADS too)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                TOKENIZERS_PARALLELISM="false")


def prepare_engine(args, engine: str, checkpoint: Path) -> float | str:
    """The engine's conversion in its own process: the seconds the first (uncached) call
    took, which the engine's directory keeps, or the error."""
    timing = Path(args.work_dir) / f"engines-{checkpoint.name}" / engine / "prepare-time.json"
    t0 = time.perf_counter()
    prep = subprocess.run(engine_argv(args, engine, checkpoint, "prepare"),
                          env=thread_env(args.threads), capture_output=True, text=True,
                          timeout=args.timeout)
    if prep.returncode != 0:
        return "prepare: " + _tail(prep.stderr)
    if not timing.is_file():
        timing.parent.mkdir(parents=True, exist_ok=True)
        timing.write_text(json.dumps({"prepare_s": round(time.perf_counter() - t0, 1)}))
    return json.loads(timing.read_text())["prepare_s"]


def run_engine(args, engine: str, checkpoint: Path) -> dict:
    """prepare, then measure, each in its own process; the record, or the error (a process
    past ``--timeout`` too: the other engines still run)."""
    try:
        return _prepare_and_measure(args, engine, checkpoint)
    except subprocess.TimeoutExpired as exc:
        phase = exc.cmd[exc.cmd.index("--phase") + 1]
        return {"engine": engine, "error": f"{phase}: over --timeout {args.timeout:.0f} s"}


def _prepare_and_measure(args, engine: str, checkpoint: Path) -> dict:
    env = thread_env(args.threads)
    prepare_s = prepare_engine(args, engine, checkpoint)
    if isinstance(prepare_s, str):
        return {"engine": engine, "error": prepare_s}
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "record.json"
        run = subprocess.run(engine_argv(args, engine, checkpoint, "measure")
                             + ["--result", str(result)], env=env, capture_output=True,
                             text=True, timeout=args.timeout)
        if run.returncode != 0 or not result.is_file():
            return {"engine": engine, "error": "measure: " + _tail(run.stderr)}
        record = json.loads(result.read_text())
    return {**record, "prepare_s": prepare_s}


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(args) -> None:
    checkpoint = ensure_checkpoint(args)
    if args.prepare_only:  # conversions first, so none runs beside a measurement
        for engine in args.engines.split(","):
            print(engine, "prepared:", prepare_engine(args, engine, checkpoint), flush=True)
        return
    header = {"run": datetime.datetime.now().isoformat(timespec="seconds"),
              "date": datetime.date.today().isoformat(), "cpu": cpu_model() or platform.machine(),
              "cores": len(os.sched_getaffinity(0)), "size": args.size,
              "params": param_count(args.size), "seed": args.seed,
              "python": sys.version.split()[0],
              "versions": versions()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for engine in args.engines.split(","):
        load_before = os.getloadavg()[0]
        row = {**header, **run_engine(args, engine, checkpoint),
               "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        reference = row if engine == args.reference else find_reference(out, args)
        if "token_ids" in row and reference:
            row["prefix_ref"] = args.reference
            row["prefix"] = common_prefix(reference["token_ids"], row["token_ids"])
        with out.open("a") as sink:
            sink.write(json.dumps(row) + "\n")
        print(_summary(row), flush=True)


def find_reference(out: Path, args) -> dict | None:
    """The newest row of ``--reference`` (hf-eager) in ``out`` for the same checkpoint size,
    seed and lengths, so an engine measured in a later run is still cross-checked."""
    if not out.is_file():
        return None
    same = {"engine": args.reference, "size": args.size, "threads": args.threads,
            "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens}
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "token_ids" in r and r.get("seed", 0) == args.seed
            and all(r.get(k) == v for k, v in same.items())]
    return rows[-1] if rows else None


def _summary(row: dict) -> str:
    if "error" in row:
        return f"{row['engine']}: FAILED\n{row['error']}"
    prefix = f"{row['prefix']}/{row['new_tokens']}" if "prefix" in row else "n/a"
    ref = row.get("prefix_ref", "the reference")
    return (f"{row['engine']}: TTFT {row['ttft_s'] * 1e3:.0f} ms, prefill "
            f"{row['prefill_tok_s']:.1f} tok/s, decode {row['decode_tok_s']:.2f} tok/s, "
            f"{row['decode_cpu_ms_per_tok']:.0f} CPU ms/tok, "
            f"peak RSS {row['peak_rss_mb']:.0f} MB, ids shared with {ref}: {prefix}")


def render(paths: list[str]) -> str:
    """A markdown table per run (rows of one run share its ``run`` stamp)."""
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines()
            if line.strip()]
    runs: dict[str, list[dict]] = {}
    for row in rows:
        runs.setdefault(row["run"], []).append(row)
    return "\n".join(_render_run(group) for group in runs.values())


def _render_run(rows: list[dict]) -> str:
    first = rows[0]
    vers = ", ".join(f"{k} {v}" for k, v in first["versions"].items())
    lines = [f"{first['date']}, {first['cpu']} ({first['cores']} cores), size {first['size']}"
             f" ({first['params'] / 1e6:.0f}M parameters), {vers}", "",
             "| engine | variant | threads | TTFT (ms) | prefill tok/s | decode tok/s "
             "| decode CPU ms/tok | peak RSS (MB) | file (MB) | prepare (s) | warm-up (s) "
             f"| same ids as {first.get('prefix_ref', '-')} | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | failed: {r['error'].splitlines()[-1][:80]} "
                         "| | | | | | | | | | | |")
            continue
        mem = (f"{r['peak_gpu_mb']:.0f} GPU" if r.get("peak_gpu_mb")
               else f"{r['peak_rss_mb']:.0f}")
        lines.append(
            f"| {r['engine']} | {r['variant']} | {r['threads']} | {r['ttft_s'] * 1e3:.0f} "
            f"| {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} "
            f"| {r.get('decode_cpu_ms_per_tok', float('nan')):.0f} | {mem} "
            f"| {r['file_bytes'] / 1e6:.0f} | {r.get('prepare_s', 0):.0f} "
            f"| {r['warmup_s']:.1f} | {r.get('prefix', '-')}/{r['new_tokens']} "
            f"| {r['loadavg_1m'][0]:.1f}-{r['loadavg_1m'][1]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="300m", choices=["tiny", "300m", "1b"])
    parser.add_argument("--checkpoint", help="an existing checkpoint directory instead")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--engines", default=DEFAULT_ENGINES)
    parser.add_argument("--engine-module", action="append", default=[],
                        help="a module that calls register_engine (repeatable)")
    parser.add_argument("--reference", default="hf-eager",
                        help="the engine whose greedy ids the others are compared with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    parser.add_argument("--work-dir", default="build/llm")
    parser.add_argument("--out", default="build/llm-bench.jsonl")
    parser.add_argument("--prepare-only", action="store_true",
                        help="write the checkpoint and every engine's files, measure nothing")
    parser.add_argument("--render", nargs="+", metavar="JSONL",
                        help="print markdown tables from these files and stop")
    args = parser.parse_args(argv)
    if args.render:
        sys.stdout.write(render(args.render))
    else:
        run(args)


if __name__ == "__main__":
    main()
