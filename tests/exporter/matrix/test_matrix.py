"""`exporter matrix`: three tiny models x two onnx recipes (benched), run as a user runs it.

The models: zoo:mlp (builds everywhere), a custom op no backend knows (on the CPU fallback
under `--fallback warn`, refused under `forbid`) and a model file whose factory raises. The
Ray run starts a local cluster of 2 CPUs, and the worker running one cell is killed (by
pid) mid-build: Ray runs the cell again and the matrix completes. A rerun builds nothing
(every cell from the cache); the local executor gives the same table (make test-slow).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from exporter.matrix import spec_file, warm
from exporter.report.speed import phrase
from tests.conftest import ROOT, _record

pytest.importorskip("onnxruntime")
KILLED = "mlp--onnx"  # the cell whose worker is killed
# what must match between runs and executors (timings, workers and paths may differ)
SAME = ("status", "stage", "error_type", "exit_code", "ops", "partitions", "fallback_ops",
        "target", "dtype")


def _write_matrix(folder: Path) -> Path:
    (folder / "raises.py").write_text("def factory():\n    raise RuntimeError('broken "
                                      "on purpose')\n")
    path = folder / "tiny.toml"
    path.write_text(textwrap.dedent(f"""
        timeout = 300
        retries = 2
        warm_start = {str(warm.AVAILABLE).lower()}  # the Ray workers fork their cells
        [models]
        mlp = "zoo:mlp"
        softclip = {{ spec = "{ROOT}/tests/models/custom_op.py:factory", group = "custom" }}
        broken = "raises.py:factory"
        [targets.onnx]
        [targets.onnx-forbid]
        target = "onnx"
        fallback = "forbid"
        [bench]
        runs = 5
        warmup = 1
    """))
    return path


def _command(matrix: Path, out: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "exporter", "matrix", str(matrix), "--out", str(out),
           "--json", *extra]
    _record(["exporter", *cmd[3:]])
    return cmd


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _cells(data: dict) -> dict[str, dict]:
    return {f"{c['model']}--{c['column']}": c for c in data["cells"]}


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    """The matrix on a 2-CPU Ray cluster; the worker building KILLED is killed with
    SIGKILL as soon as that build has started. Returns (data, the killed marker)."""
    pytest.importorskip("ray")
    folder = tmp_path_factory.mktemp("matrix")
    matrix, out = _write_matrix(folder), folder / "ray"
    proc = subprocess.Popen(_command(matrix, out, "--executor", "ray", "--workers", "2"),
                            cwd=folder, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    marker_file = out / "running" / f"{KILLED}.json"
    deadline = time.monotonic() + 240
    while not marker_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    marker = json.loads(marker_file.read_text())
    os.kill(marker["worker_pid"], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stderr[-3000:]  # 1: some cells failed, as they should
    return folder, matrix, json.loads(stdout), marker


def test_the_table_is_right_and_bad_cells_fail_alone(ray_run):
    _, _, data, _ = ray_run
    cells = _cells(data)
    assert data["totals"] == {"cells": 6, "passed": 3, "failed": 3, "unvalidated": 0, "not_run": 0,
                              "built": 6, "cached": 0}
    for cell in ("mlp--onnx", "mlp--onnx-forbid", "softclip--onnx"):
        row = cells[cell]
        assert row["status"] == "ok" and row["error_ratio"] <= 1.0, row
        assert Path(row["artifact"]).is_file() and row["artifact_bytes"] > 0
        assert row["bench"]["latency_ms"] > 0 and row["bench"]["ratios"]["artifact/eager"] > 0
    assert cells["mlp--onnx"]["fallback_ops"] == 0
    for row in cells.values():  # the timeline: each cell ran within the matrix's run
        began, ended = row["ran"]
        start = data["marks"]["started_at"]
        assert start <= data["marks"]["planned_at"] <= data["marks"]["first_submitted_at"]
        assert data["marks"]["first_submitted_at"] <= began <= ended <= start + data["wall_s"] + 1
    assert cells["softclip--onnx"]["fallback_ops"] == 1  # the custom op, on the fallback
    refused = cells["softclip--onnx-forbid"]
    assert (refused["status"], refused["error_type"]) == ("bad-input", "UnsupportedOpsError")
    assert "forbid" in refused["error"]
    assert "edgetest::soft_clip" in refused["error_details"][-1]  # the op, under the error
    for column in ("onnx", "onnx-forbid"):
        broken = cells[f"broken--{column}"]
        assert (broken["status"], broken["error_type"]) == ("bad-input", "SpecError")
        assert "broken on purpose" in broken["error"] and "load model" in broken["stage"]
    html = Path(data["files"]["html"]).read_text()
    assert "UnsupportedOpsError" in html and "1 of 4 ops on the CPU fallback" in html
    assert "no ONNX translation registered for edgetest::soft_clip" in html
    assert html.count(" than eager)") == 3  # latency and how much faster, where a cell was benched
    csv_lines = Path(data["files"]["csv"]).read_text().splitlines()
    assert len(csv_lines) == 7 and csv_lines[0].startswith("model,group,column")


def test_a_killed_worker_has_its_cell_run_again(ray_run):
    _, _, data, marker = ray_run
    row = _cells(data)[KILLED]
    assert marker["attempt"] == 1
    assert row["attempts"] == 2 and row["status"] == "ok", row
    assert row["worker"] != f"{marker['host']}:{marker['worker_pid']}"
    # the build the worker was running died with it (gone, or a zombie awaiting init)
    status = Path(f"/proc/{marker['build_pid']}/status")
    assert not status.exists() or "\nState:\tZ" in status.read_text()


def test_a_rerun_builds_nothing(ray_run):
    folder, matrix, first, _ = ray_run
    done = subprocess.run(_command(matrix, folder / "ray", "--executor", "ray"), cwd=folder,
                          env=_env(), capture_output=True, text=True, timeout=300)
    data = json.loads(done.stdout)
    assert data["totals"]["built"] == 0 and data["totals"]["cached"] == 6, done.stderr
    before, after = _cells(first), _cells(data)
    for cell, row in after.items():
        assert row["cached"] and {k: row.get(k) for k in SAME} == {
            k: before[cell].get(k) for k in SAME}, cell


def test_cells_start_longest_first_from_their_last_build_times(ray_run):
    """Each built cell's time is kept beside the cache (whatever its outcome), and the
    next run starts the cells never built first, then the longest: the order that lets
    N workers finish close to 1/N of the loop."""
    from exporter.matrix.cell import Job
    from exporter.matrix.runner import longest_first

    folder, _, data, _ = ray_run
    recorded = json.loads((folder / "ray" / "cache" / "durations.json").read_text())
    assert set(recorded) == set(_cells(data)) and all(s > 0 for s in recorded.values())
    jobs = [Job(name, "c.toml", "a.artifact", "r.json", ".", 60.0, 1, None)
            for name in ("short", "new", "long", "middle")]
    seconds = {"short": 5.0, "long": 90.0, "middle": 30.0}
    assert [job.cell_id for job in longest_first(jobs, seconds)] == [
        "new", "long", "middle", "short"]


@pytest.mark.slow  # six more builds; the local executor also runs in test_coverage_slice
def test_the_local_executor_gives_the_same_table(ray_run):
    folder, matrix, ray_data, _ = ray_run
    done = subprocess.run(_command(matrix, folder / "local", "--workers", "2"), cwd=folder,
                          env=_env(), capture_output=True, text=True, timeout=600)
    data = json.loads(done.stdout)
    assert data["executor"] == "local" and data["totals"]["built"] == 6, done.stderr
    local, ray = _cells(data), _cells(ray_data)
    assert local.keys() == ray.keys()
    for cell in local:
        assert {k: local[cell].get(k) for k in SAME} == {k: ray[cell].get(k) for k in SAME}
        assert local[cell]["key"] == ray[cell]["key"]  # the same cache key either way


def test_a_cache_hit_rechecks_the_artifact(ray_run, tmp_path):
    """A cached artifact changed on disk is not trusted: the cell is built again."""
    import shutil

    from exporter.matrix.cache import Cache
    folder, _, data, _ = ray_run
    row = _cells(data)["mlp--onnx"]
    shutil.copytree(folder / "ray" / "cache", tmp_path / "cache")
    cache = Cache(tmp_path / "cache")
    assert cache.lookup(row["key"])["status"] == "ok"
    artifact = cache.artifact(row["key"])
    blob = bytearray(artifact.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    artifact.write_bytes(bytes(blob))
    assert cache.lookup(row["key"]) is None
    assert not (tmp_path / "cache" / f"{row['key']}.json").exists()


def test_the_key_follows_the_model_source_and_the_settings(tmp_path):
    from exporter.matrix import cache, spec_file

    (tmp_path / "m.py").write_text("import torch\ndef f():\n    return torch.nn.Linear(2, 2), "
                                   "(torch.randn(2, 2),)\n")
    matrix = tmp_path / "m.toml"

    def keys(dtype: str = "fp32") -> dict[str, str]:
        matrix.write_text(f'[models]\nm = "m.py:f"\nmlp = "zoo:mlp"\n[targets.onnx]\n'
                          f'[targets.cpu]\ndtype = "{dtype}"\n')
        cells = spec_file.read(matrix).cells
        tools = cache.toolchain({"onnx", "cpu"})
        return {c.id: cache.cell_key(c, tools) for c in cells}

    first = keys()
    assert len(set(first.values())) == 4 and keys() == first
    (tmp_path / "m.py").write_text((tmp_path / "m.py").read_text() + "# changed\n")
    changed = keys()
    assert changed["m--onnx"] != first["m--onnx"] and changed["mlp--onnx"] == first["mlp--onnx"]
    fp16 = keys("fp16")
    assert fp16["mlp--cpu"] != first["mlp--cpu"] and fp16["mlp--onnx"] == first["mlp--onnx"]


@pytest.mark.parametrize("text, named", [
    ('[models]\nm = "zoo:mlp"\n[targets.onnxx]\n', "did you mean 'onnx'"),
    ('[models]\nm = { spec = "zoo:mlp", dtyp = "fp16" }\n[targets.onnx]\n', "dtyp"),
    ('[models]\nm = "zoo:mlp"\n[targets.onnx]\ndtype = "fp8"\n', "dtype"),
    ('[targets.onnx]\n', "models"),
    ('[models]\n"a b" = "zoo:mlp"\n[targets.onnx]\n', "'a b'"),
    ('[models]\nm = { spec = "zoo:mlp", target = "cpu" }\n[targets.onnx]\n', "cannot set"),
    ('[models]\na = "zoo:mlp"\n"a--b" = "zoo:mlp"\n[targets.onnx]\n[targets."b--onnx"]\n'
     'target = "onnx"\n', "would both be cell 'a--b--onnx'"),
    ('[models]\nm = { spec = "zoo:mlp", depends = ["nope.py"] }\n[targets.onnx]\n',
     "depends names no file"),
    ('warm_start = "yes"\n[models]\nm = "zoo:mlp"\n[targets.onnx]\n', "warm_start"),
])
def test_matrix_file_mistakes_stop_before_any_build(tmp_path, text, named):
    from typer.testing import CliRunner

    from exporter.cli import app
    (tmp_path / "m.toml").write_text(text)
    result = CliRunner().invoke(app, ["matrix", str(tmp_path / "m.toml"), "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and named in result.stderr, result.stderr
    assert "m.toml" in result.stderr and not (tmp_path / "out" / "matrix.json").exists()


# Ray's own SIGTERM handler: make test-slow (a second Ray cluster); ray_run runs Ray here
@pytest.mark.parametrize("executor, stop", [
    ("local", signal.SIGINT), pytest.param("ray", signal.SIGTERM, marks=pytest.mark.slow)])
def test_ctrl_c_stops_the_builds_and_keeps_the_table(tmp_path, executor, stop):
    """Interrupted mid-build (Ctrl-C, or SIGTERM, which Ray's own handler took over):
    exit 130, no build left running, the table so far written (the cell in flight says
    not-run; finished cells are in the cache, see the rerun)."""
    if executor == "ray":
        pytest.importorskip("ray")
    (tmp_path / "slow.py").write_text("import time\ndef factory():\n    time.sleep(300)\n")
    (tmp_path / "m.toml").write_text('[models]\nslow = "slow.py:factory"\n[targets.onnx]\n')
    out = tmp_path / "out"
    proc = subprocess.Popen(_command(tmp_path / "m.toml", out, "--executor", executor,
                                     "--workers", "1"), cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker_file = out / "running" / "slow--onnx.json"
    deadline = time.monotonic() + 120
    while not marker_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    build_pid = json.loads(marker_file.read_text())["build_pid"]
    proc.send_signal(stop)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "run the same command again" in stderr, stderr
    data = json.loads((out / "matrix.json").read_text())
    assert [c["status"] for c in data["cells"]] == ["not-run"]
    status = Path(f"/proc/{build_pid}/status")
    assert not status.exists() or "\nState:\tZ" in status.read_text()


def test_an_out_that_is_a_file_or_a_cluster_nobody_runs_is_exit_2_and_keeps_the_table(tmp_path):
    """Checked before anything is written: the last run's matrix.json stays."""
    from typer.testing import CliRunner

    from exporter.cli import app
    from exporter.matrix.folder import claim
    (tmp_path / "m.toml").write_text('[models]\nm = "zoo:mlp"\n[targets.onnx]\n')
    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(app, ["matrix", str(tmp_path / "m.toml"), "--out",
                                      str(tmp_path / "afile")])
    assert result.exit_code == 2 and "is a file, not a folder" in result.stderr, result.output
    pytest.importorskip("ray")
    out = tmp_path / "out"
    claim(out, own_cache=True)  # the folder of an earlier matrix
    (out / "matrix.json").write_text("the last run's table")
    result = CliRunner().invoke(app, ["matrix", str(tmp_path / "m.toml"), "--out", str(out),
                                      "--executor", "ray", "--ray-address", "127.0.0.1:1"])
    assert result.exit_code == 2 and "nothing answers at --ray-address 127.0.0.1:1" in \
        result.stderr
    assert (out / "matrix.json").read_text() == "the last run's table"


def test_a_failed_rebuild_does_not_report_the_artifact_an_earlier_build_left(
        tmp_path, monkeypatch):
    """The cell's key path held a good artifact; the rebuild failed: the row has no
    artifact, and OUT/artifacts no longer links the old one."""
    from exporter.matrix.runner import run_matrix
    (tmp_path / "flaky.py").write_text(
        "import os, torch\ndef factory():\n    if os.environ.get('MATRIX_TEST_BREAK'):\n"
        "        raise RuntimeError('broken now')\n"
        "    return torch.nn.Linear(4, 2), (torch.randn(3, 4),)\n")
    # cold cells: a warm worker's imports cost more than a one-cell run's two builds
    (tmp_path / "m.toml").write_text('warm_start = false\n[models]\nflaky = "flaky.py:factory"\n'
                                     '[targets.onnx]\n')
    out = tmp_path / "out"
    first = run_matrix(tmp_path / "m.toml", out, workers=1)["cells"][0]
    assert first["status"] == "ok" and (out / "artifacts" / "flaky--onnx.artifact").is_file()
    monkeypatch.setenv("MATRIX_TEST_BREAK", "1")
    again = run_matrix(tmp_path / "m.toml", out, workers=1, rebuild=True)["cells"][0]
    assert again["status"] == "bad-input" and "broken now" in again["error"]
    assert not {"artifact", "artifact_sha256", "artifact_bytes"} & set(again)
    assert not (out / "artifacts" / "flaky--onnx.artifact").exists()


@pytest.mark.parametrize("line, warm_columns", [("", {"onnx", "cpu"}),
                                                 ("warm_start = true\n", {"onnx", "cpu", "cuda"}),
                                                 ("warm_start = false\n", set())])
def test_warm_start_auto_forks_the_cells_that_use_no_gpu(tmp_path, line, warm_columns):
    """By default a cell forks from a warm worker unless it uses the GPU (a warm worker
    with GPU cells must try its imports in throwaway forks, slower than fresh cells)."""
    from exporter.matrix.cache import Cache
    from exporter.matrix.runner import _Run, _warm_modules
    path = tmp_path / "m.toml"
    path.write_text(line + '[models]\nm = "zoo:mlp"\n[targets.onnx]\n[targets.cpu]\n'
                    '[targets.cuda]\n')
    matrix = spec_file.read(path)
    modules = _warm_modules(matrix)
    tools = {column: {} for column in ("onnx", "cpu", "cuda")}  # the key's toolchain part
    (tmp_path / "cells").mkdir()
    jobs = _Run(matrix, tmp_path, Cache(tmp_path / "cache"), print).plan(
        tools, rebuild=True, threads=1, warm_modules=modules)
    warm_jobs = {job.cell_id.rpartition("--")[2] for job in jobs if job.warm_modules}
    assert warm_jobs == warm_columns
    assert (modules is None) == (not warm_columns)
    if warm_columns:  # the warm process imports what its targets build with
        assert "onnx" in modules and "torch._inductor.compile_fx" in modules


def test_a_warm_worker_imports_transformers_only_where_a_model_may_use_it(tmp_path):
    """transformers (and the torchao it imports, 2.4 CPU s a worker) for hf: specs and
    model files that name it; never for zoo: models and other files."""
    from exporter.matrix.runner import _warm_modules
    (tmp_path / "plain.py").write_text("import torch\n")
    (tmp_path / "hf.py").write_text("import transformers\n")

    def modules(*specs: str) -> tuple[str, ...]:
        path = tmp_path / "m.toml"
        path.write_text("[models]\n" + "".join(f'm{i} = "{spec}"\n' for i, spec in
                                                enumerate(specs)) + "[targets.onnx]\n")
        return _warm_modules(spec_file.read(path))
    assert "transformers" not in modules("zoo:mlp", "plain.py:f")
    assert "transformers" in modules("zoo:mlp", "hf.py:f")
    assert "transformers" in modules("zoo:mlp", "hf:ckpt")


def test_a_bench_without_a_result_is_run_again_and_no_bench_shows_none():
    from exporter.matrix.runner import _needs_bench
    asked = {"runs": 5, "warmup": 1, "baseline": "eager"}
    benched = {"status": "ok", "bench": {"settings": asked, "latency_ms": 0.1}}
    timed_out = {"status": "ok", "bench": {"settings": asked, "error": "no result after 15 s"}}
    assert not _needs_bench(benched, asked) and _needs_bench(timed_out, asked)
    assert _needs_bench(benched, {**asked, "runs": 6}) and _needs_bench({"status": "ok"}, asked)
    assert not _needs_bench({"status": "build-failed"}, asked)
    assert not _needs_bench(timed_out, None)


def test_config_paths_are_the_files_folder_normalised(tmp_path):
    """calibration is a path too ("random" is not); a spec reached through ../ is
    recorded without it, so an artifact does not name the matrix's cells/ folder."""
    from exporter.config.config_file import fields_of
    folder = tmp_path / "out" / "cells"
    spec, fields = fields_of({"spec": "../../models/m.py:f", "calibration": "c.npz",
                              "inputs": "x.npz"}, folder, "t.toml")
    assert spec == f"{tmp_path}/models/m.py:f"
    assert fields["calibration"] == str(folder / "c.npz") and fields["inputs"] == str(
        folder / "x.npz")
    assert fields_of({"calibration": "random"}, folder, "t.toml")[1]["calibration"] == "random"


def test_a_generating_cell_is_benched_in_tokens_per_second(onnx_lm, tmp_path):
    """A matrix with a `task = "text-generation"` model and [bench] ended in a KeyError
    (exit 4): the cell read a plain bench's latencies from `exporter bench --json`, which
    for a generating artifact gives tokens/s. The cell's bench (as a worker runs it, in its
    own process) now keeps decode tokens/s and the first token's time, and the table says
    them beside the greedy tokens' verdict."""
    from exporter.matrix import tables
    from exporter.matrix.cell import Job, _bench, _validation_figures
    built, _ = onnx_lm
    job = Job("lm--onnx", "", str(built.artifact), str(tmp_path / "running"), str(tmp_path),
              timeout=300, threads=2, bench={"runs": 2, "warmup": 1, "baseline": "eager"})
    bench = _bench(job, 300, 1)
    row = {"status": "ok", "bench": bench, **_validation_figures(built.manifest.validation)}
    _, lines = tables.cell_text(row)
    assert bench["decode_tokens_per_s"] > 0 and bench["ttft_ms"] > 0
    assert bench["decode_ratios"]["artifact/hf-eager"] > 0 and row["tokens_identical"]
    assert lines == ["greedy tokens identical to transformers'",
                     f"decode {bench['decode_tokens_per_s']:.0f} tok/s "
                     f"({phrase(bench['decode_ratios']['artifact/hf-eager'], 'transformers')}), "
                     f"first token {bench['ttft_ms']:.3g} ms"]
