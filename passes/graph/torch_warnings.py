"""torch's own deprecation warnings and libraries' log lines that a caller of ours can do
nothing about, silenced where they are raised and nowhere else."""

from __future__ import annotations

import contextlib
import logging
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


@contextlib.contextmanager
def loggers_quiet(*names: str) -> Iterator[None]:
    """The loggers ``names`` at ERROR while the block runs, at the caller's levels after."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def quiet_inductor_int8_lowering() -> Iterator[None]:
    """Inductor's oneDNN int8 lowerings (torch 2.13, mkldnn_lowerings.py) build a tensor
    with ``torch.tensor(tensor)`` and warn about that themselves: a UserWarning on every
    int8-dynamic cpu build, which the CLI printed as two of the user's warnings."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning,
                                message="To copy construct from a tensor",
                                module=r"torch\._inductor\.mkldnn_lowerings")
        yield
