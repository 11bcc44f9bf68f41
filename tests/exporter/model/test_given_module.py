"""exporter.build(module, ...) leaves the caller's module as it was: its training mode,
and its parameters (their gradients too) and buffers on their own device, the same
tensors with the same values (a build moves the model to its device and into eval mode to
trace it, and runs its forward, which may write into its buffers and inputs); and the
example inputs it was given."""

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


class _Writer(_Net):
    """Writes into a buffer and into its float input as it runs (torch.export keeps both)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x, ids):
        self.calls.add_(1)
        x.mul_(2)
        return super().forward(x), ids + 1


def _state(module):
    grads = {name: (p.grad, p.grad.clone()) for name, p in module.named_parameters()
             if p.grad is not None}
    return ({name: (t, t.detach().clone()) for name, t in module.named_parameters()},
            {name: (t, t.clone()) for name, t in module.named_buffers()},
            {name: m.training for name, m in module.named_modules()},
            {name: p.requires_grad for name, p in module.named_parameters()}, grads)


def _assert_as_before(module, before):
    params, buffers, modes, requires_grad, grads = _state(module)
    for kind, now, then in (("parameter", params, before[0]), ("buffer", buffers, before[1]),
                            ("gradient", grads, before[4])):
        assert now.keys() == then.keys()
        for name, (tensor, _) in now.items():
            same, values = then[name]
            assert tensor is same, f"{kind} {name} is another tensor"
            assert (tensor.device, tensor.dtype) == (values.device, values.dtype), name
            assert torch.equal(tensor, values), name
    assert modes == before[2] and requires_grad == before[3]


def _in_training(net):
    """Mid-training, as a caller's model may be: gradients, a frozen parameter, a mix of
    modes."""
    net.train()
    net.linear.bias.requires_grad_(False)
    net.linear(torch.randn(5, 4)).sum().backward()
    net.drop.eval()
    return net


# "meta" makes new parameters (torch's swap path); float64 on the CPU replaces their
# ``.data`` and their gradients' (the path a move to a GPU takes); None: a build for the
# device the module is on, which moves nothing and writes into the module's own buffers.
@pytest.mark.parametrize("fails", [False, True])
@pytest.mark.parametrize("moved_to", ["meta", torch.float64, None],
                         ids=["meta", "float64", "unmoved"])
def test_moved_and_switched_to_eval_inside_then_given_back(fails, moved_to):
    net = _in_training(_Net())
    before = _state(net)
    with pytest.raises(RuntimeError) if fails else torch.no_grad():
        with left_as_given(net):
            net.to(moved_to).eval()
            assert not net.training
            if moved_to is not None:
                assert moved_to in (net.linear.weight.device.type, net.linear.weight.dtype)
                assert moved_to in (net.linear.weight.grad.device.type,
                                    net.linear.weight.grad.dtype)
            with torch.no_grad():
                net.norm.running_mean.add_(1)  # as a forward writes its buffers
            if fails:
                raise RuntimeError("the build failed")
    _assert_as_before(net, before)


def test_a_build_and_a_validation_leave_the_module_and_its_inputs_as_given(tmp_path):
    import exporter
    import runtime
    from exporter.model.spec import ModelSpec
    net = _in_training(_Writer())
    x, ids = torch.randn(2, 4), torch.arange(3)
    before, given = _state(net), (x.clone(), ids.clone())
    built = exporter.build(net, (x, ids), target="onnx", out=tmp_path / "net.artifact")
    _assert_as_before(net, before)
    assert torch.equal(x, given[0]) and torch.equal(ids, given[1])
    assert built.manifest.validation["passed"]
    spec = ModelSpec("python:_Writer", net.eval(), (x, ids), {}, None, None)  # as specs are
    before = _state(net)
    assert exporter.validate(built.artifact, spec)["passed"]
    _assert_as_before(net, before)
    assert torch.equal(x, given[0]) and torch.equal(ids, given[1])
    with torch.no_grad():
        expected = net(x.clone(), ids)
    torch.testing.assert_close(runtime.load(built.artifact)(x, ids), expected)



@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_build_moves_the_module_and_gives_it_back_on_the_cpu(tmp_path):
    """The move the float64 case above stands in for, on a real GPU: parameters and
    their gradients back on the CPU, the same tensors."""
    import exporter
    net = _in_training(_Net())
    x = torch.randn(2, 4)
    before, given = _state(net), x.clone()
    built = exporter.build(net, (x,), target="cuda", out=tmp_path / "net.artifact")
    assert built.manifest.validation["passed"]
    _assert_as_before(net, before)
    assert torch.equal(x, given)

class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 4)
        self.head = torch.nn.Linear(4, 5, bias=False)
        self.head.weight = self.embed.weight  # tied, as language models' heads are
        self.register_buffer("positions", torch.arange(5))

    def forward(self, ids):
        return self.head(self.embed(ids + self.positions[:ids.shape[-1]] * 0))


def test_a_converted_copy_casts_floats_keeps_ties_and_leaves_the_original():
    from exporter.model.given_module import converted_copy
    net = _Tied()
    net.embed.weight.grad = torch.ones(5, 4)
    before = _state(net)
    copied = converted_copy(net, dtype=torch.float64)
    _assert_as_before(net, before)
    assert copied.embed.weight.dtype == torch.float64 and copied.positions.dtype == torch.long
    assert copied.head.weight is copied.embed.weight and copied.embed.weight.grad is None
    assert copied.embed.weight.requires_grad
    assert not set(map(id, copied.parameters())) & set(map(id, net.parameters()))
    ids = torch.tensor([[1, 2, 3]])
    # float64 against float32 arithmetic: float32's tolerance (float64's default failed
    # for one element in 15 on some random weights)
    torch.testing.assert_close(copied(ids), net(ids).double(), rtol=1.3e-6, atol=1e-5)
