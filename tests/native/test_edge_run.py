"""edge-run and the core of the native runtime: the inputs checked as the Python runtime
checks them, numpy files read strictly, nothing half-written, artifacts it cannot run
refused by name, and the runner's build (exporter/ship/native_runner.py)."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from tests.native.conftest import native_refusal, run_native


def _refused(edge_run, artifact, inputs, tmp_path):
    refusal = native_refusal(edge_run, artifact, inputs, tmp_path / "out.npz")
    assert refusal.exit_code == 2, refusal
    return refusal.message


def _python_input_error(artifact, **arrays) -> str:
    import torch

    import runtime
    from runtime.errors import InputMismatchError
    with pytest.raises(InputMismatchError) as caught:
        runtime.load(artifact).run({k: torch.from_numpy(v) for k, v in arrays.items()})
    return str(caught.value)


@pytest.mark.parametrize("arrays, keyword", [
    ({"y": np.zeros((2, 64), np.float32)}, "do not match the artifact's input names"),
    ({"x": np.zeros((2, 64), np.float64)}, "expected dtype float32, got float64"),
    ({"x": np.zeros((2, 65), np.float32)}, "dim 1: expected 64, got 65"),
    ({"x": np.zeros((64,), np.float32)}, "expected rank 2"),
    ({"x": np.zeros((0, 64), np.float32)}, "outside the built range"),
], ids=["wrong-name", "wrong-dtype", "wrong-dim", "wrong-rank", "batch-out-of-range"])
def test_inputs_that_do_not_fit_the_signature_are_refused_like_the_python_runtime(
        native_mlp, edge_run, tmp_path, arrays, keyword):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **arrays)
    message = _refused(edge_run, native_mlp, inputs, tmp_path)
    assert keyword in message, message
    assert keyword in _python_input_error(native_mlp, **arrays)


def _npy_with_header(header: str, data: bytes) -> bytes:
    text = header.encode().ljust(118) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


HOSTILE_ARRAYS = [
    ("object-array", lambda p: np.savez(p, x=np.array([{"a": 1}, None], dtype=object)),
     "object arrays"),
    ("fortran-order", lambda p: np.savez(p, x=np.asfortranarray(np.zeros((2, 64), np.float32))),
     "Fortran-order"),
    ("big-endian", lambda p: np.savez(p, x=np.zeros((2, 64), ">f4")), "big-endian"),
    ("complex-dtype", lambda p: np.savez(p, x=np.zeros((2, 64), np.complex64)), "unsupported"),
    ("truncated-data", lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 64), }", bytes(100))), "truncated"),
    ("header-not-a-dict", lambda p: p.write_bytes(_npy_with_header("__import__('os')", b"")),
     "header is malformed"),
    ("not-numpy", lambda p: p.write_bytes(b"hello"), "not a valid .npz"),
    ("more-than-the-inputs-take", lambda p: np.savez_compressed(p, x=np.zeros((1 << 16, 64),
                                                                             np.float32)),
     "the most these inputs can take"),
]


@pytest.mark.parametrize("write, keyword", [c[1:] for c in HOSTILE_ARRAYS],
                         ids=[c[0] for c in HOSTILE_ARRAYS])
def test_hostile_input_arrays_are_refused_naming_the_file_and_array(
        native_mlp, edge_run, tmp_path, write, keyword):
    inputs = tmp_path / "in.npz"
    write(inputs)
    message = _refused(edge_run, native_mlp, inputs, tmp_path)
    assert keyword in message and str(inputs) in message, message
    if keyword not in ("not a valid .npz", "the most these inputs can take"):
        assert "array x" in message, message


def test_a_single_npy_feeds_the_only_input(native_mlp, edge_run, tmp_path):
    inputs = tmp_path / "x.npy"
    np.save(inputs, np.ones((4, 64), np.float32))
    done = run_native(edge_run, native_mlp, inputs, tmp_path / "out.npz")
    assert done.returncode == 0, done.stdout
    said = json.loads(done.stdout)
    assert said["outputs"][0]["shape"][0] == 4
    with np.load(tmp_path / "out.npz") as out:
        assert out[said["outputs"][0]["name"]].shape[0] == 4


def test_a_failed_run_leaves_an_existing_out_file_as_it_was(native_mlp, edge_run, tmp_path):
    inputs, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, x=np.zeros((2, 65), np.float32))
    out.write_bytes(b"the previous results")
    done = run_native(edge_run, native_mlp, inputs, out)
    assert done.returncode == 2
    assert out.read_bytes() == b"the previous results"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out.npz"]


def test_out_that_is_a_file_it_reads_or_not_a_regular_file_is_refused(native_mlp, edge_run,
                                                                      tmp_path):
    """A FIFO (or a device node: renamed over, /dev/null became a file), the artifact, the
    inputs or a link to one are never replaced; a dangling link writes its target."""
    import shutil
    artifact, inputs = tmp_path / "a.artifact", tmp_path / "in.npz"
    shutil.copy(native_mlp, artifact)
    np.savez(inputs, x=np.zeros((2, 64), np.float32))
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(artifact)
    before = artifact.read_bytes(), inputs.read_bytes()
    for out in ("fifo", "a.artifact", "in.npz", "link"):
        done = run_native(edge_run, artifact, inputs, tmp_path / out)
        assert done.returncode == 2, (out, done.stdout, done.stderr)
        assert "regular file" in done.stdout or "which this run reads" in done.stdout, done.stdout
    assert (artifact.read_bytes(), inputs.read_bytes()) == before
    assert (tmp_path / "fifo").is_fifo() and (tmp_path / "link").is_symlink()
    (tmp_path / "dangling").symlink_to("made.npz")
    assert run_native(edge_run, artifact, inputs, tmp_path / "dangling").returncode == 0
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "made.npz").is_file()


def test_the_private_copy_of_the_entries_is_removed_after_the_run(
        native_mlp, edge_run, mlp_inputs, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    cmd = [str(edge_run), str(native_mlp), "--inputs", str(mlp_inputs), "--out",
           str(tmp_path / "out.npz")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr
    assert list(scratch.iterdir()) == []


def test_an_onnx_artifact_is_refused_naming_its_partitions_and_the_targets_that_go_native(
        onnx_mlp, edge_run, mlp_inputs, tmp_path):
    message = _refused(edge_run, onnx_mlp, mlp_inputs, tmp_path)
    for part in ("(onnxruntime)", "executorch", "tvm", "--fallback forbid"):
        assert part in message, message


@pytest.mark.parametrize("args, keyword", [
    ([], "no artifact given"),
    (["a.artifact", "--inputs", "in.npz"], "no --out file given"),
    (["a.artifact", "--inputs"], "--inputs needs a value"),
    (["a.artifact", "b.artifact"], "unexpected argument"),
])
def test_bad_command_lines_print_one_error_paragraph_and_exit_2(edge_run, args, keyword):
    done = subprocess.run([str(edge_run), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and done.stderr.count("error:") == 1
    assert keyword in done.stderr and "Traceback" not in done.stderr
    as_json = subprocess.run([str(edge_run), "--json", *args], capture_output=True, text=True,
                             check=False)
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["error"]["exit_code"] == 2


def test_an_artifact_path_that_is_a_folder_is_refused(edge_run, mlp_inputs, tmp_path):
    assert "not a regular file" in _refused(edge_run, tmp_path, mlp_inputs, tmp_path)


def test_the_c_api_header_compiles_as_c99_with_warnings_as_errors(tmp_path):
    from exporter.ship.native_runner import NATIVE_DIR
    source = tmp_path / "use.c"
    source.write_text("#include <edge_runtime.h>\nint main(void) { edge_program* p = 0;\n"
                      "  if (edge_load(\"a\", 0, &p) != 0) return edge_last_exit_code();\n"
                      "  edge_free(p); return 0; }\n")
    done = subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic",
                           "-fsyntax-only", "-I", str(NATIVE_DIR / "include"), str(source)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------- the runner's build

def test_the_runner_build_is_reused_until_native_sources_change(edge_run):
    from exporter.ship.native_runner import build_runner
    before = edge_run.stat().st_mtime_ns
    assert build_runner(None, frozenset({"tvm"})) == edge_run
    assert edge_run.stat().st_mtime_ns == before


@pytest.mark.parametrize("platform, backends, keyword", [
    ("linux-sparc", frozenset(), "unknown platform"),
    (None, frozenset({"onnxruntime"}), "no backend onnxruntime"),
])
def test_an_unknown_platform_or_backend_is_a_user_error(platform, backends, keyword):
    from exporter.ship.native_runner import build_runner
    from runtime.errors import UserInputError
    with pytest.raises(UserInputError, match=keyword) as caught:
        build_runner(platform, backends)
    assert caught.value.exit_code == 2


def test_missing_cmake_is_a_typed_error_naming_make_native_deps(monkeypatch, tmp_path):
    from exporter.errors import TargetUnavailableError
    from exporter.ship import native_runner
    monkeypatch.setattr(native_runner.shutil, "which", lambda name: None)
    with pytest.raises(TargetUnavailableError, match="cmake") as caught:
        native_runner.build_runner(None, frozenset(), build_root=tmp_path)
    assert caught.value.exit_code == 2 and "make native-deps" in str(caught.value)


def test_runner_builds_share_compiled_core_sources_through_ccache(monkeypatch, tmp_path):
    """Each backend set's runner, and each checkout's, compiles the same core sources: with
    ccache here, the configure names it as the compiler launcher and the build hashes paths
    relative to the checkout (a user's own CCACHE_BASEDIR wins); without it, neither."""
    from exporter.ship import native_runner
    ran = []
    monkeypatch.setattr(native_runner, "_run", lambda cmd, log, env=None: ran.append(
        (cmd, env)) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.delenv("CCACHE_BASEDIR", raising=False)
    monkeypatch.setattr(native_runner.shutil, "which", lambda name: f"/usr/bin/{name}")
    native_runner._configure(tmp_path, [])
    native_runner._compile(tmp_path, 1)
    assert "-DCMAKE_CXX_COMPILER_LAUNCHER=/usr/bin/ccache" in ran[0][0]
    assert ran[1][1]["CCACHE_BASEDIR"] == str(native_runner.ROOT)
    monkeypatch.setenv("CCACHE_BASEDIR", "/the/users/own")
    native_runner._compile(tmp_path, 1)
    assert ran[2][1]["CCACHE_BASEDIR"] == "/the/users/own"
    monkeypatch.setattr(native_runner.shutil, "which", lambda name: None)
    native_runner._configure(tmp_path, [])
    assert not any("LAUNCHER" in word for word in ran[3][0])
