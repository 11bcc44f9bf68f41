"""targets/aoti/kernel_timing.py: the benchmarker swap during a cuda compile (any machine)
and the queued timing itself (GPU only)."""

from __future__ import annotations

import types

import pytest
import torch
from torch._inductor.runtime import triton_heuristics
from torch._inductor.runtime.hints import HeuristicType
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

from targets.aoti.kernel_timing import (
    flat_pointwise_untuned,
    host_independent_kernel_timing,
    queued_kernel_ms,
)
from targets.base import LowerOptions
from targets.registry import get_target


def test_swap_is_scoped_to_the_compile_and_keeps_the_benchmarkers_class():
    original = triton_heuristics.benchmarker
    with host_independent_kernel_timing() as swapped:
        assert swapped is True
        inside = triton_heuristics.benchmarker
        assert inside is not original
        assert isinstance(inside, type(original))  # the rest of its API is Inductor's own
        assert inside.timed == 0
    assert triton_heuristics.benchmarker is original


def test_swap_is_undone_when_the_compile_fails():
    original = triton_heuristics.benchmarker
    with pytest.raises(RuntimeError), host_independent_kernel_timing():
        raise RuntimeError("compile failed")
    assert triton_heuristics.benchmarker is original


def test_other_return_modes_go_to_inductors_own_timing(monkeypatch):
    original = triton_heuristics.benchmarker
    calls = []
    monkeypatch.setattr(type(original), "benchmark_gpu",
                        lambda self, fn, *a, **k: calls.append(k) or 1.5)
    with host_independent_kernel_timing():
        got = triton_heuristics.benchmarker.benchmark_gpu(lambda: None, return_mode="all")
    assert got == 1.5 and calls == [{"return_mode": "all"}]


def test_a_torch_without_the_layout_is_left_alone(monkeypatch):
    monkeypatch.delattr(triton_heuristics, "benchmarker")
    with host_independent_kernel_timing() as swapped:
        assert swapped is False
    assert not hasattr(triton_heuristics, "benchmarker")


@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_target_times_this_way_unless_deterministic(tmp_path, deterministic):
    target = get_target("cuda")
    options = LowerOptions(work_dir=tmp_path, deterministic=deterministic)
    original = triton_heuristics.benchmarker
    with target.lowering_fixes(options):
        swapped = triton_heuristics.benchmarker is not original
    assert swapped is not deterministic


def _kernel(kind: HeuristicType, **sizes: int):
    return types.SimpleNamespace(heuristic_type=kind, size_hints=sizes)


def test_only_1d_pointwise_kernels_skip_coordinate_descent(monkeypatch):
    tuned = []
    monkeypatch.setattr(CachingAutotuner, "coordinate_descent_tuning",
                        lambda self, launcher, *a, **k: tuned.append(self) or "best")
    flat = _kernel(HeuristicType.POINTWISE, x=262144)
    tiled = _kernel(HeuristicType.POINTWISE, y=256, x=4096)
    taps = _kernel(HeuristicType.PERSISTENT_REDUCTION, x=262144, r0_=16)
    with flat_pointwise_untuned() as wrapped:
        assert wrapped is True
        got = {id(k): CachingAutotuner.coordinate_descent_tuning(k, "start")
               for k in (flat, tiled, taps)}
    assert got == {id(flat): "start", id(tiled): "best", id(taps): "best"}
    assert tuned == [tiled, taps]
    CachingAutotuner.coordinate_descent_tuning(flat, "start")  # the wrapper is undone
    assert tuned[-1] is flat


@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_target_skips_flat_pointwise_tuning_unless_deterministic(tmp_path,
                                                                      deterministic):
    target = get_target("cuda")
    before = CachingAutotuner.__dict__["coordinate_descent_tuning"]
    with target.lowering_fixes(LowerOptions(work_dir=tmp_path, deterministic=deterministic)):
        wrapped = CachingAutotuner.__dict__["coordinate_descent_tuning"] is not before
    assert wrapped is not deterministic
    assert CachingAutotuner.__dict__["coordinate_descent_tuning"] is before


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_queued_timing_measures_the_kernel_not_the_host():
    big = torch.empty(64 * 1024 * 1024 // 4, device="cuda")
    small = torch.empty(1024, device="cuda")

    def slow_host(tensor):
        def call():
            sum(range(20000))  # ~0.5 ms of Python before each launch
            tensor.add_(1)
        return call

    big_ms, small_ms = queued_kernel_ms(slow_host(big)), queued_kernel_ms(slow_host(small))
    assert small_ms < 0.05  # the host's half millisecond is not in it
    assert big_ms > 2 * small_ms
