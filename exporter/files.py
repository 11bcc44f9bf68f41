"""Files the exporter writes for the user are replaced whole or not at all."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def written_whole(out: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``out`` to write to. When the block ends it replaces
    ``out`` in one rename; on any error it is removed, so ``out`` is never half-written and
    a good older file survives. ``suffix`` keeps an extension that a writer reads the
    format from (matplotlib's savefig)."""
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}{suffix}")
    try:
        yield partial
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
