"""ExecuTorch's runtime through its pybinding alone (``executorch.extension.pybindings._C``).

``executorch.runtime`` and ``portable_lib`` wrap the same extension, but importing either
imports ``executorch.exir`` (for a warning class): the exporter, torch._inductor and the
edge dialect's op tables, about 7 CPU s in every process that only runs a .pte. This is
the part of ``executorch.runtime`` the runtime uses, on the extension itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch  # noqa: F401 - loads libtorch, which the extension links against


def _ext():
    from executorch.extension.pybindings import _C
    return _C


def verification_levels():
    """ExecuTorch's Verification enum (Minimal, InternalConsistency)."""
    return _ext().Verification


class Method:
    """A loaded method: ``execute(inputs)`` and its ``metadata`` (MethodMeta)."""

    def __init__(self, method) -> None:
        self._method = method

    def execute(self, inputs: list[Any]) -> list[Any]:
        return self._method(inputs)

    @property
    def metadata(self):
        return self._method.method_meta()


class Program:
    """A loaded .pte program: its method names, methods loaded on request."""

    def __init__(self, program, data: bytes | None) -> None:
        self._program, self._data = program, data  # the buffer outlives the program
        self.method_names = {program.get_method_name(i) for i in range(program.num_methods())}

    def load_method(self, name: str) -> Method:
        return Method(self._program.load_method(name))

    def write_etdump_result_to_file(self, etdump_path: str, debug_path: str) -> None:
        self._program.write_etdump_result_to_file(etdump_path, debug_path)


def load_program(data: Path | bytes, *, verification=None, enable_etdump: bool = False,
                 debug_buffer_size: int = 0) -> Program:
    """A program from a .pte path or its bytes, verified with ``verification``
    (InternalConsistency unless given). RuntimeError/ValueError where ExecuTorch refuses it."""
    ext = _ext()
    level = ext.Verification.InternalConsistency if verification is None else verification
    options = dict(enable_etdump=enable_etdump, debug_buffer_size=debug_buffer_size,
                   program_verification=level, data_path=None)
    if isinstance(data, bytes):
        return Program(ext._load_program_from_buffer(data, **options), data)
    return Program(ext._load_program(str(data), **options), None)
