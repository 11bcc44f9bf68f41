"""exporter.build(module, ...) leaves the caller's module as it was: its training mode,
and its parameters and buffers on their own device, the same tensors with the same values
(a build moves the model to its device and into eval mode to trace it)."""

from __future__ import annotations

import pytest
import torch

from exporter.model.given_module import left_as_given


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.norm(self.linear(x)))


def _state(module):
    return ({name: (t, t.detach().clone()) for name, t in module.named_parameters()},
            {name: (t, t.clone()) for name, t in module.named_buffers()},
            {name: m.training for name, m in module.named_modules()})


def _assert_as_before(module, before):
    params, buffers, modes = _state(module)
    for kind, now, then in (("parameter", params, before[0]), ("buffer", buffers, before[1])):
        assert now.keys() == then.keys()
        for name, (tensor, _) in now.items():
            same, values = then[name]
            assert tensor is same, f"{kind} {name} is another tensor"
            assert tensor.device == values.device and torch.equal(tensor, values), name
    assert modes == before[2]


@pytest.mark.parametrize("fails", [False, True])
def test_moved_and_switched_to_eval_inside_then_given_back(fails):
    net = _Net().train()
    net.drop.eval()  # a mix of modes, each kept
    before = _state(net)
    with pytest.raises(RuntimeError) if fails else torch.no_grad():
        with left_as_given(net):
            net.to("meta").eval()
            assert net.linear.weight.device.type == "meta" and not net.training
            if fails:
                raise RuntimeError("the build failed")
    _assert_as_before(net, before)


def test_a_build_of_a_module_leaves_it_as_given(tmp_path):
    import exporter
    import runtime
    net = _Net().train()
    x = torch.randn(2, 4)
    before = _state(net)
    built = exporter.build(net, (x,), target="onnx", out=tmp_path / "net.artifact")
    _assert_as_before(net, before)
    with torch.no_grad():
        expected = net.eval()(x)
    torch.testing.assert_close(runtime.load(built.artifact)(x), expected)
