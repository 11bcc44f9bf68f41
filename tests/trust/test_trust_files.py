"""What the toolchain writes, replaces and removes. Only regular files are replaced,
whole or not at all; only what the toolchain provably made is swept; bundle names are
validated; a SIGTERM cleans up like Ctrl-C."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.host import scratch
from tests.conftest import ROOT


def _clean(result, code, *needles):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


# --- an output that exists and is not a regular file is never replaced ------------------

def _writers(artifact: Path, tmp_path: Path, target: Path) -> dict[str, list[str]]:
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 64), np.float32))
    return {
        "build": ["build", "zoo:mlp", "--target", "onnx", "--out", str(target)],
        "save-config": ["build", "zoo:mlp", "--target", "onnx", "--dry-run",
                        "--save-config", str(target)],
        "run": ["run", str(artifact), "--inputs", str(tmp_path / "in.npz"), "--out", str(target)],
        "report": ["report", str(artifact), "--html", str(target)],
        "inspect-plot": ["inspect", str(artifact), "--plot", str(target)],
        "sign": ["sign", str(target), "--key", str(tmp_path / "keys" / "signing.key")],
    }


@pytest.mark.parametrize("kind", ["fifo", "dev-null", "directory"])
def test_outputs_that_are_not_regular_files_are_refused(onnx_mlp, tmp_path, cli_here, kind):
    cli = cli_here  # what each command writes is under test, not its process
    assert cli("keygen", "--out-dir", str(tmp_path / "keys")).returncode == 0
    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    elif kind == "dev-null":
        target = Path("/dev/null")
    else:
        target = tmp_path / "folder"
        target.mkdir()
    before = os.stat(target).st_mode
    writers = _writers(onnx_mlp, tmp_path, target)
    if kind != "fifo":  # every writer shares one check (runtime/host/outfiles.py): two suffice
        writers = {name: writers[name] for name in ("build", "run")}
    for name, args in writers.items():
        if name == "sign" and kind == "directory":
            continue  # sign reads the artifact first: a folder is not an artifact (exit 2 too)
        result = cli(*args)
        _clean(result, 2, str(target))
        assert os.stat(target).st_mode == before, f"{name} replaced the {kind}"


def test_package_and_keygen_refuse_special_files(onnx_mlp, tmp_path, cli_here):
    cli = cli_here
    bundle = tmp_path / "bundle.tar.gz"
    os.mkfifo(bundle)
    _clean(cli("package", str(onnx_mlp), "--out", str(bundle)), 2, "FIFO")
    assert stat.S_ISFIFO(os.stat(bundle).st_mode)
    keys = tmp_path / "keys"
    keys.mkdir()
    os.mkfifo(keys / "signing.pub")
    _clean(cli("keygen", "--out-dir", str(keys)), 2, "already exists")
    assert not (keys / "signing.key").exists() and stat.S_ISFIFO(os.stat(keys / "signing.pub").st_mode)


def test_sign_through_a_symlink_signs_its_target(onnx_mlp, tmp_path, cli_here):
    cli = cli_here
    assert cli("keygen", "--out-dir", str(tmp_path / "keys")).returncode == 0
    real = shutil.copy(onnx_mlp, tmp_path / "real.artifact")
    link = tmp_path / "link.artifact"
    link.symlink_to(real)
    assert cli("sign", str(link), "--key", str(tmp_path / "keys" / "signing.key")).returncode == 0
    assert link.is_symlink(), "the link stays a link"
    checked = cli("inspect", str(real), "--trusted-key", str(tmp_path / "keys" / "signing.pub"))
    assert "(verified)" in checked.stdout, checked.stdout


# --- run --out is whole or not at all --------------------------------------------------

def test_run_out_on_a_full_disk_keeps_the_previous_outputs(onnx_mlp, tmp_path):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.random.randn(32, 64).astype(np.float32))
    previous = tmp_path / "out.npz"
    np.savez(previous, output=np.arange(4096, dtype=np.float32))  # 16 KiB of old results
    before = previous.read_bytes()
    limit = 1024  # the new outputs (32x10 float32 plus the zip) do not fit

    def limit_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    result = subprocess.run([sys.executable, "-m", "exporter", "run", str(onnx_mlp),
                             "--inputs", str(inputs), "--out", str(previous)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=limit_writes)
    _clean(result, 2, "Nothing was replaced")
    assert previous.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out.npz"]


# --- the sweeper removes only what dead processes of ours recorded ----------------------

def test_sweep_keeps_look_alikes_and_removes_recorded_leftovers(onnx_mlp, tmp_path, cli_here):
    cli = cli_here  # the dead process is a real one; the build that sweeps needs none
    out = tmp_path / "model.artifact"
    shutil.copy(onnx_mlp, out)
    notes = tmp_path / "exporter-onnx-99999-notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("mine")
    backup = tmp_path / ".model.artifact.backup-build-31337"
    backup.write_text("mine")
    # a process that records temporaries and dies without cleaning up (like SIGKILL)
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from runtime.host import scratch; "
            "from pathlib import Path; d = scratch.make_dir('exporter-build-'); "
            "(d / 'x').write_text('x'); "
            "f = scratch.make_file('.model.artifact.partial-', Path(sys.argv[2])); "
            "print(d); print(f); os._exit(0)")
    made = subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path)],
                          capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(p).exists() for p in made)
    built = cli("build", "zoo:mlp", "--target", "onnx", "--out", str(out))  # sweeps first
    assert built.returncode == 0, built.stderr
    assert not any(Path(p).exists() for p in made), "the dead process's temporaries are gone"
    assert (notes / "keep.txt").read_text() == "mine" and backup.read_text() == "mine"


def test_a_kept_onnx_report_is_released_not_swept(tmp_path):
    kept = scratch.make_dir("exporter-onnx-", tmp_path)
    scratch.release(kept)
    log = scratch._log_path()
    assert kept not in scratch.held(log)


# --- bundle names are validated ---------------------------------------------------------

@pytest.mark.parametrize("artifact_name, out_name, needle", [
    ("ok.artifact", ".tar.gz", "folder name"),
    ("two words.artifact", "b.tar.gz", "two words.artifact"),
    ("new\nline.artifact", "b.tar.gz", "line.artifact"),
    ("$(reboot).artifact", "b.tar.gz", "reboot"),
], ids=["empty-folder-name", "space", "newline", "shell"])
def test_package_refuses_names_that_break_tar_sums_or_shell(onnx_mlp, tmp_path, cli_here,
                                                               artifact_name, out_name, needle):
    artifact = shutil.copy(onnx_mlp, tmp_path / artifact_name)
    result = cli_here("package", str(artifact), "--out", str(tmp_path / out_name))
    _clean(result, 2, needle)
    assert not (tmp_path / out_name).exists()


# --- SIGTERM is Ctrl-C -------------------------------------------------------------------

def test_sigterm_stops_children_and_keeps_the_previous_artifact(onnx_mlp, tmp_path):
    out = tmp_path / "model.artifact"
    shutil.copy(onnx_mlp, out)
    before = out.read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "build", "zoo:mlp", "--target",
                             "onnx", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    time.sleep(4)  # in the middle of the build (its validation subprocess, if it got there)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the build finished before the signal")
    assert proc.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.artifact"]


def test_an_output_that_is_a_file_the_command_reads_is_refused(onnx_mlp, tmp_path, cli_here):
    """`run --out` onto its own artifact or inputs (or a link to them), `report --html` and
    `inspect --plot` onto the artifact: exit 2, and what they read is left as it was."""
    artifact = tmp_path / "a.artifact"
    shutil.copy(onnx_mlp, artifact)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.zeros((2, 64), np.float32))
    (tmp_path / "link").symlink_to(artifact)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "b.tar.gz").symlink_to(artifact)  # a bundle name that is the artifact
    before = artifact.read_bytes(), inputs.read_bytes()
    _clean(cli_here("run", artifact, "--inputs", inputs, "--out", tmp_path / "loop"), 2,
           "symbolic links")
    for args in (["run", artifact, "--inputs", inputs, "--out", artifact],
                 ["run", artifact, "--inputs", inputs, "--out", inputs],
                 ["run", artifact, "--inputs", inputs, "--out", tmp_path / "link"],
                 ["report", artifact, "--html", artifact],
                 ["package", artifact, "--out", tmp_path / "b.tar.gz"],
                 ["package", "--native", artifact, "--out", tmp_path / "b.tar.gz"],
                 ["inspect", artifact, "--plot", artifact]):
        _clean(cli_here(*args), 2, "which this command reads")
    assert (artifact.read_bytes(), inputs.read_bytes()) == before


def test_a_build_never_writes_over_its_own_model_file_or_inputs(tmp_path, cli_here):
    model = tmp_path / "model.py"
    model.write_text("import torch\n\ndef make():\n    return torch.nn.ReLU(), (torch.ones(2),)\n")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones(2, np.float32))
    before = model.read_bytes(), inputs.read_bytes()
    spec = f"{model}:make"
    for args in (["--out", model], ["--inputs", inputs, "--out", inputs],
                 ["--out", tmp_path / "m.artifact", "--save-config", model]):
        _clean(cli_here("build", spec, "--target", "onnx", *args), 2, "which this command reads")
    assert (model.read_bytes(), inputs.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "model.py"]
