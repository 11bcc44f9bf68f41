"""Temporary files of builds that died (SIGKILL, power loss) are removed by the next one.

Every temporary file or directory a build makes carries the pid of the process that
made it: the artifact writer's ``.<out>.tmp-<pid>-*`` beside the output, the staging
``.<out>.validating-<pid>`` that validation runs, and ``exporter-build-<pid>-*``,
``exporter-validate-<pid>-*`` and ``edge-artifact-<pid>-*`` in the temp directory, and
the onnx target's export report ``exporter-onnx-<pid>-*`` beside the output (kept only
when the export fails, then named in the error). A
build removes those whose process no longer exists; a live build's are never touched,
so two builds can share a directory.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from targets.onnx import REPORT_DIR_PREFIX

log = logging.getLogger(__name__)

TEMP_PREFIXES = ("exporter-build-", "exporter-validate-", "edge-artifact-")
_PID = re.compile(r"(?:validating|tmp|build|validate|artifact|onnx)-(\d+)")


def temp_prefix(kind: str) -> str:
    """The prefix for a temporary directory of this process (``kind`` in TEMP_PREFIXES)."""
    return f"{kind}{os.getpid()}-"


def sweep(out: Path) -> list[Path]:
    """Remove dead builds' leftovers beside ``out`` and in the temp directory."""
    candidates = [p for p in out.parent.glob(f".*{out.name}.*")
                  if p.name.startswith((f".{out.name}.", f"..{out.name}."))]
    candidates += [p for p in out.parent.glob(f"{REPORT_DIR_PREFIX}*") if p.is_dir()]
    candidates += [p for p in Path(tempfile.gettempdir()).glob("*-*")
                   if p.name.startswith(TEMP_PREFIXES)]
    removed = []
    for path in candidates:
        pids = [int(pid) for pid in _PID.findall(path.name)]
        if not pids or any(_alive(pid) for pid in pids):
            continue
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        except OSError:
            continue  # someone else's, or already gone: never fail a build over it
        removed.append(path)
    if removed:
        log.info("removed %d leftover(s) of interrupted builds: %s", len(removed),
                 ", ".join(p.name for p in removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True
