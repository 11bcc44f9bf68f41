"""Weights and stored constants in torch's default strides before ExecuTorch lowers them.

A tensor with a size-1 dim is contiguous under more than one set of strides: a permute
of (1, 1, 2, 16) to (1, 2, 1, 16) keeps strides (32, 16, 32, 1). ExecuTorch reads a dim
order from the strides ([0, 2, 1, 3] here), inserts a layout copy, and the XNNPACK
delegate that reads the copy fails at execute ("Propagating input shapes failed",
method error 0x1). DeBERTa's query bias, a permute that remove_noops folds into a stored
constant, died this way. The values are the same in any strides; only the layout
ExecuTorch infers from them changes.
"""

from __future__ import annotations

import logging

import torch
from torch._prims_common import make_contiguous_strides_for
from torch.export import ExportedProgram

log = logging.getLogger(__name__)


def default_strides(program: ExportedProgram) -> list[str]:
    """Give every parameter, buffer and constant of ``program`` (and its placeholder's
    value) torch's default strides, in place; the names of those changed."""
    stores = {**{name: program.state_dict for name in program.state_dict},
              **{name: program.constants for name in program.constants}}
    placeholders = {spec.target: spec.arg.name for spec in program.graph_signature.input_specs
                    if spec.target is not None}
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    changed = []
    for name, store in stores.items():
        value = store[name]
        if not isinstance(value, torch.Tensor) or _canonical(value):
            continue
        store[name] = _relaid(value)
        node = nodes.get(placeholders.get(name, ""))
        if node is not None and isinstance(node.meta.get("val"), torch.Tensor):
            node.meta["val"] = _relaid(node.meta["val"])
        changed.append(name)
    if changed:
        log.info("ExecuTorch: %d stored tensor(s) given default strides: %s", len(changed),
                 ", ".join(changed[:5]))
    return changed


def _canonical(value: torch.Tensor) -> bool:
    return tuple(value.stride()) == tuple(make_contiguous_strides_for(value.shape))


def _relaid(value: torch.Tensor) -> torch.Tensor:
    """The same values with default strides (``contiguous()`` keeps a tensor that is
    already contiguous as it is, odd strides included)."""
    relaid = value.clone(memory_format=torch.contiguous_format)
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(relaid, requires_grad=value.requires_grad)
    return relaid
