"""A linear followed by the tanh-approximate GELU as one GEMM whose epilogue applies it
(cuBLASLt's GELU-bias epilogue, through ``aten._addmm_activation``): GPT-2's fc1.

    before: h = gelu(linear(x, W, b), approximate="tanh")      or GPT-2's written-out form
            h = view(addmm(b, x2, W'), s); h = 0.5*h * (1 + tanh(sqrt(2/pi) * (h + 0.044715*h**3)))
    after:  h = _addmm_activation(b, rows(x), W.t(), use_gelu=True)    (view'd back)

The GEMM writes its output once and no GELU kernel reads it back: one kernel fewer a
layer (bench/cuda_kernel_ab.py times the pair). ``use_gelu`` is the
tanh GELU in ATen's CUDA kernels (cuBLASLt's epilogue, or the GEMM then ``gelu_(tanh)``)
but the exact one in its CPU kernel: a rewrite for the cuda target only, and the exact
GELU is never matched. Inductor keeps the op as an ATen fallback with an AOTInductor
C-shim entry. Only a constant weight and a constant 1-D bias (the epilogue's own), and a
GEMM read by nothing but the GELU.
"""

from __future__ import annotations

import math

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import attribute, rewrite_and_recapture
from targets.aoti.passes.decode_patterns import calls

aten = torch.ops.aten
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


class TanhGeluAsGemmEpilogue:
    name = "tanh_gelu_as_gemm_epilogue"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _rewrite_all, "gelu_epilogues")


def linear_tanh_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     weight_in_rows: bool) -> torch.Tensor:
    """``gelu(x @ W.T + b, approximate="tanh")`` as one GEMM: ``weight`` is [N, K]
    (a linear's), or [K, N] where ``weight_in_rows`` (an addmm's, GPT-2's Conv1D)."""
    mat2 = weight if weight_in_rows else weight.t()
    rows = x.reshape(-1, x.shape[-1])
    out = aten._addmm_activation(bias, rows, mat2, use_gelu=True)
    return out.reshape(*x.shape[:-1], mat2.shape[1])


def _rewrite_all(module: torch.fx.GraphModule) -> dict:
    rewritten = 0
    for node in list(module.graph.nodes):
        matched = _gelu_of_gemm(module, node)
        if matched is None:
            continue
        gemm, view, pattern = matched
        x, weight, bias, in_rows = _gemm_operands(gemm)
        with module.graph.inserting_before(node):
            fused = module.graph.call_function(linear_tanh_gelu, (x, weight, bias, in_rows))
            if view is not None:  # the addmm's own view back to the model's shape
                fused = module.graph.call_function(aten.view.default, (fused, view.args[1]))
        fused.meta = dict(node.meta)
        node.replace_all_uses_with(fused)
        for dead in [node, *reversed(pattern), *([view] if view else []), gemm]:
            module.graph.erase_node(dead)
        rewritten += 1
    module.recompile()
    return {"gelu_epilogues": rewritten}


def _gelu_of_gemm(module, node):
    """(gemm, view or None, the GELU's inner nodes) where ``node`` ends a tanh GELU of a
    constant-weight GEMM's output that nothing else reads (``_tanh_gelu`` checks its
    input's readers, here the addmm's under its view)."""
    found = _tanh_gelu(node)
    if found is None:
        return None
    source, inner = found
    view = None
    if calls(source, aten.view.default, aten.reshape.default):
        view, source = source, source.args[0]
        if len(source.users) != 1 or not calls(source, aten.addmm.default):
            return None
    if not calls(source, aten.linear.default, aten.addmm.default):
        return None
    _, weight, bias, _ = _gemm_operands(source)
    w, b = attribute(module, weight), attribute(module, bias)
    if w is None or b is None or w.dim() != 2 or b.dim() != 1 \
            or w.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    if source.target is aten.addmm.default and (source.kwargs or len(source.args) != 3):
        return None  # beta/alpha given: not a plain bias add
    return source, view, inner


def _gemm_operands(gemm):
    """(x, weight, bias, weight_in_rows) of a linear(x, W, b) or addmm(b, x, W')."""
    if gemm.target is aten.addmm.default:
        bias, x, weight = gemm.args
        return x, weight, bias, True
    bias = gemm.args[2] if len(gemm.args) > 2 else gemm.kwargs.get("bias")
    return gemm.args[0], gemm.args[1], bias, False


def _tanh_gelu(node):
    """(its input, the nodes between) where ``node`` is ``gelu(h, approximate="tanh")``
    or ``0.5*h * (1 + tanh(sqrt(2/pi) * (h + 0.044715 * h**3)))``, each inner node read
    only within it."""
    if calls(node, aten.gelu.default):
        approximate = node.kwargs.get("approximate",
                                      node.args[1] if len(node.args) > 1 else "none")
        h = node.args[0]
        return (h, []) if approximate == "tanh" and len(h.users) == 1 else None
    if not calls(node, aten.mul.Tensor):
        return None
    for half, one_plus in (node.args, reversed(node.args)):
        h = _scaled(half, aten.mul.Tensor, 0.5)
        tanh = _scaled(one_plus, aten.add.Tensor, 1.0)
        if h is None or not calls(tanh, aten.tanh.default):
            continue
        inner = _scaled(tanh.args[0], aten.mul.Tensor, _SQRT_2_OVER_PI)
        if not calls(inner, aten.add.Tensor) or h not in inner.args:
            continue
        cubed = _scaled(_other(inner, h), aten.mul.Tensor, 0.044715)
        if not (calls(cubed, aten.pow.Tensor_Scalar) and cubed.args[0] is h
                and cubed.args[1] == 3):
            continue
        nodes = [half, cubed, _other(inner, h), inner, tanh.args[0], tanh, one_plus]
        if all(len(n.users) == 1 for n in nodes) and set(h.users) == {half, cubed, inner}:
            return h, nodes
    return None


def _scaled(node, op, constant: float):
    """The tensor ``node`` combines with ``constant`` by ``op`` (either order), or None."""
    if not calls(node, op) or len(node.args) != 2 or node.kwargs:
        return None
    for tensor, value in (node.args, reversed(node.args)):
        if isinstance(tensor, torch.fx.Node) and isinstance(value, (int, float)) \
                and math.isclose(value, constant, rel_tol=1e-6):
            return tensor
    return None


def _other(node, known):
    a, b = node.args
    return b if a is known else a
