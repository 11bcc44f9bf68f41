"""`exporter matrix`'s warm workers (exporter/matrix/warm.py, a fork server of
exporter/forking/): a cell forked from a process that imported torch once is still
`python -m exporter` as a user runs it: the same stdout and exit code, its own session
killed at its time limit, and dead with the worker that started it.

Each test runs real `exporter` commands in a forked child; the warm process imports only
what the test names, so they take seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exporter.matrix import warm
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not warm.AVAILABLE, reason="warm workers are Linux-only")

SLEEPER = "import time\n\ndef factory():\n    time.sleep(120)\n"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


@pytest.fixture
def worker():
    process = warm.WarmProcess(_env(), ("torch",))
    yield process
    process.close()


def test_a_forked_cell_answers_as_a_fresh_exporter_does(worker, tmp_path):
    args = ["build", str(tmp_path / "missing.py") + ":factory", "--target", "onnx",
            "--out", str(tmp_path / "a.artifact"), "--json"]
    cold = subprocess.run([sys.executable, "-m", "exporter", *args], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=300)
    pids = []
    code, stdout, stderr = worker.run(args, str(tmp_path), 300, pids.append)
    assert code == cold.returncode == 2, stderr[-2000:]
    assert json.loads(stdout) == json.loads(cold.stdout)  # the same typed error object
    assert "missing.py" in json.loads(stdout)["error"]["message"]
    assert pids and not _alive(pids[0])
    # the worker serves the next cell; the first left nothing behind in it
    code, stdout, _ = worker.run(["--version"], str(tmp_path), 60, pids.append)
    assert code == 0 and stdout.strip() and len(set(pids)) == 2


def test_a_cell_past_its_time_limit_is_killed_with_its_session(worker, tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pids = []
    with pytest.raises(subprocess.TimeoutExpired):  # any limit under its 120 s sleep
        worker.run(["build", "sleeper.py:factory", "--target", "onnx", "--out", "s.artifact",
                    "--json"], str(tmp_path), 4, pids.append)
    assert pids and not _alive(pids[0])
    assert worker.alive()  # and ready for the next cell
    assert worker.run(["--version"], str(tmp_path), 60, pids.append)[0] == 0


def test_a_cell_dies_with_its_warm_worker(worker, tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pids, outcome = [], {}

    def cell():
        try:
            worker.run(["build", "sleeper.py:factory", "--target", "onnx", "--out",
                        "s.artifact", "--json"], str(tmp_path), 120, pids.append)
        except warm.WarmProcessDied as died:
            outcome["died"] = str(died)

    thread = threading.Thread(target=cell)
    thread.start()
    deadline = time.monotonic() + 60
    while not pids and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(worker._proc.pid, signal.SIGKILL)
    thread.join(60)
    assert "warm worker process ended" in outcome["died"]
    deadline = time.monotonic() + 10
    while _alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids[0])


def test_a_cell_does_not_run_the_warm_processs_exit_handlers(tmp_path):
    """An exit handler registered while the warm process imported tidies the warm
    process's own resources: a cell ending must leave them to the next cell."""
    mark = tmp_path / "ran"
    process = warm.WarmProcess({**_env(), "WARM_EXIT_MARK": str(mark)},
                               ("tests.models.exit_handler",))
    try:
        for _ in range(2):
            assert process.run(["--version"], str(tmp_path), 60, lambda pid: None)[0] == 0
        assert not mark.exists()
    finally:
        process.close()


def test_process_for_gives_each_environment_its_own_worker_and_replaces_a_dead_one():
    env = _env()
    try:
        first = warm.process_for(env, ())
        assert warm.process_for(env, ()) is first
        threads = "2" if env.get("OMP_NUM_THREADS") == "1" else "1"  # make test sets 1
        other = warm.process_for({**env, "OMP_NUM_THREADS": threads}, ())
        assert other is not first
        os.kill(first._proc.pid, signal.SIGKILL)
        first._proc.wait()
        assert warm.process_for(env, ()) is not first
    finally:
        warm.close_all()


def _where_the_model_ran(tmp_path, modules: tuple[str, ...], gpu: bool = True
                         ) -> tuple[dict, str | None]:
    """A cell whose model file records which of ``modules`` its process had imported,
    and the CUDA_VISIBLE_DEVICES it saw."""
    (tmp_path / "where.py").write_text(
        "import json, os, sys\nfrom pathlib import Path\n\ndef factory():\n"
        f"    seen = {{m: m in sys.modules for m in {list(modules)!r}}}\n"
        "    seen['CUDA_VISIBLE_DEVICES'] = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        "    Path('where.json').write_text(json.dumps(seen))\n"
        "    raise ValueError('the model file stops here')\n")
    args = ["build", "where.py:factory", "--target", "onnx", "--out", "w.artifact", "--json"]
    env = {key: value for key, value in _env().items() if key != "CUDA_VISIBLE_DEVICES"}
    process = warm.WarmProcess(env, modules, gpu)
    try:
        code, stdout, stderr = process.run(args, str(tmp_path), 300, lambda pid: None)
    finally:
        process.close()
    assert code == 2, stderr[-2000:]
    assert "the model file stops here" in json.loads(stdout)["error"]["message"]
    seen = json.loads((tmp_path / "where.json").read_text())
    assert seen.pop("CUDA_VISIBLE_DEVICES") is None  # the cell's own environment
    return seen, process.cold_because


def test_a_warm_process_that_initialized_cuda_starts_its_cells_fresh(tmp_path):
    """A process forked after CUDA was initialized cannot use CUDA (on the GPU machine,
    torch.onnx's decompositions failed in every forked onnx cell): the warm process
    sees it and execs a fresh interpreter for each cell, with the same answer."""
    seen, cold_because = _where_the_model_ran(tmp_path, ("torch", "tests.models.cuda_initialized"))
    assert "touched CUDA" in cold_because
    assert seen == {"torch": True, "tests.models.cuda_initialized": False}  # not a fork


def test_with_a_gpu_in_sight_a_module_that_initializes_cuda_is_left_to_the_cell(tmp_path):
    """Tried in a throwaway fork first, that module is not imported by the warm process,
    which stays safe to fork from for everything else."""
    seen, cold_because = _where_the_model_ran(
        tmp_path, ("torch", "tests.models.gpu_in_sight", "tests.models.cuda_initialized"))
    assert cold_because is None
    assert seen == {"torch": True, "tests.models.gpu_in_sight": True,  # forked
                    "tests.models.cuda_initialized": False}


def test_cells_without_a_gpu_import_everything_with_no_gpu_in_sight(tmp_path):
    """Their warm process imports with CUDA_VISIBLE_DEVICES empty, so nothing initializes
    CUDA; the cell itself gets its environment back."""
    seen, cold_because = _where_the_model_ran(
        tmp_path, ("torch", "tests.models.gpu_in_sight", "tests.models.cuda_initialized"),
        gpu=False)
    assert cold_because is None
    assert seen == {"torch": True, "tests.models.gpu_in_sight": True,
                    "tests.models.cuda_initialized": True}  # forked, all imported once


def test_the_matrix_says_when_its_cells_could_not_start_warm(capsys):
    from exporter.cli import matrix as matrix_cli
    why = "the warm process's imports touched CUDA, which a forked process cannot use"
    rows = [{"model": m, "column": "onnx", "cold_because": why} for m in ("a", "b")]
    matrix_cli._report({"cells": rows}, as_json=True)
    captured = capsys.readouterr()
    assert f"2 cell(s) started in a fresh interpreter, not warm: {why}" in captured.err
