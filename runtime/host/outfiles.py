"""Every file the toolchain writes for a user goes through here: checked first, then
written whole or not at all.

``checked_output(path)`` refuses what must never be replaced: anything that exists and
is not a regular file (a directory, a FIFO, a socket, a device node: ``--out /dev/null``
as root would otherwise replace the system's), or a missing or read-only folder. A
symbolic link is followed, so the file it names is what gets replaced (signing a link
signs its target, and the link keeps pointing at it).

``written_whole(path)`` yields a temporary path beside the destination; when the block
ends the file is fsynced and renamed over the destination in one step. On any error,
a full disk included, the temporary file is removed and the previous file is intact.
It lives in the runtime (the bottom room) because ``python -m runtime run --out`` and
``exporter keygen`` need it as much as ``exporter build`` does.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterable, Iterator

from runtime.errors import UserInputError
from runtime.host import scratch

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def checked_output(path: str | Path, *, flag: str = "--out", reads: Iterable = ()) -> Path:
    """The real path to write ``path`` to, or a UserInputError (exit 2) naming why not.
    ``reads``: the files the command reads (its artifact, its inputs), never replaced."""
    path = Path(os.path.realpath(Path(path).expanduser()))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a loop of symbolic links, a name too long, no permission
        raise UserInputError(f"cannot use {flag} {path} ({exc.strerror})", where=str(path),
                             hint=f"give {flag} another file name") from None
    for read in reads:
        if mode is not None and os.path.exists(read) and os.path.samefile(path, read):
            raise UserInputError(f"{flag} {path} is {read}, which this command reads; "
                                 "writing would replace it", where=str(path),
                                 hint=f"give {flag} another file name")
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise UserInputError(f"{flag} {path} is {kind}; only a regular file is ever replaced",
                             where=str(path), hint=f"give a file name for {flag}, "
                             "e.g. model.artifact in a folder you own")
    folder = path.parent
    if not folder.is_dir():
        raise UserInputError(f"the folder of {flag} ({folder}) does not exist", where=str(path),
                             hint=f"create it (mkdir -p {folder}) or choose another {flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserInputError(f"the folder of {flag} ({folder}) is not writable",
                             where=str(path), hint=f"choose another {flag}")
    return path


@contextlib.contextmanager
def written_whole(out: str | Path, *, flag: str = "--out", suffix: str = "",
                  mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside ``checked_output(out)`` to write to; see the module
    docstring. The temporary is recorded (runtime/host/scratch.py: a killed build's is swept)
    and keeps ``suffix`` (for writers that read the format from the extension)."""
    dest = checked_output(out, flag=flag)
    partial = scratch.make_file(f".{dest.name}.partial-", dest.parent, suffix)
    try:
        yield partial
        with open(partial, "rb+") as fh:  # on disk before the rename makes it visible
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        checked_output(dest, flag=flag)  # not swapped for a FIFO or a folder meanwhile
        os.replace(partial, dest)
    finally:
        scratch.remove(partial)
    _fsync_dir(dest.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
