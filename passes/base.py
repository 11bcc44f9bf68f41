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

    Passes only make a program faster or smaller, so an optional one that fails on a model
    does not fail the build: the program goes on without it, and the record says
    ``skipped`` with the error (the build warns, naming the pass). Passes edit the graph in
    place, so one that failed half-way may have left it broken: then the build stops there,
    naming the pass (copying the program before every pass to roll back would cost more). A program a pass
    says it changed is checked right after it (``check_program``: the FX graph's lint and
    torch.export's own verifier), so a pass that leaves a broken graph is blamed there,
    not at a later stage. A required pass (quantization: the user asked for it) that fails
    fails the build, naming itself and the passes run before it."""
    records: list[dict] = []
    for step in pipeline:
        start = time.perf_counter()
        try:
            result = step(program)
            if result.modified:
                check_program(result.program, step.name)
        except Exception as exc:  # noqa: BLE001 - any failure of an optional rewrite
            before = ", ".join(r["name"] for r in records) or "none"
            if getattr(step, "required", False):
                error = _required_failed(step.name, exc, before)
                if error is exc:
                    raise
                raise error from exc
            reason = f"{type(exc).__name__}: {_first_line(exc)}"
            _still_sound(program, step.name, reason, before)
            log.debug("pass %s failed and was skipped (%s; passes before it: %s)", step.name,
                      reason, before, exc_info=True)
            records.append({"name": step.name, "modified": False, "skipped": reason, "info": {},
                            "after": before, "seconds": round(time.perf_counter() - start, 4)})
            continue
        program = result.program
        records.append({"name": step.name, "modified": result.modified, "info": result.info,
                        "seconds": round(time.perf_counter() - start, 4)})
        log.debug("pass %s: modified=%s %s", step.name, result.modified, result.info)
    return program, records


class BrokenGraphError(Exception):
    """A pass left a program that fails the FX lint or torch.export's verifier."""


def check_program(program: ExportedProgram, pass_name: str) -> None:
    """The checks a changed program must pass before the next stage sees it."""
    try:
        program.graph_module.graph.lint()
        program._validate()  # torch.export's verifiers: signature, op kinds, metadata
    except Exception as exc:  # noqa: BLE001 - lint and verifiers raise many kinds
        raise BrokenGraphError(f"pass {pass_name} left a graph that fails "
                               f"torch.export's checks ({type(exc).__name__}: "
                               f"{_first_line(exc)})") from exc


def _still_sound(program: ExportedProgram, name: str, reason: str, before: str) -> None:
    """After an optional pass failed: the program it was given must still pass the checks
    (it may have been edited in place before the failure)."""
    try:
        check_program(program, name)
    except BrokenGraphError as broken:
        raise PassFailedError(f"pass {name} failed ({reason}) and left the program broken",
                              details=[f"passes run before it: {before}", str(broken)],
                              hint="build with --no-fuse to skip the fusion passes; --debug "
                                   "shows the traceback") from broken


def _required_failed(name: str, exc: Exception, before: str) -> ToolchainError:
    """A required pass's failure, naming it and the passes before it; an error that is
    already ours keeps its class (and so its exit code), with the pass's name added."""
    details = [f"passes run before it: {before}"]
    if isinstance(exc, ToolchainError):
        if not exc.what.startswith(f"pass {name}"):
            exc.what = f"pass {name}: {exc.what}"
        exc.details = list(exc.details or []) + details
        exc.args = (exc.paragraph(),)  # str() is the paragraph, made when it was raised
        return exc
    return PassFailedError(f"pass {name} failed ({type(exc).__name__}: {_first_line(exc)})",
                           details=details, hint="--debug shows the pass's traceback")


class PassFailedError(ToolchainError):
    """A required pass (one the user asked for, such as quantization) failed: exit 3."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"
