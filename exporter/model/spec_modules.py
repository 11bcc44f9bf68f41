"""Which module a ``file.py:NAME`` spec runs: the file executed once per content.

Executing a file again re-runs its ``torch.library`` registrations, and torch then frees
the previous registration of each op (``get_library_allowing_overwrite``) while the first
execution's objects still call it: the user's own imported module, or an earlier build's,
later crashed inside the dispatcher (``std::bad_alloc``). So a file already imported,
unchanged, is reused: by this loader (same bytes) or the usual way (not modified since
this process started, or its bytecode records the source's size and time as it is now).
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
from pathlib import Path

# resolved path -> (sha256 of the bytes it ran, the module) of each spec file loaded here
_LOADED: dict[Path, tuple[str, types.ModuleType]] = {}


def loaded_before(path: Path) -> types.ModuleType | None:
    """The module ``path`` already ran as, if the file has not changed since."""
    resolved = path.resolve()
    earlier = _LOADED.get(resolved)
    if earlier is not None and earlier[0] == file_digest(resolved):
        return earlier[1]
    return _imported_unchanged(resolved)


def remember(path: Path, module: types.ModuleType) -> None:
    resolved = path.resolve()
    _LOADED[resolved] = (file_digest(resolved), module)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _imported_unchanged(path: Path) -> types.ModuleType | None:
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or os.path.basename(file) != path.name:
            continue
        cached = getattr(module, "__cached__", None)
        if Path(file).resolve() == path and (_older_than_process(path) or (
                cached and _bytecode_matches(Path(cached), path))):
            return module
    return None


def _older_than_process(path: Path) -> bool:
    """Last written before this process started: whatever it imported is what is there."""
    try:
        with open("/proc/stat") as stat:
            boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
        with open("/proc/self/stat") as own:
            ticks = int(own.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
        return path.stat().st_mtime < started - 1.0  # btime is whole seconds
    except (OSError, ValueError, IndexError, StopIteration):
        return False


def _bytecode_matches(pyc: Path, source: Path) -> bool:
    """The .pyc header (PEP 552: flags, then the source's mtime and size) agrees with the
    file now; a hash-based .pyc or none at all does not count."""
    try:
        header = pyc.read_bytes()[:16]
        stat = source.stat()
    except OSError:
        return False
    if len(header) < 16 or int.from_bytes(header[4:8], "little") != 0:
        return False
    mtime, size = int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")
    return mtime == int(stat.st_mtime) & 0xFFFFFFFF and size == stat.st_size & 0xFFFFFFFF
