"""One way to say how fast an artifact ran against a baseline, in every text that says it
(bench, matrix, report): "3.2x faster than eager", "1.4x slower than compile".

A bench result's ``speedups`` hold the number behind it: how many times faster the artifact
was (above 1: faster), from latencies for a plain artifact and from decode tokens/s for a
generating one. Its ``ratios`` keep their older, per-kind meaning for readers of the JSON.
"""

from __future__ import annotations

import os

# p90 past this many medians: the timings are too noisy to compare (another job ran)
UNSTABLE_P90 = 2.0


def phrase(speedup: float | None, baseline: str) -> str:
    """``speedup`` (baseline time / artifact time) in words."""
    if not speedup or speedup <= 0:
        return f"not compared with {baseline}"
    if speedup >= 1:
        return f"{_times(speedup)} faster than {baseline}"
    return f"{_times(1 / speedup)} slower than {baseline}"


def _times(value: float) -> str:
    return f"{value:.0f}x" if value >= 10 else f"{value:.1f}x"


def speedups(bench: dict) -> dict[str, float]:
    """Baseline -> how many times faster the artifact was, from either kind of bench
    result (older results without ``speedups`` included)."""
    if bench.get("speedups"):
        return dict(bench["speedups"])
    ratios = bench.get("ratios") or {}
    if "engines" in bench:  # generating: the artifact's tokens/s over the baseline's
        return {k.removeprefix("artifact/"): v for k, v in ratios.items() if v}
    return {k.removeprefix("artifact/"): 1 / v for k, v in ratios.items() if v}


def unstable(timings: dict[str, dict]) -> list[str]:
    """A warning per candidate whose p90 is past UNSTABLE_P90 x its median."""
    return [f"{name}'s timings are unstable: p90 {t['p90_ms']:.3g} ms is "
            f"{_times(t['p90_ms'] / t['median_ms'])} its median {t['median_ms']:.3g} ms (another "
            "process was likely busy); run again on a quiet machine, or with more --runs"
            for name, t in timings.items()
            if t.get("median_ms") and t.get("p90_ms", 0) > UNSTABLE_P90 * t["median_ms"]]


def busy_machine(device: str) -> list[str]:
    """A warning when other processes held the CPU cores during a CPU bench: OpenMP code
    (eager torch, AOTInductor) waits at every barrier on a thread that lost its core, so
    a ratio against it says more about the load than about the model."""
    if device != "cpu" or not hasattr(os, "getloadavg"):
        return []
    load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    if load <= cores:
        return []
    return [f"the machine was busy (load average {load:.1f} on {cores} cores): OpenMP code "
            "such as eager torch slows far more than the rest under load, so these ratios may "
            "not hold on a quiet machine; run again when it is idle, or pin threads "
            "(OMP_NUM_THREADS) below the idle cores"]
