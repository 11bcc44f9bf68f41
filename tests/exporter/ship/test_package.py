"""`exporter package`: a bundle a device installs into a fresh virtual environment (only
the runtime wheel and the locked versions, no exporter) and runs there, matching eager;
an onnx-only bundle installs no torch (runtime/program/requires.py) and stays under 150 MB."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime
from exporter.ship.lock import lock_lines
from exporter.errors import UserInputError
from exporter.ship.wheel import build_runtime_wheel

pytest.importorskip("onnxruntime")
from tests.conftest import ROOT  # noqa: E402


@pytest.fixture(scope="module")
def bundle(mlp_build, custom_onnx, cli_here, tmp_path_factory):
    """zoo:mlp on cpu (AOTInductor) and the custom-op model on onnx (ORT + CPU fallback).
    In process: the command's own process runs in tests/native/test_executorch_native.py."""
    out = tmp_path_factory.mktemp("bundle") / "edge-bundle.tar.gz"
    result = cli_here("package", str(mlp_build.artifact), str(custom_onnx[0]), "--out",
                      str(out), "--json")
    assert result.returncode == 0, result.stderr
    return out, json.loads(result.stdout)


@pytest.fixture(scope="module")
def installed(bundle, ran, tmp_path_factory):
    """The bundle unpacked and installed by its own install.sh into a new venv."""
    return _install(bundle[0], ran, tmp_path_factory)


def _install(bundle: Path, ran, tmp_path_factory, python: str = sys.executable
             ) -> tuple[Path, dict]:
    """(the unpacked folder, the environment to run its scripts in): no PYTHONPATH, so
    nothing of this checkout is importable there. install.sh runs ``python``'s own pip
    (this one has pip), or a throwaway venv's where it has none."""
    where = tmp_path_factory.mktemp("device")
    with tarfile.open(bundle) as tar:
        tar.extractall(where, filter="data")
    folder = where / bundle.name.removesuffix(".tar.gz")
    # a device writes bytecode as usual: with PYTHONDONTWRITEBYTECODE (this box sets it)
    # every run.sh compiled torch's modules again (5.2 against 3.2 CPU s a run)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    done = ran(subprocess.run, [str(folder / "install.sh")], capture_output=True, text=True,
               env={**env, "PYTHON": python}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, env


def _distributions(ran, folder: Path, env: dict) -> dict[str, str]:
    """`pip list` of the bundle's venv (which holds no pip: this one looks in)."""
    listed = ran(subprocess.run, [sys.executable, "-m", "pip", "--python",
                                  str(folder / ".venv" / "bin" / "python"), "list", "--format",
                                  "json"], capture_output=True, text=True, env=env, check=True)
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)}


def _pins(lines: list[str]) -> dict[str, str]:
    """name -> version of the lock's requirement lines (each `NAME==VERSION --hash=...`)."""
    return dict(line.split()[0].split("==") for line in lines if "==" in line)


def _locked(folder: Path) -> dict[str, str]:
    return _pins((folder / "requirements.lock").read_text().splitlines())


def test_bundle_holds_artifacts_wheel_lock_and_scripts(bundle, mlp_build, custom_onnx):
    out, packed = bundle
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        sums = tar.extractfile("edge-bundle/SHA256SUMS").read().decode().splitlines()
        for line in sums:  # every member is listed with its hash
            digest, member = line.split("  ")
            data = tar.extractfile(f"edge-bundle/{member}").read()
            assert hashlib.sha256(data).hexdigest() == digest, member
    assert {"edge-bundle/artifacts/mlp.artifact", "edge-bundle/artifacts/custom-onnx.artifact",
            f"edge-bundle/wheels/{packed['wheel']}", "edge-bundle/requirements.lock",
            "edge-bundle/install.sh", "edge-bundle/run.sh", "edge-bundle/README.txt"} <= names
    # the runtime does not register the model file's own op: the README says to ship it
    assert any("edgetest::soft_clip" in n and "--preload" in n for n in packed["notes"])
    pins = _pins(packed["lock"])
    manifest = runtime.read_manifest(mlp_build.artifact)
    assert pins["torch"] == manifest.created_by["torch"]  # the version it was built with
    if "+" in pins["torch"]:  # a +cpu torch is on PyTorch's index only
        label = pins["torch"].split("+")[1]
        assert f"--extra-index-url https://download.pytorch.org/whl/{label}" in packed["lock"]
    wheels = {n.rsplit("/", 1)[1] for n in names if "/wheels/" in n}
    assert len(wheels) == len(pins) and all("--hash=sha256:" in line
                                            for line in packed["lock"] if "==" in line)
    onnx_manifest = runtime.read_manifest(custom_onnx[0])
    assert pins["onnxruntime"] == onnx_manifest.partitions[0].meta["onnxruntime"]
    assert {"numpy", "safetensors", "sympy", "filelock"} <= set(pins)  # torch's own deps too


def test_bundle_installs_in_a_fresh_venv_and_runs_like_eager(installed, ran, tmp_path):
    folder, env = installed
    python = folder / ".venv" / "bin" / "python"
    have = _distributions(ran, folder, env)
    for name, version in _locked(folder).items():
        assert have.get(name) == version, f"{name}: {have.get(name)} installed, {version} locked"
    assert "edge-runtime" in have and "edge-exporter" not in have and "onnxscript" not in have
    assert "torch" in have  # an AOTInductor artifact and a CPU-fallback partition need it

    from tests.models.custom_op import factory
    from exporter.model.zoo import ZOO
    x_mlp = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    x_custom = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    cases = [("mlp.artifact", x_mlp, ZOO["mlp"]()[0], []),
             ("custom-onnx.artifact", x_custom, factory()[0],
              ["--preload", str(ROOT / "tests/models/custom_op.py")])]
    for name, x, model, extra in cases:
        np.savez(tmp_path / "in.npz", x=x)
        done = ran(subprocess.run, [str(folder / "run.sh"), name, "--inputs",
                                    str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"),
                                    *extra], capture_output=True, text=True, env=env,
                   cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        with torch.no_grad(), np.load(tmp_path / "out.npz") as got:
            np.testing.assert_allclose(got["output"], model(torch.from_numpy(x)).numpy(),
                                       rtol=1e-4, atol=1e-5)
    bare = ran(subprocess.run, [str(folder / "run.sh")], capture_output=True, text=True,
               env=env, cwd=tmp_path)  # no arguments: the usage and the artifacts, exit 2
    assert bare.returncode == 2 and "usage: ./run.sh ARTIFACT" in bare.stderr
    assert "mlp.artifact" in bare.stderr and "parameter not set" not in bare.stderr
    helped = ran(subprocess.run, [str(folder / "run.sh"), "--help"], capture_output=True,
                 text=True, env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "usage: ./run.sh" in helped.stdout
    no_exporter = ran(subprocess.run, [str(python), "-c", "import exporter"],
                      capture_output=True, text=True, env=env, cwd=tmp_path)
    assert no_exporter.returncode != 0, "the device venv holds only the runtime"


ONNX_ONLY_LIMIT_MB = 150  # ONNX Runtime and numpy, no torch


@pytest.fixture(scope="module")
def onnx_only(onnx_mlp, cli_here, ran, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx-bundle") / "onnx-only.tar.gz"
    result = cli_here("package", str(onnx_mlp), "--out", str(out))  # the process: bundle()
    assert result.returncode == 0, result.stderr
    bare = tmp_path_factory.mktemp("no-pip")  # a Python without pip: install.sh's other way
    ran(subprocess.run, [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    return _install(out, ran, tmp_path_factory, str(bare / "bin" / "python"))


def test_onnx_only_bundle_installs_no_torch_and_runs_like_the_build(onnx_only, onnx_mlp, ran,
                                                                     tmp_path):
    folder, env = onnx_only
    have = _distributions(ran, folder, env)
    locked = _locked(folder)
    assert "torch" not in have and "safetensors" not in locked
    assert {"onnxruntime", "numpy"} <= set(locked)
    assert set(have) == set(locked) | {"edge-runtime"}, "the venv holds the lock, exactly"
    # the whole device venv (pip and the interpreter's links included), on disk, in MB
    kib = int(ran(subprocess.run, ["du", "-sk", str(folder / ".venv")], capture_output=True,
                  text=True, check=True).stdout.split()[0])
    assert kib * 1024 <= ONNX_ONLY_LIMIT_MB * 1e6, f"{kib * 1024 / 1e6:.1f} MB installed"

    x = np.random.default_rng(3).standard_normal((7, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    done = ran(subprocess.run, [str(folder / "run.sh"), onnx_mlp.name, "--inputs",
                                str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz")],
               capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "providers used: CPUExecutionProvider" in done.stderr and "{" not in done.stderr
    with np.load(tmp_path / "out.npz") as got:
        built = runtime.load(onnx_mlp)(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got["output"], built, rtol=1e-6, atol=1e-6)


def test_package_refuses_a_damaged_artifact_and_keeps_the_old_bundle(bundle, mlp_build,
                                                                     cli_here, tmp_path):
    (out, _), cli = bundle, cli_here  # the refusals; the bundle fixture runs the process
    before = out.read_bytes()
    damaged = tmp_path / "damaged.artifact"
    data = bytearray(Path(mlp_build.artifact).read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = cli("package", str(damaged), "--out", str(out))
    assert result.returncode == 2 and "damaged.artifact" in result.stderr
    assert "Traceback" not in result.stderr and out.read_bytes() == before
    assert cli("package", str(mlp_build.artifact), "--out", str(tmp_path / "b.zip")
               ).returncode == 2
    assert not list(out.parent.glob(".*partial*"))


def test_lock_refuses_artifacts_built_with_different_torch(mlp_build):
    manifest = runtime.read_manifest(mlp_build.artifact)
    other = runtime.read_manifest(mlp_build.artifact)
    other.created_by = {**other.created_by, "torch": "2.11.0+cu130"}
    with pytest.raises(UserInputError, match="different torch versions"):
        lock_lines([manifest, other])
    lines, _ = lock_lines([other])
    assert "torch==2.11.0+cu130" in lines and any("whl/cu130" in line for line in lines)


def test_runtime_wheel_is_reproducible_and_holds_only_the_runtime(tmp_path):
    import zipfile
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = build_runtime_wheel(tmp_path / "a"), build_runtime_wheel(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    names = zipfile.ZipFile(first).namelist()
    assert "runtime/__init__.py" in names and "runtime/executors/onnxruntime.py" in names
    assert not [n for n in names if n.startswith(("exporter/", "passes/", "plan/", "targets/"))]
    metadata = zipfile.ZipFile(first).read(next(n for n in names if n.endswith("/METADATA")))
    metadata = metadata.decode()
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist")]
    assert [r for r in required if "extra ==" not in r] == ["Requires-Dist: numpy>=1.26"]
    assert 'Requires-Dist: torch>=2.11; extra == "torch"' in required  # torch only on request


def test_a_generating_artifacts_bundle_locks_its_tokenizer_and_its_run_sh_generates(
        onnx_lm, ran, tmp_path):
    """A bundle of a generating artifact locked no `tokenizers` (a device could not turn a
    prompt into ids) and its run.sh and README offered only a forward call. Now the lock
    has it and `./run.sh generate ARTIFACT ...` generates (here with this tree's python)."""
    from exporter.ship.bundle import package
    built, _ = onnx_lm
    info = package([built.artifact], tmp_path / "lm-bundle.tar.gz")
    assert any(line.startswith("tokenizers==") for line in info["lock"])
    with tarfile.open(tmp_path / "lm-bundle.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    folder = tmp_path / "lm-bundle"
    readme = (folder / "README.txt").read_text()
    assert f"./run.sh generate {built.artifact.name}" in readme and "--inputs" not in readme
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    done = ran(subprocess.run, [str(folder / "run.sh"), "generate", built.artifact.name,
                                "--prompt", "hello", "-n", "3", "--json"],
               capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["tokens"]) == 3 and result["text"] is not None
    assert result["json_version"] == 1 and result["peak_rss_mb"] > 0
