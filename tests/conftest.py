"""Shared fixtures. Built artifacts are session-scoped: an AOTInductor CPU compile is the
slowest part of a test, so each model is compiled once per test run and shared.

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


def _built_once(tmp_path_factory, name: str, build):
    """``build(folder)`` once per test run, across pytest-xdist's workers too (its
    documented recipe: a lock in the run's shared temp dir): the worker that comes first
    builds, the others read the same artifact. Returns (BuildResult, loaded program,
    folder); a reader's BuildResult holds the artifact's own manifest."""
    import filelock

    import runtime
    from exporter.builder.pipeline import BuildResult
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    folder = shared / name
    with filelock.FileLock(str(shared / f"{name}.lock")):
        done = folder / "built.ok"
        if done.exists():
            path = Path(done.read_text())
            built = BuildResult(artifact=path, manifest=runtime.read_manifest(path))
        else:
            folder.mkdir(parents=True, exist_ok=True)
            built = build(folder)
            done.write_text(str(built.artifact))
    return built, runtime.load(built.artifact), folder


def _generating_onnx(tmp_path_factory, name: str, spec_in, **settings):
    """``spec_in(folder)``: the spec (a checkpoint it writes there, or a factory), built for
    onnx as a generating artifact once per run: (BuildResult, program, folder)."""
    def build(folder):
        import exporter
        spec = spec_in(folder)
        _record(f"python: exporter.build('{spec}', task='text-generation', target='onnx')")
        return exporter.build(spec, task="text-generation", target="onnx",
                              out=folder / f"{name}.artifact", **settings)
    return _built_once(tmp_path_factory, name, build)


@pytest.fixture(scope="session")
def onnx_lm(tmp_path_factory):
    """A tiny Gemma-3-style decoder (sliding window 12 and full layers) with a tokenizer,
    built for onnx as a generating artifact: (build result, loaded program)."""
    from tests.models import tiny_lm
    return _generating_onnx(tmp_path_factory, "tiny-gemma3-onnx", lambda folder: (
        f"hf:{tiny_lm.checkpoint(folder / 'tiny-gemma3')}"), max_context=64,
        prefill_chunk=16)[:2]


@pytest.fixture(scope="session")
def bart_onnx(tmp_path_factory):
    """A tiny BART checkpoint folder with a tokenizer, through hf: (AutoModelForSeq2SeqLM),
    built for onnx as a generating artifact: (build result, loaded program, folder)."""
    from tests.models import tiny_seq2seq
    built, program, folder = _generating_onnx(
        tmp_path_factory, "tiny-bart-onnx", lambda folder: (
            f"hf:{tiny_seq2seq.checkpoint(folder / 'tiny-bart')}"), max_context=48,
        prefill_chunk=16)
    return built, program, folder / "tiny-bart"


@pytest.fixture(scope="session")
def whisper_onnx(tmp_path_factory):
    """tests/models/tiny_seq2seq.py:whisper built for onnx: (build result, program)."""
    return _generating_onnx(tmp_path_factory, "tiny-whisper-onnx", lambda folder: (
        f"{ROOT / 'tests' / 'models' / 'tiny_seq2seq.py'}:whisper"), max_context=48)[:2]


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
