"""Shared fixtures of the native runtime's tests: the runner built once (and cached under
build/native/ across sessions by exporter/ship/native_runner.py) and a small good artifact
that runs natively, built once per session."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest


@dataclass(frozen=True)
class Refusal:
    exit_code: int
    message: str


@pytest.fixture(scope="session")
def edge_run() -> Path:
    """edge-run for this machine with the tvm backend (the good artifact's)."""
    from exporter.ship.native_runner import build_runner
    return build_runner(None, frozenset({"tvm"}))


@pytest.fixture(scope="session")
def native_mlp(tmp_path_factory) -> Path:
    """zoo:mlp on tvm with --fallback forbid: every partition can run natively (built once
    per run, across pytest-xdist's workers too)."""
    from tests.conftest import built_once

    def build(folder):
        import exporter
        return exporter.build("zoo:mlp", target="tvm", fallback="forbid",
                              out=folder / "mlp-tvm.artifact", validate_artifact=False)
    return built_once(tmp_path_factory, "native-mlp-tvm", build).artifact


@pytest.fixture(scope="session")
def mlp_inputs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("native-inputs") / "in.npz"
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    np.savez(path, x=x)
    return path


def run_native(edge_run: Path, artifact: Path, inputs: Path, out: Path,
               key: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [str(edge_run), str(artifact), "--inputs", str(inputs), "--out", str(out), "--json"]
    if key is not None:
        cmd += ["--public-key", str(key)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def native_refusal(edge_run: Path, artifact: Path, inputs: Path, out: Path,
                   key: Path | None = None) -> Refusal:
    """How edge-run refused (its --json error), asserting it wrote no --out and said one
    JSON object."""
    done = run_native(edge_run, artifact, inputs, out, key)
    assert done.returncode != 0, done.stdout
    assert not out.exists(), "a refused run wrote its --out file"
    error = json.loads(done.stdout)["error"]
    assert error["exit_code"] == done.returncode
    return Refusal(done.returncode, error["message"])


def python_refusal(artifact: Path, key: Path | None = None) -> Refusal:
    import runtime
    from runtime.errors import ToolchainError
    try:
        runtime.load(artifact, trusted_keys=[key] if key else ())
    except ToolchainError as exc:
        return Refusal(exc.exit_code, str(exc))
    pytest.fail(f"the Python loader accepted {artifact}")


def dynamic_paths(binary: Path) -> dict[str, str]:
    """The RPATH / RUNPATH entries of an ELF file of any machine (binutils' readelf)."""
    shown = subprocess.run(["readelf", "-d", "-W", str(binary)], capture_output=True,
                           text=True, check=True).stdout
    return dict(re.findall(r"\((RPATH|RUNPATH)\)\s+Library \w+: \[([^\]]*)\]", shown))


def is_stripped(binary: Path) -> bool:
    sections = subprocess.run(["readelf", "-S", "-W", str(binary)], capture_output=True,
                              text=True, check=True).stdout
    return ".symtab" not in sections and ".debug_info" not in sections
