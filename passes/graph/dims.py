"""torch.export ``dynamic_shapes`` for a re-capture, read off an existing program.

Passes that re-capture part or all of a program (partitioning, the dtype cast)
must keep its dynamic dims and their bounds: one ``Dim`` per symbol, so dims that
were equal stay one symbol.
"""

from __future__ import annotations

import contextlib

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
    attempts = [(hints, bounded) for bounded in (True, False) for hints in (False, True)]
    for hints, bounded in attempts:
        shapes = dynamic_shapes_for(inputs, program, hints=hints, bound_derived=bounded)
        try:
            with _keeping_lengths_of_one(program):
                return torch.export.export(module, args,
                                           dynamic_shapes=(shapes,) if nest else shapes,
                                           strict=False)
        except torch._dynamo.exc.UserError as exc:
            if (hints, bounded) == attempts[-1] or "Constraints violated" not in str(exc):
                raise
    raise AssertionError("unreachable")


def dynamic_shapes_for(inputs: list[Node], program: ExportedProgram, *,
                       hints: bool = False, bound_derived: bool = True) -> tuple:
    """torch.export dynamic_shapes for the flat inputs, one Dim per symbol (bounds kept);
    ``hints``: bounded ``Dim.DYNAMIC`` per axis instead (see export_keeping_dims).
    A derived dim (2*T: the token-expert pairs of a mixture of experts) is a bounded
    ``Dim.DYNAMIC`` of its own, its bounds the expression's over its symbols' (with
    ``bound_derived``), else ``Dim.AUTO``: export then assumed it 2 or more, like any
    unbounded dim, and a partition taking 2*T refused a one-token decode step (2 < 4)."""
    dims: dict = {}
    shapes = []
    for node in inputs:
        val = node.meta.get("val")
        entry = {}
        for axis, size in enumerate(getattr(val, "shape", ())):
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                expr = size.node.expr
                if expr not in program.range_constraints:  # derived (batch*seq, 2*T)
                    bounds = _derived_bounds(expr, program) if bound_derived else None
                    entry[axis] = Dim.DYNAMIC(min=bounds[0], max=bounds[1]) if bounds \
                        else Dim.AUTO  # let export infer it
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


def _keeping_lengths_of_one(program: ExportedProgram) -> contextlib.AbstractContextManager:
    """A program captured with a dim that may be 1 (a generating build's prefill, which
    takes one token: exporter/lm/build.py) keeps that bound only under size-oblivious
    reasoning: otherwise torch.export assumes 2 or more. Partitions re-captured during
    lowering (ops moved to the CPU fallback) ran without it, and a one-token decode step
    was refused by the partition that took 2*T rows."""
    from torch.fx.experimental import _config
    from torch.utils._sympy.symbol import SymT, symbol_is_type
    if any(symbol_is_type(symbol, SymT.SIZE) and bounds.lower < 2
           for symbol, bounds in program.range_constraints.items()):
        return _config.patch(backed_size_oblivious=True)
    return contextlib.nullcontext()


def _derived_bounds(expr, program: ExportedProgram) -> tuple[int, int | None] | None:
    """(lower, upper or None) of an expression over the program's symbols, or None where
    it reads a symbol the program does not bound."""
    from torch.utils._sympy.value_ranges import bound_sympy
    if not expr.free_symbols <= set(program.range_constraints):
        return None
    ranges = bound_sympy(expr, {s: program.range_constraints[s] for s in expr.free_symbols})
    if not ranges.lower.is_finite:
        return None
    return int(ranges.lower), None if ranges.upper == int_oo or not ranges.upper.is_finite \
        else int(ranges.upper)
