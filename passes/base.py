"""The pass contract and the pipeline runner.

A pass takes an ``ExportedProgram`` and returns ``PassResult(program, modified,
info)``; ``modified`` is honest, so a fixed-point runner can rely on it, and
``info`` carries the figures shown in the report. Modelled on
``torch/fx/passes/infra/pass_base.py``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from torch.export import ExportedProgram

from runtime.errors import ToolchainError

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    program: ExportedProgram
    modified: bool
    info: dict = field(default_factory=dict)


class Pass(Protocol):
    name: str
    # A required pass (quantization: the user asked for it) fails the build instead of
    # being skipped; an optional one (fusion, folding) only makes the program faster.
    required: bool


    def __call__(self, program: ExportedProgram) -> PassResult: ...


def run_pipeline(program: ExportedProgram, pipeline: Sequence[Pass]
                 ) -> tuple[ExportedProgram, list[dict]]:
    """Run passes in order; return the final program and one record per pass for the manifest.

    Passes only make a program faster or smaller, so one that fails on a model never
    fails the build: the program goes on as it was before that pass, and the record says
    ``skipped`` with the error (the build warns, naming the pass). A program a pass
    changed is linted before the next pass sees it; a broken graph counts as a failure."""
    records = []
    for step in pipeline:
        start = time.perf_counter()
        try:
            result = step(program)
            if result.modified:
                result.program.graph_module.graph.lint()
        except Exception as exc:  # noqa: BLE001 - any failure of an optional rewrite
            reason = f"{type(exc).__name__}: {_first_line(exc)}"
            if getattr(step, "required", False):
                if isinstance(exc, ToolchainError):
                    raise
                raise PassFailedError(
                    f"pass {step.name} failed ({reason})",
                    details=[f"passes run before it: "
                             f"{', '.join(r['name'] for r in records) or 'none'}"],
                    hint="--verbose shows the pass's traceback") from exc
            log.debug("pass %s failed and was skipped (%s)", step.name, reason, exc_info=True)
            records.append({"name": step.name, "modified": False, "skipped": reason, "info": {},
                            "seconds": round(time.perf_counter() - start, 4)})
            continue
        program = result.program
        records.append({"name": step.name, "modified": result.modified, "info": result.info,
                        "seconds": round(time.perf_counter() - start, 4)})
        log.debug("pass %s: modified=%s %s", step.name, result.modified, result.info)
    return program, records


class PassFailedError(ToolchainError):
    """A required pass (one the user asked for, such as quantization) failed: exit 3."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"
