"""What an in-process build leaves of its caller's process: torch's random state, the
root logger and the Inductor settings torchao sets.

A build never needs the caller's random numbers (its own examples and calibration come
from seeded generators), but code it runs draws from torch's global generator: torchao's
``convert_pt2e`` traces its rewrite patterns on random examples. A Python caller's next
``torch.randn`` should not depend on whether a build ran in between.

Libraries a build runs configure logging for the whole process: ONNX Runtime's quantizer
logs through ``logging.warning`` and ExecuTorch's XNNPACK partitioner calls
``logging.basicConfig`` when imported, each giving a root logger without handlers a stderr
one for good, after which a caller's own ``basicConfig`` does nothing.

torchao's weight-only configs (``Int8WeightOnlyConfig``, ``Int4WeightOnlyConfig``) set
Inductor options for the rest of the process when they quantize
(``recommended_inductor_config_setter``): a caller's later ``torch.compile``, and a
later build in the same process, compiled with coordinate-descent tuning on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def left_alone(quantizes: bool = False) -> Iterator[None]:
    """All three, as a build through the Python API leaves them (Inductor's settings
    where the build ``quantizes``: only torchao's quantizing sets them, and only such a
    build imports Inductor as it starts, as torchao would)."""
    inductor = inductor_settings_left_alone() if quantizes else contextlib.nullcontext()
    with random_state_left_alone(), root_logger_left_alone(), inductor:
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


# torchao.quantization.utils.recommended_inductor_config_setter's settings
TORCHAO_INDUCTOR_SETTINGS = ("coordinate_descent_tuning",
                             "coordinate_descent_check_all_directions",
                             "force_fuse_int_mm_with_mul", "fx_graph_cache",
                             "triton.unique_kernel_names")


@contextlib.contextmanager
def inductor_settings_left_alone() -> Iterator[None]:
    """The settings torchao's quantizing sets, as they were; inside, the build sees what
    torchao set, as a build in a fresh process does (its lowering follows the quantize
    pass)."""
    from torch._inductor import config
    # patch() puts back on exit the values it found, whatever was set in between
    with config.patch({name: functools.reduce(getattr, name.split("."), config)
                       for name in TORCHAO_INDUCTOR_SETTINGS}):
        yield
