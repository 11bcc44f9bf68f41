"""One output style for every command: `--json` prints one object whose keys are those
docs/json.md promises, `--quiet` leaves stderr empty on success, `--verbose` adds debug
logs, and a user's mistake is an "error:" paragraph with exit 2 (and, with --json, an
error object).

The commands run in this process through click's CliRunner (the real typer app and
argv, without a subprocess's 3 s of torch import per call); the end-to-end subprocess
runs of each command are in the other test files. They use zoo:mlp, not a model with a
custom op: loading a model file a second time in one process registers its custom op
again, which breaks the op for every later test in the process.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from exporter.cli import app

pytest.importorskip("onnxruntime")
from tests.conftest import ROOT  # noqa: E402


def _documented_keys() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "json.md").read_text()
    table = text.split("<!-- keys: begin -->")[1].split("<!-- keys: end -->")[0]
    rows = re.findall(r"^\| (`[^|]+`|error \(any command\)) \| ([^|]+) \|$", table, re.M)
    return {name.strip("`"): {k.strip() for k in keys.split(",")} for name, keys in rows}


DOCUMENTED = _documented_keys()
# Commands whose --json needs an artifact of their own kind, checked in their own file.
CHECKED_ELSEWHERE = {"generate": "tests/runtime/test_generate_runtime.py::test_cli_generate"}


@pytest.fixture
def invoke(monkeypatch):
    """Run `exporter ARGS...` in-process; returns (exit code, stdout, stderr). The CLI's
    logging and warning set-up is undone after each call."""
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()

    def call(*args: str) -> tuple[int, str, str]:
        handlers = logging.getLogger().handlers[:]
        with warnings.catch_warnings():
            result = runner.invoke(app, [str(a) for a in args])
        logging.captureWarnings(False)
        logging.getLogger().handlers[:] = handlers
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.stdout, result.stderr
    return call


@pytest.fixture(scope="module")
def workdir(mlp_build, onnx_mlp, tmp_path_factory) -> Path:
    """A copy of the zoo:mlp cpu artifact (to sign) and its inputs; the onnx one to
    package (no torch wheel: 10 MB, where the cpu one's bundle gzips 250 MB)."""
    where = tmp_path_factory.mktemp("style")
    shutil.copy(mlp_build.artifact, where / "a.artifact")
    shutil.copy(onnx_mlp, where / "o.artifact")
    np.savez(where / "in.npz", x=np.ones((2, 64), np.float32))
    return where


def _commands(d: Path, keys: str = "keys") -> dict[str, list[str]]:
    """One successful call of every command (bench and build: in test_bench_cpu, the
    onnx tests and below, with their fixtures' own JSON). keygen never overwrites a key,
    so each caller names a new folder for it."""
    (d / keys).mkdir(exist_ok=True)
    (d / "m.toml").write_text('[models]\nmlp = "zoo:mlp"\n[targets.onnx]\n')
    return {
        "targets": ["targets"],
        "doctor": ["doctor"],
        "keygen": ["keygen", "--out-dir", d / keys],
        "sign": ["sign", d / "a.artifact", "--key", d / "keys" / "signing.key"],
        "inspect": ["inspect", d / "a.artifact"],
        "report": ["report", d / "a.artifact", "--html", d / "r.html"],
        "package": ["package", d / "o.artifact", "--out", d / "b.tar.gz"],
        "run": ["run", d / "a.artifact", "--inputs", d / "in.npz"],
        "validate": ["validate", d / "a.artifact", "--model", "zoo:mlp"],
        "build --dry-run": ["build", "zoo:mlp", "--target", "onnx", "--dry-run"],
        # one cell, built once: the calls after the first find it in the matrix's cache
        "matrix": ["matrix", d / "m.toml", "--out", d / "matrix"],
    }


def test_every_command_prints_the_documented_json(invoke, workdir, custom_onnx, custom_bench):
    checked = {"build": json.loads(custom_onnx[1].stdout), "bench": custom_bench}
    for name, args in _commands(workdir).items():
        code, out, err = invoke(*args, "--json")
        assert code == 0, f"{name}: {err}"
        checked[name] = json.loads(out)
    assert set(checked) | {"error (any command)"} | set(CHECKED_ELSEWHERE) == set(DOCUMENTED), \
        "a command is undocumented"
    for name, data in checked.items():
        assert data["json_version"] == 1, name
        missing = DOCUMENTED[name] - set(data)
        assert not missing, f"{name} --json lacks documented keys {missing}"


def test_quiet_leaves_stderr_empty_and_prints_the_result(invoke, workdir):
    commands = _commands(workdir, "keys-quiet")
    for name, args in commands.items():
        code, out, err = invoke(*args, "--quiet")
        assert code == 0 and err == "", f"{name} --quiet wrote to stderr: {err!r}"
        assert out.strip(), f"{name} --quiet printed no result"
    code, out, err = invoke("--quiet", *commands["report"])  # before the command, too
    assert code == 0 and err == "" and out.strip() == str(workdir / "r.html")


def test_verbose_adds_debug_logs_in_the_same_style(invoke, workdir):
    code, _, err = invoke(*_commands(workdir)["run"], "--verbose")
    assert code == 0
    assert re.search(r"^debug runtime: loaded .*a\.artifact: 1 partition", err, re.M), err
    _, _, plain = invoke(*_commands(workdir)["run"])
    assert "debug runtime" not in plain


def test_user_mistakes_are_one_error_paragraph_with_exit_2(invoke, workdir, tmp_path):
    d, missing = workdir, tmp_path / "missing.artifact"
    (tmp_path / "a-file").write_text("not a folder")  # keygen makes a missing folder
    mistakes = {
        "inspect": (["inspect", missing], "missing.artifact"),
        "run": (["run", d / "a.artifact", "--inputs", tmp_path / "none.npz"], "none.npz"),
        "report": (["report", missing, "--html", tmp_path / "r.html"], "missing.artifact"),
        "package": (["package", missing, "--out", tmp_path / "b.tar.gz"], "missing.artifact"),
        "sign": (["sign", d / "a.artifact", "--key", tmp_path / "no.key"], "no.key"),
        "keygen": (["keygen", "--out-dir", tmp_path / "a-file"], "a-file"),  # made below
        "validate": (["validate", d / "a.artifact", "--model", "nofile.py:f"], "nofile.py"),
        "bench": (["bench", d / "a.artifact", "--baseline", "nosuch"], "nosuch"),
        "build": (["build", "zoo:mlp", "--target", "nosuch"], "nosuch"),
        "matrix": (["matrix", tmp_path / "none.toml"], "none.toml"),
    }
    for name, (args, named) in mistakes.items():
        code, out, err = invoke(*args)
        assert code == 2, f"{name}: exit {code}: {err}"
        assert err.startswith("error: ") and named in err, f"{name}: {err!r}"
        assert "Traceback" not in err and out == "", name
        code, out, _ = invoke(*args, "--json")
        error = json.loads(out)["error"]
        assert code == 2 and error["exit_code"] == 2 and named in error["message"], name
        assert set(error) == {"type", "exit_code", "message", "what", "where", "hint",
                              "details", "stage"}
    assert list(tmp_path.iterdir()) == [tmp_path / "a-file"], "a failed command wrote something"
