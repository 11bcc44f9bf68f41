"""bench/cpu_choice.py's table and bench/cpu_choice_pinned.py's phases, without building."""

from __future__ import annotations

import json
import sys
import time

import pytest

from bench import cpu_choice, cpu_choice_pinned


def _timing(median: float) -> dict:
    return {"median_ms": median, "p10_ms": median * 0.9, "p90_ms": median * 1.2}


def _row(model: str, timings: dict) -> dict:
    return {"date": "2026-11-29", "cpu": "Xeon", "cores": 2, "torch": "2.11",
            "onnxruntime": "1.30", "runs": 30, "threads": {"torch": 2}, "model": model,
            "backend_choice": {"p0": {"chosen": "onnx", "candidates": {
                "aoti": {"median_ms": 9.0}, "onnx": {"median_ms": 5.5}}}},
            "timings": {k: _timing(v) for k, v in timings.items()}}


def test_table_divides_by_the_fastest_peer_and_gives_the_geometric_mean(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        _row("mnv2", {"cpu": 6.0, "eager": 20.0, "ort": 5.0, "aoti": 8.0}),
        _row("vit", {"cpu": 150.0, "eager": 170.0, "ort": 160.0, "aoti": 200.0})]))
    text = cpu_choice.render([str(rows)])
    mnv2 = next(line for line in text.splitlines() if line.startswith("| mnv2 |"))
    assert "| plain ORT | **1.200** |" in mnv2  # 6 / 5, not 6 / 20 (eager)
    assert "onnx (aoti 9, onnx 5.5)" in mnv2 and "6 (5.4-7.2)" in mnv2
    assert "geometric mean cpu / best peer **1.061**" in text.lower()  # sqrt(1.2 * 150/160)


def _one_row_table(tmp_path, model: str, timings: dict) -> tuple[str, str]:
    """render's text for one model's row, and that row's line."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_row(model, timings)))
    text = cpu_choice.render([str(rows)])
    return text, next(line for line in text.splitlines() if line.startswith(f"| {model} |"))


def test_the_onnx_targets_column_is_shown_and_not_taken_for_a_peer(tmp_path):
    text, line = _one_row_table(tmp_path, "convnext", {"cpu": 60.0, "onnx": 50.0,
                                                       "eager": 80.0, "ort": 55.0,
                                                       "aoti": 70.0})
    assert "| cpu target ms (p10-p90) | onnx target ms (p10-p90) | eager |" in text
    assert "| 50 (45-60) |" in line and "| plain ORT | **1.091** |" in line  # 60 / 55

def test_a_timing_step_leaves_out_peers_no_earlier_step_made(tmp_path, monkeypatch):
    from bench import compare_targets

    monkeypatch.setattr(compare_targets, "plain_aoti", lambda *a: (_ for _ in ()).throw(
        AssertionError("compiled in a timing step")))
    _, calls = compare_targets.baselines("zoo:mlp", ["aoti", "aoti-aligned"], tmp_path, 1,
                                         made_only=True)
    assert set(calls) == {"eager"}


def test_the_peers_library_loaded_aligned_is_a_column_and_not_taken_for_a_peer(tmp_path):
    text, line = _one_row_table(tmp_path, "gpt2", {"cpu": 150.0, "eager": 180.0, "ort": 160.0,
                                                   "aoti": 140.0, "aoti-aligned": 130.0})
    assert "| cpu target ms (p10-p90) | AOTI frozen, constants aligned" in text
    assert "| 130 (117-156) |" in line
    assert "| AOTInductor frozen | **1.071** |" in line  # 150 / 140, not 150 / 130


def test_a_peer_package_that_is_not_one_library_cannot_be_loaded_aligned(tmp_path):
    import zipfile

    from bench import compare_targets

    empty = tmp_path / "empty.pt2"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("empty/data/aotinductor/model/notes.txt", "no library")
    with pytest.raises(RuntimeError, match="not one CPU library"):
        compare_targets.aligned_aoti(empty, tmp_path, [])


def test_split_peers_export_and_compile_in_jobs_of_their_own_the_aligned_load_with_its_file():
    assert cpu_choice_pinned.peer_jobs("ort,aoti,aoti-aligned", split=False) == [
        "ort,aoti,aoti-aligned"]
    assert cpu_choice_pinned.peer_jobs("ort,aoti,aoti-aligned", split=True) == [
        "ort", "aoti,aoti-aligned"]
    assert cpu_choice_pinned.peer_jobs("aoti-aligned,ort", split=True) == ["ort", "aoti-aligned"]


def test_a_pinned_cpu_backend_replaces_auto_in_the_cpu_builds_flags_only():
    import argparse

    pinned = argparse.Namespace(cpu_backend="aoti-onednn")
    assert cpu_choice._flags("cpu", pinned) == ["--target", "cpu", "--cpu-backend",
                                                 "aoti-onednn"]
    assert cpu_choice._flags("onnx", pinned) == ["--target", "onnx"]
    assert cpu_choice.VARIANTS["cpu"][-1] == "auto"  # the table's own flags untouched


def test_slots_still_running_at_the_barrier_are_ended_and_named(tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    quick = [sys.executable, "-c", "pass"]
    slots = [cpu_choice_pinned.Slot("slow", "0", [sleeper, quick], tmp_path / "slow.log", 1),
             cpu_choice_pinned.Slot("fast", "0", [quick], tmp_path / "fast.log", 1)]
    start = time.monotonic()
    ended = cpu_choice_pinned.run_slots(slots, start + 3.0)
    assert ended == ["slow"] and time.monotonic() - start < 20
    assert slots[1].seconds is not None and not slots[1].failed
    assert (tmp_path / "slow.log").read_text().count("$ ") == 1  # the second never started


def test_alone_the_timing_processes_run_one_after_another(tmp_path):
    stamp = ("import sys, time; f = open(sys.argv[1], 'a'); f.write(f'{time.time()} ');"
             " time.sleep(0.4); f.write(f'{time.time()}\\n')")
    timers = [cpu_choice_pinned.Slot(name, "0", [[sys.executable, "-c", stamp,
                                                   str(tmp_path / f"{name}.txt")]],
                                     tmp_path / f"{name}.log", 1) for name in ("a", "b")]
    ended = cpu_choice_pinned.run_timers(timers, time.monotonic() + 30, lanes=1)
    (a0, a1), (b0, b1) = [map(float, (tmp_path / f"{n}.txt").read_text().split())
                          for n in ("a", "b")]
    assert ended == [] and a1 <= b0, "b started before a ended"


def test_in_two_lanes_two_timings_run_at_once_and_each_lane_in_turn(tmp_path):
    stamp = ("import sys, time; f = open(sys.argv[1], 'a'); f.write(f'{time.time()} ');"
             " time.sleep(0.6); f.write(f'{time.time()}\\n')")
    timers = [cpu_choice_pinned.Slot(name, "0", [[sys.executable, "-c", stamp,
                                                   str(tmp_path / f"{name}.txt")]],
                                     tmp_path / f"{name}.log", 1) for name in "abc"]
    ended = cpu_choice_pinned.run_timers(timers, time.monotonic() + 30, lanes=2)
    (a0, a1), (b0, b1), (c0, c1) = [map(float, (tmp_path / f"{n}.txt").read_text().split())
                                    for n in "abc"]
    assert ended == []
    assert b0 < a1 and a0 < b1, "a and b (two lanes) did not overlap"
    assert a1 <= c0, "c (a's lane) started before a ended"


def test_processes_timed_together_start_when_all_are_ready_and_call_engines_until_all_are_done(
        tmp_path):
    first = cpu_choice.Together(tmp_path, 2, "a", limit_s=30)
    second = cpu_choice.Together(tmp_path, 2, "b", limit_s=30)
    (tmp_path / "ready-b").touch()  # b loaded and warmed up first
    with first.stage("warm up eager (3 calls)"):
        assert not (tmp_path / "ready-a").exists(), "warm-ups wait for no one"
    with first.stage("time eager, cpu (30 calls each, interleaved)"):
        assert (tmp_path / "ready-a").exists() and first.record["all_ready"]
    called = {"eager": 0, "cpu": 0}

    def engine(name):
        def call():
            called[name] += 1
            if called["cpu"] == 3:  # b is done while a still calls its engines
                (tmp_path / "done-b").touch()
        return call

    first.keep_busy({name: engine(name) for name in called})
    assert first.record["all_done"] and first.record["busy_after_s"] < 30
    assert called == {"eager": 3, "cpu": 3}, "the engines were not called in turn"
    with second.stage("time eager (1 calls each, interleaved)"):
        pass
    second.keep_busy({"eager": lambda: None})
    assert second.record["all_ready"] and second.record["all_done"]


def test_a_process_timed_together_goes_on_alone_once_its_wait_runs_out(tmp_path):
    alone = cpu_choice.Together(tmp_path, 2, "a", limit_s=0.2)
    with alone.stage("time eager (1 calls each, interleaved)"):
        pass
    alone.keep_busy({"eager": lambda: None})
    assert alone.record["all_ready"] is False and alone.record["all_done"] is False


def test_each_engines_timed_calls_are_kept_in_blocks_and_paired_within_their_round(
        tmp_path):
    """The machine slows everything 3x for the last rounds: the blocks of one round
    divided still give our engine's 2 ms against the peer's 2.4 ms."""
    from exporter.benchmark import time_side_by_side

    slow = {"rounds": 0}

    def engine(ms):
        def call():
            time.sleep(ms / 1e3 * (3 if slow["rounds"] >= 4 else 1))
        return call

    blocks = cpu_choice.Blocks(runs=12, rounds=6)
    calls = blocks.wrap({"ort": engine(2.4), "cpu": engine(2.0)})
    counted = calls["cpu"]

    def cpu_and_count():
        counted()
        slow["rounds"] += 1 / 3  # three calls a block: one untimed, two timed
    calls["cpu"] = cpu_and_count
    time_side_by_side(calls, "cpu", 12, 1, rounds=6, stage=blocks.stage)
    found = blocks.summary()
    assert found["per_round"] == 2 and len(found["cpu"]["ms"]) == 6
    assert len(found["cpu"]["calls"]) == 18, "the warm-up is not recorded, the untimed are"
    assert found["cpu"]["at_s"] == sorted(found["cpu"]["at_s"])
    assert cpu_choice.paired(found, "cpu", "ort") == pytest.approx(2.0 / 2.4, rel=0.08)
    row = {**_row("bert", {"cpu": 5.0, "ort": 4.0}), "blocks": found}
    text = cpu_choice.render([_written(tmp_path, row)])
    line = next(line for line in text.splitlines() if line.startswith("| bert |"))
    assert line.endswith(f" {cpu_choice.paired(found, 'cpu', 'ort'):.3f} |")
    assert "| **1.250** |" in line, "the medians' ratio stays the table's"
    paired_line = text.splitlines()[-1]
    ratio = cpu_choice.paired(found, "cpu", "ort")
    assert paired_line.startswith(f"| bert | {ratio:.3f} (") and "/6) |" in paired_line


def _written(tmp_path, row: dict) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row))
    return str(path)
