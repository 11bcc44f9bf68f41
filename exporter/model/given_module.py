"""The caller's module and example inputs, left as they were given to ``exporter.build``.

A build puts the model in eval mode and moves it to the build's device, in place (torch's
``Module.eval`` and ``Module.to`` change the module itself), for torch.export to trace it
there; and it runs the model's forward (capture, the eager reference, calibration), which
may write into its buffers (a call counter, a static cache) and its inputs. A function that
only reads a model should leave it as it was, as torch.onnx.export and torch.export do.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def left_as_given(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Within: the module may be moved and switched to eval mode, and its forward run;
    its buffers are the build's own copies, so what a forward writes stays there. After,
    even on an error: every submodule's training flag, parameter (and its ``.grad``) and
    buffer is the one it had, holding the very tensors it held (no copy back from the
    device)."""
    # Moved in place and restored in a `finally`, not copied: the host keeps one copy of
    # the weights, and a build of a spec it loaded itself frees it when moving to the GPU.
    modules = list(module.modules())
    modes = [(m, m.training) for m in modules]
    # ``.data`` aliases the storage, which ``Module.to`` replaces rather than overwrites
    params = [(m, name, p, p.data, p.grad, None if p.grad is None else p.grad.data)
              for m in modules for name, p in m._parameters.items() if p is not None]
    buffers = [(m, name, b) for m in modules for name, b in m._buffers.items()
               if b is not None]
    own: dict[int, torch.Tensor] = {}  # buffers are small next to the weights: copied
    for m, name, buffer in buffers:
        if id(buffer) not in own:  # one buffer registered twice stays one
            own[id(buffer)] = buffer.clone()
        m._buffers[name] = own[id(buffer)]
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training
        for m, name, param, data, grad, grad_data in params:
            m._parameters[name] = param  # a swap-on-conversion ``to`` made a new one
            param.data = data
            if grad is not None:
                grad.data = grad_data
            param.grad = grad
        for m, name, buffer in buffers:
            m._buffers[name] = buffer


# The scope of factories_left_as_given: where each module a spec's factory made is handed
_FACTORY_MODULES: contextvars.ContextVar[contextlib.ExitStack | None] = \
    contextvars.ContextVar("factory_modules", default=None)


@contextlib.contextmanager
def factories_left_as_given() -> Iterator[None]:
    """Within: each module a spec's factory returns (``load_spec``) is left as given
    until the scope ends, as a module passed in is. A ``package.module:make`` may hand
    out a model its caller also holds (a module-level instance); the Python API cannot
    tell, so it gives every one back. ``exporter build`` does not: its process ends with
    the build, and a cuda build then frees the host copy of the weights as it moves them."""
    with contextlib.ExitStack() as stack:
        token = _FACTORY_MODULES.set(stack)
        try:
            yield
        finally:
            _FACTORY_MODULES.reset(token)


def factory_made(module: torch.nn.Module) -> torch.nn.Module:
    """A spec's factory's module, before the build changes it: given back at the end of
    the enclosing ``factories_left_as_given``, if any."""
    stack = _FACTORY_MODULES.get()
    if stack is not None:
        stack.enter_context(left_as_given(module))
    return module


def inputs_of_its_own(tree, device: str | torch.device | None = None):
    """Every tensor in ``tree`` copied (onto ``device``, if given): a forward that writes
    into its inputs then writes into the build's copies, never the caller's; examples are
    small next to the model."""
    return torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().to(device, copy=True), tree)


def converted_copy(module: torch.nn.Module, device: str | torch.device | None = None,
                   dtype: torch.dtype | None = None) -> torch.nn.Module:
    """``copy.deepcopy(module).to(device, dtype)`` (floating tensors only take ``dtype``)
    without the deep copy's own tensors: each parameter and buffer is converted straight
    from the original, so a model cast for the build is not first held twice at its own
    dtype (a 1.1B model's float32 weights: 4.4 GB more)."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) in memo:  # tied weights stay tied
            continue
        made = tensor.detach().to(device, dtype if tensor.is_floating_point() else None,
                                  copy=True)
        memo[id(tensor)] = (torch.nn.Parameter(made, requires_grad=tensor.requires_grad)
                            if isinstance(tensor, torch.nn.Parameter) else made)
    return copy.deepcopy(module, memo)
