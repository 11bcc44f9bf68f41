"""Register-tiled CPU schedule for one contraction (matmul, batch matmul, conv) per PrimFunc.

TVM 0.27's wheel has no BLAS/DNNL offload and no CPU dlight rule for contractions:
``dl.cpu.GEMV`` computes one output element per parallel iteration with scalar
code, and an untuned conv keeps TVM's naive loops, both far from the machine's peak
(docs/design-notes.md). This rule writes the classic CPU micro-kernel instead, by
schedule primitives rather than by hand:

    parallel over (other spatial loops, row tiles, column tiles):
        acc[ROWS][COLS] = 0                 # a local tile LLVM keeps in vector registers
        for every reduction index k:        # K, or C x KH x KW for a conv
            for r in ROWS (unrolled):
                acc[r][:] += A[r, k] * B[k, :COLS]   # broadcast times one vector load
        out[tile] = epilogue(acc)           # bias, batch norm, activation, fused in

COLS is the output's innermost loop (vectorised: a weight row, an image row);
ROWS is a loop the vector operand does not depend on, so each vector load is used
ROWS times (a matmul's rows, a conv's output channels).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.sym.analyzer import Analyzer

VECTOR_LANES = 16  # fp32 lanes of AVX-512; LLVM splits wider vectors for narrower ISAs
MAX_ACCUMULATOR_VECTORS = 16  # of AVX-512's 32 registers: the rest for operands
_COLUMN_TILES = (64, 32, 16)
_ROW_TILES = (8, 6, 4, 3, 2)


class TiledContraction(dl.ScheduleRule):
    """One reduction block with spatial prologue/epilogue blocks, tiled as above.
    Returns None (next rule) for anything else: several reductions (softmax, layer
    norm), reductions whose output is not contiguous in a read (mean over H, W)."""

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if not blocks:
            return None
        reductions = [b for b in blocks if any(it.kind == "R" for it in b.iters)]
        if len(reductions) != 1 or any(it.kind == "O" for b in blocks for it in b.iters):
            return None
        red = reductions[0]
        plan = _plan(sch, red)
        if plan is None:
            return None
        try:
            _inline_elementwise(sch, blocks, red)
            _tile(sch, red, *plan)
        except RuntimeError:  # ScheduleError, InternalError  # a shape this rule did not foresee: let the next rule try
            return None
        return sch


def _plan(sch, red):
    """(columns loop, column tile, rows loop or None, row tile), or None if not a fit."""
    kinds = "".join(it.kind for it in red.iters)
    if not kinds.startswith("S") or "RS" in kinds:  # spatial loops, then reductions
        return None
    spatial = [it for it in red.iters if it.kind == "S"]
    cols = spatial[-1]
    if not isinstance(cols.dom, int) or cols.dom < 4:
        return None
    block = sch.get(red.block_rv)
    # The vector operand: a read whose innermost index moves with the column var.
    vector_reads = [r for r in block.reads
                    if r.region and _uses(r.region[-1].min, cols.var)]  # () is a scalar
    if not vector_reads:
        return None
    col_tile = next((t for t in _COLUMN_TILES if cols.dom % t == 0), None)
    if col_tile is None:
        col_tile = cols.dom if cols.dom <= 64 else VECTOR_LANES
    # Rows: the innermost other spatial loop that some vector read does not depend on.
    analyzer = Analyzer()
    for it in reversed(spatial[:-1]):
        if all(_uses_any(r, it.var) for r in vector_reads):
            continue
        vectors = -(-col_tile // VECTOR_LANES)
        for rows in _ROW_TILES:
            if rows * vectors <= MAX_ACCUMULATOR_VECTORS and \
                    analyzer.can_prove_equal(tirx.floormod(it._dom, rows), 0):
                return cols, col_tile, it, rows
        break
    return cols, col_tile, None, 1


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _uses_any(region, var) -> bool:
    return any(_uses(r.min, var) for r in region.region)


def _inline_elementwise(sch, blocks, red) -> None:
    """Inline spatial blocks into their consumers, except the reduction's direct inputs
    (padding, a transposed operand: computed once, not per reduction step) and the
    function's outputs. What stays after the reduction is one epilogue block."""
    producers = {sch.get(b).name_hint for b in sch.get_producers(red.block_rv)}
    for info in blocks:
        if info is red or info.name in producers:
            continue
        try:
            sch.compute_inline(info.block_rv)
        except RuntimeError:  # ScheduleError, InternalError
            pass  # an output block, or one read with a different shape: keep it


def _tile(sch, red, cols, col_tile, rows, row_tile) -> None:
    block = red.block_rv
    for producer in sch.get_producers(block):  # padding, a transpose: root-level loops
        _parallel_vectorize(sch, producer)
    reduce = [it.loop_rv for it in red.iters if it.kind == "R"]
    col_outer, col_inner = sch.split(cols.loop_rv, [None, col_tile])
    outer = [it.loop_rv for it in red.iters
             if it.kind == "S" and it is not cols and it is not rows]
    if rows is not None:
        row_outer, row_inner = sch.split(rows.loop_rv, [None, row_tile])
        outer += [row_outer]
        inner = [row_inner, col_inner]
    else:
        inner = [col_inner]
    sch.reorder(*outer, col_outer, *reduce, *inner)
    tile = sch.fuse(*outer, col_outer)
    sch.parallel(tile)
    # The accumulator tile; its write-back takes the epilogue in.
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tile, preserve_unit_loops=True)
    shape = _written_shape(sch, acc)
    for consumer in sch.get_consumers(acc):
        try:
            sch.reverse_compute_inline(consumer)
        except RuntimeError:  # ScheduleError, InternalError
            if _written_shape(sch, consumer) != shape:
                # a pad after the conv: its border depends on no tile, so per tile it
                # would never be written (garbage where eager has the pad value)
                _parallel_vectorize(sch, consumer)
                continue
            sch.reverse_compute_at(consumer, tile, preserve_unit_loops=True)
            _vectorize_innermost(sch, consumer)
    _vectorize_innermost(sch, acc)
    if rows is not None:
        sch.unroll(inner[0])
    sch.vectorize(inner[-1])  # before decompose_reduction: after it, the dataflow check fails
    sch.decompose_reduction(block, reduce[0])  # the init copies the inner loops' kinds


def _written_shape(sch, block) -> tuple:
    return tuple(int(d) if isinstance(d, int) or hasattr(d, "value") else str(d)
                 for d in sch.get(block).writes[0].source.shape)


def _vectorize_innermost(sch, block) -> None:
    loops = sch.get_loops(block)
    sch.vectorize(loops[-1])


def _parallel_vectorize(sch, block) -> None:
    """A root-level spatial block (padding, transpose): parallel outside, vector inside."""
    loops = sch.get_loops(block)
    if len(loops) < 2:
        return
    outer, inner = sch.split(loops[-1], [None, VECTOR_LANES])
    sch.parallel(sch.fuse(*loops[:-1]))
    sch.vectorize(inner)
