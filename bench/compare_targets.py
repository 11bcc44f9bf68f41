"""CPU targets side by side: each model built for each variant (a target, or TARGET:RECIPE
for a quantized build), then every artifact, eager torch and the asked baselines timed in ONE
process, interleaved, on the model's example inputs, every engine on ``--threads`` threads.

    python bench/compare_targets.py --models mlp,cnn,encoder,decoder --tune encoder:64 \
        --json-out build/bench/targets.jsonl
    taskset -c 0,1 python bench/compare_targets.py --work-dir build/bench-et \
        --models bench/models.py:hf_mobilenet_v2,bench/models.py:bert_base \
        --variants cpu,onnx,executorch,cpu:int8-static,onnx:int8-dynamic,\
executorch:int8-static,executorch:int8-dynamic --baselines ort,eager-int8 \
        --focus executorch --max-load 2.5 --json-out build/bench-et/targets.jsonl
    python bench/compare_targets.py --render build/bench/targets.jsonl >> bench/RESULTS.md

A model is a zoo name or any build spec (FILE.py:FUNCTION, zoo:NAME). Builds run as the CLI
(`python -m exporter build`, validation included), cached in ``--work-dir`` with a sidecar
of their command, time or typed error: a variant that does not build is a column that says
so. Baselines: ``ort``, a plain ONNX Runtime session on ``torch.onnx.export``'s file of the
same model (no artifact, numpy feeds made once); ``eager-int8``, torch's own dynamic int8
(``torch.ao.quantization.quantize_dynamic`` of the Linear layers). Static recipes calibrate
on random inputs (timing, not accuracy). Before timing each model the script waits for the
1-minute load average to fall under ``--max-load`` and records it during the measurement.

All runtimes live in one process, as a service embedding several would: ONNX Runtime's
and TVM's thread pools spin briefly after a call, which the interleaving (blocks of
runs/10 calls per candidate, ten rounds) spreads over all candidates alike.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (LoadSampler, append_row, fix_threads, machine_header,  # noqa: E402
                          read_rows, run_or_render, time_artifacts, wait_for_quiet)

TARGETS = ("cpu", "onnx", "tvm")


def _spec(model: str) -> str:
    return model if ":" in model else f"zoo:{model}"


def _name(model: str) -> str:
    return model.rsplit(":", 1)[-1]


def variants(model: str, labels: list[str], tune: int, min_sqnr: float | None = None
             ) -> list[tuple[str, str, list[str]]]:
    """(label, spec, CLI flags) per build; TARGET:RECIPE is a quantized build (``min_sqnr``:
    its gate, lowered to time a recipe that random weights make miss it)."""
    out = []
    for label in labels:
        target, _, recipe = label.partition(":")
        flags = ["--target", target]
        if recipe:
            flags += ["--quantize", recipe]
            flags += [] if min_sqnr is None else ["--min-sqnr", str(min_sqnr),
                                                  "--min-cosine", "-1"]
            flags += ["--calibration", "random"] if recipe == "int8-static" else []
        out.append((label, _spec(model), flags))
    if tune:  # MetaSchedule tunes static shapes only: static builds, untuned and tuned
        static = f"{ROOT}/bench/static_zoo.py:{_name(model)}"
        out += [("tvm-static", static, ["--target", "tvm"]),
                (f"tvm-static-tune{tune}", static, ["--target", "tvm", "--tune", str(tune)])]
    return out


def build_one(label: str, spec: str, flags: list[str], work_dir: Path, name: str) -> dict:
    """{"path", "build_s", "command"} or {"error"}: built once, then read from the cache."""
    out = work_dir / f"{name}-{label.replace(':', '-')}.artifact"
    sidecar = out.with_suffix(".build.json")
    if sidecar.exists() and (out.exists() or "error" in json.loads(sidecar.read_text())):
        return json.loads(sidecar.read_text())
    cmd = [sys.executable, "-m", "exporter", "build", spec, *flags, "--out", str(out), "--json"]
    if out.exists():  # built by an earlier run cut short (the CLI writes it only when done)
        return {"command": " ".join(["python", *cmd[1:]]), "build_s": None, "path": str(out)}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    info = {"command": " ".join(["python", *cmd[1:]]),
            "build_s": round(time.perf_counter() - start, 1)}
    if done.returncode == 0:
        info["path"] = str(out)
    else:  # the CLI's --json error object, or the last line of a crash
        try:
            info["error"] = json.loads(done.stdout)["error"]["message"].splitlines()[0]
        except (ValueError, KeyError, TypeError):
            info["error"] = (done.stderr.strip().splitlines() or ["no output"])[-1]
        info["exit_code"] = done.returncode
    sidecar.write_text(json.dumps(info))
    print(f"  {label}: {info.get('error', 'built')} ({info['build_s']} s)", file=sys.stderr,
          flush=True)
    return info


def delegation(path: str) -> dict:
    """Where an executorch artifact's ops run: inside XNNPACK, on ExecuTorch's own kernels
    (which ops), and the partitions outside ExecuTorch (our CPU fallback)."""
    import runtime

    manifest = runtime.read_manifest(path).to_dict()
    out = {"xnnpack_ops": 0, "portable_ops": 0, "delegates": 0, "portable": {},
           "other_partitions": []}
    for part in manifest["partitions"]:
        meta = part.get("meta", {})
        if part.get("backend") != "executorch":
            out["other_partitions"].append(part.get("backend"))
            continue
        for key in ("xnnpack_ops", "portable_ops", "delegates"):
            out[key] += meta.get(key) or 0
        for op, where in (meta.get("placement") or {}).items():
            if where.get("portable"):
                out["portable"][op] = out["portable"].get(op, 0) + where["portable"]
    return out


def plain_ort(module, args: tuple, kwargs: dict, inputs: list, path: Path, threads: int):
    """A call of ONNX Runtime on ``torch.onnx.export``'s file, as a user without us would."""
    import onnxruntime as ort
    import torch

    if not path.exists():
        tmp = path.with_suffix(".tmp.onnx")
        torch.onnx.export(module, args, str(tmp), kwargs=kwargs or None, dynamo=True)
        tmp.rename(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feeds = dict(zip(names, (t.numpy() for t in inputs)))
    return lambda: session.run(None, feeds)


def plain_aoti(module, args: tuple, kwargs: dict, path: Path, while_compiling=None,
               freezing: bool = True):
    """A call of AOTInductor as a user without us would: ``torch.export``, then
    ``aoti_compile_and_package`` with freezing (weights folded into the library and
    prepacked: Inductor's fast CPU setting), loaded as ``aoti_load_package`` does. Compiled
    under the process's thread count, which Inductor's C++ code is generated for;
    ``while_compiling``: a context manager around the compile (one change to Inductor);
    ``freezing=False``: the weights stay inputs of the library's kernels, as in eager."""
    import contextlib

    import torch

    from targets.toolchain import choose_cxx

    if not path.exists():
        tmp = path.with_suffix(".tmp.pt2")
        configs = {"freezing": freezing, "cpp.cxx": (None, choose_cxx().compiler or "g++")}
        with torch.no_grad(), (while_compiling or contextlib.nullcontext()):
            program = torch.export.export(module, args, kwargs, strict=False)
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp),
                                                     inductor_configs=configs)
        tmp.rename(path)
    # aoti_load_package's own wrapper over this C++ loader, without its CPU-ISA probes
    # (compiler runs, most of a minute on a fresh machine: runtime/executors/aoti.py)
    from torch._inductor.package.package import AOTICompiledModel
    runner = AOTICompiledModel(torch._C._aoti.AOTIModelPackageLoader(str(path), "model",
                                                                      False, 1, -1))
    return lambda: runner(*args, **(kwargs or {}))


def aligned_aoti(path: Path, work_dir: Path, inputs: list):
    """The AOTInductor-frozen package's library as the runtime loads a CPU library
    (runtime/executors/aoti.py): its float32 oneDNN-packed constants copied to 64-byte
    aligned memory, so the two loads of one library can be timed side by side."""
    import tempfile

    from runtime.executors.aoti import aligned_cpu_runner

    runner = aligned_cpu_runner(path, Path(tempfile.mkdtemp(dir=work_dir,
                                                            prefix="aoti-aligned-")))
    if runner is None:
        raise RuntimeError(f"{path}: not one CPU library, nothing to align")
    return lambda: runner.run(inputs)


def eager_int8(module):
    import copy

    import torch
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(copy.deepcopy(module), {torch.nn.Linear}, dtype=torch.qint8)


def baselines(model: str, names: list[str], work_dir: Path, threads: int,
              made_only: bool = False) -> tuple:
    """(inputs, {label: call}) for eager and each asked baseline (``aoti``: AOTInductor
    frozen; ``aoti-aligned``: its library with the constants the runtime would copy to
    aligned memory copied so). ``made_only``: a baseline whose file an earlier step did
    not make is left out rather than made now (a timing step must not compile beside
    other timings)."""
    from exporter.model.spec import load_spec
    from runtime.program.flat_inputs import flatten_inputs

    spec = load_spec(_spec(model))
    module, args, kwargs = spec.module, spec.args, spec.kwargs
    inputs = flatten_inputs(args, kwargs).tensors
    calls = {"eager": lambda: module(*args, **kwargs)}
    files = {"ort": work_dir / f"{_name(model)}-torch-onnx-export.onnx",
             "aoti": work_dir / f"{_name(model)}-aoti-frozen.pt2"}
    files["aoti-aligned"] = files["aoti"]
    names = [n for n in names if not (made_only and n in files and not files[n].exists())]
    if "ort" in names:
        calls["ort"] = plain_ort(module, args, kwargs, inputs, files["ort"], threads)
    if "aoti" in names:
        calls["aoti"] = plain_aoti(module, args, kwargs, files["aoti"])
    if "aoti-aligned" in names:
        plain_aoti(module, args, kwargs, files["aoti"])  # compiled if not yet
        calls["aoti-aligned"] = aligned_aoti(files["aoti"], work_dir, inputs)
    if "eager-int8" in names:
        quantized = eager_int8(module)
        calls["eager-int8"] = lambda: quantized(*args, **kwargs)
    return inputs, calls


def run(args) -> None:
    import onnxruntime
    import torch

    work_dir = Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tune = dict(item.split(":") for item in args.tune.split(",") if item)
    threads = fix_threads(args.threads)
    versions = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
    for key, package in (("tvm", "apache-tvm"), ("executorch", "executorch")):
        try:
            versions[key] = metadata.version(package)
        except metadata.PackageNotFoundError:  # not installed: no such column
            continue
    header = machine_header(**versions, runs=args.runs, threads=threads,
                            affinity=sorted(os.sched_getaffinity(0)), focus=args.focus,
                            argv=" ".join(sys.argv))
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json_out, "a") as sink:
        for model in args.models.split(","):
            print(f"{model}:", file=sys.stderr, flush=True)
            built = {label: build_one(label, spec, flags, work_dir, _name(model))
                     for label, spec, flags in variants(model, args.variants.split(","),
                                                        int(tune.get(_name(model), 0)),
                                                        args.min_sqnr)}
            if args.build_only:
                continue
            inputs, calls = baselines(model, args.baselines.split(","), work_dir, args.threads)
            quiet = wait_for_quiet(args.max_load, args.max_wait)
            with _one_measurement(work_dir):  # two of ours timing at once would spoil both
                quiet["again"] = wait_for_quiet(args.max_load, min(60.0, args.max_wait))
                with LoadSampler() as load:
                    timings = time_artifacts({k: v["path"] for k, v in built.items()
                                              if "path" in v}, inputs, args.runs, args.warmup,
                                             extra_calls=calls)
            row = {**header, "model": _name(model), "spec": _spec(model), "timings": timings,
                   "build_s": {k: v["build_s"] for k, v in built.items()},
                   "errors": {k: v["error"] for k, v in built.items() if "error" in v},
                   "commands": {k: v["command"] for k, v in built.items()},
                   "quiet": quiet, "load": load.summary(),
                   "delegation": {k: delegation(v["path"]) for k, v in built.items()
                                  if k.startswith(args.focus) and "path" in v
                                  and args.focus == "executorch"}}
            append_row(sink, row)


@contextlib.contextmanager
def _one_measurement(work_dir: Path):
    with open(work_dir / ".timing.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _int8(label: str) -> bool:
    return "int8" in label


def _ratio_cells(t: dict, focus: str, labels: list[str]) -> str:
    """focus/eager and focus/best peer, the focus being its fastest variant among labels."""
    mine = {k: t[k] for k in labels if k.split(":")[0] == focus and k in t}
    peers = {k: t[k] for k in labels if k.split(":")[0] != focus and k in t}
    if not mine or "eager" not in t:
        return "– | – |"
    best = min(mine, key=mine.get)
    peer = min(peers, key=peers.get) if peers else None
    vs_peer = f"{mine[best] / peers[peer]:.2f} ({peer})" if peer else "–"
    return f"{mine[best] / t['eager']:.2f} | {vs_peer} |"


def _table(rows: list[dict], labels: list[str], focus: str) -> list[str]:
    lines = [f"| model | load (1-min, during) | eager | " + " | ".join(labels)
             + f" | {focus}/eager | {focus}/best peer |",
             "|---|---|---|" + "---|" * (len(labels) + 2)]
    for row in rows:
        t = {k: v["median_ms"] for k, v in row["timings"].items()}
        errors = row.get("errors", {})
        cells = [f"{t[k]:.3f}" if k in t else ("fails" if k in errors else "–") for k in labels]
        load = row.get("load")
        where = f"{load['min']:.1f}-{load['max']:.1f}" if load else "–"
        lines.append(f"| {row['model']} | {where} | {t['eager']:.3f} | " + " | ".join(cells)
                     + f" | {_ratio_cells(t, focus, labels)}")
    return lines


def render(paths: list[str]) -> str:
    return render_rows(read_rows(paths))


def render_rows(rows: list[dict]) -> str:
    head = rows[0]
    focus = head.get("focus", "tvm")
    labels = list(dict.fromkeys(label for row in rows  # every column, in first-seen order
                                for label in [*row["timings"], *row.get("errors", {})]
                                if label != "eager"))
    engines = ", ".join(f"{k} {head[k]}" for k in ("torch", "onnxruntime", "executorch", "tvm")
                        if k in head)
    lines = [f"\n## {head['date']}: CPU targets side by side, {head['cpu']}, {head['cores']} cores",
             f"{engines}, Python {head['python']}. `python bench/compare_targets.py`: "
             f"per model, every artifact and eager in one process, interleaved; median ms over "
             f"{head['runs']} calls at the example inputs; threads {head.get('threads', '-')}."
             f" Ratios below 1: {focus} is faster.\n"]
    fp32 = [k for k in labels if not _int8(k)]
    int8 = [k for k in labels if _int8(k)]
    lines += _table(rows, fp32, focus)
    if int8:
        lines += ["", f"int8 (ratios against fp32 eager, and the fastest int8 peer):", ""]
        lines += _table(rows, int8, focus)
    placed = [f"- {row['model']} {k}: {d['xnnpack_ops']} ops in {d['delegates']} XNNPACK "
              f"subgraph(s), {d['portable_ops']} on ExecuTorch's kernels"
              + (f" ({', '.join(f'{op} x{n}' for op, n in sorted(d['portable'].items()))})"
                 if d["portable"] else "")
              + (f"; partitions outside ExecuTorch: {', '.join(d['other_partitions'])}"
                 if d["other_partitions"] else "")
              for row in rows for k, d in row.get("delegation", {}).items()]
    if placed:
        lines += ["", f"Where the {focus} programs' ops run (the build's manifest):", *placed]
    failed = [f"- {row['model']} {k}: {e}" for row in rows
              for k, e in row.get("errors", {}).items()]
    if failed:
        lines += ["", "Builds that failed (typed errors of `exporter build`):", *failed]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cnn,encoder,decoder")
    parser.add_argument("--variants", default=",".join(TARGETS),
                        help="TARGET or TARGET:RECIPE (a --quantize build), comma-separated")
    parser.add_argument("--baselines", default="",
                        help="ort, aoti (frozen), eager-int8 (eager always)")
    parser.add_argument("--focus", default="tvm", help="the target the ratio columns are of")
    parser.add_argument("--tune", default="", help="MODEL:TRIALS,... for tvm --tune")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-load", type=float, default=1e9,
                        help="wait before timing until the 1-minute load average is below")
    parser.add_argument("--max-wait", type=float, default=600.0, help="seconds, at most")
    parser.add_argument("--min-sqnr", type=float, default=None,
                        help="quantized builds' gate (default: the build's); the table "
                             "times them either way, the gate figures are in the manifest")
    parser.add_argument("--build-only", action="store_true", help="build (or check the cache)")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    run_or_render(parser, run, render, "build/bench/targets.jsonl")


if __name__ == "__main__":
    main()
