"""``Program``: a loaded artifact. It checks inputs and runs the partitions in order.

Executors (one per backend kind) only turn tensors into tensors; scheduling,
input checks and the hand-off of tensors between partitions live here.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from runtime.arena import Arena
from runtime.errors import InputMismatchError
from runtime.executors.base import Executor
from runtime.flat_inputs import flatten_inputs
from runtime.manifest import Manifest, TensorSpec
from runtime.outputs import decode_tree

__all__ = ["Executor", "Program", "check_inputs"]


class Program:
    def __init__(self, manifest: Manifest, executors: Sequence[Executor], *, source: str,
                 arenas: Mapping[str, Arena] | None = None) -> None:
        self.manifest = manifest
        self.source = source
        # A generating artifact's further programs (``decode``) and tokenizer: runtime.load
        # fills them in; ``generate`` drives them (runtime/generation/).
        self.entry_points: dict[str, Program] = {}
        self.tokenizer_json: str | None = None
        self.decode_graphs = False  # the decode step replays as one CUDA graph (runtime.load)
        self._generator = None
        self._executors = list(executors)
        # A bound method: calling an object's __call__ costs ~45 ns more per run.
        self._fast_check = _FastCheck(manifest.signature.inputs).check
        # Per device, the preallocated bytes that hand-offs between devices are copied into
        # (runtime/arena.py); what lives there is never handed to the caller.
        self._arenas = dict(arenas or {})
        self._arena_storages = {a.storage.untyped_storage().data_ptr()
                                for a in self._arenas.values()}
        # Resolved once: this loop runs per call, and 0.1 ms models feel microseconds.
        # ``__call__`` too: calling an object looks it up on its class each time (~45 ns).
        calls = [execute.__call__ for execute in self._executors]
        self._steps = [(call, p.inputs, p.outputs, torch.device(p.device),
                        self._arenas.get(p.device))
                       for p, call in zip(manifest.partitions, calls)]
        self._input_names = self.input_names
        self._output_names = self.output_names
        # The common case, one partition that takes the program's inputs and gives its
        # outputs in order, skips the named-value bookkeeping (a few us per call).
        only = manifest.partitions[0] if len(manifest.partitions) == 1 else None
        self._single = (only is not None and list(only.inputs) == self._input_names
                        and list(only.outputs) == self._output_names)
        # ...and when that partition runs on the CPU and gets CPU tensors, nothing moves.
        self._cpu_executor = calls[0] if self._single and only.device == "cpu" else None

    def __repr__(self) -> str:
        """One line: where it came from, what to call it with, what it returns, and which
        backends run its partitions."""
        signature = self.manifest.signature
        backends: dict[str, int] = {}
        for partition in self.manifest.partitions:
            key = f"{partition.backend}@{partition.device}"
            backends[key] = backends.get(key, 0) + 1
        return (f"<Program {self.source!r} target={self.manifest.target} "
                f"inputs=[{', '.join(s.describe() for s in signature.inputs)}] "
                f"outputs=[{', '.join(s.describe() for s in signature.outputs)}] "
                f"partitions=[{', '.join(f'{k} x{n}' for k, n in backends.items())}]>")

    @property
    def executors(self) -> list[Executor]:
        """One executor per partition, in run order (read-only view)."""
        return list(self._executors)

    @property
    def backend_reports(self) -> dict[str, dict]:
        """What each partition's backend said at load (e.g. ONNX Runtime's providers and
        node placement), by partition name: CPU fallback inside a backend is never silent.
        Backends with nothing to say are left out; every report has a ``placement`` (None
        where the backend cannot say), which `exporter run` prints."""
        reports = {}
        for partition, execute in zip(self.manifest.partitions, self._executors):
            report = execute.report()
            if report:
                reports[partition.name] = dict(report, placement=report.get("placement"))
        return reports

    @property
    def memory_report(self) -> dict[str, dict]:
        """Per device: the arena's bytes and how many planned tensors live there (hand-off
        copies, and CPU-fallback intermediates that run in it)."""
        slots = sum(execute.arena_slots for execute in self._executors)
        return {device: {"arena_bytes": arena.nbytes, "planned": len(arena.slots),
                         "handoffs": sum(key.startswith("handoff/") for key in arena.slots),
                         "fallback_slots_in_use": slots if device == "cpu" else 0}
                for device, arena in self._arenas.items()}

    def generate(self, prompt: Any, max_new_tokens: int = 128, **options: Any) -> Any:
        """Generate from a prompt (text, or token ids): see runtime/generation/generator.py
        for the options (sampling, stop strings, streaming). Artifacts built with
        ``--task text-generation`` only."""
        return self.generator.generate(prompt, max_new_tokens, **options)

    @property
    def generator(self) -> Any:
        """The ``Generator`` behind ``generate`` (its cache, steps and teacher forcing)."""
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

        saved = self._steps, self._single, self._cpu_executor
        self._steps = [(timed(call, p.name, p.device), *rest)
                       for (call, *rest), p in zip(self._steps, self.manifest.partitions)]
        self._single, self._cpu_executor = False, None
        try:
            yield record
        finally:
            self._steps, self._single, self._cpu_executor = saved

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.manifest.signature.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.manifest.signature.outputs]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call like the original model; tensors are taken from args/kwargs in pytree order,
        and the outputs come back in the model's structure (dicts, tuples, lists)."""
        flat = flatten_inputs(args, kwargs)
        arrays = [type(leaf).__name__ for leaf in flat.leaves
                  if type(leaf).__module__ == "numpy" and hasattr(leaf, "shape")]
        if arrays:  # dropped as constants otherwise, and then "0 inputs were given"
            raise InputMismatchError(
                f"the artifact takes torch tensors; {len(arrays)} input(s) are numpy "
                f"{arrays[0]}", where=self.source,
                hint="wrap them with torch.from_numpy(...), or use program.run with tensors")
        outputs = self.run(flat.tensors)
        return decode_tree(self.manifest.signature.output_tree, list(outputs.values()))

    def run(self, inputs: Mapping[str, torch.Tensor] | Sequence[torch.Tensor], *,
            output_device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
        """Run on named or positional inputs; returns outputs by name.

        Outputs land on ``output_device``, by default the device of the first input."""
        # Hot path: a list of CPU tensors shaped as last time, one CPU partition.
        on_cpu = self._fast_check(inputs) if type(inputs) is list else None
        if on_cpu and self._cpu_executor is not None and (
                output_device is None or output_device == "cpu" or output_device == _CPU):
            return dict(zip(self._output_names, self._cpu_executor(inputs)))
        return self._run_general(inputs, output_device, on_cpu)

    def _run_general(self, inputs: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
                     output_device: str | torch.device | None, on_cpu: bool | None
                     ) -> dict[str, torch.Tensor]:
        tensors = self._order_inputs(inputs)
        if on_cpu is None:
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

    def _order_inputs(self, inputs: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]
                      ) -> list[torch.Tensor]:
        names = self._input_names
        if type(inputs) in (list, tuple) and len(inputs) == len(names):
            return inputs
        if isinstance(inputs, Mapping):
            missing = [n for n in names if n not in inputs]
            unexpected = sorted(set(inputs) - set(names))
            if missing or unexpected:
                details = [f"missing input '{n}'" for n in missing]
                details += [f"unexpected input '{n}'" for n in unexpected]
                raise InputMismatchError(
                    "the inputs given do not match the artifact's input names", where=self.source,
                    details=details, hint=f"give exactly these inputs: {', '.join(names)}")
            return [inputs[n] for n in names]
        tensors = list(inputs)
        if len(tensors) != len(names):
            raise InputMismatchError(
                f"the artifact takes {len(names)} input tensor(s) and {len(tensors)} were given",
                where=self.source, details=[spec.describe() for spec in self.manifest.signature.inputs],
                hint="pass one tensor per input, in this order")
        return tensors


_CPU = torch.device("cpu")


@functools.lru_cache(maxsize=16)
def _device(name: str) -> torch.device:
    return torch.device(name)  # parsing "cuda:0" costs about 1 us, per call without the cache


def _on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move only when needed: ``.to`` costs microseconds even when it is a no-op."""
    here = tensor.device
    if here == device or (here.type == device.type and device.index is None):
        return tensor
    return tensor.to(device)


class _FastCheck:
    """The signature check on the hot path, precompiled. Returns None when an input does
    not fit, else whether every input is on the CPU. (Runs per call: a 0.1 ms ONNX model
    spent 14 us in the descriptive check; a 5 us one still feels each attribute read,
    hence ``is_cpu`` rather than ``device.type``, 0.08 against 0.45 us here, and the
    memo of the shapes that passed last time.)"""

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        self.rules = [(getattr(torch, spec.dtype, None), len(spec.shape),
                       [(axis, d.size, d.symbol, d.min, d.max) for axis, d in enumerate(spec.shape)])
                      for spec in specs]
        self.dtypes = [dtype for dtype, _, _ in self.rules]
        self.passed: list = [None] * len(specs)  # the shapes of the last inputs that fitted

    def check(self, tensors: Sequence[Any]) -> bool | None:
        # CPU tensors shaped as last time: one loop, no list built (0.3 us less).
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
            if not self._shapes_fit(shapes):
                return None
            self.passed = shapes
        return on_cpu

    def _shapes_fit(self, shapes: list) -> bool:
        symbols: dict[str, int] = {}
        for (_, rank, dims), shape in zip(self.rules, shapes):
            if len(shape) != rank:
                return False
            for axis, size, symbol, low, high in dims:
                got = shape[axis]
                if size is not None:
                    if got != size:
                        return False
                elif not low <= got <= high or symbols.setdefault(symbol, got) != got:
                    return False
        return True


def check_inputs(specs: Sequence[TensorSpec], tensors: Sequence[Any], *, where: str) -> None:
    """Raise one InputMismatchError listing every input that does not fit its spec."""
    problems: list[str] = []
    symbols: dict[str, tuple[int, str]] = {}  # symbol -> (value, first input that set it)
    for spec, tensor in zip(specs, tensors):
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"input '{spec.name}': expected a tensor, got {type(tensor).__name__}")
            continue
        problems += _check_one(spec, tensor, symbols)
    if problems:
        raise InputMismatchError(
            f"{len(problems)} problem(s) with the inputs", where=where, details=problems,
            hint="the artifact expects " + "; ".join(s.describe() for s in specs))


def _check_one(spec: TensorSpec, tensor: torch.Tensor, symbols: dict) -> list[str]:
    problems = []
    got_dtype = str(tensor.dtype).removeprefix("torch.")
    if got_dtype != spec.dtype:
        problems.append(f"input '{spec.name}': expected dtype {spec.dtype}, got {got_dtype}")
    if tensor.device.type not in ("cpu", "cuda"):
        problems.append(f"input '{spec.name}': tensors on device '{tensor.device}' are not "
                        "supported (give cpu or cuda tensors)")
    if tensor.dim() != len(spec.shape):
        return problems + [f"input '{spec.name}': expected rank {len(spec.shape)} "
                           f"({spec.describe()}), got shape {tuple(tensor.shape)}"]
    for axis, (dim, got) in enumerate(zip(spec.shape, tensor.shape)):
        if not dim.is_dynamic:
            if got != dim.size:
                problems.append(f"input '{spec.name}' dim {axis}: expected {dim.size}, got {got}")
            continue
        if not dim.min <= got <= dim.max:
            problems.append(f"input '{spec.name}' dim {axis} ({dim.symbol}): {got} is outside "
                            f"the built range {dim.min}..{dim.max}")
        seen = symbols.setdefault(dim.symbol, (got, spec.name))
        if seen[0] != got:
            problems.append(f"input '{spec.name}' dim {axis} ({dim.symbol}) is {got} but input "
                            f"'{seen[1]}' has {dim.symbol}={seen[0]}; they must be equal")
    return problems
