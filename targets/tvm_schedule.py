"""How TVM's CPU code gets scheduled without tuning.

An untuned ``tvm.compile(mod, "llvm")`` emits scalar, single-threaded loops
(ResNet-50: 5.5 s per inference). TVM 0.27 ships dlight rules for GPUs and, for
CPUs, only ``dl.cpu.GEMV`` and ``dl.cpu.Reduction``. So the pipeline here is
TVM's own ``cpu_generic`` pipeline (library dispatch, legalize, fuse) with
dlight applied between legalization and lowering: TVM's two CPU rules first, then
``ParallelVectorize`` (ours, below: no rule in the wheel parallelises and
vectorises the remaining spatial loops, which are most of a CNN's and an
encoder's work). ``--tune N`` replaces all of this with MetaSchedule.

Every PrimFunc is reported by the rule that scheduled it, so the build report
says what was scheduled how.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

VECTOR_LANES = 16  # fp32 lanes of AVX-512; LLVM splits it for narrower ISAs


class ParallelVectorize(dl.ScheduleRule):
    """Parallel outer spatial loops, a vectorised inner spatial loop, reductions kept
    serial in between. Written here because TVM 0.27 has no generic CPU rule that does it."""

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        blocks = try_inline_contiguous_spatial(sch, blocks) if blocks is not None else None
        if not blocks:
            return None
        scheduled = False
        for block in blocks:
            scheduled |= _schedule_block(sch, block)
        return sch if scheduled else None


def _schedule_block(sch, block) -> bool:
    kinds = block.dom_kind()
    loops = sch.get_loops(block.block_rv)
    if len(loops) != len(kinds) or not kinds or kinds[0] != "S":
        return False
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == "S"]
    reduce = [loop for loop, kind in zip(loops, kinds) if kind != "S"]
    try:
        outer, inner = sch.split(spatial[-1], [None, VECTOR_LANES])
        sch.reorder(*spatial[:-1], outer, *reduce, inner)
        parallel = sch.fuse(*spatial[:-1]) if len(spatial) > 2 else (
            spatial[0] if len(spatial) == 2 else outer)
        sch.parallel(parallel)
        sch.vectorize(inner)  # before decompose_reduction, which would break the dataflow check
        if reduce:
            sch.decompose_reduction(block.block_rv, reduce[0])
    except tvm.TVMError:  # a block this simple rule cannot handle keeps TVM's default loops
        return False
    return True


def default_rules() -> list:
    return [dl.cpu.GEMV(), dl.cpu.Reduction(), ParallelVectorize()]


def schedule(mod: tvm.IRModule, target: tvm.target.Target, rules: list | None
             ) -> tvm.IRModule:
    """cpu_generic's library dispatch and legalization, then dlight's rules.
    ``rules=None`` leaves TVM's default loops (for MetaSchedule to tune instead)."""
    from tvm.relax.backend.cpu_generic import pipeline as generic
    from tvm import relax
    with target:
        # Inference-time decompositions (batch norm into a scale and shift) and constant
        # folding first: otherwise batch norm recomputes sqrt(var + eps) on every call.
        steps = [relax.transform.DecomposeOpsForInference(), relax.transform.FoldConstant()]
        steps += generic.library_dispatch_passes(target) + generic.legalize_passes(target)
        steps += [dl.ApplyDefaultSchedule(*rules)] if rules else []
        return tvm.transform.Sequential(steps)(mod)


def lower_pipeline(target: tvm.target.Target):
    """The rest of cpu_generic's pipeline, for ``tvm.compile(scheduled, relax_pipeline=...)``."""
    from tvm.relax.backend.cpu_generic import pipeline as generic

    @tvm.transform.module_pass(opt_level=0)
    def pipeline(mod, _ctx):
        with target:
            steps = generic.dataflow_lower_passes(target) + generic.finalize_passes(target)
            return tvm.transform.Sequential(steps)(mod)
    return pipeline


def schedule_report(mod: tvm.IRModule) -> dict:
    """PrimFuncs by how their loops ended up: parallel and/or vectorised, or plain."""
    counts: Counter = Counter()
    for _, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        text = func.script()  # TVMScript spells loop kinds out: T.parallel, T.vectorized
        parallel, vector = "T.parallel(" in text, "T.vectorized(" in text
        counts["parallel+vectorized" if parallel and vector else "parallel" if parallel
               else "vectorized" if vector else "serial"] += 1
    return dict(counts)
