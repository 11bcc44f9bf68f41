"""Device footprint of a native executorch bundle against the Python onnx bundle: installed
size and process start to first output, on zoo:cnn (a small CNN).

    .venv/bin/python -m bench.native_footprint [--runs 7] [--work DIR]

Builds zoo:cnn for executorch and onnx, packs `exporter package --native` (executorch) and
`exporter package` (onnx), installs the onnx bundle (./install.sh), then times each way of
running one input from a fresh process to its exit (the output file written): the native
runner alone, the native bundle's run.sh (SHA-256 checks first), the onnx bundle's run.sh
(Python, ONNX Runtime) and `python -m runtime run` on the executorch artifact (Python,
ExecuTorch's pybindings, from the dev venv). Prints one JSON object.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="native-footprint-"))
    work.mkdir(parents=True, exist_ok=True)
    et, onnx = work / "cnn-et.artifact", work / "cnn-onnx.artifact"
    for artifact, target in ((et, "executorch"), (onnx, "onnx")):
        if not artifact.exists():
            _cli("build", "zoo:cnn", "--target", target, "--out", str(artifact))
    _cli("package", "--native", str(et), "--out", str(work / "native.tar.gz"))
    _cli("package", str(onnx), "--out", str(work / "py-onnx.tar.gz"))
    native = _unpack(work / "native.tar.gz", work / "n")
    py_onnx = _unpack(work / "py-onnx.tar.gz", work / "p")
    if not (py_onnx / ".venv" / "bin" / "python").exists():  # a rerun keeps its install
        subprocess.run([str(py_onnx / "install.sh")], check=True, capture_output=True)
    inputs = work / "in.npz"
    np.savez(inputs, image=np.random.default_rng(0).standard_normal((1, 3, 32, 32)
                                                                    ).astype(np.float32))
    out = str(work / "out.npz")
    site = next((py_onnx / ".venv" / "lib").glob("python*/site-packages"))
    env = {"PATH": "/usr/bin:/bin"}
    rows = {
        "native edge-run": _median_s([str(native / "bin" / "edge-run"), str(et), "--inputs",
                                      str(inputs), "--out", out], args.runs,
                                     {**env, "LD_LIBRARY_PATH": str(native / "lib")}),
        "native run.sh": _median_s([str(native / "run.sh"), et.name, "--inputs", str(inputs),
                                    "--out", out], args.runs, env),
        "python onnx bundle run.sh": _median_s([str(py_onnx / "run.sh"), onnx.name, "--inputs",
                                                str(inputs), "--out", out], args.runs, env),
        "python -m runtime run (executorch)": _median_s(
            [sys.executable, "-m", "runtime", "run", str(et), "--inputs", str(inputs), "--out",
             out, "--quiet"], args.runs),
    }
    print(json.dumps({
        "installed_kib": {"native executorch bundle": _du_kib(native),
                          "native lib/": _du_kib(native / "lib"),
                          "python onnx bundle site-packages": _du_kib(site)},
        "native_libraries": sorted(p.name for p in (native / "lib").iterdir()),
        "start_to_output_s_median": {k: round(v, 3) for k, v in rows.items()},
        "runs": args.runs, "work": str(work)}, indent=1))


if __name__ == "__main__":
    main()
