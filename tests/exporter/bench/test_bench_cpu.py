"""`exporter bench` on the cpu target: one process, same inputs, medians and ratios."""

from __future__ import annotations

import json


def test_bench_reports_medians_and_ratios(mlp_build, cli_here):
    result = cli_here("bench", str(mlp_build.artifact), "--baseline", "eager", "--runs", "30",
                      "--warmup", "5", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["timer"] == "perf_counter" and data["runs"] == 30
    for name in ("artifact", "eager"):
        timing = data["timings"][name]
        assert 0 < timing["min_ms"] <= timing["median_ms"] <= timing["p90_ms"]
    assert data["ratios"]["artifact/eager"] > 0


def test_bench_rejects_unknown_baselines(mlp_build, cli_here):
    result = cli_here("bench", str(mlp_build.artifact), "--baseline", "tensorrt")
    assert result.returncode == 2 and "tensorrt" in result.stderr


def test_python_api_is_what_the_cli_calls(mlp_build):
    """exporter.build -> Artifact, runtime.load -> Program, exporter.validation.validate, exporter.bench."""
    import torch

    import exporter
    import runtime

    program = runtime.load(mlp_build.artifact)
    assert program(torch.randn(3, 64)).shape[0] == 3
    record = exporter.validate(mlp_build.artifact, "zoo:mlp")
    assert record["passed"] is True
    timings = exporter.bench(mlp_build.artifact, baselines=("eager",), runs=5, warmup=1)
    assert set(timings["timings"]) == {"artifact", "eager"}


def test_bench_times_eager_by_default_and_says_how_much_faster_in_words(mlp_build, cli_here):
    result = cli_here("bench", str(mlp_build.artifact), "--runs", "10", "--warmup", "2")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith("  artifact: ")]
    assert len(said) == 1 and said[0].endswith(" than eager")
    assert (" faster " in said[0]) != (" slower " in said[0])
    assert "compile" not in result.stdout and "compile" not in result.stderr
    assert "; inputs x float32[" in result.stderr  # what was timed, and with what versions
    assert "torch 2." in result.stderr.splitlines()[-1], result.stderr


def test_bench_times_the_batch_asked_and_the_inputs_given(mlp_build, cli_here, tmp_path):
    import numpy as np

    batch = cli_here("bench", str(mlp_build.artifact), "--batch-size", "5", "--runs", "3",
                     "--warmup", "1", "--json")
    assert batch.returncode == 0, batch.stderr
    assert json.loads(batch.stdout)["inputs"][0]["shape"] == [5, 64]
    path = tmp_path / "x.npz"
    np.savez(path, x=np.ones((3, 64), dtype=np.float32))
    given = cli_here("bench", str(mlp_build.artifact), "--inputs", str(path), "--runs", "3",
                     "--warmup", "1", "--json")
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["inputs"][0]["shape"] == [3, 64]
    too_big = cli_here("bench", str(mlp_build.artifact), "--batch-size", "1000", "--json")
    assert too_big.returncode == 2 and "outside the built range" in too_big.stdout


def test_no_candidate_is_timed_straight_after_another_ones_call():
    """Each timed block starts with an untimed call of the same candidate (another
    engine's pool may still spin on the cores), and the order rotates every round."""
    from exporter.benchmark import time_side_by_side

    log: list[str] = []
    calls = {name: (lambda name=name: log.append(name)) for name in ("a", "b", "c")}
    time_side_by_side(calls, "cpu", runs=6, warmup=0, rounds=3)
    blocks = [log[i:i + 3] for i in range(0, len(log), 3)]  # settle + 2 timed calls
    assert all(len(set(block)) == 1 for block in blocks)
    firsts = [blocks[i][0] for i in range(0, len(blocks), 3)]
    assert firsts == ["a", "b", "c"]
