"""Progress of long commands (build, bench): named stages, told three ways.

- The CLI draws each stage as a spinner with a running clock (exporter/cli/common.py).
- Python callers pass ``progress=callback`` to ``exporter.build`` / ``exporter.bench``
  and get a ``StageEvent`` as each stage starts and ends.
- Every stage is also logged on the ``exporter`` logger (INFO), so an application that
  configures ``logging`` sees the build without either of the above.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Literal

log = logging.getLogger("exporter")

StageHook = Callable[[str], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class StageEvent:
    """One stage starting ("start", seconds 0) or ending ("done" or "failed")."""
    stage: str
    state: Literal["start", "done", "failed"]
    seconds: float = 0.0


ProgressCallback = Callable[[StageEvent], None]


@contextlib.contextmanager
def quiet_stage(name: str) -> Iterator[None]:
    yield


def callback_stage(progress: ProgressCallback | None) -> StageHook:
    """A stage hook that reports to ``progress`` (a user's function: it sees every stage)."""
    if progress is None:
        return quiet_stage

    @contextlib.contextmanager
    def stage(name: str) -> Iterator[None]:
        start = time.perf_counter()
        progress(StageEvent(name, "start"))
        try:
            yield
        except BaseException:
            progress(StageEvent(name, "failed", time.perf_counter() - start))
            raise
        progress(StageEvent(name, "done", time.perf_counter() - start))
    return stage


def logged(stage: StageHook) -> StageHook:
    """``stage`` plus a log line on the ``exporter`` logger as each stage starts and ends."""
    @contextlib.contextmanager
    def wrapped(name: str) -> Iterator[None]:
        start = time.perf_counter()
        log.info("%s...", name)
        try:
            with stage(name):
                yield
        except BaseException:
            log.info("%s failed after %.1fs", name, time.perf_counter() - start)
            raise
        log.info("%s done in %.1fs", name, time.perf_counter() - start)
    return wrapped
