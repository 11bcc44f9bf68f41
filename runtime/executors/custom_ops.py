"""Kernels the runtime registers itself for custom ops a CPU-fallback partition may call.

A partition that calls a custom op needs the op registered in the loading process. For
ops defined by a library the device should not need, or by this project, the runtime
registers them when a partition asks (``register_known``), so an artifact runs from a
bare ``pip install '.[runtime]'`` without ``--preload``:

- ``edge_exporter::cached_attention``: ours (runtime/generation/attention_op.py); a
  partition holds it where a target could not fuse it (Cohere2-MoE on onnx).
- ``edge_exporter::grouped_mm_int8`` / ``grouped_mm_int4``: ours, a quantized MoE's
  experts (runtime/generation/experts_op.py).
- ``transformers::grouped_mm_fallback``: the experts of every transformers MoE model
  (Mixtral, Qwen-MoE, gpt-oss, ...) on the CPU. Where transformers is installed its own
  registration is imported; where it is not (a device), the kernel below, written here
  because transformers is a ~10 MB dependency with torch-version coupling that a device
  should not carry for one loop of matmuls. Same schema and same arithmetic as
  transformers.integrations.moe._grouped_mm_fallback (5.x).
"""

from __future__ import annotations

import functools
import importlib
from typing import Callable

import torch


def _grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor,
                         offs: torch.Tensor) -> torch.Tensor:
    """``input`` [S, in] sorted by expert, ``weight`` [E, in, out], ``offs`` [E] the
    cumulative row counts: rows ``offs[e-1]:offs[e]`` meet ``weight[e]`` (the loop the
    quantized experts ops share)."""
    from runtime.generation.experts_op import grouped_rows
    return grouped_rows(input, offs, weight.size(2), lambda expert: weight[expert])


def _grouped_mm_fallback_fake(input: torch.Tensor, weight: torch.Tensor,
                              offs: torch.Tensor) -> torch.Tensor:
    return input.new_empty(input.size(0), weight.size(2))


def _transformers_moe() -> None:
    try:  # its own registration, where it is installed and imports with this torch
        importlib.import_module("transformers.integrations.moe")
        return
    except Exception:  # not installed (a device), or broken: the kernel above
        if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
            return
    torch.library.custom_op("transformers::grouped_mm_fallback", _grouped_mm_fallback,
                            mutates_args=(),
                            schema="(Tensor input, Tensor weight, Tensor offs) -> Tensor")
    torch.library.register_fake("transformers::grouped_mm_fallback",
                                _grouped_mm_fallback_fake)


def _module(name: str) -> Callable[[], object]:
    return functools.partial(importlib.import_module, name)


# "namespace::op" -> what registers it; each runs at most once a process
KNOWN: dict[str, Callable[[], object]] = {
    "transformers::grouped_mm_fallback": _transformers_moe,
    "edge_exporter::cached_attention": _module("runtime.generation.attention_op"),
    "edge_exporter::grouped_mm_int8": _module("runtime.generation.experts_op"),
    "edge_exporter::grouped_mm_int4": _module("runtime.generation.experts_op"),
}
_registered: set[str] = set()


def register_known(ops: set[str]) -> None:
    """Register those of ``ops`` ("namespace::op") the runtime has kernels for."""
    for op in sorted(ops & KNOWN.keys() - _registered):
        KNOWN[op]()
        _registered.add(op)
