"""Checks shared by the per-target test files."""

from __future__ import annotations

from pathlib import Path

import torch

import runtime
from exporter.model.zoo import ZOO


def assert_zoo_artifact_matches_eager(out: Path, name: str, batches=(1, 32)) -> None:
    """Load the built zoo model and compare it with eager at the ends of its batch range."""
    module, args, _ = ZOO[name]()
    program = runtime.load(out)
    for batch in batches:
        grown = tuple(a[:1].repeat(batch, *([1] * (a.dim() - 1))) for a in args)
        got = torch.utils._pytree.tree_leaves(program(*grown))
        expected = torch.utils._pytree.tree_leaves(module(*grown))
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
