"""Removing what killed processes of ours left behind: the temporaries their scratch logs
still hold (runtime/host/scratch.py records them; a device only records, the build sweeps)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from runtime.host.scratch import held, registry

log = logging.getLogger(__name__)


def sweep() -> list[Path]:
    """Remove the temporaries of processes that no longer exist; return what went."""
    folder = registry()
    if folder is None:
        return []
    removed = []
    for log_file in folder.glob("*.log"):
        pid = int(log_file.stem) if log_file.stem.isdigit() else None
        if pid is None or pid == os.getpid() or _alive(pid):
            continue
        try:
            paths = held(log_file)
        except FileNotFoundError:  # another build starting now swept it first
            continue
        for path in paths:
            if path.exists() or path.is_symlink():
                with contextlib.suppress(OSError):
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                    removed.append(path)
        log_file.unlink(missing_ok=True)
    if removed:
        log.info("removed %d leftover(s) of interrupted runs: %s", len(removed),
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
