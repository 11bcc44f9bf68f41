"""AOTInductor's C++ wrapper declares each size/stride array in the buffer that uses it,
also when that buffer is freed and another takes its address."""

from __future__ import annotations

from itertools import count

import pytest

from targets.aoti.wrapper_arrays import arrays_declared


def _wrapper():
    """The C++ wrapper with only what naming an array needs (a whole one needs a graph)."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch.utils._ordered_set import OrderedSet
    wrapper = CppWrapperCpu.__new__(CppWrapperCpu)
    wrapper.int_array_id = count()
    wrapper.declared_int_array_vars = OrderedSet()
    wrapper.codegen_int_array_var_cache = {}
    return wrapper


def _declared_in_own_buffer(wrapper, buffers: int) -> int:
    """How many of ``buffers`` short-lived buffers, each naming the same array, hold the
    declaration of the name they were given."""
    from torch._inductor.codegen.common import IndentedBuffer
    found = 0
    for _ in range(buffers):
        buffer = IndentedBuffer()
        name = wrapper.codegen_int_array_var("{1L, 32L, 1L, 64L}", buffer.writeline,
                                             known_statically=True)
        found += f"{name}[]" in buffer.getvalue()
        del buffer  # freed at once (no cycle): the next buffer can take its address
    return found


def test_every_short_lived_buffer_declares_the_array_it_names():
    wrapper = _wrapper()
    with arrays_declared() as active:
        try:
            found = _declared_in_own_buffer(wrapper, 50)
        except AttributeError:
            pytest.skip("this torch's wrapper names arrays otherwise")
    assert active
    assert found == 50


def test_the_wrapper_is_as_torch_left_it_afterwards():
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    before = CppWrapperCpu.__dict__["codegen_int_array_var"]
    with arrays_declared():
        assert CppWrapperCpu.__dict__["codegen_int_array_var"] is not before
    assert CppWrapperCpu.__dict__["codegen_int_array_var"] is before
