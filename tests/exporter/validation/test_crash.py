"""A validation process that dies is reported by what it printed last and the stage it died
in, never by its exit status alone (exporter/validation/crash.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import exporter
from exporter.errors import BuildError
from exporter.validation.crash import crash_error

pytest.importorskip("onnxruntime")


def test_a_validation_process_that_exits_1_says_its_last_line_and_stage(tmp_path):
    out = tmp_path / "exits.artifact"
    with pytest.raises(BuildError) as caught:
        exporter.build("tests/models/crashing_op.py:exits_factory", target="onnx", out=out,
                       fallback="allow")
    what = caught.value.what
    assert "exited with status 1" in what
    assert "device lost while running exit_in_runtime" in what  # its last words
    assert "while running the first (warm-up) run" in what  # the stage it died in
    assert not out.exists()


def test_a_signal_names_the_python_frame_it_stopped_and_the_stage():
    stderr = ("warning: something earlier\n"
              "Fatal Python error: Segmentation fault\n\n"
              "Current thread 0x00007f3a (most recent call first):\n"
              '  File "/opt/x/runtime/executors/tvm_exec.py", line 88 in __call__\n'
              '  File "/opt/x/runtime/program/torch_program.py", line 140 in run\n'
              "\nExtension modules: numpy.core (total: 3)\n")
    error = crash_error(-11, "", stderr, Path("m.artifact"), "running case 'max'")
    assert error.what.endswith("it was killed by SIGSEGV; it said: Fatal Python error: "
                               "Segmentation fault in __call__ (runtime/executors/tvm_exec.py:88)")
    assert "while running case 'max'" in error.what
    assert error.details == ["warning: something earlier"]
    assert "compiled code failing on these inputs" in error.hint  # not the load-time ABI hint


def test_the_childs_own_error_paragraph_is_quoted_by_its_first_line_not_its_try():
    stderr = ("error: ONNX Runtime refused the partition. Where: p0.\n"
              "  - node Concat_3: ranks differ\nTry: another --target\n")
    error = crash_error(2, "", stderr, Path("m.artifact"), "loading the artifact")
    assert "it said: ONNX Runtime refused the partition. Where: p0." in error.what
    assert error.details == ["Try: another --target"]


def test_a_silent_death_says_it_printed_nothing_and_long_lines_are_cut():
    silent = crash_error(1, "", "", Path("m.artifact"), None)
    assert "it printed nothing" in silent.what and "no stage recorded" in silent.what
    noisy = crash_error(1, "", "RuntimeError: " + "x" * 5000 + "\n", Path("m.artifact"), "x")
    assert len(noisy.what) < 500 and noisy.what.endswith("...")
