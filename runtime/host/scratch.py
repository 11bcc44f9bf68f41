"""Temporary files and folders the toolchain makes, recorded so that only they are swept.

A build that is killed (SIGKILL, power loss) cannot remove its temporaries; the next
build does. Matching names is not enough to know what is ours: a user folder called
``exporter-onnx-99999-notes`` or a file ``.model.artifact.backup-build-31337`` looks the
same as a leftover. So every temporary is recorded when it is made, in a per-process
log under a private folder (``$TMPDIR/exporter-scratch-<uid>/``, mode 0700, ours or not
used at all), and released when it is removed or kept on purpose (an ONNX export report
that an error message points to). The build's ``exporter.leftovers.sweep()`` removes
what the logs of dead processes still hold, and nothing else.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)


def registry() -> Path | None:
    """The private folder of logs, or None if it is not safely ours (then nothing is
    recorded and nothing swept: failing safe means leaving files, never deleting)."""
    folder = _registry_path()
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.debug("not using %s for the scratch registry: not a private folder of ours", folder)
        return None
    return folder


def _log_path() -> Path | None:
    folder = registry()
    return folder / f"{os.getpid()}.log" if folder else None


def _append(line: str) -> None:
    path = _log_path()
    if path is None:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(line + "\n")


def record(path: Path) -> Path:
    """Note ``path`` as a temporary of this process (swept if the process dies)."""
    _append("+" + str(Path(path).absolute()))
    return path


def release(path: Path) -> None:
    """``path`` is no longer a temporary: removed, or kept for the user on purpose."""
    _append("-" + str(Path(path).absolute()))


def make_dir(prefix: str, dir: Path | None = None) -> Path:
    """A new 0o700 folder, recorded."""
    return record(Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dir)))


def make_file(prefix: str, dir: Path | None = None, suffix: str = "") -> Path:
    """A new empty 0o600 file, recorded."""
    fd, name = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}-", suffix=suffix, dir=dir)
    os.close(fd)
    return record(Path(name))


def remove(path: Path) -> None:
    """Remove a recorded temporary (file or folder) and release it."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    release(path)


@contextlib.contextmanager
def directory(prefix: str, dir: Path | None = None) -> Iterator[Path]:
    """A recorded temporary folder for the block (like tempfile.TemporaryDirectory)."""
    path = make_dir(prefix, dir)
    try:
        yield path
    finally:
        remove(path)


def held(log_file: Path) -> list[Path]:
    """The paths a log still holds (recorded and not released), in order."""
    live: dict[str, None] = {}
    for line in log_file.read_text(errors="replace").splitlines():
        if line[:1] == "+":
            live[line[1:]] = None
        elif line[:1] == "-":
            live.pop(line[1:], None)
    return [Path(p) for p in live]


@atexit.register
def forget_own_log() -> None:
    """A process that ends normally has removed or released what it recorded."""
    path = _log_path() if _registry_path().is_dir() else None
    if path is not None and path.exists():
        stale = [p for p in held(path) if p.exists()]
        if not stale:
            path.unlink(missing_ok=True)


def _registry_path() -> Path:
    return Path(tempfile.gettempdir()) / f"exporter-scratch-{os.getuid()}"
