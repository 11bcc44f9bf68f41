"""The ONNX Runtime executor's hot path: IO binding over the input tensors' own memory.

Why not ``session.run``: it wraps every input in a numpy array, converts each into an
OrtValue, allocates fresh outputs and wraps each in a numpy view, which on a small model
is a large part of the call. Here the inputs are bound by pointer and rebound only when a
pointer, shape or dtype changes, and ORT writes into the same output buffers every call,
which are copied out (docs/design-notes.md).

Output modes, per thread and input shapes:
- copy: outputs stay bound between calls; ORT reuses their memory, so each result is a
  copy (a view would be overwritten by the next call). For small outputs only.
- view: outputs rebound unallocated before each call; ORT allocates, the result is a
  view of that buffer. For outputs over ``COPY_LIMIT`` (copying 256 KiB costs more than
  a fresh buffer) and for outputs whose shape the input shapes do not fix (a kept buffer
  of the old shape would make ORT fail).
The first call with new input shapes runs in view mode and picks the mode from the
outputs it got.

In-place outputs (a KV cache that GroupQueryAttention updates where it lies) are bound
onto the memory of their input whenever that input is bound, and never returned; a
session with them always runs in view mode (copy mode's ``copy_outputs_to_cpu`` would
copy the whole cache out).

Anything else (GPU tensors, strided views, dtypes without a numpy twin) takes the plain
path given as ``fallback``.
"""

from __future__ import annotations

import re
import threading
from typing import Callable

import torch

from runtime.format.dtypes import NUMPY_TWINS, numpy_dtype

COPY_LIMIT = 64 * 1024  # bytes of all outputs; copy vs fresh buffer crossed at 64-256 KiB

# torch dtype -> the numpy scalar type ORT's binding takes as the element type
_ELEMENT_TYPES = {getattr(torch, name): numpy_dtype(name).type for name in NUMPY_TWINS}


class _ThreadState:
    """One thread's binding: ORT's IOBinding is not safe to share between threads."""
    __slots__ = ("io", "bound", "copy_out")

    def __init__(self, io, inputs: int, outputs: list[str], cpu) -> None:
        self.io = io
        for name in outputs:  # in the session's order, which get_outputs() then keeps:
            io.bind_output(name, cpu)  # rebinding a name later keeps its place
        # (data_ptr, shape, dtype) per input as bound; the placeholder matches no tensor.
        self.bound: list[tuple] = [(None, None, None)] * inputs
        self.copy_out = False


def bound_runner(ort, session, options, fallback: Callable[[list], list],
                 in_place: dict[str, int] | None = None) -> Callable[[list], list]:
    """The executor's callable: list of input tensors -> list of output tensors.
    ``in_place``: {output name: index of the input whose memory it is written into}.

    A closure rather than a class: calling an instance costs a method lookup per call,
    and the executor is called once per run of a model that may take microseconds."""
    raw = session._sess  # the binding under InferenceSession (see onnxruntime.py)
    run_bound = raw.run_with_iobinding
    new_binding = ort.capi._pybind_state.SessionIOBinding
    cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
    input_names = [i.name for i in session.get_inputs()]
    all_outputs = [o.name for o in session.get_outputs()]
    output_names, returned, onto_input = _split_outputs(all_outputs, in_place or {})
    shapes_follow = outputs_follow_inputs(session) and not in_place
    local = threading.local()

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        try:
            state = local.state
        except AttributeError:
            state = local.state = _ThreadState(new_binding(raw), len(input_names),
                                               all_outputs, cpu)
        if state.copy_out and len(inputs) == len(input_names):
            for tensor, (pointer, shape, dtype) in zip(inputs, state.bound):
                # Strides are not in the key: a transposed view can share pointer, shape
                # and dtype with the tensor bound last time, so only dense tensors pass.
                if (not tensor.is_cpu or tensor.data_ptr() != pointer or tensor.shape != shape
                        or tensor.dtype is not dtype or not tensor.is_contiguous()):
                    break
            else:
                return run_copy(state)
        return run_rebound(state, inputs)

    def run_rebound(state: _ThreadState, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Bind the inputs that changed, then run; the first run with new input shapes
        picks the output mode."""
        if len(inputs) != len(input_names):
            return fallback(inputs)  # which raises, naming the counts
        new_shapes = False
        for index, tensor in enumerate(inputs):
            element = _ELEMENT_TYPES.get(tensor.dtype)
            if element is None or not tensor.is_cpu or not tensor.is_contiguous():
                return fallback(inputs)
            key = (tensor.data_ptr(), tensor.shape, tensor.dtype)
            if key != state.bound[index]:
                state.io.bind_input(input_names[index], cpu, element, key[1], key[0])
                for name in onto_input.get(index, ()):
                    state.io.bind_output(name, cpu, element, key[1], key[0])
                new_shapes = new_shapes or key[1] != state.bound[index][1]
                state.bound[index] = key
        if new_shapes or not state.copy_out:
            return run_view(state, choose_mode=new_shapes)
        return run_copy(state)

    def run_copy(state: _ThreadState) -> list[torch.Tensor]:
        try:
            run_bound(state.io, options)
        except Exception:  # e.g. an output shape that follows the data after all
            state.copy_out = False
            return run_view(state, choose_mode=False)
        return list(map(torch.from_numpy, state.io.copy_outputs_to_cpu()))

    def run_view(state: _ThreadState, *, choose_mode: bool) -> list[torch.Tensor]:
        io = state.io
        for name in output_names:
            io.bind_output(name, cpu)  # unallocated: ORT allocates a fresh buffer
        run_bound(io, options)
        values = io.get_outputs()
        # By index: iterating pybind's vector ends in a costly C++ stop_iteration.
        arrays = [values[i].numpy() for i in returned]
        if choose_mode:
            state.copy_out = shapes_follow and sum(a.nbytes for a in arrays) <= COPY_LIMIT
            if state.copy_out:  # let go of the buffers just handed out
                for name in output_names:
                    io.bind_output(name, cpu)
        return list(map(torch.from_numpy, arrays))

    return run


def _split_outputs(outputs: list[str], in_place: dict[str, int]
                   ) -> tuple[list[str], list[int], dict[int, list[str]]]:
    """(the outputs returned, their indices among all, {input index: the in-place outputs
    bound onto that input's memory})."""
    returned = [name for name in outputs if name not in in_place]
    onto_input: dict[int, list[str]] = {}
    for name, index in in_place.items():
        onto_input.setdefault(index, []).append(name)
    return returned, [outputs.index(name) for name in returned], onto_input


_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def outputs_follow_inputs(session) -> bool:
    """Whether equal input shapes give equal output shapes: every output dim is a number or
    an expression of the inputs' named dims ("2*s0"; an unbacked "u0" is not)."""
    known: set[str] = set()
    for arg in session.get_inputs():
        for dim in arg.shape:
            if isinstance(dim, str):
                known.update(_SYMBOL.findall(dim))
    for arg in session.get_outputs():
        for dim in arg.shape:
            if dim is None or (isinstance(dim, str) and not set(_SYMBOL.findall(dim)) <= known):
                return False
    return True
