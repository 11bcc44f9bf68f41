"""AOTInductor's C++ wrapper kept compiling: each size or stride array it names is declared
where it is used.

The wrapper names an array once per (its contents, the buffer it is written to), the buffer
told apart by ``id()``. A view passed to a kernel has its arrays written to a buffer of
its own, freed once the call's line is written; a later buffer at the same address then
takes the earlier one's name without a declaration, and the wrapper fails to compile
("'int_array_N' was not declared in this scope"; torch 2.11 and 2.13 do, torch fixed it
later the same way). ``arrays_declared()`` keeps every such buffer alive while a build
compiles, so no two share an address.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator


@contextlib.contextmanager
def arrays_declared() -> Iterator[bool]:
    """While a build compiles: every buffer the wrapper writes an array to is kept until
    the end. Yields whether this torch's wrapper has the place changed here."""
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:
        yield False
        return
    original = CppWrapperCpu.__dict__.get("codegen_int_array_var")
    if original is None:
        yield False
        return
    kept: list = []

    @functools.wraps(original)
    def codegen_int_array_var(self, int_array, *args, **kwargs):
        kept.append(kwargs.get("writeline", args[0] if args else None))
        return original(self, int_array, *args, **kwargs)

    CppWrapperCpu.codegen_int_array_var = codegen_int_array_var
    try:
        yield True
    finally:
        CppWrapperCpu.codegen_int_array_var = original
        kept.clear()
