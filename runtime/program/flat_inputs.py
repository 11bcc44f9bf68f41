"""A model's ``(args, kwargs)`` as the flat tensor list an artifact takes, and back.

One implementation for every room: the runtime flattens a caller's arguments,
the exporter flattens example inputs and rebuilds them for eager runs, and the
dtype pass rebuilds them inside its re-captured wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten


@dataclass
class FlatInputs:
    tensors: list[torch.Tensor]  # the tensor leaves, in the artifact's input order
    leaves: list[Any]  # every leaf, non-tensor constants included
    spec: TreeSpec

    def rebuild(self, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
        """Flat input tensors -> (args, kwargs), constants put back."""
        leaves = list(self.leaves)
        slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        for slot, tensor in zip(slots, tensors):
            leaves[slot] = tensor
        return tree_unflatten(leaves, self.spec)


def flatten_inputs(args: tuple, kwargs: dict) -> FlatInputs:
    # torch.export flattens (args, kwargs) with kwargs in the order given, as here.
    leaves, spec = tree_flatten((tuple(args), dict(kwargs)))
    return FlatInputs([leaf for leaf in leaves if isinstance(leaf, torch.Tensor)], leaves, spec)
