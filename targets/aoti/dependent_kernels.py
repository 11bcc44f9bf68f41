"""Inductor's own Triton kernels started as programmatic dependent launches in cuda builds.

A batch-1 CNN runs 100-200 kernels of 1-3 us a call, and each plain launch waits for the
kernel before to drain: about 2.2 us a kernel against 0.4 us as a dependent launch.
Inductor writes its kernels for that under
``triton.enable_pdl`` (``gdc_wait`` before an access, ``gdc_launch_dependents`` after the
last load), but AOTInductor starts every kernel plainly. While a cuda build compiles with
that setting (``dependent_kernels()``), three things change:

- Every Inductor kernel waits before its first global access. Inductor waits only where
  the access touches what the scheduler's previous node wrote or read; in the library's
  stream a kernel can follow other work (an alignment copy, a kernel that never waited and
  so may finish before the one before it), and a read of a buffer written two kernels back
  would race. Waiting first keeps stream order: a dependent kernel touches memory only
  after everything before it has finished, and finishes only after it too.
- A kernel is started as a dependent launch only if its compiled settings say
  ``launch_pdl`` (Inductor's pointwise and reduction kernels; not its templates, not
  user or extern kernels) and its source shows the protocol: a ``gdc_wait`` at the top
  level of its body before any line that names one of its pointer arguments
  (``follows_protocol``). Its launch line calls ``launchKernelDependent``; every other
  kernel keeps ``launchKernel``.
- The library's launcher gets ``launchKernelDependent`` (kernels/dependent_launch.py's
  rewrite: on compute capability 9 or later and unless ``EDGE_EXPORTER_PLAIN_LAUNCHES`` is
  set where it runs; otherwise a plain launch, where ``gdc_wait`` returns at once).

Where the torch in use lacks any of the places changed here, the setting stays off
(``inductor_settings()`` is empty) and the build is as before.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import torch

from targets.aoti.kernels.dependent_launch import (
    PLAIN_ENV,
    dependent_launch_here,
    with_dependent_launches,
)

SETTING = "triton.enable_pdl"
WAIT = "tl.extra.cuda.gdc_wait()"
_LAUNCH = "launchKernel("
_DEPENDENT = "launchKernelDependent("
_DEF = re.compile(r"^(\s*)def (\w+)\(([^)]*)\)\s*:", re.M)
launched: list[str] = []  # the kernels the library compiled last starts as dependent launches


def inductor_settings() -> dict:
    """The Inductor setting under which its kernels wait for the kernel before, where this
    torch, this GPU and the switch allow dependent launches; {} elsewhere."""
    if (torch.version.hip is not None or os.environ.get(PLAIN_ENV)
            or not torch.cuda.is_available()
            or not dependent_launch_here(torch.device("cuda")) or _patch_points() is None):
        return {}
    return {SETTING: True}


def follows_protocol(source: str, kernel_name: str, triton_meta: dict | None) -> bool:
    """Whether the Triton kernel ``kernel_name`` in ``source`` may start before the kernel
    ahead of it finishes: compiled with ``launch_pdl``, and waiting, unconditionally, before
    any line of its body names a pointer or descriptor argument (``triton_meta``'s
    signature)."""
    if not triton_meta or not triton_meta.get("launch_pdl"):
        return False
    signature = triton_meta.get("signature") or {}
    pointers = [name for name, kind in signature.items()
                if isinstance(kind, str) and (kind.startswith("*") or "desc" in kind.lower())]
    found = next((m for m in _DEF.finditer(source) if m.group(2) == kernel_name), None)
    if found is None or not pointers:
        return False
    body = [line for line in source[found.end():].splitlines() if line.strip()]
    if not body:
        return False
    indent = _indent(body[0])
    named = re.compile(r"\b(" + "|".join(map(re.escape, pointers)) + r")\b")
    for line in body:
        if _indent(line) <= len(found.group(1)):
            return False  # the function ended before any wait
        if line.strip() == WAIT:
            return _indent(line) == indent
        if named.search(line):
            return False
    return False


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class _DependentLaunchLines:
    """A code buffer that writes a kernel's launch line as a dependent launch."""

    def __init__(self, buffer) -> None:
        self._buffer = buffer
        self.rewritten = 0

    def __getattr__(self, name: str):
        return getattr(self._buffer, name)

    def writeline(self, line) -> None:
        if isinstance(line, str) and line.startswith(_LAUNCH):
            line, self.rewritten = _DEPENDENT + line[len(_LAUNCH):], self.rewritten + 1
        self._buffer.writeline(line)


def _patch_points():
    """(TritonKernel, DeferredTritonCallWrapper, CUDADeviceOpOverrides) where this torch
    has each place changed here as expected, else None."""
    try:
        from torch._inductor.codegen.cpp_wrapper_gpu import DeferredTritonCallWrapper
        from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
        from torch._inductor.codegen.triton import TritonKernel
    except ImportError:
        return None
    config = torch._inductor.config.triton
    if not (hasattr(config, "enable_pdl")
            and hasattr(TritonKernel, "_handle_pdl_before_access")
            and getattr(TritonKernel, "GDC_WAIT", None) == WAIT
            and hasattr(DeferredTritonCallWrapper, "generate_launch_kernel")
            and with_dependent_launches(CUDADeviceOpOverrides().kernel_driver()) is not None):
        return None
    return TritonKernel, DeferredTritonCallWrapper, CUDADeviceOpOverrides


@contextlib.contextmanager
def dependent_kernels() -> Iterator[bool]:
    """While a cuda build compiles (entered after kernels/dependent_launch.py's
    ``dependent_launches()``, whose launcher rewrite it extends): with ``SETTING`` on,
    Inductor's kernels wait before their first access and those that follow the protocol
    start as dependent launches (``launched`` names them). Yields whether this is in place."""
    points = _patch_points() if inductor_settings() else None
    if points is None:
        yield False
        return
    kernel, call_wrapper, overrides = points
    saved = [(kernel, "_handle_pdl_before_access"),
             (call_wrapper, "generate_launch_kernel"), (overrides, "kernel_driver")]
    originals = [getattr(owner, name) for owner, name in saved]
    kernel._handle_pdl_before_access = _waiting_first(originals[0])
    call_wrapper.generate_launch_kernel = _launching_dependent(originals[1])
    overrides.kernel_driver = _with_dependent_launcher(originals[2])
    launched.clear()
    try:
        yield True
    finally:
        for (owner, name), original in zip(saved, originals):
            setattr(owner, name, original)


def _on() -> bool:
    return bool(getattr(torch._inductor.config.triton, "enable_pdl", False))


def _waiting_first(original):
    """Inductor's wait placement, told there is no previous node: it then waits before
    every access, and keeps the first wait (``_filter_pdl``)."""
    def handle(self, *args, **kwargs):
        from torch._inductor.virtualized import V
        scheduler = getattr(V.graph, "scheduler", None)
        if scheduler is None:
            return original(self, *args, **kwargs)
        previous, scheduler.previous_node = getattr(scheduler, "previous_node", None), None
        try:
            return original(self, *args, **kwargs)
        finally:
            scheduler.previous_node = previous
    return handle


def _launching_dependent(original):
    def generate_launch_kernel(self, prefix, wrapper, kernel_var_name, params, *rest, **kw):
        body = self.kernel_name_to_body.get(self.kernel_name, "")
        if not (_on() and follows_protocol(body, self.kernel_name, params.get("triton_meta"))):
            return original(self, prefix, wrapper, kernel_var_name, params, *rest, **kw)
        lines = _DependentLaunchLines(prefix)
        result = original(self, lines, wrapper, kernel_var_name, params, *rest, **kw)
        if lines.rewritten:
            launched.append(self.kernel_name)
        return result
    return generate_launch_kernel


def _with_dependent_launcher(original):
    """The launcher with ``launchKernelDependent``: rewritten here unless
    ``dependent_launches()`` has rewritten it already."""
    def kernel_driver(self) -> str:
        source = original(self)
        if not _on() or "launchKernelPlain(" in source:
            return source
        return with_dependent_launches(source) or source
    return kernel_driver
