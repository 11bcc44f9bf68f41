"""The matrix's output folder (``--out``): new, empty, or one that ``exporter matrix`` made
itself, which a marker file at its root says. A folder holding anything else is refused
before any work; in its own folder the matrix replaces only what it writes (its tables,
cell configs, artifact links) and removes only its own markers of cells that were running.

What it writes there: ``MARKER``, matrix.json/.csv/.html, ``cells/ID.toml``,
``artifacts/ID.artifact``, ``running/ID.json`` while a cell runs, and ``cache/`` unless
``--cache`` names another folder.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from exporter.errors import UserInputError
from exporter.versions import JSON_VERSION, TOOLCHAIN_NAME, toolchain_version

log = logging.getLogger(__name__)

MARKER = ".exporter-matrix.json"
TOOL = "exporter matrix"
SUBFOLDERS = ("cells", "running", "artifacts")
TABLES = ("matrix.json", "matrix.csv", "matrix.html")
_RUNNING = re.compile(r"(?P<cell>[A-Za-z0-9][A-Za-z0-9_.-]*)\.json(?P<tmp>\.\d+\.tmp)?")
_SHOWN = 5  # foreign entries named in the error


def check(out: Path, cell_ids: list[str], *, own_cache: bool) -> None:
    """Refuse ``out`` (UserInputError, exit 2) unless the matrix may write there; reads
    only. ``own_cache``: the cache is OUT/cache (no --cache)."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out} is a file, not a folder",
                             hint="give a folder for matrix.json, the cells and the artifacts")
    if not out.exists() or is_ours(out):
        _check_entries(out, cell_ids, own_cache)
        return
    foreign = sorted(entry.name for entry in out.iterdir())
    if foreign:
        shown = ", ".join(foreign[:_SHOWN]) + (f" and {len(foreign) - _SHOWN} more"
                                               if len(foreign) > _SHOWN else "")
        raise UserInputError(
            f"--out {out} holds files that `exporter matrix` did not write ({shown})",
            where=str(out), hint="give a new or empty folder, or the folder of an earlier "
                                 f"matrix (it has a {MARKER} file); nothing was changed")


def is_ours(out: Path) -> bool:
    """Whether ``out`` holds the marker an earlier matrix wrote."""
    marker = out / MARKER
    if marker.is_symlink() or not marker.is_file():
        return False
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("tool") == TOOL


def claim(out: Path, *, own_cache: bool) -> None:
    """Make ``out`` the matrix's (its subfolders and marker) and clear the markers of cells
    a run that was cut short left; after ``check``."""
    try:
        for sub in SUBFOLDERS + (("cache",) if own_cache else ()):
            (out / sub).mkdir(parents=True, exist_ok=True)
        if not is_ours(out):
            (out / MARKER).write_text(json.dumps({
                "tool": TOOL, "toolchain": TOOLCHAIN_NAME, "version": toolchain_version(),
                "json_version": JSON_VERSION}, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserInputError(f"cannot write the matrix's folder --out {out} ({exc.strerror})",
                             where=str(out), hint="give a folder you can write") from exc
    for entry in (out / "running").iterdir():
        if _stale_marker(entry):
            entry.unlink()


def _check_entries(out: Path, cell_ids: list[str], own_cache: bool) -> None:
    """Where the matrix writes a file, nothing else stands (a folder, a FIFO), and
    where it makes a folder, no file: said before any work, not as a crash mid-run."""
    folders = [out / sub for sub in SUBFOLDERS + (("cache",) if own_cache else ())]
    files = [out / MARKER, *(out / name for name in TABLES)]
    for cell in cell_ids:
        files += [out / "cells" / f"{cell}.toml", out / "artifacts" / f"{cell}.artifact",
                  out / "running" / f"{cell}.json"]
    odd = [f"{path} is not a folder" for path in folders if path.exists() and not path.is_dir()]
    odd += [f"{path} is not a regular file" for path in files
            if path.exists() and not path.is_file()]
    if odd:
        raise UserInputError(
            f"--out {out} has {len(odd)} entr{'y' if len(odd) == 1 else 'ies'} where the "
            "matrix writes", where=str(out), details=odd,
            hint="move them away (the matrix never removes what it did not write) or give "
                 "another --out")


def _stale_marker(entry: Path) -> bool:
    """A marker of a running cell (or its half-written temporary) that this matrix wrote:
    a regular file of that name, holding that cell's marker."""
    match = _RUNNING.fullmatch(entry.name)
    if match is None or entry.is_symlink() or not entry.is_file():
        return False
    if match["tmp"]:
        return True
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("cell") == match["cell"] and "worker_pid" in data
