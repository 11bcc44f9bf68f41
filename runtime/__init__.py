"""The device-side runtime: load an artifact and run it.

This package is the bottom floor. It must never import ``exporter``, ``passes``
or ``targets`` (tests/test_layering.py checks it), so a device can install it
alone with ``pip install '.[runtime]'``.

    import runtime
    program = runtime.load("model.artifact")
    outputs = program(x)                    # model's own output structure
    named = program.run({"x": x})           # {output name: tensor}
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

from runtime.archive import ArtifactReader, Limits
from runtime.arena import Arena
from runtime.consistency import check_dataflow, check_host_devices
from runtime.cuda_graphs import GraphReplay
from runtime.errors import (ArtifactError, CompatibilityError, ExecutionError,
                            InputMismatchError, ToolchainError, UserInputError)
from runtime.executors import create_executor
from runtime.hostinfo import check_requirements
from runtime.manifest import Manifest
from runtime.program import Program
from runtime.shared_weights import SharedWeights

__all__ = ["ArtifactError", "CompatibilityError", "ExecutionError", "InputMismatchError",
           "Limits", "Manifest", "Program", "ToolchainError", "UserInputError", "load",
           "read_manifest"]

log = logging.getLogger(__name__)


def read_manifest(path: str | Path, *, limits: Limits = Limits()) -> Manifest:
    """Verify the whole artifact (names, sizes, hashes) and return its manifest."""
    with ArtifactReader.open(path, limits) as reader:
        return Manifest.from_dict(reader.manifest, where=str(path))


def load(path: str | Path, *, limits: Limits = Limits(), cuda_graphs: bool = True,
         static_outputs: bool = False, max_graphs: int = 8, arenas: bool = True,
         trusted_keys: Iterable[str | Path | bytes] = ()) -> Program:
    """Verify, check compatibility, then load every partition from a private verified copy.

    GPU partitions of static or dynamic shape are captured into CUDA graphs and
    replayed (one graph per seen input shape, at most ``max_graphs``) unless
    ``cuda_graphs=False``. Outputs are fresh tensors unless ``static_outputs=True``,
    which returns the graph's own buffers (overwritten by the next call).
    ``arenas=False`` ignores the build's memory plan: every tensor comes from the
    allocator (to compare, or where the plan's preallocation is not wanted).
    With ``trusted_keys`` (Ed25519 public keys, PEM), the artifact must be signed by one
    of them (runtime/signing.py), checked before anything in it is parsed or loaded."""
    where = str(path)
    with ArtifactReader.open(path, limits) as reader:
        if trusted_keys:
            from runtime.signing import verify
            verify(reader, trusted_keys)
        manifest = Manifest.from_dict(reader.manifest, where=where)
        views = [manifest, *(manifest.entry_point(name) for name in manifest.entry_points)]
        for view in views:
            check_dataflow(view, where=where)
            check_host_devices(view, where=where)
        check_requirements(manifest.requirements, where=where)
        # Compiled libraries are opened from this private copy, never from a
        # user-writable location; on Linux the mapping outlives the files, so the
        # copy is removed when the reader closes. Only the partitions' own entries are
        # copied: an artifact padded with unused entries costs no disk.
        private_dir = reader.extract_private(_partition_entries(manifest, reader.names()))
        shared = SharedWeights.from_manifest(manifest.shared_weights, private_dir, where=where)
        # A generating artifact's decode step is captured whole (runtime/generation/
        # decode_graph.py), so its partitions are not captured one by one; prefill, whose
        # length varies per prompt, runs without graphs.
        generating = manifest.generation is not None
        programs = [_program(view, reader, private_dir, where, shared,
                             cuda_graphs=cuda_graphs and not generating,
                             single_threaded=cuda_graphs and generating,
                             static_outputs=static_outputs, max_graphs=max_graphs,
                             arenas=arenas) for view in views]
        main = programs[0]
        main.decode_graphs = cuda_graphs and generating
        main.entry_points = dict(zip(manifest.entry_points, programs[1:]))
        if manifest.generation is not None:
            from runtime.generation.tokenizer import read_tokenizer
            main.tokenizer_json = read_tokenizer(manifest.generation, reader, where=where)
    log.debug("loaded %s: %d program(s)", where, len(programs))
    return main


def _program(manifest: Manifest, reader: ArtifactReader, private_dir: Path, where: str,
             shared: SharedWeights | None, *, cuda_graphs: bool, single_threaded: bool,
             static_outputs: bool, max_graphs: int, arenas: bool) -> Program:
    planned = (manifest.memory_plan or {}).get("arenas") or {} if arenas else {}
    if not isinstance(planned, dict):
        raise ArtifactError("the memory plan's arenas are not an object", where=where)
    allocated = {device: Arena(device, plan, where=where) for device, plan in planned.items()}
    executors = []
    for partition in manifest.partitions:
        graphed = cuda_graphs and partition.device == "cuda"
        execute = create_executor(partition, private_dir, where=where,
                                  entries=set(reader.names()),
                                  run_single_threaded=graphed or single_threaded,
                                  shared=shared,
                                  arena=allocated.get(partition.device))
        if graphed:
            execute = GraphReplay(execute, partition.device, max_graphs, static_outputs)
        executors.append(execute)
    return Program(manifest, executors, source=where, arenas=allocated)


def _partition_entries(manifest: Manifest, names: list[str]) -> list[str]:
    folders = tuple(f"partitions/{p.name}/" for p in manifest.all_partitions())
    store = set(SharedWeights.entries(manifest.shared_weights))
    return [name for name in names if name.startswith(folders) or name in store]
