"""``exporter doctor``: what this machine can build and run, each problem with its fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT


def _doctor(env_extra: dict | None = None, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "exporter", "doctor", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_doctor_reports_every_part_with_the_build_s_own_probes():
    result = _doctor(None, "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    for name in ("torch", "gpu", "c++ compiler", "timeout", "ccache", "onnxruntime", "apache-tvm",
                 "torchao", "target cpu", "target cuda", "target onnx", "target tvm"):
        assert name in checks, name
    assert torch.__version__ in checks["torch"]["found"]
    if not torch.cuda.is_available():
        assert checks["target cuda"]["status"] == "absent" and checks["gpu"]["fix"]
    assert "providers" in checks["target onnx"]["found"]  # the target says what it runs on
    assert checks["ccache"]["status"] == ("ok" if shutil.which("ccache") else "absent")
    for check in checks.values():
        assert check["status"] in ("ok", "problem", "absent")
        assert check["status"] == "ok" or check["fix"], check


@pytest.fixture
def cxx(monkeypatch):
    """Sets CXX for an in-process `exporter doctor`: the compiler choice is made once per
    process (targets/toolchain.py choose_cxx), so it is forgotten before and after."""
    from targets.toolchain import choose_cxx

    def use(compiler: str) -> None:
        monkeypatch.setenv("CXX", compiler)
        choose_cxx.cache_clear()
    yield use
    choose_cxx.cache_clear()  # before monkeypatch gives CXX back: the next use probes again


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("readelf") is None,
                    reason="needs g++ and readelf")
@pytest.mark.parametrize("kind, says", [("static", "statically"), ("missing", "was not found")])
def test_doctor_names_a_bad_compiler_and_the_fix(tmp_path, cxx, cli_here, kind, says):
    compiler = tmp_path / "static-g++"
    if kind == "static":  # what the GPU machine's CXX does
        compiler.write_text('#!/bin/sh\nexec g++ "$@" -static-libstdc++ -static-libgcc\n')
        compiler.chmod(0o755)
    cxx(str(compiler))  # in process: the command's own process is the other test's
    result = cli_here("doctor", "--json")
    assert result.returncode == 0, result.stderr
    (row,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "c++ compiler"]
    assert says in row["found"] and "set CXX=" in row["fix"]
    assert "c++ compiler" in cli_here("doctor").stdout  # the table renders too
