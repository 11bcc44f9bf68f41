"""The coverage suite's random weights (bench/coverage/unit_scale.py): every model's outputs
have unit-order spread, so a build that returns zeros or a constant fails its validation.
Session 68 found eight vision models validating against outputs of 0 to 1e-8."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from torch import nn

from tests.conftest import ROOT

pytest.importorskip("transformers")

from bench.coverage.check_eager import load_factory  # noqa: E402
from bench.coverage.matrix import UNIT_SCALE, matrix_toml  # noqa: E402
from bench.coverage.suite import SUITE  # noqa: E402
from bench.coverage.unit_scale import spread_problems, unit_scaled  # noqa: E402

# The models whose outputs were near zero before unit scaling, and one of every
# other factory file: the default tier. The whole suite is the slow tier.
FAST = {"mobilenet_v1", "mobilenet_v2", "efficientnet", "mobilevit", "mobilevitv2", "levit",
        "dpt", "mobilevit_deeplabv3", "mobilenetv2_deeplabv3", "bert", "llama", "t5"}
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def _conv_bn_stack(depth: int = 12) -> nn.Module:
    """Convolutions at transformers' std 0.02 through identity (fresh, eval) BatchNorms."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        conv = nn.Conv2d(8, 8, 3, padding=1)
        nn.init.normal_(conv.weight, std=0.02)
        layers += [conv, nn.BatchNorm2d(8), nn.ReLU()]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).eval()


def test_unit_scaled_revives_a_conv_batchnorm_stack_whose_output_vanished():
    model, x = _conv_bn_stack(), torch.randn(1, 8, 8, 8)
    with torch.no_grad():
        before = model(x)
    assert spread_problems([before]), f"the stack was meant to vanish: {before}"
    unit_scaled(model, (x,), {})
    with torch.no_grad():
        after = model(x)
    assert not spread_problems([after])
    assert 0.5 < float(after.square().mean().sqrt()) < 2.0  # unit root mean square


def test_a_layer_called_twice_is_scaled_once_and_a_silent_one_not_at_all():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.shared, self.silent = nn.Linear(4, 4), nn.Linear(4, 4)
            nn.init.zeros_(self.silent.weight), nn.init.zeros_(self.silent.bias)

        def forward(self, x):
            return self.shared(self.shared(x)) + self.silent(x)

    torch.manual_seed(0)
    model, x = Twice(), torch.randn(3, 4)
    with torch.no_grad():
        first = model.shared(x)
    weight = model.shared.weight.clone()
    unit_scaled(model, (x,), {})
    rms = float(first.double().square().mean().sqrt())
    assert torch.allclose(model.shared.weight, weight / rms)
    assert not model.silent.weight.any() and not model.silent.bias.any()


def test_spread_problems_flags_near_constant_and_nonfinite_outputs_only():
    assert spread_problems([torch.randn(2, 10), torch.tensor([3.0])]) == []  # a scalar: no spread
    assert spread_problems([torch.arange(4), torch.full((2, 3), 1e-30)])  # ints skipped
    assert spread_problems([torch.full((4,), 0.5) + 1e-4 * torch.randn(4)])
    assert spread_problems([torch.tensor([1.0, float("nan")])])
    assert spread_problems([torch.tensor([100.0, 101.0])]), "a spread of 1 % of the scale"


def _param(model) -> object:
    marks = [] if model.name in FAST else [pytest.mark.slow]
    if model.needs == "torchvision" and not HAS_TORCHVISION:
        marks.append(pytest.mark.skip(reason="needs torchvision (the GPU machine)"))
    return pytest.param(model, id=model.name, marks=marks)


@pytest.mark.parametrize("model", [_param(m) for m in SUITE])
def test_suite_model_outputs_have_unit_order_spread(model):
    """A build returning a constant (zeros) must fail this model's validation: every float
    output spreads over at least a quarter of max(1, max|x|)."""
    module, args, kwargs = load_factory(model.spec)()
    with torch.no_grad():
        out = module(*args, **kwargs)
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    assert leaves and not spread_problems(leaves), spread_problems(leaves)


def test_the_matrix_cache_key_covers_unit_scale(tmp_path):
    """The factories import unit_scale.py, which their spec files' bytes do not cover: each
    model names it in ``depends``, so editing it rebuilds every cell."""
    from exporter.matrix.spec_file import read

    path = tmp_path / "coverage.toml"
    path.write_text(matrix_toml([m for m in SUITE if m.name in ("resnet", "bert")], ["cpu"],
                                ["fp32"], 300.0))
    cells = read(path).cells
    assert [c.depends for c in cells] == [(str(UNIT_SCALE.resolve()),)] * 2
    assert UNIT_SCALE.is_file() and UNIT_SCALE.parent == ROOT / "bench" / "coverage"
    assert json.dumps(str(UNIT_SCALE)) in path.read_text()
