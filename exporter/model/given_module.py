"""The caller's module, left as it was given to ``exporter.build``.

A build puts the model in eval mode and moves it to the build's device, in place (torch's
``Module.eval`` and ``Module.to`` change the module itself), for torch.export to trace it
there. A function that only reads a model should not leave it on a GPU or out of training
mode, as torch.onnx.export and torch.export themselves do not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def left_as_given(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Within: the module may be moved and switched to eval mode. After, even on an
    error: every submodule's training flag, parameter and buffer is the one it had,
    holding the very tensors it held (no copy back from the device)."""
    modules = list(module.modules())
    modes = [(m, m.training) for m in modules]
    # ``.data`` aliases the storage, which ``Module.to`` replaces rather than overwrites
    params = [(m, name, p, p.data) for m in modules
              for name, p in m._parameters.items() if p is not None]
    buffers = [(m, name, b) for m in modules for name, b in m._buffers.items()
               if b is not None]
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training
        for m, name, param, data in params:
            m._parameters[name] = param  # a swap-on-conversion ``to`` made a new one
            param.data = data
        for m, name, buffer in buffers:
            m._buffers[name] = buffer
