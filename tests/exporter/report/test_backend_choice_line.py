"""The build report and `exporter inspect` say each partition's chosen backend, why, and
every candidate's figure in one line (exporter/report/backend_choice.py), and a hostile
manifest's record of another shape prints what fits, never raises."""

from __future__ import annotations

from exporter.report.backend_choice import choice_lines


def test_a_measured_choice_is_one_line_with_every_candidates_figure():
    build = {"backend_choice": {"p0": {
        "chosen": "onnx", "backend": "onnxruntime", "by": "measured", "threads": 2,
        "candidates": {"onnx": {"median_ms": 120.94, "build_s": 9.1},
                       "aoti": {"median_ms": 450.56, "build_s": 51.0}}}}}
    assert choice_lines(build) == [
        "backend of partition p0: onnx (measured at 2 threads): onnx 120.9 ms, aoti 450.6 ms"]


def test_the_kept_backend_comes_first_whatever_the_records_order():
    """The manifest on disk has sorted keys (aoti before onnx): `exporter inspect` said
    'aoti 0.148 ms, onnx 0.021 ms' where the build had said onnx first."""
    build = {"backend_choice": {"p0": {
        "chosen": "onnx", "by": "measured", "threads": 2,
        "candidates": {"aoti": {"median_ms": 0.148}, "onnx": {"median_ms": 0.021}}}}}
    assert choice_lines(build) == [
        "backend of partition p0: onnx (measured at 2 threads): onnx 0.021 ms, aoti 0.148 ms"]


def test_stalled_timing_rounds_left_out_are_counted():
    build = {"backend_choice": {"p0": {
        "chosen": "onnx", "by": "measured", "threads": 2,
        "candidates": {"onnx": {"median_ms": 0.021, "stalled_rounds": [0, 3]},
                       "aoti": {"median_ms": 0.148, "stalled_rounds": [0, 3]}}}}}
    assert choice_lines(build) == [
        "backend of partition p0: onnx (measured at 2 threads): onnx 0.021 ms, aoti 0.148 ms;"
        " 2 stalled timing round(s) left out"]


def test_a_pin_and_a_dropped_candidate_are_said():
    build = {"backend_choice": {
        "p0": {"chosen": "aoti", "by": "--cpu-backend aoti"},
        "p2": {"chosen": "onnx", "by": "the only backend that built",
               "candidates": {"aoti": {"dropped": "failed to build: LoweringError: x"}}}}}
    assert choice_lines(build) == [
        "backend of partition p0: aoti (--cpu-backend aoti)",
        "backend of partition p2: onnx (the only backend that built): aoti dropped "
        "(failed to build: LoweringError: x)"]


def test_a_record_of_another_shape_prints_what_fits_and_never_raises():
    assert choice_lines(None) == [] and choice_lines({"backend_choice": [1]}) == []
    hostile = {"backend_choice": {"p0": {"candidates": ["x"], "threads": "many"},
                                  "p1": "text", "p2": {"candidates": {
                                      "a": {"median_ms": True}, "b": {"median_ms": "9"},
                                      "c": 7}}}}
    assert choice_lines(hostile) == ["backend of partition p0: None (not said)",
                                     "backend of partition p2: None (not said)"]
