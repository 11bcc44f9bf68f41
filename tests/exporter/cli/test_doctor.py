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
    for name in ("torch", "gpu", "c++ compiler", "timeout", "onnxruntime", "apache-tvm",
                 "torchao", "target cpu", "target cuda", "target onnx", "target tvm"):
        assert name in checks, name
    assert torch.__version__ in checks["torch"]["found"]
    if not torch.cuda.is_available():
        assert checks["target cuda"]["status"] == "absent" and checks["gpu"]["fix"]
    assert "providers" in checks["target onnx"]["found"]  # the target says what it runs on
    for check in checks.values():
        assert check["status"] in ("ok", "problem", "absent")
        assert check["status"] == "ok" or check["fix"], check


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("readelf") is None,
                    reason="needs g++ and readelf")
@pytest.mark.parametrize("cxx, says", [("static", "statically"), ("missing", "was not found")])
def test_doctor_names_a_bad_compiler_and_the_fix(tmp_path, cxx, says):
    compiler = tmp_path / "static-g++"
    if cxx == "static":  # what the GPU machine's CXX does
        compiler.write_text('#!/bin/sh\nexec g++ "$@" -static-libstdc++ -static-libgcc\n')
        compiler.chmod(0o755)
    result = _doctor({"CXX": str(compiler)}, "--json")
    assert result.returncode == 0, result.stderr
    (row,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "c++ compiler"]
    assert says in row["found"] and "set CXX=" in row["fix"]
    assert "c++ compiler" in _doctor({"CXX": str(compiler)}).stdout  # the table renders too
