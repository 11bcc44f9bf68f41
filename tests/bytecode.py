"""Bytecode for the site-packages modules the tier's collection imports, compiled once
before pytest-xdist's workers start (`make test`, `make test-slow`).

uv installs no bytecode: Python writes it on first import (docs/testing.md). Both
workers collect at once, import the same ~3,750 modules and so compiled each of them
twice (about 20 CPU s each). bytecode_modules.txt lists them, a line per folder of
site-packages (`FOLDER: module module ...`); `python -m tests.bytecode` compiles them in
one process per core. A fresh venv on the 2-core box, quiet: the two collections took
29.4 s; 7.2 s of compiling and then 11.2 s with it. (Every .py of those folders, 5,079
files: 13.9 s of compiling, 26 CPU s.)

The list is `python -m tests.bytecode record` in a fresh venv (`make install` on a
clean clone) after one `pytest --collect-only`: the modules that have bytecode then. A
stale list only compiles a little more or less than the collection needs.
"""

from __future__ import annotations

import os
import py_compile
import sys
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MODULES = Path(__file__).with_name("bytecode_modules.txt")


def _compile(path: str) -> None:
    try:  # quiet=2: a file that does not compile is the import's to report
        py_compile.compile(path, quiet=2)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    site = Path(sysconfig.get_paths()["purelib"])
    if argv[:1] == ["record"]:
        folders: dict[str, set[str]] = {}
        for pyc in site.rglob("__pycache__/*.pyc"):
            folder = pyc.parent.parent
            if (folder / f"{pyc.name.split('.')[0]}.py").is_file():
                folders.setdefault(str(folder.relative_to(site)), set()).add(
                    pyc.name.split(".")[0])
        MODULES.write_text("".join(f"{f}: {' '.join(sorted(m))}\n"
                                   for f, m in sorted(folders.items())))
        return 0
    files = [str(site / folder / f"{name}.py") for line in MODULES.read_text().splitlines()
             for folder, _, names in [line.partition(": ")] for name in names.split()]
    files = [f for f in files if os.path.isfile(f)]
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(_compile, files, chunksize=64))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
