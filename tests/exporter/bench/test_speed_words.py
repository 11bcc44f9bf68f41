"""One convention for how fast an artifact ran: words (faster/slower than), the same in
the bench, the matrix and the report; noisy timings flagged; no negative residual."""

from __future__ import annotations

from exporter.matrix import tables
from exporter.report.perf import _around
from exporter.report.speed import phrase, speedups, unstable


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


def test_partitions_slower_than_the_artifact_leave_no_negative_time():
    row = _around(total=1.0, inside=1.079)
    assert not any("-0.079" in str(cell) or "−0.079" in str(cell) for cell in row)
    assert "noise" in row[-1]


def test_the_matrix_says_the_artifact_is_faster_than_eager():
    row = {"status": "ok", "bench": {"latency_ms": 0.5, "ratios": {"artifact/eager": 0.12}}}
    _, lines = tables.cell_text(row)
    assert "0.5 ms (8.3x faster than eager)" in lines
