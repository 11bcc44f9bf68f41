"""What an in-process build leaves of its caller's process: torch's random state.

A build never needs the caller's random numbers (its own examples and calibration come
from seeded generators), but code it runs draws from torch's global generator: torchao's
``convert_pt2e`` traces its rewrite patterns on random examples. A Python caller's next
``torch.randn`` should not depend on whether a build ran in between.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def random_state_left_alone() -> Iterator[None]:
    """torch's CPU generator, and each CUDA device's where CUDA was in use before, as
    they were (``torch.random.fork_rng``); CUDA is not started to ask."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        yield
