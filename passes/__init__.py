"""Graph passes over ``ExportedProgram`` and the pipeline runner (see DESIGN.md, Contracts)."""

from passes.base import Pass, PassResult, run_pipeline

__all__ = ["Pass", "PassResult", "run_pipeline"]
