"""The validation process forked from a template that imported torch once
(exporter/validation/process.py, a fork server of exporter/forking/) is what a fresh
``python -m`` was: its own process, arguments, environment, folder, output, exit code and
signal, and nothing of the build's process in it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.forking import client
from exporter.validation import process
from exporter.validation.process import Child
from exporter.validation.validate import _child_env
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not process.AVAILABLE, reason="forked children: Linux only")
PROBE = "tests.models.validation_probe"


def _run(tmp_path, *words, env=None, timeout=120):
    folder = tmp_path / f"child-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    child = Child([PROBE, *words], env or _child_env(), folder)
    code = child.wait(timeout)
    stdout, stderr = child.output()
    return code, (json.loads(stdout.splitlines()[0]) if stdout.strip() else None), stderr


def test_a_validation_child_starts_with_torch_imported_and_nothing_of_the_build(tmp_path):
    import exporter.builder.pipeline  # noqa: F401  the build's side, in this process only
    env = {**_child_env(), "EDGE_PROBE": "mine"}
    code, first, stderr = _run(tmp_path, "ok", "two words", env=env)
    assert code == 0 and stderr == "probe: on stderr\n"
    assert first["preloaded"] and first["build_side"] == [] and first["name"] == "__main__"
    assert first["argv"] == ["ok", "two words"] and first["probe_env"] == "mine"
    assert first["cwd"] == os.getcwd() and first["path0"] == os.getcwd()
    assert first["ppid"] != os.getpid()  # the template's child
    _, second, _ = _run(tmp_path, "ok", env=env)
    assert second["ppid"] == first["ppid"] and second["pid"] != first["pid"]


def test_a_child_that_exits_raises_or_crashes_says_so_as_a_fresh_one_would(tmp_path):
    assert _run(tmp_path, "exit3")[0] == 3
    code, _, stderr = _run(tmp_path, "raise")
    assert code == 1 and stderr.rstrip().endswith("RuntimeError: the probe raised")
    code, _, stderr = _run(tmp_path, "segv")  # faulthandler: PYTHONFAULTHANDLER is set
    assert code == -signal.SIGSEGV and "Fatal Python error: Segmentation fault" in stderr


def test_a_module_the_template_preloaded_runs_without_runpys_warning(tmp_path):
    """The template imports runtime.__main__ for its imports; the child runs it as a fresh
    ``python -m runtime`` does, and its last words (shown when a validation dies) are
    the runtime's, not runpy's "found in sys.modules" warning."""
    child = Child(["runtime", "nonsense"], _child_env(), tmp_path)
    code = child.wait(120)
    _, stderr = child.output()
    assert code == 2 and stderr.startswith("usage: python -m runtime"), stderr


def test_a_child_past_its_time_is_killed_and_the_template_serves_the_next(tmp_path):
    child = Child([PROBE, "sleep"], _child_env(), tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(1.0)
    child.close()
    assert child.returncode == -signal.SIGKILL
    assert _run(tmp_path, "ok")[0] == 0


def test_ctrl_c_stops_the_child_not_its_template(tmp_path):
    """The terminal sends SIGINT to the whole process group: the child stops as a
    Python process does (KeyboardInterrupt, then death by SIGINT); the template stays."""
    _, first, _ = _run(tmp_path, "ok")
    template = first["ppid"]
    assert template != os.getpid()
    child = Child([PROBE, "sleep"], _child_env(), tmp_path)
    os.kill(template, signal.SIGINT)
    with pytest.raises(subprocess.TimeoutExpired):  # still running after the template's
        child.wait(0.5)
    pid = json.loads(child.output()[0].splitlines()[0])["pid"]
    os.kill(pid, signal.SIGINT)
    assert child.wait(30) == -signal.SIGINT and "KeyboardInterrupt" in child.output()[1]
    assert _run(tmp_path, "ok")[1]["ppid"] == template


def test_another_environment_gets_another_template_a_test_name_does_not(tmp_path):
    base = _child_env()
    _, first, _ = _run(tmp_path, "ok", env={**base, "PYTEST_CURRENT_TEST": "one"})
    _, renamed, _ = _run(tmp_path, "ok", env={**base, "PYTEST_CURRENT_TEST": "two"})
    threads = "2" if base.get("OMP_NUM_THREADS") == "1" else "1"  # not the base's (make test: 1)
    _, other, _ = _run(tmp_path, "ok", env={**base, "OMP_NUM_THREADS": threads})
    assert renamed["ppid"] == first["ppid"] and other["ppid"] != first["ppid"]


def test_what_the_templates_imports_never_read_may_differ_and_reaches_the_child(tmp_path):
    changes = {"COLUMNS": "200", "HF_HUB_OFFLINE": "1", "TVM_NUM_THREADS": "2"}
    base = {k: v for k, v in _child_env().items() if k not in changes}
    _, plain, _ = _run(tmp_path, "ok", env=base)
    _, changed, _ = _run(tmp_path, "ok", env={**base, **changes})
    assert changed["ppid"] == plain["ppid"] != os.getpid(), "one template serves both"
    assert (plain["columns"], plain["hf_offline"]) == (None, None)
    assert (changed["columns"], changed["hf_offline"]) == ("200", "1")


def test_a_dead_template_gives_way_to_a_fresh_interpreter(tmp_path):
    _, first, _ = _run(tmp_path, "ok")
    os.kill(first["ppid"], signal.SIGKILL)
    code, after, _ = _run(tmp_path, "ok")
    assert code == 0 and after["ppid"] != first["ppid"]  # a new template, or none


def test_two_children_at_once_both_run(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    slow = Child([PROBE, "sleep"], _child_env(), tmp_path / "a")
    quick = Child([PROBE, "ok"], _child_env(), tmp_path / "b")
    assert quick.wait(120) == 0  # in a fresh interpreter: the template is busy
    with pytest.raises(subprocess.TimeoutExpired):
        slow.wait(0.1)
    slow.close()
    assert slow.returncode == -signal.SIGKILL


def test_a_fresh_interpreter_runs_it_where_forking_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "AVAILABLE", False)
    code, seen, _ = _run(tmp_path, "ok")
    assert code == 0 and seen["ppid"] == os.getpid() and not seen["preloaded"]


_CLIENT = """
import json, os, sys, time
from pathlib import Path
from exporter.forking import client
from exporter.validation import process
from exporter.validation.validate import _child_env
folder = Path(sys.argv[1])
child = process.Child(["tests.models.validation_probe", "sleep"], _child_env(), folder)
while not (folder / "child.stdout").read_text():
    time.sleep(0.1)
pid = json.loads((folder / "child.stdout").read_text().splitlines()[0])["pid"]
print(json.dumps({"template": process.TEMPLATES.servers()[0]._proc.pid, "child": pid}), flush=True)
os.kill(os.getpid(), 9)
"""


def _gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "\nState:\tZ" in status.read_text()  # a zombie awaiting its reaper
    except OSError:
        return True


def test_a_template_ends_with_the_process_that_started_it_and_takes_its_child(tmp_path):
    done = subprocess.run([sys.executable, "-c", _CLIENT, str(tmp_path)], cwd=ROOT,
                          env=_child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pids = json.loads(done.stdout)
    deadline = time.monotonic() + 30
    while not all(map(_gone, pids.values())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(map(_gone, pids.values())), pids


def test_closing_a_child_whose_template_died_starts_nothing_new(tmp_path):
    """Ctrl-C or SIGTERM end the template too: the build's clean-up then must not start
    the validation again in a fresh interpreter."""
    env = {**_child_env(), "EDGE_PROBE": "closing"}  # its own template, still importing
    child = Child([PROBE, "ok"], env, tmp_path)
    (template,) = [t for t in process.TEMPLATES.servers()
                   if t.key[1] == client.env_key(process._template_env(env))]
    template._proc.kill()
    child.close()
    assert child.returncode == -signal.SIGKILL and child.output() == ("", "")
