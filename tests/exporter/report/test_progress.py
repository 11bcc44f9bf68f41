"""Progress from Python: exporter.build / exporter.bench report each stage to a callback
and log it on the `exporter` logger; the CLI shows the same stages (checked in a pipe)."""

import logging

import pytest

import exporter
from exporter.progress import StageEvent
from tests.conftest import exporter_cli


def _pairs(events: list[StageEvent]) -> list[tuple[str, str]]:
    return [(e.stage, e.state) for e in events]


def test_build_reports_every_stage_to_the_callback_and_the_log(tmp_path, caplog):
    events: list[StageEvent] = []
    with caplog.at_level(logging.INFO, logger="exporter"):
        built = exporter.build("zoo:mlp", target="onnx", out=tmp_path / "m.artifact",
                               progress=events.append)
    pairs = _pairs(events)
    stages = [stage for stage, state in pairs if state == "start"]
    assert stages[:2] == ["load model", "capture (torch.export)"]
    assert "lower (onnxruntime)" in stages and stages[-1] == "package"
    assert "validate (subprocess)" in stages
    for stage in stages:  # every start has its end, in order, with a duration
        assert pairs.index((stage, "start")) < pairs.index((stage, "done"))
    assert all(e.seconds >= 0 for e in events)
    assert sum(e.seconds for e in events if e.state == "done") <= sum(built.timings.values()) + 1
    logged = [r.getMessage() for r in caplog.records if r.name == "exporter"]
    assert "capture (torch.export)..." in logged
    assert any(m.startswith("package done in ") for m in logged)

    bench_events: list[StageEvent] = []
    timed = exporter.bench(built.artifact, baselines=("eager",), runs=5, warmup=1,
                           progress=bench_events.append)
    bench_stages = [s for s, state in _pairs(bench_events) if state == "done"]
    assert bench_stages[:2] == ["load model", "load artifact"]
    assert "warm up eager (1 calls)" in bench_stages
    assert any(s.startswith("time artifact, eager") for s in bench_stages)
    assert set(timed["timings"]) == {"artifact", "eager"}


def test_a_failing_stage_is_reported_failed(tmp_path):
    model_file = tmp_path / "broken.py"
    model_file.write_text("def factory():\n    raise RuntimeError('no weights here')\n")
    events: list[StageEvent] = []
    with pytest.raises(Exception, match="no weights here"):
        exporter.build(f"{model_file}:factory", target="onnx", out=tmp_path / "x.artifact",
                       progress=events.append)
    assert _pairs(events) == [("load model", "start"), ("load model", "failed")]


def test_cli_build_in_a_pipe_prints_one_line_per_stage(tmp_path):
    done = exporter_cli("build", "zoo:mlp", "--target", "onnx", "--no-validate",
                        "--out", str(tmp_path / "m.artifact"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("✓ load model ")
    assert any(line.startswith("✓ lower (onnxruntime) ") for line in lines)
    assert "\x1b[" not in done.stderr  # no terminal codes, no spinner frames in a pipe
    inspected = exporter_cli("inspect", str(tmp_path / "m.artifact"))
    lines = inspected.stdout.splitlines()
    # into a pipe, sentences stay whole (rich would cut them at 80 columns mid-word)
    memory = next(line for line in lines if line.startswith("memory plan"))
    assert "without reuse" in memory and len(memory) > 80
    assert not any(line.startswith("pass ") and "{" in line for line in lines)  # no raw dicts


def test_cli_build_in_a_terminal_shows_each_stage_running_with_its_clock(tmp_path):
    """Under a terminal (a pty) a stage shows a spinner and the time so far while it runs
    (rich's elapsed column, 0:00:SS), before its "✓ name 1.2s" line."""
    import os
    import pty
    import subprocess
    import sys

    from tests.conftest import ROOT, _record
    args = ["build", "zoo:mlp", "--target", "onnx", "--no-validate",
            "--out", str(tmp_path / "m.artifact")]
    _record(["exporter", *args, "(under a pty)"])
    main, child = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "exporter", *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=child)
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(timeout=300) == 0, seen.decode(errors="replace")[-2000:]
    text = seen.decode(errors="replace")
    assert "lower (onnxruntime)..." in text and "0:00:0" in text  # running, with its clock
    assert "✓" in text and "lower (onnxruntime)" in text
