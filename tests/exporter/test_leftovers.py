"""The sweep of killed processes' temporaries, with real scratch logs in a private tmp."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from exporter import leftovers
from runtime.host import scratch


@pytest.fixture
def dead_pid_log(tmp_path, monkeypatch):
    """A scratch log of a process that has exited, holding one temporary folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = scratch.registry()
    assert folder is not None
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    leftover = tmp_path / "edge-build-leftover"
    leftover.mkdir()
    (leftover / "partial.bin").write_bytes(b"x")
    log_file = folder / f"{int(child.stdout)}.log"
    log_file.write_text(f"+{leftover}\n")
    return log_file, leftover


def test_sweep_removes_what_a_dead_process_held(dead_pid_log):
    log_file, leftover = dead_pid_log
    assert leftovers.sweep() == [leftover]
    assert not leftover.exists() and not log_file.exists()


def test_sweep_skips_a_log_another_build_swept_first(dead_pid_log, monkeypatch):
    log_file, leftover = dead_pid_log
    real_held = leftovers.held

    def swept_meanwhile(path):
        path.unlink()  # the other build won the race between glob and read
        return real_held(path)

    monkeypatch.setattr(leftovers, "held", swept_meanwhile)
    assert leftovers.sweep() == []
    assert leftover.exists(), "what the other build is removing is left to it"
