"""A build's warnings as the CLI prints them: a list under a warning (one line per op on
the CPU fallback: hundreds where most of a model fell back) is cut to a few lines and a
count unless --verbose (exporter/cli/build.py)."""

from __future__ import annotations

from exporter.cli.build import LISTED, shown_warnings


def _fallback_warnings(ops: int) -> list[str]:
    return ([f"{ops} op(s) run on the CPU fallback instead of 'onnx':"]
            + [f"  aten.sub.Tensor (sub_{i}): no ONNX overload" for i in range(ops)]
            + ["validation used random inputs"])


def test_a_long_list_is_cut_to_its_first_lines_and_a_count():
    shown = shown_warnings(_fallback_warnings(437), verbose=False)
    assert shown[0] == "437 op(s) run on the CPU fallback instead of 'onnx':"
    assert shown[1:1 + LISTED] == [f"  aten.sub.Tensor (sub_{i}): no ONNX overload"
                                   for i in range(LISTED)]
    assert shown[1 + LISTED].startswith(f"  ... and {437 - LISTED} more (--verbose lists")
    assert shown[2 + LISTED:] == ["validation used random inputs"]  # the next warning kept


def test_verbose_and_short_lists_print_every_line():
    assert shown_warnings(_fallback_warnings(437), verbose=True) == _fallback_warnings(437)
    short = _fallback_warnings(LISTED + 1)  # cutting would hide one line behind one line
    assert shown_warnings(short, verbose=False) == short
