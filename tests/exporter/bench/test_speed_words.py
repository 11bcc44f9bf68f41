"""One convention for how fast an artifact ran: words (faster/slower than), the same in
the bench, the matrix and the report; noisy timings flagged; no negative residual."""

from __future__ import annotations

import os

from exporter.matrix import tables
from exporter.report.perf import _around
from exporter.report.speed import busy_machine, phrase, speedups, unstable


def test_speedups_read_as_faster_or_slower_than_the_baseline():
    assert phrase(3.2, "eager") == "3.2x faster than eager"
    assert phrase(1 / 1.4, "compile") == "1.4x slower than compile"
    assert phrase(12.4, "eager") == "12x faster than eager"


def test_plain_and_generating_bench_results_give_speedups_one_way():
    plain = {"ratios": {"artifact/eager": 0.25}}  # a latency ratio: 4x faster
    generating = {"engines": {}, "ratios": {"artifact/hf-eager": 9.5}}  # tokens/s: faster
    assert speedups(plain) == {"eager": 4.0}
    assert speedups(generating) == {"hf-eager": 9.5}


def test_a_p90_far_past_the_median_is_warned_as_unstable():
    timings = {"artifact": {"median_ms": 1.0, "p90_ms": 1.2},
               "eager": {"median_ms": 1.14, "p90_ms": 91.0}}
    (warning,) = unstable(timings)
    assert warning.startswith("eager's timings are unstable") and "80" in warning


def test_a_cpu_bench_on_a_busy_machine_says_its_ratios_may_not_hold(monkeypatch):
    """Eager torch's OpenMP threads wait on each other when other processes hold the cores
    (240 ms instead of 3 ms: "545x faster than eager"); the bench says the machine was busy."""
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 5.0, 4.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    (warning,) = busy_machine("cpu")
    assert "busy (load average 6.0 on 2 cores)" in warning and "OMP_NUM_THREADS" in warning
    assert busy_machine("cuda") == []  # GPU times are CUDA events: the CPU's load is not in them
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert busy_machine("cpu") == []


def test_partitions_slower_than_the_artifact_leave_no_negative_time():
    row = _around(total=1.0, inside=1.079)
    assert not any("-0.079" in str(cell) or "−0.079" in str(cell) for cell in row)
    assert "noise" in row[-1]


def test_the_matrix_says_the_artifact_is_faster_than_eager():
    row = {"status": "ok", "bench": {"latency_ms": 0.5, "ratios": {"artifact/eager": 0.12}}}
    _, lines = tables.cell_text(row)
    assert "0.5 ms (8.3x faster than eager)" in lines
