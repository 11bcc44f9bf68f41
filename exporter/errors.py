"""Errors raised by the exporter (build side). See ``runtime.errors`` for the base classes.

Exit codes (mapped by the CLI): 0 ok, 1 validation failed, 2 bad usage or input,
3 build failed.
"""

from __future__ import annotations

from runtime.errors import (  # re-exported: the exporter's callers need one import
    ArtifactError,
    CompatibilityError,
    ExecutionError,
    InputMismatchError,
    ToolchainError,
    UserInputError,
)

__all__ = [
    "ArtifactError", "BuildError", "CompatibilityError", "ExecutionError", "ExportFailedError",
    "InputMismatchError", "MemoryBudgetError", "SpecError", "TargetUnavailableError", "ToolchainError",
    "UserInputError", "ValidationFailedError",
]


class SpecError(UserInputError):
    """The model spec cannot be loaded: missing file, bad name, factory failure."""


class TargetUnavailableError(UserInputError):
    """The target cannot build on this machine (no GPU, missing package...)."""


class ExportFailedError(ToolchainError):
    """torch.export could not capture the model (exit code 3)."""


class BuildError(ToolchainError):
    """Lowering, compiling or packaging failed (exit code 3)."""


class MemoryBudgetError(ToolchainError):
    """Weights plus planned activations exceed --memory-budget (exit code 1: the build
    worked, the model does not fit)."""

    exit_code = 1


class ValidationFailedError(ToolchainError):
    """The artifact does not compute what eager PyTorch computes (exit code 1)."""

    exit_code = 1

    def __init__(self, what: str, *, record: dict | None = None, **kwargs) -> None:
        self.record = record
        super().__init__(what, **kwargs)
