"""torch.export ``dynamic_shapes`` for a re-capture, read off an existing program.

Passes that re-capture part or all of a program (partitioning, the dtype cast)
must keep its dynamic dims and their bounds: one ``Dim`` per symbol, so dims that
were equal stay one symbol.
"""

from __future__ import annotations

import torch
from torch.export import Dim, ExportedProgram
from torch.utils._sympy.numbers import int_oo
from torch.fx import Node


def dynamic_shapes_for(inputs: list[Node], program: ExportedProgram) -> tuple:
    """torch.export dynamic_shapes for the flat inputs, one Dim per symbol (bounds kept)."""
    dims: dict = {}
    shapes = []
    for node in inputs:
        val = node.meta.get("val")
        entry = {}
        for axis, size in enumerate(getattr(val, "shape", ())):
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                expr = size.node.expr
                if expr not in program.range_constraints:
                    entry[axis] = Dim.AUTO  # derived dim (e.g. batch*seq): let export infer it
                    continue
                if expr not in dims:
                    bounds = program.range_constraints[expr]
                    # unbounded (Dim("b") without max): torch's int_oo, which says is_finite
                    upper = None if bounds.upper == int_oo else int(bounds.upper)
                    dims[expr] = Dim(f"d{len(dims)}", min=int(bounds.lower), max=upper)
                entry[axis] = dims[expr]
        shapes.append(entry or None)
    return tuple(shapes)
