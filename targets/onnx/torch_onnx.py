"""Calling torch.onnx on a partition: what the onnx target wraps around the call.

Its registry quiet, the program's input guards off, and a report folder for a failure.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path

from torch.export import ExportedProgram

from runtime import scratch
from targets.base import LowerOptions

REPORT_DIR_PREFIX = "exporter-onnx-"


@contextlib.contextmanager
def quiet_registry():
    """Building torch.onnx's registry warns once per torchvision op when torchvision is
    absent (four lines per partition); models that use no torchvision op don't care."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def without_input_guards(program: ExportedProgram):
    """torch.onnx decomposes ``program.module()``, which calls a ``_guards_fn`` checking the
    inputs where the program keeps example inputs; on a re-captured partition with a
    derived dim it failed ("'NoneType' object has no attribute 'size'": a mixture of
    experts' partitions moved to the CPU fallback). The ONNX graph needs no input guards."""
    kept = program.example_inputs
    program.example_inputs = None
    try:
        yield
    finally:
        program.example_inputs = kept


def new_report_dir(options: LowerOptions) -> Path:
    parent = options.log_dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    return scratch.make_dir(f"{REPORT_DIR_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-", parent)
