"""Fold an eval-mode BatchNorm into the conv or linear before it.

    before: y = conv2d(x, W, b); z = batch_norm(y, gamma, beta, mean, var, training=False)
    after:  z = conv2d(x, W * s, (b - mean) * s + beta)      with s = gamma / sqrt(var + eps)

One op and one pass over the activation fewer; backends that do not fold on their own
(TVM's and ONNX Runtime's importers see two ops) gain the most.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from passes.base import PassResult
from passes.graph.rewrite import add_constant, attribute, rewrite_and_recapture

_PRODUCERS = {torch.ops.aten.conv1d.default, torch.ops.aten.conv2d.default,
              torch.ops.aten.conv3d.default, torch.ops.aten.linear.default}
_BATCH_NORM = torch.ops.aten.batch_norm.default


class FoldBatchNorm:
    name = "fold_batchnorm"
    required = False

    def __call__(self, program: ExportedProgram) -> PassResult:
        return rewrite_and_recapture(program, _fold_all, "batchnorms_folded")


def _fold_all(module: torch.fx.GraphModule) -> dict:
    folded = 0
    for bn in list(module.graph.nodes):
        if bn.op == "call_function" and bn.target is _BATCH_NORM and _fold(module, bn):
            folded += 1
    module.graph.eliminate_dead_code()
    module.recompile()
    return {"batchnorms_folded": folded}


def _fold(module: torch.fx.GraphModule, bn: torch.fx.Node) -> bool:
    producer, gamma, beta, mean, var, training, _momentum, eps, *_ = bn.args
    if training or not isinstance(producer, torch.fx.Node) or producer.target not in _PRODUCERS \
            or len(producer.users) != 1:
        return False
    weight = attribute(module, producer.args[1])
    bias = attribute(module, producer.args[2]) if len(producer.args) > 2 else None
    stats = [attribute(module, n) for n in (mean, var)]
    if weight is None or any(s is None for s in stats) or (len(producer.args) > 2 and
                                                           producer.args[2] is not None
                                                           and bias is None):
        return False  # something computed, not stored: leave it
    mean_t, var_t = stats
    scale = torch.rsqrt(var_t + eps)
    if gamma is not None:
        gamma_t = attribute(module, gamma)
        if gamma_t is None:
            return False
        scale = scale * gamma_t
    shift = attribute(module, beta) if beta is not None else torch.zeros_like(scale)
    if shift is None:
        return False
    new_weight = weight * scale.reshape(-1, *[1] * (weight.dim() - 1))
    new_bias = ((bias if bias is not None else torch.zeros_like(mean_t)) - mean_t) * scale + shift
    w_node = add_constant(module, f"{producer.name}_weight_folded", new_weight, producer)
    b_node = add_constant(module, f"{producer.name}_bias_folded", new_bias, producer)
    args = list(producer.args) + [None] * (3 - len(producer.args))
    args[1], args[2] = w_node, b_node
    producer.args = tuple(args)
    bn.replace_all_uses_with(producer)
    return True
