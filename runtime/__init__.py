"""The device-side runtime: load an artifact and run it.

This package is the bottom floor. It must never import ``exporter``, ``passes``
or ``targets`` (tests/system/test_layering.py checks it), so a device can install it
alone: the runtime wheel in an ``exporter package`` bundle, with what its artifacts need.

    import runtime
    program = runtime.load("model.artifact")
    outputs = program(x)                    # model's own output structure
    named = program.run({"x": x})           # {output name: tensor}

Torch tensors in and out; on a device without torch, an artifact whose partitions all
run on ONNX Runtime or TVM (runtime/program/requires.py) takes and gives numpy arrays instead
(an ArrayProgram), and torch is never imported. Torch is imported only where the
artifact needs it, or where it is installed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from runtime.errors import (ArtifactError, CompatibilityError, ExecutionError,
                            InputMismatchError, ToolchainError, UserInputError)
from runtime.format.archive import ArtifactReader, Limits
from runtime.format.manifest import Manifest

__all__ = ["ArrayProgram", "ArtifactError", "CompatibilityError", "ExecutionError",
           "InputMismatchError", "Limits", "Manifest", "Program", "ToolchainError",
           "UserInputError", "load", "read_manifest"]

if TYPE_CHECKING:
    from runtime.program.array_program import ArrayProgram
    from runtime.program.torch_program import Program

log = logging.getLogger(__name__)


def __getattr__(name: str):
    """``runtime.Program`` imports torch, ``ArrayProgram`` numpy: only when asked for (PEP
    562), so a tool that only reads manifests (`exporter inspect`) starts without them."""
    if name == "Program":
        from runtime.program.torch_program import Program
        return Program
    if name == "ArrayProgram":
        from runtime.program.array_program import ArrayProgram
        return ArrayProgram
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")


def read_manifest(path: str | Path, *, limits: Limits = Limits()) -> Manifest:
    """Verify the whole artifact (names, sizes, hashes) and return its manifest."""
    with ArtifactReader.open(path, limits) as reader:
        return Manifest.from_dict(reader.manifest, where=str(path))


def load(path: str | Path, *, limits: Limits = Limits(), cuda_graphs: bool = True,
         static_outputs: bool = False, max_graphs: int = 8, arenas: bool = True,
         trusted_keys: Iterable[str | Path | bytes] = ()) -> Program | ArrayProgram:
    """Verify, check compatibility, then load every partition from a private verified copy.

    GPU partitions of static or dynamic shape are captured into CUDA graphs and
    replayed (one graph per seen input shape, at most ``max_graphs``) unless
    ``cuda_graphs=False``. Outputs are fresh tensors unless ``static_outputs=True``,
    which returns the graph's own buffers (overwritten by the next call).
    ``arenas=False`` ignores the build's memory plan: every tensor comes from the
    allocator (to compare, or where the plan's preallocation is not wanted).
    With ``trusted_keys`` (Ed25519 public keys, PEM), the artifact must be signed by one
    of them (runtime/format/signing.py), checked before anything in it is parsed or loaded.
    Without torch installed, an artifact that does not need it loads as an ArrayProgram
    (numpy arrays in and out; the options about CUDA and arenas have nothing to do)."""
    from runtime.executors import create_executor, holds_native_code
    from runtime.format.consistency import (check_dataflow, check_host_devices,
                                            check_requirements)
    from runtime.program.array_program import ArrayProgram
    from runtime.program.requires import torch_or_none, torch_reasons

    where = str(path)
    with ArtifactReader.open(path, limits) as reader:
        if trusted_keys:
            from runtime.format.signing import verify
            verify(reader, trusted_keys)
        manifest = Manifest.from_dict(reader.manifest, where=where)
        views = [manifest, *(manifest.entry_point(name) for name in manifest.entry_points)]
        for view in views:
            check_dataflow(view, where=where)
        torch = torch_or_none(manifest, where=where)
        check_requirements(manifest.requirements, where=where,
                           torch=torch if torch_reasons(manifest) else None,
                           native=[p for p in manifest.all_partitions() if holds_native_code(p)])
        for view in views:
            check_host_devices(view, where=where)
        # Compiled libraries are opened from this private copy, never from a
        # user-writable location; on Linux the mapping outlives the files, so the
        # copy is removed when the reader closes. Only the partitions' own entries are
        # copied: an artifact padded with unused entries costs no disk, and the shared
        # weight store streams from the archive into memory (a model's size less disk).
        private_dir = reader.extract_private(_partition_entries(manifest, reader.names()))
        if torch is None:
            executors = [create_executor(partition, private_dir, where=where,
                                         entries=set(reader.names()), arrays=True)
                         for partition in manifest.partitions]
            log.debug("loaded %s without torch: %d partition(s)", where, len(executors))
            return ArrayProgram(manifest, executors, source=where)
        return _tensor_programs(manifest, views, reader, private_dir, where,
                                cuda_graphs=cuda_graphs, max_graphs=max_graphs,
                                static_outputs=static_outputs, arenas=arenas)


def _tensor_programs(manifest: Manifest, views: list[Manifest], reader: ArtifactReader,
                     private_dir: Path, where: str, *, cuda_graphs: bool, max_graphs: int,
                     static_outputs: bool, arenas: bool) -> Program:
    """The main program, its entry points (a generating artifact's decode) on the one
    shared weight store, and what generation needs."""
    from runtime.memory.shared_weights import SharedWeights
    from runtime.program.torch_program import Program

    shared = SharedWeights.from_manifest(manifest.shared_weights, reader, where=where)
    # A generating artifact's decode step is captured whole (runtime/generation/
    # decode_graph.py), so its partitions are not captured one by one; prefill, whose
    # length varies per prompt, runs without graphs.
    generating = manifest.generation is not None
    programs = []
    for view in views:
        allocated = _arenas(view, where) if arenas else {}
        executors = [_tensor_executor(partition, private_dir, reader, allocated, where,
                                      cuda_graphs and not generating, max_graphs,
                                      static_outputs, shared,
                                      single_threaded=cuda_graphs and generating)
                     for partition in view.partitions]
        programs.append((view, executors, allocated))
    (_, executors, allocated), *entries = programs
    main = Program(manifest, executors, source=where, arenas=allocated,
                   entry_points={name: Program(view, steps, source=where, arenas=planned)
                                 for name, (view, steps, planned)
                                 in zip(manifest.entry_points, entries)},
                   tokenizer_json=_tokenizer(manifest, reader, where),
                   decode_graphs=cuda_graphs and generating)
    if generating:  # a section that contradicts the programs is refused here, not at generate
        main.generation_settings()
    log.debug("loaded %s: %d partition(s)%s", where, sum(len(v.partitions) for v in views),
              f" in {len(views)} entry points" if len(views) > 1 else "")
    return main


def _tokenizer(manifest: Manifest, reader: ArtifactReader, where: str) -> str | None:
    if manifest.generation is None:
        return None
    from runtime.generation.tokenizer import read_tokenizer
    return read_tokenizer(manifest.generation.tokenizer, reader, where=where)


def _arenas(manifest: Manifest, where: str) -> dict:
    from runtime.memory.arena import Arena
    planned = (manifest.memory_plan or {}).get("arenas") or {}
    if not isinstance(planned, dict):
        raise ArtifactError("the memory plan's arenas are not an object", where=where)
    return {device: Arena(device, plan, where=where) for device, plan in planned.items()}


def _tensor_executor(partition, private_dir: Path, reader: ArtifactReader, arenas: dict,
                     where: str, cuda_graphs: bool, max_graphs: int, static_outputs: bool,
                     shared, *, single_threaded: bool = False):
    from runtime.executors import create_executor
    graphed = cuda_graphs and partition.device == "cuda"
    execute = create_executor(partition, private_dir, where=where, entries=set(reader.names()),
                              run_single_threaded=graphed or single_threaded, shared=shared,
                              arena=arenas.get(partition.device))
    if graphed:
        from runtime.program.cuda_graphs import GraphReplay
        execute = GraphReplay(execute, partition.device, max_graphs, static_outputs)
    return execute


def _partition_entries(manifest: Manifest, names: list[str]) -> list[str]:
    folders = tuple(f"partitions/{p.name}/" for p in manifest.all_partitions())
    return [name for name in names if name.startswith(folders)]
