"""Checks across a manifest's parts, made at load so that an inconsistent (hand-edited,
hostile or corrupt) manifest is refused there, with exit 2, and never fails later as a
KeyError at the first call.

Field-by-field shape checks are in runtime/format/manifest.py; these are the ones that need
several fields (or the archive's entry list, or this host) at once.

``check_requirements`` runs before any compiled library is loaded: a library built for an
ISA the CPU lacks would die with SIGILL, and one built for another torch may crash in its
constructor; both become a CompatibilityError that names both sides. What asks torch (its
version, the GPU) applies only to artifacts whose partitions run on torch
(runtime/program/requires.py).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from runtime.errors import ArtifactError, CompatibilityError
from runtime.format.manifest import Manifest, Partition, Requirements
from runtime.host import hostinfo
from runtime.host.platforms import host_platform

_HINT = "rebuild the artifact with `exporter build`"


def check_dataflow(manifest: Manifest, *, where: str) -> None:
    """Every partition input exists when its partition runs, every program output is
    made, names are unique, and the output tree indexes exactly the outputs."""
    problems: list[str] = []
    inputs = [t.name for t in manifest.signature.inputs]
    outputs = [t.name for t in manifest.signature.outputs]
    for what, names in (("input", inputs), ("output", outputs),
                        ("partition", [p.name for p in manifest.partitions])):
        repeated = sorted({n for n in names if names.count(n) > 1})
        problems += [f"the {what} name {n!r} is used twice" for n in repeated]
    if not manifest.partitions:
        problems.append("there are no partitions")
    known = set(inputs)
    for partition in manifest.partitions:
        problems += [f"partition {partition.name!r} reads {name!r}, which no program input "
                     "or earlier partition gives" for name in partition.inputs
                     if name not in known]
        known.update(partition.outputs)
    problems += [f"the program output {name!r} is made by no partition" for name in outputs
                 if name not in known]
    tree_problem = _tree_problem(manifest.signature.output_tree, len(outputs))
    if tree_problem:
        problems.append(f"the output tree {tree_problem}")
    if problems:
        raise ArtifactError("the manifest is inconsistent", where=where, details=problems,
                            hint=_HINT)


def _tree_problem(tree: Any, count: int) -> str | None:
    """Why ``tree`` (runtime/program/outputs.py's JSON) cannot index ``count`` outputs
    exactly once."""
    if tree is None:
        return None
    leaves: list[int] = []

    def walk(node: Any, depth: int) -> str | None:
        if depth > 64:
            return "is nested more than 64 levels deep"
        if not isinstance(node, dict):
            return f"has a node that is not an object ({type(node).__name__})"
        if "leaf" in node:
            if type(node["leaf"]) is not int:
                return "has a leaf that is not an integer index"
            leaves.append(node["leaf"])
            return None
        kind, items = node.get("kind"), node.get("items")
        if kind not in ("dict", "list", "tuple") or not isinstance(items, list):
            return f"has a node of unknown kind {kind!r:.40}"
        if kind == "dict" and (not isinstance(node.get("keys"), list)
                               or len(node["keys"]) != len(items)
                               or not all(isinstance(k, str) for k in node["keys"])):
            return "has a dict whose keys do not match its items"
        return next((p for p in (walk(child, depth + 1) for child in items) if p), None)

    problem = walk(tree, 0)
    if problem is None and sorted(leaves) != list(range(count)):
        problem = f"indexes outputs {sorted(leaves)[:8]}..., not each of the {count} once"
    return problem


def check_partition_files(partition: Partition, files: Mapping[str, str], entries: set[str],
                          *, where: str) -> None:
    """The meta values an executor opens as files (``files``: {key: value}, from its Meta's
    ``Entry`` fields) name verified entries of this artifact: never an absolute path, a
    '..', or a file that was not hashed."""
    for key, value in files.items():
        if value not in entries:
            raise ArtifactError(
                f"partition '{partition.name}' points its {key!r} at {value!r:.200}, which "
                f"is not an entry of the artifact (only its own verified entries are loaded)",
                where=where, hint=_HINT)


def check_host_devices(manifest: Manifest, *, where: str) -> None:
    """A CUDA partition or arena on a host without CUDA is an incompatibility, said now."""
    planned = (manifest.memory_plan or {}).get("arenas") or {}
    devices = {p.device for p in manifest.partitions} | set(planned if isinstance(planned, dict)
                                                           else ())
    if "cuda" in devices and not _cuda_available():
        raise CompatibilityError("the artifact runs partitions on CUDA, and this machine has "
                                 "no usable CUDA device", where=where,
                                 hint="run it on a GPU machine, or rebuild with --target cpu")


def check_arena_fits(device: str, nbytes: int, *, where: str) -> None:
    """An arena larger than this machine's memory is refused before it is allocated."""
    if device == "cpu":
        total = _physical_memory()
    elif _cuda_available():
        import torch
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    else:
        total = None
    if total is not None and nbytes > total:
        raise CompatibilityError(
            f"the memory plan asks for a {nbytes / 2**30:.1f} GiB {device} arena, more than "
            f"this machine's {total / 2**30:.1f} GiB", where=where,
            hint="run it on a larger machine, or load with arenas=False (each tensor from "
                 "the allocator); rebuild if the number is not what the model needs")


def _cuda_available() -> bool:
    """Asked only of artifacts with CUDA parts, which need torch (runtime/program/requires.py)."""
    import torch
    return torch.cuda.is_available()


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_requirements(req: Requirements, *, where: str, torch=None,
                       native: Sequence[Partition] = ()) -> None:
    """Raise CompatibilityError naming both sides if this host cannot run the artifact.
    ``native``: the partitions that hold native code (runtime.executors.holds_native_code),
    checked against this platform and CPU; ONNX, .pte and exported torch programs run
    wherever their runtime does. ``torch``: the module when a partition runs on it (then its
    version and the GPU are checked too), else None."""
    if native:
        _check_platform(req, native, where)
        _check_cpu_flags(req, where)
    if torch is None:
        return
    if hostinfo.torch_release(req.torch) != hostinfo.torch_release(torch.__version__):
        raise CompatibilityError(
            f"the artifact was built with torch {req.torch} but this runtime has torch "
            f"{torch.__version__}; compiled AOTInductor code is only loadable by the same "
            "torch major.minor", where=where,
            hint=f"install torch=={req.torch.split('+')[0]} here, or rebuild with this torch")
    if req.cuda_capability is not None:
        _check_cuda(req, where, torch)


def _check_platform(req: Requirements, native: Sequence[Partition], where: str) -> None:
    host = host_platform()
    if req.platform_name == host:
        return
    parts = ", ".join(f"'{p.name}' ({p.backend})" for p in native[:3])
    more = f" and {len(native) - 3} more" if len(native) > 3 else ""
    raise CompatibilityError(
        f"the artifact was built for {req.platform_name} but this machine is {host}: "
        f"partition {parts}{more} holds native code compiled for {req.platform_name}",
        where=where, hint=f"build it again with `exporter build --platform {host}` (on a "
                          "target that builds for it), or run it on a "
                          f"{req.platform_name} machine")


def _check_cpu_flags(req: Requirements, where: str) -> None:
    have = hostinfo.cpu_flags()
    if not req.cpu_flags or have is None:
        return
    missing = sorted(set(req.cpu_flags) - have)
    if missing:
        raise CompatibilityError(
            f"the artifact was compiled for the {req.cpu_isa} CPU instruction set, and this CPU "
            f"lacks {len(missing)} of the features it needs: {', '.join(missing)}", where=where,
            hint="rebuild with a lower --cpu-isa (e.g. `--cpu-isa avx2` or `--cpu-isa generic`), "
                 "or, for the onnx target's own kernels, with --no-own-kernels")


def _check_cuda(req: Requirements, where: str, torch) -> None:
    if not torch.cuda.is_available():
        raise CompatibilityError(
            f"the artifact needs a CUDA GPU of compute capability {req.cuda_capability} or newer, "
            f"and none is usable here (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'none'})", where=where,
            hint="run it on a machine with an NVIDIA GPU and a CUDA build of torch")
    major, minor = torch.cuda.get_device_capability()
    need = tuple(int(p) for p in req.cuda_capability.split("."))
    if (major, minor) < need:
        raise CompatibilityError(
            f"the artifact was built for CUDA compute capability {req.cuda_capability} and this "
            f"GPU ({torch.cuda.get_device_name()}) has {major}.{minor}", where=where,
            hint="rebuild the artifact on a machine with this GPU")
