"""`exporter package --platform`: a Python bundle for another platform carries that
platform's wheels and a lock pip accepts there; what the device would refuse is refused
here, before any download."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename
from packaging.version import Version

import runtime
from exporter.errors import UserInputError
from exporter.ship.bundle import package
from exporter.ship.download import wheel_tag_options
from exporter.ship.lock import PYTORCH_INDEX, lock_for
from tests.runtime.test_platforms import _as_tvm, _rewrite

pytest.importorskip("onnxruntime")
A64 = "linux-aarch64"


@pytest.fixture(scope="module")
def a64_bundle(onnx_mlp, cli_here, tmp_path_factory) -> tuple[Path, dict]:
    """The onnx zoo:mlp packaged for aarch64 (in process: test_package runs the command's
    own), unpacked: (folder, the --json answer)."""
    where = tmp_path_factory.mktemp("a64")
    out = where / "mlp-a64.tar.gz"
    result = cli_here("package", str(onnx_mlp), "--platform", A64, "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    with tarfile.open(out) as tar:
        tar.extractall(where, filter="data")
    return where / "mlp-a64", json.loads(result.stdout)


def test_an_aarch64_bundle_carries_aarch64_wheels_and_a_lock_pip_accepts_there(a64_bundle,
                                                                              tmp_path):
    folder, answer = a64_bundle
    assert answer["platform"] == A64 and answer["lock"][0].startswith(f"# exact versions for {A64}")
    tags = {wheel.name: {t.platform for t in parse_wheel_filename(wheel.name)[3]}
            for wheel in (folder / "wheels").glob("*.whl")}
    binary = {name for name, platforms in tags.items() if platforms != {"any"}}
    assert any(name.startswith("onnxruntime-") for name in binary)
    assert all(any(p.endswith("_aarch64") for p in tags[name]) for name in binary), tags
    report = tmp_path / "report.json"
    dry = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                          "--report", str(report), "--no-index", "--find-links",
                          str(folder / "wheels"), "--only-binary=:all:", "--require-hashes",
                          *wheel_tag_options(A64), "--target", str(tmp_path / "t"), "-r",
                          str(folder / "requirements.lock")], capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    chosen = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    locked = {line.split("==")[0] for line in answer["lock"] if "==" in line}
    assert chosen == locked


def test_install_sh_of_an_aarch64_bundle_refuses_an_x86_machine(a64_bundle):
    folder, _ = a64_bundle
    if os.uname().machine == "aarch64":
        pytest.skip("this machine is aarch64: the bundle is its own")
    done = subprocess.run([str(folder / "install.sh"), str(folder / "never")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert f"wheels are for aarch64 and this machine is {os.uname().machine}" in done.stderr
    assert not (folder / "never").exists()


def _needs_torch(onnx_mlp):
    """onnx zoo:mlp's manifest with its partitions on the torch fallback, built by torch+cpu."""
    manifest = runtime.read_manifest(onnx_mlp)
    needs_torch = dataclasses.replace(manifest, partitions=[
        dataclasses.replace(p, backend="torch") for p in manifest.partitions])
    needs_torch.created_by = {**manifest.created_by, "torch": "2.13.0+cpu"}
    return needs_torch


def test_an_aarch64_lock_pins_pytorchs_cpu_build_from_its_cpu_index(onnx_mlp):
    """PyPI's torch 2.13.0 for aarch64 is a CUDA build (it needs cuda-toolkit 13); the CPU
    one is 2.13.0+cpu on PyTorch's cpu index, as for x86_64."""
    for platform in (A64, "linux-x86_64"):
        lock = lock_for([("a", _needs_torch(onnx_mlp))], platform)
        assert lock.pins["torch"] == Version("2.13.0+cpu")
        assert f"--extra-index-url {PYTORCH_INDEX}cpu" in lock.lines()


def _resolves(requirements: list[str], tmp: Path, *index: str) -> subprocess.CompletedProcess:
    """pip's resolution of ``requirements`` as an aarch64 device's pip would make it."""
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                           "--no-deps", "--only-binary=:all:", "--ignore-installed",
                           "--disable-pip-version-check", *wheel_tag_options(A64),
                           "--target", str(tmp / "t"), *index, *requirements],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_every_other_pin_of_an_aarch64_torch_lock_resolves_on_pypi_for_aarch64(onnx_mlp,
                                                                               tmp_path):
    lines = lock_for([("a", _needs_torch(onnx_mlp))], A64).lines()
    others = [line for line in lines if "==" in line and not line.startswith("torch==")]
    assert len(others) >= 5  # numpy, sympy, networkx, jinja2, filelock...
    done = _resolves(others, tmp_path, "--index-url", "https://pypi.org/simple")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_pytorchs_cpu_index_serves_the_aarch64_torch_an_aarch64_lock_pins(onnx_mlp, tmp_path):
    try:
        socket.getaddrinfo("download.pytorch.org", 443)
    except OSError:
        pytest.skip("download.pytorch.org cannot be reached from here")
    lines = lock_for([("a", _needs_torch(onnx_mlp))], A64).lines()
    torch_pin = [line for line in lines if line.startswith("torch==")]
    done = _resolves(torch_pin, tmp_path, "--index-url", PYTORCH_INDEX + "cpu")
    assert done.returncode == 0, done.stderr


def test_native_code_of_another_platform_is_refused_before_any_download(onnx_mlp, tmp_path,
                                                                        monkeypatch):
    x86_tvm = _rewrite(onnx_mlp, tmp_path / "x86-tvm.artifact", _as_tvm("linux-x86_64"))
    monkeypatch.setattr("exporter.ship.bundle.download_wheels", pytest.fail)
    with pytest.raises(UserInputError, match=f"holds native code \\(tvm\\) for linux-x86_64, "
                       f"and the bundle is for {A64}") as caught:
        package([x86_tvm], tmp_path / "b.tar.gz", A64)
    assert "--platform linux-x86_64" in caught.value.hint
    with pytest.raises(UserInputError, match="did you mean linux-aarch64"):
        package([onnx_mlp], tmp_path / "b.tar.gz", "linux-arm64")
    assert not (tmp_path / "b.tar.gz").exists()
