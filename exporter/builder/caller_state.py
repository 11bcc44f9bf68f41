"""What an in-process build leaves of its caller's process: torch's random state and the
root logger.

A build never needs the caller's random numbers (its own examples and calibration come
from seeded generators), but code it runs draws from torch's global generator: torchao's
``convert_pt2e`` traces its rewrite patterns on random examples. A Python caller's next
``torch.randn`` should not depend on whether a build ran in between.

Libraries a build runs configure logging for the whole process: ONNX Runtime's quantizer
logs through ``logging.warning`` and ExecuTorch's XNNPACK partitioner calls
``logging.basicConfig`` when imported, each giving a root logger without handlers a stderr
one for good, after which a caller's own ``basicConfig`` does nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def left_alone() -> Iterator[None]:
    """Both, as a build through the Python API leaves them."""
    with random_state_left_alone(), root_logger_left_alone():
        yield


@contextlib.contextmanager
def random_state_left_alone() -> Iterator[None]:
    """torch's CPU generator, and each CUDA device's where CUDA was in use before, as
    they were (``torch.random.fork_rng``); CUDA is not started to ask."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        yield


@contextlib.contextmanager
def root_logger_left_alone() -> Iterator[None]:
    """A root logger that had no handlers has none after, and its level back; one the
    caller configured is theirs (a library's ``basicConfig`` leaves it alone)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        if not handlers:
            for handler in [h for h in root.handlers if h not in handlers]:
                root.removeHandler(handler)
                handler.close()
            root.setLevel(level)
