"""``Program``: a loaded artifact. It checks inputs and runs the partitions in order.

Executors (one per backend kind) only turn tensors into tensors; scheduling,
input checks and the hand-off of tensors between partitions live here. Torch tensors in
and out (numpy arrays are taken too); on a device without torch, ``runtime.load`` gives
an ArrayProgram instead (runtime/program/array_program.py). What both share is in
runtime/program/base.py.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils._pytree import tree_map

from runtime.executors.base import Executor
from runtime.format.manifest import Manifest, TensorSpec
from runtime.memory.arena import Arena
from runtime.program.base import ProgramBase, check_inputs, shape_rules, shapes_fit
from runtime.program.flat_inputs import flatten_inputs
from runtime.program.outputs import decode_tree

__all__ = ["Executor", "Program", "check_inputs"]


class Program(ProgramBase):
    def __init__(self, manifest: Manifest, executors: Sequence[Executor], *, source: str,
                 arenas: Mapping[str, Arena] | None = None,
                 entry_points: Mapping[str, Program] | None = None,
                 tokenizer_json: str | None = None, decode_graphs: bool = False) -> None:
        super().__init__(manifest, executors, source=source)
        # A generating artifact's further programs (``decode``) and tokenizer, which
        # ``generate`` drives (runtime/generation/).
        self.entry_points: dict[str, Program] = dict(entry_points or {})
        self.tokenizer_json = tokenizer_json
        self.decode_graphs = decode_graphs  # the decode step replays as one CUDA graph
        self._generator = None
        self._generation_settings = None
        self._generator_lock = threading.Lock()  # made once, whichever thread asks first
        # A bound method: calling an object's __call__ costs a lookup more per run.
        self._fast_check = _FastCheck(manifest.signature.inputs).check
        # Per device, the preallocated bytes that hand-offs between devices are copied into
        # (runtime/memory/arena.py); what lives there is never handed to the caller.
        self._arenas = dict(arenas or {})
        self._arena_storages = {a.storage.untyped_storage().data_ptr()
                                for a in self._arenas.values()}
        # Resolved once: this loop runs per call, and small models feel microseconds.
        # ``__call__`` too: calling an object looks it up on its class each time.
        calls = [execute.__call__ for execute in self._executors]
        self._steps = [(call, p.inputs, p.outputs, torch.device(p.device),
                        self._arenas.get(p.device))
                       for p, call in zip(manifest.partitions, calls)]
        # The common case, one partition that takes the program's inputs and gives its
        # outputs in order, skips the named-value bookkeeping (a few us per call).
        only = manifest.partitions[0] if len(manifest.partitions) == 1 else None
        self._single = (only is not None and list(only.inputs) == self._input_names
                        and list(only.outputs) == self._output_names)
        # ...and when that partition runs on the CPU and gets CPU tensors, nothing moves.
        self._cpu_executor = calls[0] if self._single and only.device == "cpu" else None
        # ...and whether it can leave out what it stored into its inputs (run_in_place)
        self._in_place = _in_place(only, calls[0], self._executors[0],
                                   self._output_names) if self._single else None

    def generate(self, prompt: Any, max_new_tokens: int | None = None, **options: Any) -> Any:
        """Generate from a prompt (text, or token ids): see runtime/generation/generator.py
        for the options (sampling, stop strings, streaming). Artifacts built with
        ``--task text-generation`` only. Safe from many threads at once: calls take turns
        on the program's one KV cache, each giving the tokens it gives alone (a cache per
        concurrent call measured no faster: docs/trust.md, "Threads")."""
        return self.generator.generate(prompt, max_new_tokens, **options)

    def generation_settings(self) -> Any:
        """The generation section, read and checked against the programs once
        (runtime/generation/settings.py): ``runtime.load`` asks first, ``generate`` reuses it."""
        if self._generation_settings is None:
            from runtime.generation.settings import GenerationSettings
            self._generation_settings = GenerationSettings.read(self)
        return self._generation_settings

    @property
    def generator(self) -> Any:
        """The ``Generator`` behind ``generate`` (its cache, steps and teacher forcing;
        its docstring says what it promises to threads)."""
        with self._generator_lock:
            if self._generator is None:
                from runtime.generation.generator import Generator
                self._generator = Generator(self)
            return self._generator

    @contextlib.contextmanager
    def timing_partitions(self, clock: Callable[[Callable[[], Any], str], float]
                          ) -> Iterator[dict[str, dict]]:
        """Within the block, every run times each partition's executor call with
        ``clock(call, device) -> ms`` (``exporter bench`` passes device events on a GPU,
        perf_counter on the CPU) and keeps the partition's last inputs. Yields
        ``{partition: {"ms": [one per call], "inputs": [tensors]}}``. The fast paths are
        off meanwhile (every run goes through the partition loop); not for use from two
        threads at once."""
        record = {p.name: {"ms": [], "inputs": []} for p in self.manifest.partitions}

        def timed(call: Callable, name: str, device: str) -> Callable:
            def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
                result: list = []
                record[name]["ms"].append(clock(lambda: result.extend(call(inputs)), device))
                record[name]["inputs"] = inputs
                return result
            return run

        saved = self._steps, self._single, self._cpu_executor, self._in_place
        self._steps = [(timed(call, p.name, p.device), *rest)
                       for (call, *rest), p in zip(self._steps, self.manifest.partitions)]
        self._single, self._cpu_executor, self._in_place = False, None, None
        try:
            yield record
        finally:
            self._steps, self._single, self._cpu_executor, self._in_place = saved

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call like the original model; tensors are taken from args/kwargs in pytree order,
        and the outputs come back in the model's structure (dicts, tuples, lists)."""
        flat = flatten_inputs(args, kwargs)
        if any(type(leaf) is np.ndarray for leaf in flat.leaves):
            # taken as tensors sharing their memory (dropped as constants otherwise)
            flat = flatten_inputs(*tree_map(_as_tensor, (args, kwargs)))
        outputs = self.run(flat.tensors)
        return decode_tree(self.manifest.signature.output_tree, list(outputs.values()))

    def run(self, inputs: Mapping[str, torch.Tensor] | Sequence[torch.Tensor], *,
            output_device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
        """Run on named or positional inputs; returns outputs by name. Numpy arrays are
        taken as tensors sharing their memory.

        Outputs land on ``output_device``, by default the device of the first input."""
        # Hot path: a list of CPU tensors shaped as last time, one CPU partition.
        on_cpu = self._fast_check(inputs) if type(inputs) is list else None
        if on_cpu and self._cpu_executor is not None and (
                output_device is None or output_device == "cpu" or output_device == _CPU):
            return dict(zip(self._output_names, self._cpu_executor(inputs)))
        return self._run_general(inputs, output_device, on_cpu)

    def run_in_place(self, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``run`` for a caller that reads where the program stored its results: outputs a
        partition wrote into its inputs' memory (an ONNX generating step's new cache rows,
        ``OnnxRuntimeMeta.stored_outputs``) are left out rather than handed back as views
        of those inputs. Other programs, and other inputs than the fast path takes, give
        every output, as ``run``."""
        if self._in_place is not None:
            run, names, on_cpu = self._in_place
            here = self._fast_check(inputs)
            # the GPU's rows were stored only where the cache itself went in, not a copy
            if here is not None and (here if on_cpu else
                                     all(tensor.is_cuda for tensor in inputs)):
                return dict(zip(names, run(inputs)))
        return self.run(inputs)

    def _run_general(self, inputs: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
                     output_device: str | torch.device | None, on_cpu: bool | None
                     ) -> dict[str, torch.Tensor]:
        tensors = self._order_inputs(inputs)
        if on_cpu is None:
            tensors = [_as_tensor(t) for t in tensors]
            on_cpu = self._fast_check(tensors)
            if on_cpu is None:  # the slow path explains what is wrong
                check_inputs(self.manifest.signature.inputs, tensors, where=self.source)
        if output_device is None:
            output_device = tensors[0].device if tensors else torch.device("cpu")
        elif not isinstance(output_device, torch.device):
            output_device = _device(output_device)
        if on_cpu and self._cpu_executor is not None and output_device == _CPU:
            return dict(zip(self._output_names, self._cpu_executor(tensors)))
        if self._single:
            execute, _, _, device, _ = self._steps[0]
            outputs = execute([_on(t, device) for t in tensors])
            return {name: _on(t, output_device) for name, t in zip(self._output_names, outputs)}
        values: dict[str, torch.Tensor] = dict(zip(self._input_names, tensors))
        copies: dict[tuple[str, torch.device], torch.Tensor] = {}  # one per tensor and device
        for execute, input_names, output_names, device, arena in self._steps:
            args = []
            for name in input_names:
                value = values[name]
                if arena is not None and value.device.type != device.type:
                    moved = copies.get((name, device))
                    if moved is None:
                        key = "handoff/" + name
                        moved = (arena.copy_into(key, value) if key in arena.slots
                                 else _on(value, device))
                        copies[(name, device)] = moved
                    value = moved
                args.append(_on(value, device))
            values.update(zip(output_names, execute(args)))
        return {name: self._owned(_on(values[name], output_device)) for name in self._output_names}

    def _owned(self, tensor: torch.Tensor) -> torch.Tensor:
        """A backend may return a view of its input as an output; when that input sits in
        an arena, the caller gets a copy (the next call overwrites the arena)."""
        if self._arena_storages and tensor.untyped_storage().data_ptr() in self._arena_storages:
            return tensor.clone()
        return tensor


_CPU = torch.device("cpu")


def _in_place(partition, call: Callable, executor: Executor, output_names: list[str]
              ) -> tuple[Callable, list[str], bool] | None:
    """(a run giving the outputs not stored into the inputs, their names, whether it
    takes CPU inputs) for the one partition of a program, or None where it stores none.
    An ONNX CPU step's executor returns its stored rows as views, which ``computing``
    leaves out; a GPU library (AotiMeta.stored_outputs) returns them as computed too, and
    they are dropped here."""
    if partition.device == "cpu":
        stored = getattr(call, "stored_outputs", None)
        if stored is None:
            return None
        return call.computing, [n for i, n in enumerate(output_names) if i not in stored], True
    stored = set(getattr(executor, "stored_outputs", None) or ())
    if not stored or partition.device != "cuda":
        return None
    kept = [i for i in range(len(output_names)) if i not in stored]

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        outputs = call(inputs)
        return [outputs[i] for i in kept]
    return run, [output_names[i] for i in kept], False


def _as_tensor(value: Any) -> Any:
    if type(value) is not np.ndarray or value.dtype.kind not in "biufc":
        return value  # objects, strings: the input check names what it got
    if not value.dtype.isnative or any(stride < 0 for stride in value.strides):
        value = np.ascontiguousarray(value, value.dtype.newbyteorder("="))  # torch takes neither
    return torch.from_numpy(value)


@functools.lru_cache(maxsize=16)
def _device(name: str) -> torch.device:
    return torch.device(name)  # parsing "cuda:0" per call would cost more than the lookup


def _on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move only when needed: ``.to`` costs microseconds even when it is a no-op."""
    here = tensor.device
    if here == device or (here.type == device.type and device.index is None):
        return tensor
    return tensor.to(device)


class _FastCheck:
    """The signature check on the hot path, precompiled. Returns None when an input does
    not fit, else whether every input is on the CPU. (Runs per call, where a small model
    feels each attribute read: hence ``is_cpu`` rather than ``device.type``, and the
    memo of the shapes that passed last time; docs/design-notes.md.)"""

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        self.rules = shape_rules(specs)
        self.dtypes = [getattr(torch, spec.dtype, None) for spec in specs]
        self.passed: list = [None] * len(specs)  # the shapes of the last inputs that fitted

    def check(self, tensors: Sequence[Any]) -> bool | None:
        # CPU tensors shaped as last time: one loop, no list built.
        try:
            for tensor, dtype, shape in zip(tensors, self.dtypes, self.passed):
                if tensor.dtype is not dtype or not tensor.is_cpu or tensor.shape != shape:
                    break
            else:
                if len(tensors) == len(self.dtypes):
                    return True
        except AttributeError:  # not a tensor: the descriptive check says which
            return None
        return self._check(tensors)

    def _check(self, tensors: Sequence[Any]) -> bool | None:
        if len(tensors) != len(self.rules):
            return None
        try:
            shapes = [tensor.shape for tensor in tensors]
            on_cpu = True
            for dtype, tensor in zip(self.dtypes, tensors):
                if tensor.dtype is not dtype:
                    return None
                if not tensor.is_cpu:
                    if not tensor.is_cuda:
                        return None
                    on_cpu = False
        except AttributeError:
            return None
        if shapes != self.passed:
            if not shapes_fit(self.rules, shapes):
                return None
            self.passed = shapes
        return on_cpu
