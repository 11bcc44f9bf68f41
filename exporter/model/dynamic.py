"""``--dynamic x:0=1..32``: mark input dims dynamic, in torch.export's own format.

Dims from the CLI that have the same bounds and the same size in the example
inputs share one ``torch.export.Dim``: a batch dim shared by ``input_ids`` and
``attention_mask`` must be one symbol, or export rejects the program. torch's
``Dim.DYNAMIC`` would infer that, but it turns a lower bound of 1 into 2 (0/1
specialisation), and batch 1 is the common case on a device.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import Dim

from exporter.errors import UserInputError

_PATTERN = re.compile(r"^(?P<name>[A-Za-z_][\w.]*):(?P<dim>\d+)=(?P<lo>\d+)\.\.(?P<hi>\d+)$")


@dataclass(frozen=True)
class DynamicDim:
    input: str
    axis: int
    min: int
    max: int


def parse_dynamic(texts: list[str]) -> list[DynamicDim]:
    dims = []
    for text in texts:
        match = _PATTERN.match(text.strip())
        if not match:
            raise UserInputError(f"cannot read --dynamic '{text}'",
                                 hint="write INPUT:DIM=MIN..MAX, e.g. --dynamic x:0=1..32")
        lo, hi = int(match["lo"]), int(match["hi"])
        if lo > hi or hi < 1:
            raise UserInputError(f"--dynamic '{text}': the range {lo}..{hi} is empty",
                                 hint="MIN must be <= MAX, e.g. 1..32")
        dims.append(DynamicDim(match["name"], int(match["dim"]), lo, hi))
    return dims


def apply_dynamic(module: torch.nn.Module, args: tuple, kwargs: dict, base: Any,
                  dims: list[DynamicDim]) -> Any:
    """Merge CLI dims into the spec's dynamic_shapes; returns a dict keyed by parameter name."""
    if not dims:
        return base
    params = inspect.signature(module.forward).bind(*args, **kwargs).arguments
    shapes = _as_named(base, list(params))
    shared: dict[tuple[int, int, int], Dim] = {}
    for dim in dims:
        tensor = params.get(dim.input)
        if not isinstance(tensor, torch.Tensor):
            tensors = [n for n, v in params.items() if isinstance(v, torch.Tensor)]
            raise UserInputError(f"--dynamic names input '{dim.input}', which is not a tensor "
                                 "parameter of the model's forward",
                                 hint=f"tensor inputs are: {', '.join(tensors)}")
        if dim.axis >= tensor.dim():
            raise UserInputError(f"--dynamic {dim.input}:{dim.axis}: '{dim.input}' has only "
                                 f"{tensor.dim()} dims (shape {tuple(tensor.shape)})")
        size = tensor.shape[dim.axis]
        if not dim.min <= size <= dim.max:
            raise UserInputError(
                f"--dynamic {dim.input}:{dim.axis}={dim.min}..{dim.max} does not hold the example "
                f"input's size {size}", hint="widen the range or change the example input")
        key = (dim.min, dim.max, size)
        if key not in shared:
            shared[key] = Dim(f"{dim.input}_{dim.axis}".replace(".", "_"), min=dim.min, max=dim.max)
        entry = shapes.get(dim.input)
        entry = dict(entry) if isinstance(entry, dict) else {}
        entry[dim.axis] = shared[key]
        shapes[dim.input] = entry
    return shapes


def _as_named(base: Any, names: list[str]) -> dict:
    if base is None:
        return {}
    if isinstance(base, dict):
        return dict(base)
    return dict(zip(names, base))
