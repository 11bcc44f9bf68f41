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


def export_keeping_dims(module: torch.nn.Module, args: tuple, inputs: list[Node],
                        program: ExportedProgram, *, nest: bool = False) -> ExportedProgram:
    """``torch.export`` of ``module`` on ``args`` (the flat values of ``inputs``), with the
    program's dynamic dims. Named ``Dim``s first; where export refuses them for a guard it
    cannot prove, though every value satisfies it (SDPA's stride arithmetic asks
    min(1024+16T, 2048+32T) == 1024+16T of a cached-attention graph), bounded
    ``Dim.DYNAMIC`` hints, which accept such guards and still keep the bounds."""
    for hints in (False, True):
        shapes = dynamic_shapes_for(inputs, program, hints=hints)
        try:
            return torch.export.export(module, args, dynamic_shapes=(shapes,) if nest else shapes,
                                       strict=False)
        except torch._dynamo.exc.UserError as exc:
            if hints or "Constraints violated" not in str(exc):
                raise
    raise AssertionError("unreachable")


def dynamic_shapes_for(inputs: list[Node], program: ExportedProgram, *,
                       hints: bool = False) -> tuple:
    """torch.export dynamic_shapes for the flat inputs, one Dim per symbol (bounds kept);
    ``hints``: bounded ``Dim.DYNAMIC`` per axis instead (see export_keeping_dims)."""
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
                    low = int(bounds.lower)
                    dims[expr] = (Dim.DYNAMIC(min=low, max=upper) if hints else
                                  Dim(f"d{len(dims)}", min=low, max=upper))
                entry[axis] = dims[expr]
        shapes.append(entry or None)
    return tuple(shapes)
