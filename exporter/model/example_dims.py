"""Example inputs fitted to the dims ``--dynamic`` makes dynamic, where the spec can make
them again (``hf:``: ``ModelSpec.remake``).

torch.export makes a dim whose example size is 0 or 1 a constant, so a dynamic batch
cannot be traced from batch-1 examples: each dynamic shared dim (batch, sequence) of such
a spec gets examples of size 2 or more, inside its range. A spec that cannot remake its
examples (a user's factory) keeps them, and ``dynamic.apply_dynamic`` says what to give.
"""

from __future__ import annotations

import dataclasses

from exporter.model.dynamic import DynamicDim, bound_inputs, expand
from exporter.model.spec import ModelSpec

# a shared dim -> the detail that records its example size (the build's summary, manifest)
_DETAIL = {"batch": "batch_size", "sequence": "seq_len"}


def fit_examples(spec: ModelSpec, dims: list[DynamicDim]) -> ModelSpec:
    """``spec`` with examples of a traceable size on every dynamic shared dim, and its
    details naming the dynamic ranges (``dynamic_dims``: {"batch": [1, 8]})."""
    if not dims or spec.remake is None:
        return spec
    params = bound_inputs(spec.module, spec.args, spec.kwargs)
    expanded = {(d.input, d.axis): d for d in expand(dims, spec.groups, params)}
    sizes, ranges = {}, {}
    for group, members in spec.groups.items():
        dim = next((expanded[m] for m in members if m in expanded), None)
        if dim is None:
            continue
        ranges[group] = [dim.min, dim.max]
        size = params[dim.input].shape[dim.axis]
        fitted = min(max(size, dim.min, 2), dim.max)
        if fitted != size:
            sizes[group] = fitted
    details = {**spec.details, "dynamic_dims": ranges}
    details.update({_DETAIL[g]: size for g, size in sizes.items() if g in _DETAIL})
    args = spec.remake(sizes) if sizes else spec.args
    return dataclasses.replace(spec, args=args, details=details)
