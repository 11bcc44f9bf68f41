"""Lines a native library writes to stderr itself, dropped while it loads.

TVM logs every memory scope of a Relax VM it loads as a warning ("executable.cc:340:
Warning: Scope Loaded:", 4 lines for an XLNet), and ExecuTorch its CPU probing when its
thread pool starts ("[cpuinfo_utils.cpp:71] Reading file ...", 5 lines at the first
program's load), both from C++ and with no switch to turn them off; a user saw them before
every `exporter run`. While the block runs, file descriptor 2 goes to a temporary file;
after it, every line but the noise is written to stderr (native/src/backends do the same).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Callable, Iterator


@contextlib.contextmanager
def native_stderr(handle: Callable[[list[str]], None]) -> Iterator[None]:
    """While the block runs, file descriptor 2 (what C++ libraries write past Python) goes
    to a temporary file; after it, ``handle`` gets the lines written there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            handle(held.read().decode(errors="replace").splitlines(True))


def lines_dropped(is_noise: Callable[[str], bool]) -> contextlib.AbstractContextManager[None]:
    """native_stderr, every line but the noise written back to stderr."""
    def write_kept(lines: list[str]) -> None:
        kept = [line for line in lines if not is_noise(line)]
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
    return native_stderr(write_kept)
