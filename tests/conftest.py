"""Shared fixtures. Built artifacts are session-scoped: an AOTInductor CPU compile takes
30-60 s here, so each model is compiled once per test run and shared.

Every external command a test runs goes through the ``ran`` fixture, and the
list is printed at the end of the run, so the suite says what it ran.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_COMMANDS: list[str] = []


def _record(cmd) -> None:
    text = cmd if isinstance(cmd, str) else shlex.join(str(c) for c in cmd)
    _COMMANDS.append(text.replace(str(ROOT) + "/", ""))


@pytest.fixture(scope="session")
def ran():
    """Call ``ran(subprocess.run, cmd, ...)`` to run and record a command."""
    def call(fn, cmd, **kwargs):
        _record(cmd)
        return fn(cmd, **kwargs)
    return call


def exporter_cli(*args: str, cwd: Path | None = None, timeout: float = 900
                 ) -> subprocess.CompletedProcess:
    """Run the real console entry point in a subprocess, as a user would."""
    cmd = [sys.executable, "-m", "exporter", *args]
    _record(["exporter", *args])
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "COLUMNS": "200"}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout,
                          env=env)


@pytest.fixture(scope="session")
def cli():
    return exporter_cli


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: hand its list to the controller
        workeroutput["commands"] = list(_COMMANDS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pytest-xdist, on the controller
    _COMMANDS.extend(getattr(node, "workeroutput", {}).get("commands", []))


def pytest_terminal_summary(terminalreporter):
    if _COMMANDS:
        terminalreporter.section("commands the tests ran")
        for command in _COMMANDS:
            terminalreporter.write_line(command)


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="session")
def mlp_build(artifacts_dir):
    """zoo:mlp built for cpu through the Python API, validated (dynamic batch 1..32)."""
    import exporter
    _record("python: exporter.build('zoo:mlp', target='cpu')")
    return exporter.build("zoo:mlp", target="cpu", out=artifacts_dir / "mlp.artifact")


@pytest.fixture(scope="session")
def onnx_mlp(artifacts_dir):
    """zoo:mlp built for onnx (about 10 s): the quick artifact hostile-input tests edit."""
    import exporter
    _record("python: exporter.build('zoo:mlp', target='onnx')")
    return exporter.build("zoo:mlp", target="onnx", out=artifacts_dir / "mlp-onnx.artifact").artifact


@pytest.fixture(scope="session")
def custom_onnx(artifacts_dir, cli):
    """tests/models/custom_op.py on onnx: ONNX Runtime, a CPU-fallback partition for the
    custom op, ONNX Runtime again. Returns (path, the build's CompletedProcess)."""
    out = artifacts_dir / "custom-onnx.artifact"
    return out, cli("build", "tests/models/custom_op.py:factory", "--target", "onnx", "--out",
                    str(out), "--json")


@pytest.fixture(scope="session")
def custom_bench(custom_onnx, cli):
    """`exporter bench --json` of custom_onnx against eager (20 runs): the parsed result."""
    import json
    artifact, built = custom_onnx
    assert built.returncode == 0, built.stderr
    timed = cli("bench", str(artifact), "--baseline", "eager", "--runs", "20", "--warmup", "3",
                "--json")
    assert timed.returncode == 0, timed.stderr
    return json.loads(timed.stdout)
