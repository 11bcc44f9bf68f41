"""Shared fixtures. Built artifacts are session-scoped: an AOTInductor CPU compile is the
slowest part of a test, so each model is compiled once per test run and shared.

Every external command a test runs goes through the ``ran`` fixture, and the
list is printed at the end of the run, so the suite says what it ran.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_COMMANDS: list[str] = []
# cpu builds skip the backend choice (an ONNX build and a timing each) unless a test asks
os.environ.setdefault("EDGE_EXPORTER_CPU_BACKEND", "aoti")
# OpenMP threads sleep between parallel regions instead of spinning: two workers and their
# builds share two cores, and libgomp's spin-waits were 12% of a worker's CPU samples
# (perf); read when torch loads libgomp, so set before anything imports torch
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The cyclic GC took 13% of a worker's CPU in in-process builds (FX and torch.export make
# millions of short-lived objects; each full pass walked torch's and the suite's imports):
# fewer young passes, and what collection imported is frozen out of them (3.3 -> 1.0 GC
# CPU s in test_onnx_backend; docs/testing.md). gc.collect() still frees everything new.
gc.set_threshold(50_000, 20, 10)


def pytest_collection_finish(session):
    gc.freeze()


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


def exporter_in_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``exporter ARGS`` through the console script's own command group in this process:
    the same parsing, messages and exit codes as exporter_cli, without a new interpreter's
    seconds of imports. For what a command says and does; start-up, signals and exit
    handlers stay with exporter_cli. What the CLI sets process-wide is undone after."""
    from click.testing import CliRunner

    from exporter.cli.commands import console_command
    _record(["exporter", *args, "(in process)"])
    args_list = [str(a) for a in args]
    handlers, signals = logging.getLogger().handlers[:], {
        s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    levels = {n: logging.getLogger(n).level for n in ("exporter", "passes", "targets", "runtime")}
    here = os.getcwd()
    try:
        os.chdir(cwd or ROOT)
        with warnings.catch_warnings():
            done = CliRunner(env={"COLUMNS": "200"}).invoke(
                console_command(args_list), args_list, prog_name="python -m exporter")
    finally:
        os.chdir(here)
        logging.captureWarnings(False)
        logging.getLogger().handlers[:] = handlers
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        for number, handler in signals.items():
            signal.signal(number, handler)
        from exporter.cli import interrupts
        interrupts.forget()  # a process runs one command; here the next one starts afresh
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception  # a subprocess would have printed a traceback: a bug
    return subprocess.CompletedProcess(["exporter", *args_list], done.exit_code, done.stdout,
                                       done.stderr)


@pytest.fixture(scope="session")
def cli_here():
    """exporter_cli's in-process twin (exporter_in_process)."""
    return exporter_in_process


def _torch_modes() -> dict | None:
    torch = sys.modules.get("torch")  # a test that never imported torch changed none
    if torch is None:
        return None
    return {"grad mode": torch.is_grad_enabled(), "inference mode":
            torch.is_inference_mode_enabled(), "default dtype": torch.get_default_dtype(),
            "deterministic algorithms": torch.are_deterministic_algorithms_enabled()}


@pytest.fixture(autouse=True)
def torch_modes_kept():
    """torch's process-wide modes as each test found them: a build leaves its caller's
    as given (docs/trust.md), and a test that sets one undoes it, or the tests after it
    run in a process no user has (a leaked grad-mode-off hid a build's leak once)."""
    before = _torch_modes()
    yield
    after = _torch_modes()
    if before is not None and after != before:
        changed = {k: f"{before[k]} -> {after[k]}" for k in before if before[k] != after[k]}
        import torch  # put back, so one test's leak fails that test only
        torch.set_grad_enabled(before["grad mode"])
        torch.set_default_dtype(before["default dtype"])
        torch.use_deterministic_algorithms(before["deterministic algorithms"])
        pytest.fail(f"the test left torch's process-wide modes changed: {changed}")


def pytest_configure(config):
    from tests.cpu_record import register
    register(config)  # EDGE_TEST_CPU=FOLDER: per-test CPU seconds (tests/cpu_record.py)


def pytest_collection_modifyitems(items):
    from tests.schedule import heaviest_first
    heaviest_first(items)


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


def _shared_folder(tmp_path_factory, name: str, make) -> Path:
    """A folder that ``make(folder)`` fills once per test run, across pytest-xdist's
    workers too (its documented recipe: a lock in the run's shared temp dir): the worker
    that comes first makes it, the others wait and read it."""
    import filelock
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    shared.mkdir(parents=True, exist_ok=True)
    folder = shared / name
    with filelock.FileLock(str(shared / f"{name}.lock")):
        if not (folder / "made.ok").exists():
            folder.mkdir(exist_ok=True)
            make(folder)
            (folder / "made.ok").touch()
    return folder


def built_once(tmp_path_factory, name: str, build):
    """``build(folder)`` (a BuildResult) once per test run across workers: the
    BuildResult, its artifact's own manifest in it where another worker built it."""
    import runtime
    from exporter.builder.pipeline import BuildResult
    made: list = []

    def make(folder):
        made.append(build(folder))
        (folder / "artifact.path").write_text(str(made[0].artifact))
    folder = _shared_folder(tmp_path_factory, name, make)
    if made:
        return made[0]
    path = Path((folder / "artifact.path").read_text())
    return BuildResult(artifact=path, manifest=runtime.read_manifest(path))


@pytest.fixture(scope="session")
def mlp_build(tmp_path_factory):
    """zoo:mlp built for cpu through the Python API, validated (dynamic batch 1..32)."""
    def build(folder):
        import exporter
        _record("python: exporter.build('zoo:mlp', target='cpu')")
        return exporter.build("zoo:mlp", target="cpu", out=folder / "mlp.artifact")
    return built_once(tmp_path_factory, "mlp-cpu", build)


@pytest.fixture(scope="session")
def onnx_mlp(tmp_path_factory):
    """zoo:mlp built for onnx (about 10 s): the quick artifact hostile-input tests edit."""
    def build(folder):
        import exporter
        _record("python: exporter.build('zoo:mlp', target='onnx')")
        return exporter.build("zoo:mlp", target="onnx", out=folder / "mlp-onnx.artifact")
    return built_once(tmp_path_factory, "mlp-onnx", build).artifact


def _generating_onnx(tmp_path_factory, name: str, spec_in, **settings):
    """``spec_in(folder)``: the spec (a checkpoint it writes there, or a factory), built for
    onnx as a generating artifact once per run: (BuildResult, program, folder)."""
    import runtime

    def build(folder):
        import exporter
        spec = spec_in(folder)
        _record(f"python: exporter.build('{spec}', task='text-generation', target='onnx')")
        return exporter.build(spec, task="text-generation", target="onnx",
                              out=folder / f"{name}.artifact", **settings)
    built = built_once(tmp_path_factory, name, build)
    return built, runtime.load(built.artifact), built.artifact.parent


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


def _cli_once(tmp_path_factory, name: str, *args: str, run=exporter_cli
              ) -> subprocess.CompletedProcess:
    """``exporter ARGS`` (ARGS may hold ``{folder}``) run once per test run across workers
    (``run``: in a subprocess, or exporter_in_process); every worker gets its
    CompletedProcess."""
    def make(folder):
        done = run(*(a.format(folder=folder) for a in args))
        (folder / "done.json").write_text(json.dumps(
            {"args": done.args, "returncode": done.returncode, "stdout": done.stdout,
             "stderr": done.stderr}))
    kept = json.loads((_shared_folder(tmp_path_factory, name, make) / "done.json").read_text())
    return subprocess.CompletedProcess(**kept)


@pytest.fixture(scope="session")
def custom_onnx(tmp_path_factory):
    """tests/models/custom_op.py on onnx: ONNX Runtime, a CPU-fallback partition for the
    custom op, ONNX Runtime again. Returns (path, the build's CompletedProcess). In process:
    a spec file already imported keeps its op registered once (test_spec_modules.py), so
    the module is imported first (an import after the spec's own run would run it again)."""
    import tests.models.custom_op  # noqa: F401
    built = _cli_once(tmp_path_factory, "custom-onnx", "build",
                      "tests/models/custom_op.py:factory", "--target", "onnx", "--out",
                      "{folder}/custom-onnx.artifact", "--json", run=exporter_in_process)
    return Path(built.args[built.args.index("--out") + 1]), built


@pytest.fixture(scope="session")
def bert_cpu(tmp_path_factory):
    """tests/models/hf_bert.py's BERT (its ModelOutput a dict of two outputs) built for cpu
    from the CLI in process, batch 1..8: (path, the build's CompletedProcess)."""
    pytest.importorskip("transformers")
    built = _cli_once(tmp_path_factory, "tiny-bert-cpu", "build",
                      "tests/models/hf_bert.py:tiny_bert", "--target", "cpu", "--out",
                      "{folder}/bert.artifact", "--json", "--dynamic", "input_ids:0=1..8",
                      "--dynamic", "attention_mask:0=1..8", run=exporter_in_process)
    return Path(built.args[built.args.index("--out") + 1]), built


@pytest.fixture(scope="session")
def custom_bench(custom_onnx, tmp_path_factory):
    """`exporter bench --json` of custom_onnx against eager (20 runs): the parsed result."""
    artifact, built = custom_onnx
    assert built.returncode == 0, built.stderr
    timed = _cli_once(tmp_path_factory, "custom-bench", "bench", str(artifact), "--baseline",
                      "eager", "--runs", "20", "--warmup", "3", "--json", run=exporter_in_process)
    assert timed.returncode == 0, timed.stderr
    return json.loads(timed.stdout)
