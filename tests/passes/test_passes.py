"""Passes: before/after graphs, numerics against the unpassed program, honest `modified`."""

from __future__ import annotations

import torch

from exporter.model.zoo import ZOO
from passes.base import run_pipeline
from exporter.model.cast import cast_model
from passes.cleanup.dead_code import EliminateDeadCode


class _Dangling(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        _unused = torch.tanh(y)  # a dropped output leaves this behind
        return torch.relu(y)


def _ops(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def test_dead_code_removes_the_unused_branch_and_is_idempotent():
    x = torch.randn(2, 4)
    program = torch.export.export(_Dangling().eval(), (x,))
    expected = program.module()(x)
    assert "aten.tanh.default" in _ops(program)
    first = EliminateDeadCode()(program)
    assert first.modified and first.info["nodes_removed"] == 1
    assert "aten.tanh.default" not in _ops(first.program)
    torch.testing.assert_close(first.program.module()(x), expected)
    second = EliminateDeadCode()(first.program)
    assert not second.modified and second.info["nodes_removed"] == 0


def test_cast_model_runs_math_in_bf16_and_keeps_io_dtypes():
    module, args, dynamic_shapes = ZOO["encoder"]()
    cast = cast_model(module, "bf16")
    program = torch.export.export(cast, args, dynamic_shapes=dynamic_shapes)
    params = [p for p in program.state_dict.values() if p.is_floating_point()]
    assert params and all(p.dtype == torch.bfloat16 for p in params)
    got = program.module()(*args)
    expected = module(*args)
    for key, value in expected.items():
        assert got[key].dtype == torch.float32  # callers keep their dtypes
        torch.testing.assert_close(got[key], value, rtol=0.1, atol=0.1)
    # the model's own signature: dynamic_shapes bind by its parameter names
    (bounds,) = program.range_constraints.values()
    assert (bounds.lower, bounds.upper) == (1, 32)


class _UpcastNorm(torch.nn.Module):
    """RMSNorm as LLaMA writes it: float32 on purpose inside, a mask from finfo(dtype)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        mask = torch.full((x.shape[-1],), torch.finfo(self.weight.dtype).min)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype) + mask.clamp(min=0)


def test_cast_model_is_model_to_dtype_with_deliberate_upcasts_kept():
    module = _UpcastNorm()
    x = torch.randn(2, 8)
    program = torch.export.export(cast_model(module, "fp16"), (x,))
    (rsqrt,) = [n for n in program.graph.nodes if n.target is torch.ops.aten.rsqrt.default]
    assert rsqrt.meta["val"].dtype == torch.float32, "the model's float32 upcast stays"
    out = program.module()(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, module(x), rtol=1e-2, atol=1e-2)
    assert all(p.dtype == torch.float32 for p in module.parameters()), "user's model untouched"


def test_pipeline_records_each_pass():
    x = torch.randn(2, 4)
    program = torch.export.export(_Dangling().eval(), (x,))
    _, records = run_pipeline(program, [EliminateDeadCode()])
    assert records[0]["name"] == "eliminate_dead_code" and records[0]["modified"] is True


class _RmsNorm(torch.nn.Module):
    """LLaMA's RMSNorm, and an rsqrt used beyond a product (left alone)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        other = torch.rsqrt(x.abs() + 1.0)
        return self.weight * (x * r), other + 1.0


def test_rsqrt_products_become_divisions_by_the_root():
    """x * rsqrt(v) -> x / sqrt(v) (ONNX Runtime fuses that form of RMSNorm into one
    kernel); an rsqrt with another use stays; the values agree to a rounding."""
    from targets.onnx.passes.rsqrt_as_division import RsqrtAsDivision
    x = torch.randn(2, 3, 8)
    program = torch.export.export(_RmsNorm().eval(), (x,))
    expected = program.module()(x)
    before = _ops(program)
    result = RsqrtAsDivision()(program)
    after = _ops(result.program)
    assert before.count("aten.rsqrt.default") == 2 and "aten.sqrt.default" not in before
    assert result.modified and result.info["products_rewritten"] == 1
    assert after.count("aten.rsqrt.default") == 1 and "aten.sqrt.default" in after
    assert after.count("aten.div.Tensor") == 1
    for got, want in zip(result.program.module()(x), expected):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not RsqrtAsDivision()(result.program).modified


class _NormOutput(torch.nn.Module):
    """The norm's product is what the program returns (a cpu partition ending at an MoE
    layer's fallback ops returns its first RMSNorm's product)."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_rsqrt_product_that_is_the_output_keeps_the_signature_sound():
    from passes.base import check_program
    from targets.onnx.passes.rsqrt_as_division import RsqrtAsDivision
    x = torch.randn(2, 3, 8)
    program = torch.export.export(_NormOutput(), (x,))
    expected = program.module()(x)
    result = RsqrtAsDivision()(program)
    assert result.info["products_rewritten"] == 1
    check_program(result.program, "rsqrt_as_division")  # the signature names the division
    torch.testing.assert_close(result.program.module()(x), expected, rtol=1e-6, atol=1e-6)


class _WholeHeadRotary(torch.nn.Module):
    """Phi-3's rotary: cat(rotated part, untouched part), the latter empty here, on a
    transposed view, then a view that needs the contiguous result eager's cat returns."""

    def forward(self, x):  # x [1, T, 4, 16]
        q = x.transpose(1, 2)
        out = torch.cat([q * 2.0, q[..., 16:]], dim=-1)
        return out.view(1, 2, 2 * out.shape[2], 16)


def test_empty_concat_operands_are_dropped_and_the_result_stays_contiguous():
    from passes.cleanup.empty_concat import DropEmptyConcatOperands
    x = torch.randn(1, 5, 4, 16)
    program = torch.export.export(_WholeHeadRotary(), (x,),
                                  dynamic_shapes=({1: torch.export.Dim("t", min=2, max=16)},))
    result = DropEmptyConcatOperands()(program)
    ops = _ops(result.program)
    assert result.info == {"operands_dropped": 1} and "cat" not in " ".join(ops)
    assert any("clone" in op for op in ops)
    torch.testing.assert_close(result.program.module()(x), _WholeHeadRotary()(x))
    assert DropEmptyConcatOperands()(result.program).modified is False


def test_a_recapture_keeps_a_length_of_one_and_bounds_derived_dims():
    """A generating build's prefill takes one token (captured size-oblivious, T >= 1). A
    partition re-captured later (ops moved to the CPU fallback while lowering) ran
    without that, and one taking 2*T rows (a mixture of experts' token-expert pairs,
    gpt-oss on onnx) refused the one-token decode step: "shape[0] >= 4, got 2"."""
    from torch.export import Dim
    from torch.fx.experimental import _config

    from passes.graph.dims import export_keeping_dims

    class Pairs(torch.nn.Module):
        def forward(self, x, pairs):
            return x.sum(-1) + pairs.view(2, -1).sum(0)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pairs = Pairs()

        def forward(self, x):
            return self.pairs(x, torch.cat([x[:, 0], x[:, 1]]))

    x = torch.randn(8, 4)
    with _config.patch(backed_size_oblivious=True):
        program = torch.export.export(Step(), (x,), dynamic_shapes=({0: Dim("T", min=1,
                                                                               max=64)},))
    nodes = {n.name: n for n in program.graph.nodes}
    cut = [nodes["x"], next(n for n in program.graph.nodes if "cat" in str(n.target))]
    part = export_keeping_dims(Pairs(), (x, torch.cat([x[:, 0], x[:, 1]])), cut, program)
    one = torch.randn(1, 4)
    got = part.module()(one, torch.cat([one[:, 0], one[:, 1]]))
    assert torch.allclose(got, Step()(one))


def test_decomposing_a_program_leaves_no_torch_future_warning():
    """torch 2.13's run_decompositions warns about its own LeafSpec check; an API build
    (its decompose pass) must not pass that on to the caller."""
    import warnings

    from passes.cleanup.decompose import Decompose
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(2, 4),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Decompose(lambda: None, "core ATen")(program)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]
