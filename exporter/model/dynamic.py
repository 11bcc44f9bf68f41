"""``--dynamic x:0=1..32``: mark input dims dynamic, in torch.export's own format.

``--dynamic batch=1..8`` names a dim every input shares: ``batch`` is dim 0 of every
tensor input, and a spec may name more (``hf:``: ``sequence``, and ``input_ids:0`` marks
``attention_mask:0`` too); such dims are one ``Dim`` of that name. Other dims from the
CLI that have the same bounds and the same size in the example inputs share one
``torch.export.Dim``: a batch dim shared by ``input_ids`` and
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

_PATTERN = re.compile(
    r"^(?P<name>[A-Za-z_][\w.]*)(:(?P<dim>\d+))?=(?P<lo>\d+)\.\.(?P<hi>\d+)$")
FORMS = "INPUT:DIM=MIN..MAX, or batch=MIN..MAX for dim 0 of every input"


@dataclass(frozen=True)
class DynamicDim:
    input: str  # an input's name, or a shared dim's ("batch") where axis is None
    axis: int | None
    min: int
    max: int
    name: str | None = None  # the shared dim's name, its symbol in the manifest


def parse_dynamic(texts: list[str]) -> list[DynamicDim]:
    dims = []
    for text in texts:
        match = _PATTERN.match(text.strip())
        if not match:
            raise UserInputError(f"cannot read --dynamic '{text}'",
                                 hint=f"write {FORMS}, e.g. --dynamic x:0=1..32")
        lo, hi = int(match["lo"]), int(match["hi"])
        if lo > hi or hi < 1:
            raise UserInputError(f"--dynamic '{text}': the range {lo}..{hi} is empty",
                                 hint="MIN must be <= MAX, e.g. 1..32")
        axis = None if match["dim"] is None else int(match["dim"])
        dims.append(DynamicDim(match["name"], axis, lo, hi))
    return dims


def bound_inputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """forward()'s parameter names -> the example values given for them."""
    return dict(inspect.signature(module.forward).bind(*args, **kwargs).arguments)


def expand(dims: list[DynamicDim], groups: dict, params: dict[str, Any]) -> list[DynamicDim]:
    """Shared dims as one dim per input: ``batch`` (dim 0 of every tensor input, unless the
    spec's ``groups`` say otherwise) and a spec's own groups, where one member is named."""
    batch = tuple((n, 0) for n, v in params.items() if isinstance(v, torch.Tensor) and v.dim())
    groups = {"batch": batch, **groups}
    found: dict[tuple[str, int], DynamicDim] = {}
    for dim in dims:
        if dim.axis is None and dim.input not in groups:
            raise UserInputError(f"--dynamic {dim.input}={dim.min}..{dim.max}: no dim is named "
                                 f"'{dim.input}'", hint=f"name one of {', '.join(groups)}, or "
                                 f"write INPUT:DIM=MIN..MAX")
        name = dim.input if dim.axis is None else _group_of(dim, groups, batch)
        members = groups[name] if name else ((dim.input, dim.axis),)
        for member in members:
            new = DynamicDim(member[0], member[1], dim.min, dim.max, name)
            old = found.setdefault(member, new)
            if (old.min, old.max) != (new.min, new.max):
                raise UserInputError(f"--dynamic gives {member[0]}:{member[1]} two ranges, "
                                     f"{old.min}..{old.max} and {new.min}..{new.max}",
                                     hint="give each dim one range")
    return list(found.values())


def _group_of(dim: DynamicDim, groups: dict, batch: tuple) -> str | None:
    """The spec's own shared dim that holds ``dim`` (not the assumed batch of any model)."""
    for name, members in groups.items():
        if (dim.input, dim.axis) in members and members is not batch:
            return name
    return None


def apply_dynamic(module: torch.nn.Module, args: tuple, kwargs: dict, base: Any,
                  dims: list[DynamicDim], groups: dict | None = None) -> Any:
    """Merge CLI dims into the spec's dynamic_shapes; returns a dict keyed by parameter name."""
    if not dims:
        return base
    params = bound_inputs(module, args, kwargs)
    shapes = _as_named(base, list(params))
    shared: dict[tuple, Dim] = {}
    for dim in expand(dims, groups or {}, params):
        size = _example_size(dim, params)
        key = (dim.name,) if dim.name else (dim.min, dim.max, size)
        if key not in shared:
            shared[key] = Dim(dim.name or f"{dim.input}_{dim.axis}".replace(".", "_"),
                              min=dim.min, max=dim.max)
        entry = shapes.get(dim.input)
        entry = dict(entry) if isinstance(entry, dict) else {}
        entry[dim.axis] = shared[key]
        shapes[dim.input] = entry
    # torch.export wants every parameter named once the dict form is used
    return {name: shapes.get(name) for name in params} | shapes


def _example_size(dim: DynamicDim, params: dict[str, Any]) -> int:
    """The example's size on ``dim``, checked: inside the range, and 2 or more where the
    range has room (torch.export makes a dim whose example is 0 or 1 a constant)."""
    tensor = params.get(dim.input)
    shown = f"--dynamic {dim.name}" if dim.name else f"--dynamic {dim.input}:{dim.axis}"
    if not isinstance(tensor, torch.Tensor):
        tensors = [n for n, v in params.items() if isinstance(v, torch.Tensor)]
        raise UserInputError(f"--dynamic names input '{dim.input}', which is not a tensor "
                             "parameter of the model's forward",
                             hint=f"tensor inputs are: {', '.join(tensors)}")
    if dim.axis >= tensor.dim():
        raise UserInputError(f"{shown}: '{dim.input}' has only {tensor.dim()} dims "
                             f"(shape {tuple(tensor.shape)})")
    size = tensor.shape[dim.axis]
    if not dim.min <= size <= dim.max:
        raise UserInputError(
            f"{shown}={dim.min}..{dim.max} does not hold the example input's size {size} "
            f"('{dim.input}' dim {dim.axis})", hint="widen the range or change the example input")
    if size < 2 <= dim.max:
        raise UserInputError(
            f"{shown}={dim.min}..{dim.max}: the example input '{dim.input}' has size {size} on "
            f"dim {dim.axis}, and torch.export makes a dim whose example is 0 or 1 a constant, "
            "so it cannot stay dynamic",
            hint=f"give example inputs of size {max(2, dim.min)} or more on that dim (the "
                 f"factory's example args); the artifact still takes every size in "
                 f"{dim.min}..{dim.max}")
    return size


def _as_named(base: Any, names: list[str]) -> dict:
    if base is None:
        return {}
    if isinstance(base, dict):
        return dict(base)
    return dict(zip(names, base))
