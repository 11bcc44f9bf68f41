"""Fast unit tests of the core path's own functions (no compiles)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_flatten_with_path

from exporter.model.capture import output_names
from exporter.model.dynamic import parse_dynamic
from exporter.errors import UserInputError
from exporter.validation.gates import QuantGate, Tolerance, compare_output
from runtime.errors import InputMismatchError
from runtime.format.manifest import Dim, TensorSpec
from runtime.program.outputs import decode_tree, encode_tree
from runtime.program.torch_program import _FastCheck, check_inputs


def test_parse_dynamic_reads_bounds():
    (dim,) = parse_dynamic(["x:0=1..32"])
    assert (dim.input, dim.axis, dim.min, dim.max) == ("x", 0, 1, 32)


@pytest.mark.parametrize("text", ["x", "x:0", "x:a=1..2", "x:0=5..2", "x:0=1-32", ":0=1..2"])
def test_parse_dynamic_rejects_malformed(text):
    with pytest.raises(UserInputError, match="--dynamic"):
        parse_dynamic([text])


@pytest.mark.parametrize("tree", [
    torch.ones(1),
    (torch.ones(1), torch.ones(2)),
    {"logits": torch.ones(1), "hidden": [torch.ones(2), torch.ones(3)]},
    [torch.ones(1), {"a": (torch.ones(2),)}],
])
def test_output_tree_round_trip(tree):
    flat, spec = tree_flatten(tree)
    rebuilt = decode_tree(encode_tree(spec), flat)
    assert tree_flatten(rebuilt)[1] == spec


def test_output_names_are_readable():
    out = {"logits": 1, "hidden": (2, 3)}
    paths = [p for p, _ in tree_flatten_with_path(out)[0]]
    assert output_names(paths) == ["logits", "hidden.0", "hidden.1"]
    assert output_names([p for p, _ in tree_flatten_with_path((1, 2))[0]]) == [
        "output_0", "output_1"]
    assert output_names([()]) == ["output"]


SPECS = (TensorSpec("x", "float32", (Dim(symbol="batch", min=1, max=8), Dim(size=4))),
         TensorSpec("mask", "int64", (Dim(symbol="batch", min=1, max=8),)))


def test_check_inputs_accepts_a_good_call():
    check_inputs(SPECS, [torch.ones(3, 4), torch.ones(3, dtype=torch.int64)], where="t")


@pytest.mark.parametrize("inputs, needle", [
    ([torch.ones(3, 4, dtype=torch.float64), torch.ones(3, dtype=torch.int64)],
     "input 'x': expected dtype float32, got float64"),
    ([torch.ones(9, 4), torch.ones(9, dtype=torch.int64)], "outside the built range 1..8"),
    ([torch.ones(3, 5), torch.ones(3, dtype=torch.int64)], "input 'x' dim 1: expected 4, got 5"),
    ([torch.ones(3, 4), torch.ones(2, dtype=torch.int64)], "they must be equal"),
    ([torch.ones(3), torch.ones(3, dtype=torch.int64)], "expected rank 2"),
])
def test_check_inputs_names_the_input(inputs, needle):
    with pytest.raises(InputMismatchError) as info:
        check_inputs(SPECS, inputs, where="model.artifact")
    assert needle in str(info.value)
    assert "model.artifact" in str(info.value)


def test_text_shorter_than_the_built_minimum_is_told_to_pad_with_attention_mask_zero():
    seq = Dim(symbol="sequence", min=8, max=128)
    specs = (TensorSpec("input_ids", "int64", (Dim(size=1), seq)),
             TensorSpec("attention_mask", "int64", (Dim(size=1), seq)))
    short = torch.ones(1, 5, dtype=torch.int64)
    with pytest.raises(InputMismatchError) as info:
        check_inputs(specs, [short, short], where="bert.artifact")
    assert "padded to 8" in info.value.hint and "attention_mask 0" in info.value.hint


def test_parse_dynamic_reads_a_shared_dim_by_name():
    (dim,) = parse_dynamic(["batch=1..8"])
    assert (dim.input, dim.axis, dim.min, dim.max) == ("batch", None, 1, 8)


def test_fast_check_agrees_with_the_full_check_after_a_good_call():
    """The hot-path check remembers the shapes that passed; a bad call after a good one
    must still be caught (None), whatever it gets wrong."""
    check = _FastCheck(SPECS).check
    good = [torch.ones(3, 4), torch.ones(3, dtype=torch.int64)]
    assert check(good) is True and check(good) is True  # second call: the memo
    bad_calls = [
        [torch.ones(3, 4, dtype=torch.float64), torch.ones(3, dtype=torch.int64)],
        [torch.ones(9, 4), torch.ones(9, dtype=torch.int64)],
        [torch.ones(3, 4), torch.ones(2, dtype=torch.int64)],
        [torch.ones(3), torch.ones(3, dtype=torch.int64)],
        [torch.ones(3, 4), "not a tensor"],
        [torch.ones(3, 4, device="meta"), torch.ones(3, dtype=torch.int64)],
    ]
    for bad in bad_calls:
        assert check(bad) is None, bad
        assert check(good) is True
        with pytest.raises(InputMismatchError):
            check_inputs(SPECS, bad, where="t")
    # Counts are Program._order_inputs's to explain.
    assert check([torch.ones(3, 4)]) is None
    assert check(good + [torch.ones(3)]) is None


def test_compare_output_judges_against_eager_error():
    ref = torch.linspace(-1, 1, 100, dtype=torch.float64)
    eager = (ref + 1e-7).float()
    tol = Tolerance(10.0, 1e-9)
    assert compare_output((ref + 5e-7).float(), ref, eager, tol)["passed"]
    assert not compare_output((ref + 1e-4).float(), ref, eager, tol)["passed"]


def test_compare_output_integers_exact_and_nan_positions():
    ints = torch.arange(5)
    assert compare_output(ints, ints, ints, Tolerance())["passed"]
    assert compare_output(ints + 1, ints, ints, Tolerance())["mismatches"] == 5
    x = torch.tensor([1.0, float("nan")])
    moved = torch.tensor([float("nan"), 1.0])
    row = compare_output(moved, x.double(), x, Tolerance())
    assert not row["passed"] and not row["nan_inf_positions_match"]


class _CannedRun:
    """Stands in for the artifact's subprocess: the outputs are the test's."""
    results_by_case: ClassVar[dict] = {}  # the test sets it

    def __init__(self, artifact, cases, *, preload=(), timeout=900, command=None) -> None:
        self.memory: dict = {}

    def results(self) -> dict:
        return self.results_by_case

    def close(self) -> None:
        pass


class _HandEager:
    """Eager float32 is 0.25 off the float64 reference in its first element."""
    def __init__(self) -> None:
        self.float64_runs = 0

    def run(self, inputs, *, float64=False):
        if float64:
            self.float64_runs += 1
            return [torch.tensor([1.0, -2.0, 0.5, 4.0], dtype=torch.float64), torch.arange(3)]
        return [torch.tensor([1.25, -2.0, 0.5, 4.0]), torch.arange(3)]


def test_validate_judges_through_either_gate(monkeypatch):
    """One artifact output (2.0 off float64, 1.75 off eager float32) through validate():
    within the float tolerance (10 x 0.25 + 1e-6 x 4), short of the quantized gate."""
    import exporter.validation.validate as validation
    from exporter.validation.inputs import Case
    monkeypatch.setattr(validation, "ArtifactRun", _CannedRun)
    monkeypatch.setattr(_CannedRun, "results_by_case", {
        "example": {"y": torch.tensor([3.0, -2.0, 0.5, 4.0]), "ids": torch.arange(3)}})
    signature = SimpleNamespace(outputs=[SimpleNamespace(name="y"), SimpleNamespace(name="ids")])
    cases = [Case("example", "example", {"x": torch.ones(1)})]

    eager = _HandEager()
    record = validation.validate("a", eager, signature, cases, gate=Tolerance.for_dtype("fp32"))
    y, ids = record["outputs"]
    assert record["passed"] and eager.float64_runs == 1
    assert record["reference_dtype"] == "float64" and record["policy"].startswith("float outputs")
    assert y["criterion"] == "relative-to-eager" and y["max_abs_err"] == 2.0
    assert y["eager_max_abs_err"] == 0.25 and y["allowed"] == pytest.approx(2.500004)
    assert y["abs_err_histogram"]["0"] == 3 and y["abs_err_histogram"][">=1"] == 1
    assert ids == {"case": "example", "output": "ids", "passed": True, "criterion": "exact",
                   "mismatches": 0}

    eager = _HandEager()
    gate = QuantGate(20.0, 0.99, "int8-dynamic")
    record = validation.validate("a", eager, signature, cases, gate=gate)
    y, ids = record["outputs"]
    assert not record["passed"] and eager.float64_runs == 0  # no float64 copy for a quant gate
    assert record["reference_dtype"] == "float32" and record["policy"].startswith("quantized")
    signal, noise = (1.25**2 + 4 + 0.25 + 16) / 4, 1.75**2 / 4
    assert y["criterion"] == "quantized" and not y["passed"]
    assert y["sqnr_db"] == pytest.approx(10 * math.log10(signal / noise))
    assert y["cosine"] == pytest.approx(24 / math.sqrt(29.25 * 21.8125))
    assert ids["passed"] and ids["criterion"] == "exact"
    assert validation.summarize_failure(record)[0].startswith("example / y: SQNR 8.5 dB")
    assert gate.failure() == ("the int8-dynamic artifact misses the accuracy gate against "
                              "eager float32") and not gate.bisects and Tolerance().bisects


class _NoFloat64Eager(_HandEager):
    def run(self, inputs, *, float64=False):
        if float64:
            raise RuntimeError("value cannot be converted to type float without overflow")
        return super().run(inputs)


def test_without_a_float64_reference_float32_is_judged_with_the_bisect_floor(monkeypatch):
    """A model that cannot run at float64 (XGLM) is judged against eager float32, whose
    own error is then 0: the floor must hold two float32 runs' rounding apart (1e-6
    failed an onnx XGLM whose tokens were identical), and the record says so."""
    import exporter.validation.validate as validation
    from exporter.lm.gate import EagerLogits
    from exporter.validation.inputs import Case
    monkeypatch.setattr(validation, "ArtifactRun", _CannedRun)
    signature = SimpleNamespace(outputs=[SimpleNamespace(name="y"), SimpleNamespace(name="ids")])
    cases = [Case("example", "example", {"x": torch.ones(1)})]
    for off, passed in ((2e-4, True), (1e-3, False)):  # 4 x 1e-4 allowed
        monkeypatch.setattr(_CannedRun, "results_by_case", {"example": {
            "y": torch.tensor([1.25 + off, -2.0, 0.5, 4.0]), "ids": torch.arange(3)}})
        record = validation.validate("a", _NoFloat64Eager(), signature, cases,
                                     gate=Tolerance.for_dtype("fp32"))
        assert record["passed"] is passed and record["reference_dtype"] == "float32"
        assert record["outputs"][0]["allowed"] == pytest.approx(4e-4)
        assert "used float32, with a floor of 0.0001" in record["reference_note"]
    assert Tolerance.for_dtype("fp16").without_float64().floor == 1e-3  # looser already

    class LM(torch.nn.Module):  # a causal LM whose float64 forward raises, as XGLM's
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(8, 3)

        def forward(self, input_ids):
            if self.table.weight.dtype == torch.float64:
                raise RuntimeError("value cannot be converted to type float without overflow")
            return SimpleNamespace(logits=self.table(input_ids))
    eager = EagerLogits(LM())
    got = eager.at([1, 2, 3], 1, 2, float64=True)
    assert got.dtype == torch.float32 and torch.equal(got, eager.at([1, 2, 3], 1, 2))
    assert eager.note.startswith("float64 reference failed (RuntimeError: value cannot")


def test_a_torch_without_cpp_march_builds_for_this_host(monkeypatch):
    """torch 2.11's Inductor has no cpp.march (patching it raised, so every cpu build
    failed there) and compiles with -march=native: the build then leaves the setting out
    and the library requires this host's own CPU flags."""
    import platform

    from runtime.host.hostinfo import cpu_flags
    from targets import cpu_isa
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86-64 levels apply on x86-64 hosts")
    level = cpu_isa.X86_LEVELS["avx2"]
    assert cpu_isa.inductor_configs(level)["cpp.march"] == "x86-64-v3"  # this torch has it
    monkeypatch.setattr(cpu_isa, "_inductor_takes_march", lambda: False)
    monkeypatch.setattr(cpu_isa, "_compiler_takes_every_isa", lambda: False)
    assert cpu_isa.inductor_configs(level) == {"cpp.simdlen": 256}
    name, flags = cpu_isa.required_flags(level)
    assert flags == tuple(sorted(cpu_flags() or ()))
    assert name == platform.machine()  # the host's own ISA: -march=native


@pytest.mark.parametrize("line, knows", [
    ("g++ (Debian 12.2.0-14+deb12u1) 12.2.0", True),
    ("g++ (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", False),  # no AVX512-FP16 flag
    ("Debian clang version 14.0.6", True), ("clang version 13.0.1", False),
    ("icpx (ICX) 2024.0.0", False)])
def test_isa_probes_are_skipped_only_with_a_compiler_that_takes_every_isa(line, knows):
    """Inductor's compile-and-run probe of each vector ISA is skipped (the ISA comes from
    /proc/cpuinfo) only where the compiler knows every ISA's flags."""
    from targets import cpu_isa
    assert cpu_isa.knows_every_isa(line) is knows


def test_a_validation_process_that_raised_is_quoted_by_its_exception_not_its_frames():
    """An exception in the validation process (exit 1: ONNX Runtime refusing a head size)
    was quoted as traceback frames, under a hint about compilers and ABIs."""
    from exporter.validation.crash import crash_error as _crash_error
    stderr = ("Traceback (most recent call last):\n"
              '  File "/x/runtime/executors/ort_binding.py", line 111, in run_rebound\n'
              "    return run_view(state, choose_mode=new_shapes)\n"
              "           ^^^^^^^^^^^^^^^^^^^^\n"
              "RuntimeError: Error in execution: head_size must be a multiple of 8\n")
    error = _crash_error(1, "", stderr, Path("model.artifact"))
    assert error.what.endswith("it said: RuntimeError: Error in execution: head_size must be "
                               "a multiple of 8") and error.details == []
    assert "raised that error" in error.hint and "ABI" not in error.hint
    assert "ABI" in _crash_error(-11, "", "", Path("model.artifact")).hint  # a crash
