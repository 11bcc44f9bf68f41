"""targets/aoti/tuning_warmup.py: coordinate-descent candidates compiled ahead in the
compile workers, read without a GPU (the tuner, the swap, the worker's job)."""

from __future__ import annotations

import os
import types

import pytest
from torch._inductor import codecache
from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

from targets.aoti import tuning_warmup


def _config(xblock: int, warps: int):
    return types.SimpleNamespace(kwargs={"XBLOCK": xblock}, num_warps=warps, num_stages=1)


def test_first_sweep_is_one_step_each_way_per_field_within_limits():
    tuner = CoordescTuner(size_hints={"x": 128},
                          inductor_meta={"warp_size": 32, "max_threads_per_block": 1024})
    got = [(c.kwargs["XBLOCK"], c.num_warps) for c in
           tuning_warmup.first_sweep(tuner, _config(128, 4))]
    # XBLOCK 256 is past the size hint; warps one step each way; the start is not repeated
    assert got == [(64, 4), (128, 8), (128, 2)]


def test_warming_runs_before_inductors_tuning_and_never_stops_it(monkeypatch):
    order = []
    monkeypatch.setattr(CachingAutotuner, "coordinate_descent_tuning",
                        lambda self, launcher, *a, **k: order.append("tune") or "best")
    monkeypatch.setattr(tuning_warmup, "WARM", True)
    launcher = types.SimpleNamespace(config=_config(64, 4))
    with tuning_warmup.warmed_neighbours() as on:
        assert on is True
        monkeypatch.setattr(tuning_warmup, "warm", lambda kernel, config: order.append(
            "warm"))
        assert CachingAutotuner.coordinate_descent_tuning(object(), launcher) == "best"

        def broken(kernel, config):
            raise RuntimeError("no worker pool")
        monkeypatch.setattr(tuning_warmup, "warm", broken)
        assert CachingAutotuner.coordinate_descent_tuning(object(), launcher) == "best"
    assert order == ["warm", "tune", "tune"]
    order.clear()
    CachingAutotuner.coordinate_descent_tuning(object(), launcher)  # the swap is undone
    assert order == ["tune"]


def test_off_unless_turned_on(monkeypatch):
    monkeypatch.setattr(tuning_warmup, "WARM", False)
    before = CachingAutotuner.__dict__["coordinate_descent_tuning"]
    with tuning_warmup.warmed_neighbours() as on:
        assert on is False
        assert CachingAutotuner.__dict__["coordinate_descent_tuning"] is before


def test_the_workers_job_compiles_the_one_config_into_the_cache(monkeypatch):
    made = {}

    class Kernel:
        configs = ["inductor's own"]

        def _precompile_config(self, config):
            self.configs = [config]  # what a careless job would leave behind
            made["compiled"] = config

    shared = Kernel()

    def load(name, source):
        made["loaded"] = (name, source)
        return shared
    monkeypatch.setattr(codecache, "_load_triton_kernel_from_source", load)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    tuning_warmup.compile_config("triton_poi_x", "source", "candidate",
                                 {"TRITON_CACHE_DIR": "/the/build's"})
    assert made == {"loaded": ("triton_poi_x", "source"), "compiled": "candidate"}
    assert shared.configs == ["inductor's own"]  # the worker's kernel is left as it was
    assert os.environ["TRITON_CACHE_DIR"] == "/the/build's"


@pytest.mark.parametrize("kind", ["TEMPLATE", "FIXED"])
def test_kernels_inductor_does_not_tune_are_not_warmed(kind):
    kernel = types.SimpleNamespace(heuristic_type=types.SimpleNamespace(name=kind))
    assert tuning_warmup.warm(kernel, _config(64, 4)) == 0
