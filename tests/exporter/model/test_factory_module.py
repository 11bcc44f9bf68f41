"""A ``package.module:make`` spec may hand out a model its caller also holds; the Python
API's build, validate and bench leave that model as it was (its training mode, parameters and
buffers), as they leave a module passed in."""

from __future__ import annotations

import sys
import types

import torch

from tests.exporter.model.test_given_module import (_assert_as_before, _in_training, _state,
                                                     _Writer)


def test_a_factory_module_the_caller_holds_is_given_back(tmp_path, monkeypatch):
    import exporter
    net = _in_training(_Writer())
    held = types.ModuleType("held_models")
    held.make = lambda: (net, (torch.randn(2, 4), torch.arange(3)))
    monkeypatch.setitem(sys.modules, "held_models", held)
    before = _state(net)
    out = tmp_path / "held.artifact"
    built = exporter.build("held_models:make", target="cpu", cpu_backend="onnx", out=out)
    assert built.manifest.validation["passed"]
    _assert_as_before(net, before)  # training, and the forward's counter not advanced
    assert exporter.validate(out, "held_models:make")["passed"]
    _assert_as_before(net, before)
    exporter.bench(out, model="held_models:make", baselines=("eager",), runs=2, warmup=1)
    _assert_as_before(net, before)
