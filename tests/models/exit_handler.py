"""A module that registers an exit handler when imported (tests/exporter/matrix/test_matrix_warm.py):
it writes the file $WARM_EXIT_MARK names, so a test sees whether a process ran it."""

import atexit
import os
from pathlib import Path


@atexit.register
def _mark() -> None:
    Path(os.environ["WARM_EXIT_MARK"]).write_text(str(os.getpid()))
