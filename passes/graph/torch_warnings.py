"""torch's own deprecation warnings that a caller of ours can do nothing about, silenced
where torch raises them and nowhere else."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator


@contextlib.contextmanager
def quiet_run_decompositions() -> Iterator[None]:
    """``ExportedProgram.run_decompositions`` (torch 2.13) deep-copies the module call
    graph's pytree specs, and torch warns about its own deprecated ``LeafSpec`` check
    there (a FutureWarning per call: twice per onnx build, from the decompose pass and
    torch.onnx's export)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning,
                                message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        yield
