"""`exporter bench` on the cpu target: one process, same inputs, medians and ratios."""

from __future__ import annotations

import json


def test_bench_reports_medians_and_ratios(mlp_build, cli):
    result = cli("bench", str(mlp_build.artifact), "--baseline", "eager", "--runs", "30",
                 "--warmup", "5", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["timer"] == "perf_counter" and data["runs"] == 30
    for name in ("artifact", "eager"):
        timing = data["timings"][name]
        assert 0 < timing["min_ms"] <= timing["median_ms"] <= timing["p90_ms"]
    assert data["ratios"]["artifact/eager"] > 0


def test_bench_rejects_unknown_baselines(mlp_build, cli):
    result = cli("bench", str(mlp_build.artifact), "--baseline", "tensorrt")
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
