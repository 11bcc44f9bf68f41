"""The cpu target keeps, per partition, the fastest backend that builds and runs right
(targets/aoti/choice.py), records why and every candidate's figures, and builds only the
one a user pins. The suite pins aoti (tests/conftest.py); these tests ask for auto or a
pin themselves. Unit tests use stand-in lowerings and figures; the builds are real."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import exporter
import runtime
from exporter.errors import UserInputError
from exporter.settings import BuildSettings, settings_from
from targets.aoti import choice, timing
from targets.aoti.card import CPU_BACKEND_ENV, CPU_BACKENDS, CpuOptions
from targets.base import Lowered, LowerOptions, base_requirements
from targets.errors import LoweringError, TargetOptionError

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def _stand_in(name: str, calls: list[str], fail: Exception | None = None):
    """A lowering that writes one file, or raises ``fail``."""
    def lower(program, options: LowerOptions) -> Lowered:
        calls.append(name)
        if fail is not None:
            raise fail
        options.work_dir.mkdir(parents=True, exist_ok=True)
        path = options.work_dir / f"{name}.bin"
        path.write_bytes(name.encode())
        return Lowered(files={path.name: path}, meta={"made_by": name},
                       requirements=base_requirements())
    return lower


def _figures(**medians: float):
    def time_candidates(candidates, program, folder):
        assert set(candidates) == set(medians), "every backend that built is timed"
        return {"threads": 2, "candidates": {
            name: {"median_ms": ms, "p10_ms": ms * 0.9, "calls": 7}
            for name, ms in medians.items()}}
    return time_candidates


def _options(tmp_path, **own) -> LowerOptions:
    return LowerOptions(work_dir=tmp_path, target=CpuOptions(**own))


def test_the_faster_backend_is_kept_and_every_candidates_figures_recorded(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(timing, "time_candidates", _figures(aoti=9.0, onnx=3.0))
    calls: list[str] = []
    low = choice.lower_chosen(None, _options(tmp_path, cpu_backend="auto"),
                              {"aoti": _stand_in("aoti", calls),
                               "onnx": _stand_in("onnx", calls)})
    assert calls == ["onnx", "aoti"], "the cheaper export first"
    assert low.backend == "onnxruntime" and low.meta == {"made_by": "onnx"}
    record = low.choice
    assert (record["chosen"], record["by"], record["threads"]) == ("onnx", "measured", 2)
    assert record["candidates"]["aoti"]["median_ms"] == 9.0
    assert record["candidates"]["onnx"]["median_ms"] == 3.0
    assert record["candidates"]["aoti"]["backend"] == "aoti"
    assert not (tmp_path / "aoti").exists(), "the slower backend's files are not kept"


def test_a_backend_faster_in_every_round_is_kept_though_a_slow_spell_fell_on_its_turns(
        tmp_path, monkeypatch):
    """Round by round aoti runs at 0.9 of onnx, but the machine's slow minutes fell on
    more of its turns: its median of all calls is the higher, its share of the rounds
    the lower, and the share decides."""
    aoti = [9.0, 9.0, 18.0, 18.0, 18.0]
    onnx = [10.0, 10.0, 10.0, 20.0, 20.0]
    shares = timing.round_shares({"aoti": aoti, "onnx": onnx})
    assert shares["aoti"] == pytest.approx(0.9 ** 0.5) and shares["onnx"] > 1.0

    def time_candidates(candidates, program, folder):
        return {"threads": 2, "candidates": {
            "aoti": {"median_ms": 18.0, "round_share": shares["aoti"]},
            "onnx": {"median_ms": 10.0, "round_share": shares["onnx"]}}}
    monkeypatch.setattr(timing, "time_candidates", time_candidates)
    low = choice.lower_chosen(None, _options(tmp_path, cpu_backend="auto"),
                              {"aoti": _stand_in("aoti", []), "onnx": _stand_in("onnx", [])})
    assert low.choice["chosen"] == "aoti"
    assert low.choice["candidates"]["aoti"]["round_share"] == shares["aoti"]
    assert timing.round_shares({"aoti": aoti}) == {}, "no share of one candidate alone"


def _counted(macs: int, calls: list[str]):
    """The aoti stand-in, recording its float32 linears' multiply-adds as the real one."""
    lower = _stand_in("aoti", calls)
    return lambda program, options: dataclasses.replace(
        lower(program, options), choice={"float32_linear_macs": macs})


def test_inductors_packed_linears_are_a_third_candidate_where_the_linears_are_worth_it(
        tmp_path, monkeypatch):
    packed = choice.PACKED
    monkeypatch.setattr(timing, "time_candidates", _figures(
        **{"aoti": 9.0, "onnx": 8.0, packed: 7.0}))
    calls: list[str] = []
    low = choice.lower_chosen(None, _options(tmp_path / "big", cpu_backend="auto"),
                              {"aoti": _counted(choice.PACKED_MIN_MACS, calls),
                               packed: _stand_in(packed, calls),
                               "onnx": _stand_in("onnx", calls)})
    assert calls == ["onnx", "aoti", packed]
    assert (low.choice["chosen"], low.backend, low.meta) == (packed, "aoti",
                                                             {"made_by": packed})
    assert low.choice["candidates"]["aoti"]["float32_linear_macs"] == choice.PACKED_MIN_MACS
    assert "not_built" not in low.choice

    monkeypatch.setattr(timing, "time_candidates", _figures(aoti=9.0, onnx=8.0))
    calls.clear()
    low = choice.lower_chosen(None, _options(tmp_path / "small", cpu_backend="auto"),
                              {"aoti": _counted(choice.PACKED_MIN_MACS - 1, calls),
                               packed: _stand_in(packed, calls),
                               "onnx": _stand_in("onnx", calls)})
    assert calls == ["onnx", "aoti"] and low.choice["chosen"] == "onnx"
    assert "multiply-adds a call" in low.choice["not_built"][packed]
    assert packed not in low.choice["candidates"]  # not a line of the build's report


def test_inductors_packed_linears_are_no_candidate_of_a_build_the_choice_does_not_time(
        tmp_path):
    calls: list[str] = []
    options = LowerOptions(work_dir=tmp_path, target=CpuOptions(cpu_backend="auto"),
                           dtype="bf16")
    low = choice.lower_chosen(None, options, {"aoti": _counted(10**12, calls),
                                              choice.PACKED: _stand_in(choice.PACKED, calls),
                                              "onnx": _stand_in("onnx", calls)})
    assert calls == ["aoti"] and "bf16" in low.choice["not_built"][choice.PACKED]


def test_a_candidate_that_fails_to_build_is_dropped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "time_candidates", _figures())  # asserts it is not needed
    calls: list[str] = []
    broken = LoweringError("AOTInductor failed to compile the program", movable=False)
    low = choice.lower_chosen(None, _options(tmp_path, cpu_backend="auto"),
                              {"aoti": _stand_in("aoti", calls, broken),
                               "onnx": _stand_in("onnx", calls)})
    assert low.choice["chosen"] == "onnx"
    assert low.choice["by"] == "the only backend that built"
    assert "failed to build" in low.choice["candidates"]["aoti"]["dropped"]
    assert "AOTInductor failed to compile" in low.choice["candidates"]["aoti"]["dropped"]


def test_when_no_backend_builds_the_aoti_error_is_the_builds(tmp_path):
    calls: list[str] = []
    own = LoweringError("AOTInductor failed", movable=False)
    with pytest.raises(LoweringError) as info:
        choice.lower_chosen(None, _options(tmp_path, cpu_backend="auto"),
                            {"aoti": _stand_in("aoti", calls, own),
                             "onnx": _stand_in("onnx", calls, LoweringError("no export"))})
    assert info.value is own


@pytest.mark.parametrize("pin", CPU_BACKENDS)
def test_a_pinned_backend_is_the_only_one_built_and_its_failure_is_the_error(tmp_path, pin):
    other = "onnx" if pin != "onnx" else "aoti"
    calls: list[str] = []
    low = choice.lower_chosen(None, _options(tmp_path / "ok", cpu_backend=pin),
                              {pin: _stand_in(pin, calls), other: _stand_in(other, calls)})
    assert calls == [pin] and low.choice == {
        "chosen": pin, "backend": choice.EXECUTOR[pin], "by": f"--cpu-backend {pin}"}
    failure = LoweringError(f"{pin} failed")
    with pytest.raises(LoweringError) as info:
        choice.lower_chosen(None, _options(tmp_path / "bad", cpu_backend=pin),
                            {pin: _stand_in(pin, [], failure), other: _stand_in(other, [])})
    assert info.value is failure


def test_the_environment_pins_the_backend_where_no_option_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv(CPU_BACKEND_ENV, "onnx")
    calls: list[str] = []
    low = choice.lower_chosen(None, _options(tmp_path),
                              {"aoti": _stand_in("aoti", calls),
                               "onnx": _stand_in("onnx", calls)})
    assert calls == ["onnx"] and low.choice["by"] == f"{CPU_BACKEND_ENV}=onnx"


def test_a_bad_backend_in_the_environment_is_refused_with_the_settings(monkeypatch):
    monkeypatch.setenv(CPU_BACKEND_ENV, "tvm")
    with pytest.raises(UserInputError) as info:
        settings_from({"target": "cpu"})
    assert CPU_BACKEND_ENV in str(info.value) and "aoti" in str(info.value)


def test_pinning_onnx_in_a_quantized_cpu_build_is_refused_before_any_work():
    with pytest.raises(ValueError, match="--cpu-backend onnx"):
        BuildSettings(target="cpu", cpu_backend="onnx", quantize="int8-dynamic")


def test_only_aoti_is_offered_where_onnx_cannot_run_the_build(tmp_path):
    calls: list[str] = []
    options = LowerOptions(work_dir=tmp_path, target=CpuOptions(cpu_backend="auto"),
                           dtype="bf16")
    low = choice.lower_chosen(None, options, {"aoti": _stand_in("aoti", calls),
                                              "onnx": _stand_in("onnx", calls)})
    assert calls == ["aoti"]
    assert "bf16" in low.choice["candidates"]["onnx"]["dropped"]
    with pytest.raises(TargetOptionError, match="bf16"):
        choice.lower_chosen(None, LowerOptions(work_dir=tmp_path, dtype="bf16",
                                               target=CpuOptions(cpu_backend="onnx")),
                            {"aoti": _stand_in("aoti", []), "onnx": _stand_in("onnx", [])})


def _linear_program(seed: int):
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                 torch.nn.Linear(32, 4)).eval()
    return torch.export.export(module, (torch.randn(2, 16),))


def test_the_timing_process_times_what_runs_right_and_drops_what_runs_wrong(tmp_path):
    """Real ONNX Runtime lowerings timed by the child process; one made from other
    weights gives other outputs and is dropped, untimed."""
    program = _linear_program(0)
    right = choice.lower_as_onnx(program, _options(tmp_path / "right"))
    wrong = choice.lower_as_onnx(_linear_program(1), _options(tmp_path / "wrong"))
    found = timing.time_candidates({"onnx": ("onnxruntime", right),
                                    "aoti": ("onnxruntime", wrong)}, program,
                                   tmp_path / "timing")
    assert found["threads"] >= 1
    assert found["candidates"]["onnx"]["median_ms"] > 0
    assert found["candidates"]["onnx"]["calls"] >= timing.ROUNDS
    assert len(found["candidates"]["onnx"]["turn_ms"]) == timing.ROUNDS
    assert "round_share" not in found["candidates"]["onnx"], "timed alone: no share"
    assert found["candidates"]["aoti"]["dropped"].startswith("failed validation: output 0")


class _PoolsOnOneCore:
    """Stand-in candidates that share the cores: a call right after another candidate's
    costs ``SWITCH_S`` more (that one's thread pool still holds them), and each one's
    first call ``FIRST_S`` more (lazy set-up)."""
    SWITCH_S, FIRST_S = 0.010, 0.100

    def __init__(self, **steady_s: float) -> None:
        self.last = None
        self.runs = {name: self._run(name, s) for name, s in steady_s.items()}

    def _run(self, name: str, steady_s: float):
        first = [True]

        def run(inputs):
            import time
            time.sleep(steady_s + self.FIRST_S * first[0]
                       + self.SWITCH_S * (self.last not in (None, name)))
            first[0], self.last = False, name
        return run


def test_the_choice_times_each_turn_after_an_untimed_call_so_a_switch_costs_neither(
        monkeypatch):
    """A slow first call must not shrink a candidate's turns to one call each, every one
    of them paying for the previous candidate's pool: the medians are the steady calls."""
    monkeypatch.setattr(timing, "ROUND_S", 0.02)
    pools = _PoolsOnOneCore(aoti=0.002, onnx=0.001)
    turns = timing.interleaved(pools.runs, [])
    times = {name: [t for turn in done for t in turn] for name, done in turns.items()}
    for name, steady_s in (("aoti", 0.002), ("onnx", 0.001)):
        assert len(turns[name]) == timing.ROUNDS
        assert len(times[name]) >= timing.ROUNDS * timing.TURN_CALLS
        median = sorted(times[name])[len(times[name]) // 2]
        assert median < steady_s + pools.SWITCH_S / 2, (name, median)


def test_a_cpu_artifact_keeps_onnx_when_aoti_fails_and_loads_fresh_matching_eager(
        tmp_path, monkeypatch, cli_here):
    """AOTInductor failing on the model: the build goes on with ONNX Runtime alone, says
    why, and its artifact (an onnxruntime partition in a cpu artifact) passes validation
    in its own process and matches eager here; `exporter inspect` says so in one line."""
    from targets.aoti.base import AOTInductorTarget

    def broken(self, program, options):
        raise LoweringError("AOTInductor failed to compile the program for 'cpu' (stand-in)",
                            movable=False)
    monkeypatch.setattr(AOTInductorTarget, "lower", broken)
    out = tmp_path / "mlp.artifact"
    result = exporter.build("zoo:mlp", target="cpu", cpu_backend="auto", out=out)
    (partition,) = result.manifest.partitions
    assert partition.backend == "onnxruntime"
    record = result.manifest.build["backend_choice"][partition.name]
    assert record["chosen"] == "onnx" and "stand-in" in record["candidates"]["aoti"]["dropped"]
    assert result.manifest.validation["passed"] is True
    assert {row["backend"] for row in result.manifest.coverage} == {"onnxruntime"}
    from tests.helpers import assert_zoo_artifact_matches_eager
    assert_zoo_artifact_matches_eager(out, "mlp")
    shown = cli_here("inspect", str(out))
    assert f"backend of partition {partition.name}: onnx (the only backend that built)" \
        in shown.stdout


@pytest.mark.slow
def test_an_auto_build_times_both_backends_and_keeps_the_faster(tmp_path):
    result = exporter.build("zoo:cnn", target="cpu", cpu_backend="auto",
                            out=tmp_path / "cnn.artifact")
    (partition,) = result.manifest.partitions
    record = result.manifest.build["backend_choice"][partition.name]
    shares = {name: c["round_share"] for name, c in record["candidates"].items()}
    assert set(shares) == {"aoti", "onnx"} and record["by"] == "measured"
    assert choice.PACKED in record["not_built"]  # zoo:cnn's linears: far under the bar
    assert record["chosen"] == min(shares, key=shares.get)
    assert partition.backend == choice.EXECUTOR[record["chosen"]]
    assert result.manifest.validation["passed"] is True
    program = runtime.load(result.artifact)
    assert program is not None


class _WideLinear(torch.nn.Module):
    """One float32 linear of 128 x 1024 x 1024 multiply-adds: over choice.PACKED_MIN_MACS."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1024, 1024)

    def forward(self, x):
        return torch.relu(self.linear(x))


@pytest.mark.slow
def test_an_auto_build_of_wide_linears_times_inductors_packing_too(tmp_path):
    from tests.targets.aoti.test_linear_packing import _libraries

    model = _WideLinear().eval()
    result = exporter.build(model, (torch.randn(128, 1024),), target="cpu",
                            cpu_backend="auto", out=tmp_path / "wide.artifact")
    (partition,) = result.manifest.partitions
    record = result.manifest.build["backend_choice"][partition.name]
    shares = {name: c["round_share"] for name, c in record["candidates"].items()}
    assert set(shares) == {"aoti", choice.PACKED, "onnx"}
    assert record["candidates"]["aoti"]["float32_linear_macs"] == 128 * 1024 * 1024
    assert record["chosen"] == min(shares, key=shares.get)
    if record["chosen"] != "onnx":  # the kept library calls the GEMM its name says
        library = _libraries(result.artifact)
        assert (b"_linear_pointwise" in library) == (record["chosen"] == choice.PACKED)
    assert "constants_as_loaded" not in partition.meta, "read from the aligned copies"
    program = runtime.load(result.artifact)
    x = torch.randn(128, 1024)
    torch.testing.assert_close(program(x), model(x), rtol=1e-4, atol=1e-4)
