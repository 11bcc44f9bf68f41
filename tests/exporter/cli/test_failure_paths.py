"""How failures surface: an optional pass that breaks is skipped and named, a required one
fails naming itself and the passes before it, a backend crash becomes a LoweringError
naming the partition's ops (so they can move to the CPU fallback), and an exception we did
not raise on purpose is exit 4 with the stage and a log file, never exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import typer

from exporter.cli.common import INTERNAL_ERROR_EXIT, guarded
from exporter.builder.lowering import _lower_delegated
from passes.base import PassFailedError, PassResult, run_pipeline
from passes.cleanup.dead_code import EliminateDeadCode
from plan.partition import PlannedPartition
from targets import LowerOptions
from targets.errors import LoweringError


class _Broken:
    name = "broken_fusion"
    required = False

    def __call__(self, program):
        raise ValueError("Cannot view a tensor with shape [1, 4] as [4, 1]")


class _BrokenRequired(_Broken):
    name = "quantize"
    required = True


def _program():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    return torch.export.export(module, (torch.randn(2, 4),))


def test_an_optional_pass_that_fails_is_skipped_and_named():
    program = _program()
    result, records = run_pipeline(program, [_Broken(), EliminateDeadCode()])
    assert result is program or records[-1]["modified"]
    assert records[0]["name"] == "broken_fusion" and not records[0]["modified"]
    assert records[0]["skipped"].startswith("ValueError: Cannot view")
    assert records[1]["name"] == "eliminate_dead_code" and "skipped" not in records[1]


def test_a_required_pass_that_fails_fails_the_build_naming_it():
    with pytest.raises(PassFailedError) as info:
        run_pipeline(_program(), [EliminateDeadCode(), _BrokenRequired()])
    assert "pass quantize failed" in str(info.value)
    assert "eliminate_dead_code" in str(info.value)  # the passes before it
    assert info.value.exit_code == 3


def test_a_pass_that_breaks_the_graph_is_caught_by_the_lint():
    class Dangling:
        name, required = "dangling", False

        def __call__(self, program):
            graph = program.graph_module.graph
            calls = [n for n in graph.nodes if n.op == "call_function"]
            with graph.inserting_before(calls[0]):  # reads a value defined after it
                graph.call_function(torch.ops.aten.relu.default, (calls[-1],))
            return PassResult(program, modified=True)
    # it edited the program in place before the check failed: the build cannot go on
    with pytest.raises(PassFailedError) as info:
        run_pipeline(_program(), [Dangling()])
    assert "pass dangling failed" in str(info.value) and "left the program broken" in str(
        info.value)


def test_a_pass_that_breaks_the_signature_is_caught_by_the_verifier():
    """The FX lint passes (the graph is well formed), torch.export's verifier does not:
    an input the graph signature does not list. Blamed on the pass, right after it."""
    class StrayInput:
        name, required = "stray_input", True

        def __call__(self, program):
            graph = program.graph_module.graph
            first = next(n for n in graph.nodes if n.op == "placeholder")
            with graph.inserting_before(first):
                graph.placeholder("stray")
            return PassResult(program, modified=True)
    with pytest.raises(PassFailedError) as info:
        run_pipeline(_program(), [EliminateDeadCode(), StrayInput()])
    assert "pass stray_input" in str(info.value) and "torch.export's checks" in str(info.value)
    assert "passes run before it: eliminate_dead_code" in str(info.value)


def test_our_own_error_inside_a_required_pass_keeps_its_class_and_names_the_pass():
    from runtime.errors import UserInputError

    class NeedsCalibration:
        name, required = "quantize", True

        def __call__(self, program):
            raise UserInputError("int8-static needs calibration data")
    with pytest.raises(UserInputError) as info:
        run_pipeline(_program(), [EliminateDeadCode(), NeedsCalibration()])
    assert info.value.exit_code == 2 and str(info.value).startswith("pass quantize: int8-static")
    assert "passes run before it: eliminate_dead_code" in str(info.value)


def test_a_backend_crash_names_the_partitions_ops():
    program = _program()
    nodes = [n for n in program.graph.nodes if n.op == "call_function"]

    class Crashing:
        name = "toy"

        def lower(self, program, options):
            raise RuntimeError("segfault-ish internal failure")

    class Prep:
        target, out, calibration = Crashing(), Path("x.artifact"), []
        options = LowerOptions(work_dir=Path("."))

    plan = PlannedPartition("p3", True, nodes, program=program)
    from exporter.settings import BuildSettings
    settings = BuildSettings(target="cpu", out="x.artifact")
    with pytest.raises(LoweringError) as info:
        _lower_delegated(Prep(), settings, plan, settings.out.parent)
    assert "partition 'p3'" in str(info.value) and "RuntimeError" in str(info.value)
    assert info.value.nodes == [n.name for n in nodes]


def test_an_unexpected_exception_is_exit_4_with_stage_and_log(capsys):
    def body():
        error = KeyError("partition_meta")
        error.exporter_stage = "stage 'lower (onnxruntime)'"
        raise error
    with pytest.raises(typer.Exit) as info:
        guarded(body)
    assert info.value.exit_code == INTERNAL_ERROR_EXIT == 4
    err = capsys.readouterr().err
    assert "internal error in stage 'lower (onnxruntime)'" in err
    assert "bug in the exporter" in err and "Traceback" not in err
    assert "--no-fuse or another --target" in err  # a build stage broke: its detours
    log = err.split("the traceback is in ")[1].split(".log")[0] + ".log"
    with open(log) as f:
        assert "KeyError: 'partition_meta'" in f.read()


def test_an_internal_error_outside_a_build_offers_no_build_flags(capsys):
    """report, matrix, inspect...: --no-fuse or --target would not help there."""
    def body():
        raise KeyError("output")
    with pytest.raises(typer.Exit):
        guarded(body)
    err = capsys.readouterr().err
    assert "internal error in the command" in err
    assert "--no-fuse" not in err and "--target" not in err


def test_an_inductor_failure_is_not_blamed_on_the_cpp_toolchain(tmp_path):
    """DeepSeek-V2 on cpu: Inductor asserted ("... is not solvable") before any C++ ran,
    and the hint sent the user to check their compiler, with a one-line log. Now the hint
    says whose limit it is and the log holds the traceback; a compiler failure keeps the
    compiler hint."""
    from targets import get_target
    target = get_target("cpu")
    options = LowerOptions(work_dir=tmp_path, log_dir=tmp_path)

    def raised(exc):
        try:
            raise exc
        except Exception as caught:  # a traceback, as a real failure has
            return caught

    inductor = target._lowering_error(raised(AssertionError("Eq(4*s21, s49) is not solvable")),
                                      options)
    assert "torch's compiler, not of your toolchain" in inductor.hint
    log = next(tmp_path.glob("exporter-cpu-*.log")).read_text()
    assert "Traceback" in log and "is not solvable" in log

    class CppCompileError(RuntimeError):
        pass
    compiler = target._lowering_error(raised(CppCompileError("g++ failed")), options)
    assert "check that a C++ compiler works" in compiler.hint
