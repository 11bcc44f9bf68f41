"""Device footprint of a native bundle (executorch or tvm) against the Python onnx bundle:
installed size and process start to first output, on zoo:cnn (a small CNN) or another spec.

    .venv/bin/python -m bench.native_footprint [--target executorch|tvm] [--spec zoo:cnn]
                                               [--aarch64] [--runs 7] [--work DIR]

Builds the spec for the target (tvm: --fallback forbid) and onnx, packs `exporter package
--native` and `exporter package` (onnx), installs the onnx bundle (./install.sh), then times
each way of running one input (batch 1) from a fresh process to its exit (the output file
written): the native runner alone, the native bundle's run.sh (SHA-256 checks first), the onnx
bundle's run.sh (Python, ONNX Runtime) and `python -m runtime run` on the target's artifact
(Python and the target's Python runtime, from the dev venv). ``--aarch64`` also builds the
spec for linux-aarch64 (not validated: size only) and reports its native bundle's size.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

import runtime

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "exporter", *args], cwd=ROOT, check=True,
                   capture_output=True)


def _unpack(bundle: Path, into: Path) -> Path:
    with tarfile.open(bundle) as tar:
        tar.extractall(into, filter="tar")
    return into / bundle.name.removesuffix(".tar.gz")


def _du_kib(path: Path) -> int:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def _median_s(cmd: list[str], runs: int, env: dict | None = None) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _build(spec: str, target: str, out: Path, *extra: str) -> Path:
    if not out.exists():  # a rerun in the same --work reuses its builds
        native = ["--fallback", "forbid"] if target == "tvm" else []
        _cli("build", spec, "--target", target, "--out", str(out), *native, *extra)
    return out


def _inputs(artifact: Path, path: Path) -> Path:
    """One random input per signature input, batch (every dynamic dim) at its minimum."""
    rng, arrays = np.random.default_rng(0), {}
    for spec in runtime.read_manifest(artifact).signature.inputs:
        shape = [d.size if d.size is not None else d.min for d in spec.shape]
        arrays[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    np.savez(path, **arrays)
    return path


def _aarch64_bundle_kib(spec: str, target: str, work: Path, stem: str) -> int:
    artifact = _build(spec, target, work / f"{stem}-a64.artifact", "--platform",
                      "linux-aarch64", "--no-validate")
    bundle = work / f"native-a64-{target}.tar.gz"
    _cli("package", "--native", str(artifact), "--platform", "linux-aarch64", "--out",
         str(bundle))
    return _du_kib(_unpack(bundle, work / "a64"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", choices=("executorch", "tvm"), default="executorch")
    parser.add_argument("--spec", default="zoo:cnn")
    parser.add_argument("--aarch64", action="store_true")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="native-footprint-"))
    work.mkdir(parents=True, exist_ok=True)
    stem = args.spec.rsplit(":", 1)[-1]
    built = _build(args.spec, args.target, work / f"{stem}-{args.target}.artifact")
    onnx = _build(args.spec, "onnx", work / f"{stem}-onnx.artifact")
    _cli("package", "--native", str(built), "--out", str(work / "native.tar.gz"))
    _cli("package", str(onnx), "--out", str(work / "py-onnx.tar.gz"))
    native = _unpack(work / "native.tar.gz", work / "n")
    py_onnx = _unpack(work / "py-onnx.tar.gz", work / "p")
    if not (py_onnx / ".venv" / "bin" / "python").exists():  # a rerun keeps its install
        subprocess.run([str(py_onnx / "install.sh")], check=True, capture_output=True)
    inputs = _inputs(built, work / "in.npz")
    out = str(work / "out.npz")
    site = next((py_onnx / ".venv" / "lib").glob("python*/site-packages"))
    env = {"PATH": "/usr/bin:/bin"}
    rows = {
        "native edge-run": _median_s([str(native / "bin" / "edge-run"), str(built), "--inputs",
                                      str(inputs), "--out", out], args.runs, env),
        # TVM's pool of one worker per core starts (and spins) before the first output
        "native edge-run, one thread": _median_s(
            [str(native / "bin" / "edge-run"), str(built), "--inputs", str(inputs), "--out",
             out], args.runs, {**env, "TVM_NUM_THREADS": "1", "EDGE_THREADS": "1"}),
        "native run.sh": _median_s([str(native / "run.sh"), built.name, "--inputs", str(inputs),
                                    "--out", out], args.runs, env),
        "python onnx bundle run.sh": _median_s([str(py_onnx / "run.sh"), onnx.name, "--inputs",
                                                str(inputs), "--out", out], args.runs, env),
        f"python -m runtime run ({args.target})": _median_s(
            [sys.executable, "-m", "runtime", "run", str(built), "--inputs", str(inputs), "--out",
             out, "--quiet"], args.runs),
    }
    sizes = {f"native {args.target} bundle": _du_kib(native),
             "native lib/": _du_kib(native / "lib"),
             "native artifacts/": _du_kib(native / "artifacts"),
             "python onnx bundle site-packages": _du_kib(site)}
    if args.aarch64:
        sizes[f"native {args.target} bundle, linux-aarch64"] = _aarch64_bundle_kib(
            args.spec, args.target, work, stem)
    print(json.dumps({
        "spec": args.spec, "target": args.target, "installed_kib": sizes,
        "native_libraries": sorted(p.name for p in (native / "lib").iterdir()),
        "start_to_output_s_median": {k: round(v, 3) for k, v in rows.items()},
        "runs": args.runs, "work": str(work)}, indent=1))


if __name__ == "__main__":
    main()
