"""A failed validation's summary line says only what is true of the output: the
comparison that holds, and how many NaN/Inf each side has (exporter/validation/gates.py)."""

from __future__ import annotations

import torch

from exporter.validation.bisect import _describe, _difference
from exporter.validation.gates import Tolerance, compare_output
from exporter.validation.validate import summarize_failure

NAN, INF = float("nan"), float("inf")


def _line(got: torch.Tensor, eager: torch.Tensor) -> str:
    row = compare_output(got, eager.double(), eager, Tolerance(10.0, 1e-6))
    (line,) = summarize_failure({"outputs": [{"case": "example", "output": "y", **row}]})
    return line


def test_nan_where_eager_has_none_is_counted_and_a_small_error_is_not_called_too_big():
    eager = torch.ones(8)
    got = eager.clone()
    got[:3] = NAN
    line = _line(got, eager)
    assert "max abs error 0 <= allowed" in line and "over the elements finite in both" in line
    assert line.endswith("NaN/Inf positions differ: the artifact has 3, eager 0")


def test_a_wrong_output_without_nan_says_there_is_none_on_either_side():
    eager = torch.ones(8)
    line = _line(eager + 0.25, eager)
    assert "max abs error 0.25 > allowed" in line and line.endswith("no NaN/Inf in either")
    assert "finite in both" not in line


def test_shared_infinities_are_said_to_match_with_their_count():
    eager = torch.tensor([INF, -INF, 1.0, 2.0])
    line = _line(eager + torch.tensor([0.0, 0.0, 0.5, 0.0]), eager)
    assert line.endswith("NaN/Inf at the same 2 position(s) as eager")


def test_the_bisect_line_counts_the_partitions_nan_too():
    want = torch.ones(4)
    got = torch.tensor([NAN, 1.0, 1.0, 1.0])
    text = _describe(_difference("output", got, want, 1e-4))
    assert text.endswith("NaN/Inf positions differ: the artifact has 1, eager 0")
