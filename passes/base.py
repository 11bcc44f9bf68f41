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

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    program: ExportedProgram
    modified: bool
    info: dict = field(default_factory=dict)


class Pass(Protocol):
    name: str

    def __call__(self, program: ExportedProgram) -> PassResult: ...


def run_pipeline(program: ExportedProgram, pipeline: Sequence[Pass]
                 ) -> tuple[ExportedProgram, list[dict]]:
    """Run passes in order; return the final program and one record per pass for the manifest."""
    records = []
    for step in pipeline:
        start = time.perf_counter()
        result = step(program)
        program = result.program
        records.append({"name": step.name, "modified": result.modified, "info": result.info,
                        "seconds": round(time.perf_counter() - start, 4)})
        log.debug("pass %s: modified=%s %s", step.name, result.modified, result.info)
    return program, records
