"""Graph passes over ``ExportedProgram`` and the pipeline runner (see docs/architecture.md, Contracts)."""

from passes.base import Pass, PassResult, run_pipeline

__all__ = ["Pass", "PassResult", "run_pipeline"]
