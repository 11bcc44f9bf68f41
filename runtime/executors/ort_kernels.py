"""The onnx target's own kernels at load: a partition whose meta names a custom-op library
(targets/onnx/kernels, OnnxRuntimeMeta.kernels) runs some of its nodes on it. The library
is native code for one platform and instruction set, so this machine is checked against
the partition's record before anything is loaded, then the library is registered on the
session's options (from the artifact's verified private copy, as AOTInductor's are)."""

from __future__ import annotations

from pathlib import Path

from runtime.errors import CompatibilityError
from runtime.host import hostinfo
from runtime.host.platforms import host_platform

_OPT_OUT = "--no-own-kernels"


def check_kernels(meta, partition: str, where: str) -> None:
    """CompatibilityError (exit 2) naming what this machine lacks for the partition's
    kernels; nothing when it has none."""
    if meta.kernels is None:
        return
    built_for, here = meta.kernels_platform or "?", host_platform()
    nodes = sum((meta.kernels_nodes or {}).values())
    what = (f"partition '{partition}' runs {nodes} node(s) on the onnx target's own kernels, "
            f"compiled for {built_for} with {meta.kernels_isa or 'its ISA'}")
    hint = (f"rebuild with {_OPT_OUT} (ONNX Runtime's own ops run on any CPU), or run it on "
            f"a {built_for} CPU with {', '.join(meta.kernels_cpu_flags or ())}")
    if built_for != here:
        raise CompatibilityError(f"{what}, and this machine is {here}", where=where, hint=hint)
    have = hostinfo.cpu_flags()
    missing = [f for f in meta.kernels_cpu_flags or () if have is None or f not in have]
    if missing:
        raise CompatibilityError(f"{what}, and this CPU lacks {', '.join(missing)}",
                                 where=where, hint=hint)


def register_kernels(options, library: Path, partition: str, where: str) -> None:
    """The library's ops on ``options`` (one SessionOptions per session: ORT takes a
    domain once per options)."""
    try:
        options.register_custom_ops_library(str(library))
    except Exception as exc:  # ORT's pybind errors: a library that does not load here
        raise CompatibilityError(
            f"ONNX Runtime could not load partition '{partition}''s kernel library "
            f"({type(exc).__name__}: {str(exc).strip()[:300]})", where=where,
            hint=f"rebuild the artifact, or with {_OPT_OUT}") from exc
