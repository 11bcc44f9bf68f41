"""Artifacts people can trust: hostile weights, signatures, faults while building, and
reproducible bytes. (Hostile zips, names and manifests: tests/runtime/test_archive.py; wrong
ISA, torch or GPU: tests/exporter/cli/test_bad_inputs.py; the fuzzers: tests/runtime/test_fuzz_loader.py.)"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import exporter
import runtime
import tests.models.custom_op  # noqa: F401  registers edgetest::soft_clip for loads here
from runtime.format.archive import ArtifactReader
from exporter.ship.archive_writer import write_artifact
from runtime.errors import ArtifactError, InputMismatchError
from runtime.format.signing import SignatureError
from tests.conftest import ROOT, built_once

# as a module, not a file path: built in this process, a path would load the file again and
# register its custom op a second time, leaving the module's op object stale
# ("basic_string::_M_create" when a later test in the process called it)
CUSTOM = "tests.models.custom_op:factory"
WEIGHTS = "partitions/p0/weights.safetensors"


@pytest.fixture(scope="module")
def fallback_artifact(tmp_path_factory) -> Path:
    """Every op on the CPU fallback (islands under 3 ops): a safetensors weights slot. One
    build a run, shared with tests/runtime/test_fuzz_loader.py's seed (read only)."""
    def build(folder):
        return exporter.build(CUSTOM, target="onnx", min_partition_size=3,
                              out=folder / "all-fallback.artifact")
    return built_once(tmp_path_factory, "all-fallback-onnx", build).artifact


def rewrite(src: Path, dst: Path, *, files: dict | None = None, meta: callable = None) -> Path:
    """``src`` with entries replaced and partition 0's meta edited, hashes made consistent
    again: what an attacker who can rewrite an unsigned manifest produces."""
    with ArtifactReader.open(src) as reader:
        manifest = {k: v for k, v in reader.manifest.items() if k not in ("entries", "format")}
        entries = {name: reader.read_bytes(name) for name in reader.names()}
    entries.update(files or {})
    if meta is not None:
        meta(manifest["partitions"][0]["meta"])
    return write_artifact(dst, manifest, entries)


def _safetensors(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _torch_save_bytes() -> bytes:
    import io
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    return buffer.getvalue()


def _drop_index(meta: dict) -> None:
    del meta["tensor_index"]


def _wrong_shape(meta: dict) -> None:
    name = next(iter(meta["tensor_index"]["weights"]))
    meta["tensor_index"]["weights"][name][1] = [999]


HOSTILE_WEIGHTS = [
    # id, replacement weights bytes or None, manifest edit or None, message
    ("pickle", pickle.dumps({"w": [1.0, 2.0]}), None, "not a valid safetensors file"),
    ("torch-save", _torch_save_bytes(), None, "not a valid safetensors file"),
    ("header-too-long", struct.pack("<Q", 10**12) + b"{}", None, "the header claims"),
    ("header-not-json", struct.pack("<Q", 5) + b"{nope", None, "not UTF-8 JSON"),
    ("gap", _safetensors({"param/inp.weight": {"dtype": "F32", "shape": [1],
                                                "data_offsets": [4, 8]}}, bytes(8)),
     None, "overlap or leave gaps"),
    ("wrong-length", _safetensors({"param/inp.weight": {"dtype": "F32", "shape": [3],
                                                         "data_offsets": [0, 8]}}, bytes(8)),
     None, "spans 8 bytes"),
    ("bad-dtype", _safetensors({"x": {"dtype": "PICKLE", "shape": [1],
                                      "data_offsets": [0, 1]}}, bytes(1)),
     None, "unknown dtype"),
    ("no-index", None, _drop_index, "no index of this weights file"),
    ("shape-vs-manifest", None, _wrong_shape, "does not match the manifest's index"),
]


@pytest.mark.parametrize("weights, edit, message", [c[1:] for c in HOSTILE_WEIGHTS],
                         ids=[c[0] for c in HOSTILE_WEIGHTS])
def test_hostile_weights_are_refused_before_any_unpickling(fallback_artifact, tmp_path,
                                                           monkeypatch, weights, edit, message):
    bad = rewrite(fallback_artifact, tmp_path / "bad.artifact",
                  files={WEIGHTS: weights} if weights is not None else None, meta=edit)

    def refuse(*_a, **_k):
        raise AssertionError("a weights slot must never be unpickled")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(ArtifactError) as caught:
        runtime.load(bad)
    assert message in str(caught.value) and "weights.safetensors" in str(caught.value)
    assert list(tmp_path.iterdir()) == [bad], "nothing extracted beside it"


def test_extra_tensor_in_the_weights_is_named(fallback_artifact, tmp_path):
    from safetensors.torch import load, save
    with ArtifactReader.open(fallback_artifact) as reader:
        tensors = load(reader.read_bytes(WEIGHTS))
    extra = save({**tensors, "param/smuggled": torch.zeros(4)})
    bad = rewrite(fallback_artifact, tmp_path / "bad.artifact", files={WEIGHTS: extra})
    with pytest.raises(ArtifactError, match="'param/smuggled' is in the file, not in the manifest"):
        runtime.load(bad)


# ---------------------------------------------------------------------------- signatures

@pytest.fixture(scope="module")
def keys(tmp_path_factory, cli_here):
    directory = tmp_path_factory.mktemp("keys")
    result = cli_here("keygen", "--out-dir", str(directory))
    assert result.returncode == 0, result.stderr
    assert oct((directory / "signing.key").stat().st_mode & 0o777) == "0o600"
    return directory


def test_signed_artifact_loads_only_with_its_key(fallback_artifact, keys, cli_here, tmp_path):
    cli = cli_here  # what sign writes; the loads below are the test's own
    signed = tmp_path / "signed.artifact"
    shutil.copy(fallback_artifact, signed)
    with pytest.raises(SignatureError, match="not signed"):
        runtime.load(signed, trusted_keys=[keys / "signing.pub"])
    result = cli("sign", str(signed), "--key", str(keys / "signing.key"))
    assert result.returncode == 0, result.stderr
    program = runtime.load(signed, trusted_keys=[keys / "signing.pub"])
    x = torch.randn(3, 16)
    torch.testing.assert_close(program(x), runtime.load(fallback_artifact)(x))
    with ArtifactReader.open(signed) as a, ArtifactReader.open(fallback_artifact) as b:
        assert a.manifest_bytes == b.manifest_bytes, "signing leaves the manifest's bytes alone"

    other = tmp_path / "other"
    other.mkdir()
    assert cli("keygen", "--out-dir", str(other)).returncode == 0
    with pytest.raises(SignatureError, match="not among the trusted keys"):
        runtime.load(signed, trusted_keys=[other / "signing.pub"])


def test_changed_after_signing_is_refused(fallback_artifact, keys, cli_here, tmp_path):
    cli = cli_here  # runtime.load refuses it in this process first: no new interpreter
    signed = tmp_path / "signed.artifact"
    shutil.copy(fallback_artifact, signed)
    assert cli("sign", str(signed), "--key", str(keys / "signing.key")).returncode == 0
    with ArtifactReader.open(signed) as reader:
        signature = reader.signature_bytes()
    # The attacker rewrites a consistent, unsigned-looking manifest and keeps the signature.
    tampered = rewrite(signed, tmp_path / "tampered.artifact",
                       meta=lambda m: m.update(weights_count=m["weights_count"] + 1))
    from exporter.ship.archive_writer import write_signed
    with ArtifactReader.open(tampered) as reader:
        write_signed(tampered, reader, signature)
    with pytest.raises(SignatureError, match="does not match the manifest"):
        runtime.load(tampered, trusted_keys=[keys / "signing.pub"])
    np_inputs = tmp_path / "in.npz"
    import numpy as np
    np.savez(np_inputs, x=np.ones((2, 16), np.float32))
    result = cli("run", str(tampered), "--inputs", str(np_inputs), "--trusted-key",
                 str(keys / "signing.pub"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "changed after it was signed" in result.stderr


# ---------------------------------------------------------------------------- inputs

def test_nan_and_inf_flow_through_and_an_empty_batch_is_refused(fallback_artifact):
    program = runtime.load(fallback_artifact)
    x = torch.randn(4, 16)
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), float("-inf")
    from tests.models.custom_op import factory
    model, _, _ = factory()
    torch.testing.assert_close(program(x), model(x), equal_nan=True)
    with pytest.raises(InputMismatchError, match=r"0 is outside the built range 1\.\.16"):
        program(torch.randn(0, 16))


# ---------------------------------------------------------------------------- faults

def _build_cmd(out: Path, spec: str = "zoo:mlp", *extra: str) -> list[str]:
    return [sys.executable, "-m", "exporter", "build", spec, "--target", "onnx",
            "--out", str(out), *extra]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def _leftovers(directory: Path, out: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != out.name)


@pytest.fixture(scope="module")
def good_mlp(onnx_mlp) -> Path:
    """zoo:mlp on onnx, the session's shared build (tests copy it, never edit it)."""
    return onnx_mlp


# SIGKILL's leftovers, removed by the next build: make test-slow (SIGINT runs the same steps)
@pytest.mark.parametrize("sig, after", [(signal.SIGINT, 3.0),
                                        pytest.param(signal.SIGKILL, 5.0, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGKILL"])
def test_interrupted_build_keeps_the_previous_artifact(good_mlp, tmp_path, cli_here, sig,
                                                       after):
    out = tmp_path / "model.artifact"
    shutil.copy(good_mlp, out)
    before = out.read_bytes()
    proc = subprocess.Popen(_build_cmd(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=ROOT)
    time.sleep(after)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert "Traceback" not in stderr
    if "interrupted: nothing was written" in stderr or sig == signal.SIGKILL:
        assert out.read_bytes() == before, "the previous artifact is untouched"
    else:  # the signal came after the artifact was written: it must be whole
        runtime.load(out)
    if sig == signal.SIGINT and proc.returncode == 130:
        assert _leftovers(tmp_path, out) == [], "an interrupted build cleans up after itself"
    # SIGKILL leaves what it leaves; the next build (any process) removes it and succeeds
    again = cli_here(*_build_cmd(out)[3:])
    assert again.returncode == 0, again.stderr
    assert _leftovers(tmp_path, out) == []
    runtime.load(out)


def test_ctrl_c_while_the_cli_starts_says_so_without_a_traceback(tmp_path):
    """A Ctrl-C before any command runs (while torch imports: seconds on a loaded
    machine) exits 130 with one line, as one during a build does."""
    proc = subprocess.Popen(_build_cmd(tmp_path / "model.artifact"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    time.sleep(1.0)  # the interpreter is up; torch takes seconds more (or the build runs:
    # then the command says the same)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr
    assert proc.returncode == 130 and "interrupted" in stderr, stderr[-3000:]
    assert not (tmp_path / "model.artifact").exists()


def test_two_builds_to_one_path_leave_one_whole_artifact(tmp_path):
    out = tmp_path / "model.artifact"
    # unvalidated: the race is in writing and renaming; each validation was a fresh
    # interpreter's imports (2 x 2.2 CPU s), checked in every other build here
    procs = [subprocess.Popen(_build_cmd(out, "zoo:mlp", "--no-validate"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(), cwd=ROOT) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _ in results), [err[-500:] for _, err in results]
    assert _leftovers(tmp_path, out) == []
    program = runtime.load(out)  # whole and verified, whichever rename came last
    assert program.run([torch.randn(2, 64)])


def test_full_disk_is_a_clear_error_and_keeps_the_previous_file(good_mlp, tmp_path):
    """A file-size limit (RLIMIT_FSIZE) makes writes past it fail as a full disk does."""
    out = tmp_path / "model.artifact"
    shutil.copy(good_mlp, out)
    before = out.read_bytes()
    limit = 32 << 10  # under the ONNX model's weights

    def limit_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    result = subprocess.run(_build_cmd(out), capture_output=True, text=True, env=_env(),
                            cwd=ROOT, timeout=300, preexec_fn=limit_writes)
    assert result.returncode in (2, 3) and "Traceback" not in result.stderr
    assert "File too large" in result.stderr
    assert out.read_bytes() == before
    assert _leftovers(tmp_path, out) == []


def test_artifact_crashing_in_validation_is_a_build_error(good_mlp, tmp_path, cli_here):
    out = tmp_path / "model.artifact"
    shutil.copy(good_mlp, out)
    before = out.read_bytes()
    # --force: the good file is another model's, which a build replaces only when asked; in
    # process: the crash is the validation process's (tests/exporter/validation/test_crash.py)
    result = cli_here("build", "tests/models/crashing_op.py:factory", "--target", "onnx",
                      "--out", str(out), "--keep-failed", "--force")
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "SIGSEGV" in result.stderr and out.read_bytes() == before
    # --keep-failed keeps it (the hint says where, and no longer offers the flag again)
    assert _leftovers(tmp_path, out) == ["model.FAILED-VALIDATION.artifact"]
    assert "kept at" in result.stderr and "--keep-failed to keep" not in result.stderr


# ---------------------------------------------------------------------------- reproducible

def test_rebuilding_gives_identical_bytes_onnx(good_mlp, tmp_path):
    again = tmp_path / "again.artifact"
    exporter.build("zoo:mlp", target="onnx", out=again)
    assert again.read_bytes() == good_mlp.read_bytes()
    assert runtime.read_manifest(again).build["nondeterminism"] == []


@pytest.mark.slow  # an AOTInductor compile; the onnx twin above runs in make test
def test_rebuilding_gives_identical_bytes_aoti_cpu(mlp_build, tmp_path):
    again = tmp_path / "again.artifact"
    exporter.build("zoo:mlp", target="cpu", out=again)
    assert again.read_bytes() == mlp_build.artifact.read_bytes()
    notes = runtime.read_manifest(again).build["nondeterminism"]
    assert any("cache directory path" in n for n in notes)


def test_deterministic_refuses_tuning(cli_here):
    result = cli_here("build", "zoo:mlp", "--deterministic", "--autotune", "--dry-run")
    assert result.returncode == 2 and "--deterministic cannot be combined" in result.stderr


_FAKE_CXX = """#!/bin/sh
# g++ for the toolchain probe; for every compile Inductor asks of it, slow or crashing
case "$*" in *probe.cpp*|*--version*|*-dumpversion*) ;; *) {action};; esac
exec /usr/bin/g++ "$@"
"""


@pytest.mark.parametrize("action, expected", [
    ("sleep 120", "did not finish within --compile-timeout 2 s"),
    ("kill -SEGV $$", "CppCompileError"),
], ids=["hangs", "crashes"])
def test_compiler_that_hangs_or_crashes_is_a_build_error_naming_the_log(tmp_path, action,
                                                                       expected):
    if not Path("/usr/bin/g++").exists():
        pytest.skip("needs /usr/bin/g++ behind the fake compiler")
    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text(_FAKE_CXX.format(action=action))
    fake.chmod(0o755)
    out = tmp_path / "model.artifact"
    env = {**_env(), "CXX": str(fake), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "exporter", "build", "zoo:mlp", "--target",
                             "cpu", "--compile-timeout", "2", "--out", str(out)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert expected in result.stderr
    log = Path(result.stderr.split("Where: ")[1].split(".log")[0] + ".log")
    assert log.is_file() and not out.exists()


# Where in the CLI's start the Ctrl-C lands, made exact: the process signals itself from a
# function of that phase. Timed signals (above) land anywhere; CI found the gap they missed.
_STARTUP_PHASES = {
    "building the command": "exporter.cli.commands.tidy_help",
    "parsing the flags": "exporter.cli.common._configure_logging",
}


@pytest.mark.parametrize("phase", sorted(_STARTUP_PHASES))
def test_ctrl_c_in_each_phase_of_the_cli_start_is_exit_130(tmp_path, phase):
    module, _, name = _STARTUP_PHASES[phase].rpartition(".")
    code = (f"import importlib, os, signal, exporter.cli\n"
            f"m = importlib.import_module({module!r}); real = getattr(m, {name!r})\n"
            f"def hit(*a, **k):\n"
            f"    os.kill(os.getpid(), signal.SIGINT)\n"
            f"    return real(*a, **k)\n"
            f"setattr(m, {name!r}, hit)\n"
            f"exporter.cli.main()\n")
    out = tmp_path / "model.artifact"
    result = subprocess.run([sys.executable, "-c", code, *_build_cmd(out)[3:]],
                            capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert result.returncode == 130 and "interrupted" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
