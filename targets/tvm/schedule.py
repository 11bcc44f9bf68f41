"""How TVM's CPU code gets scheduled without tuning.

An untuned ``tvm.compile(mod, "llvm")`` emits scalar, single-threaded loops
(seconds per ResNet-50 inference). TVM 0.27 ships dlight rules for GPUs and, for
CPUs, only ``dl.cpu.GEMV`` and ``dl.cpu.Reduction``; the wheel has no BLAS or DNNL
to offload to. So the pipeline here is TVM's own ``cpu_generic`` pipeline
(library dispatch, legalize, fuse) with dlight applied between legalization and
lowering, rules tried in order on each PrimFunc:

1. ``TiledContraction`` (ours, targets/tvm/tiling.py): matmuls and convolutions
   as register-tiled, vectorised, parallel micro-kernels with the epilogue fused in;
2. TVM's ``dl.cpu.Reduction`` (softmax, layer norm, means);
3. ``ParallelVectorize`` (ours, below): the remaining spatial loops.

``dl.cpu.GEMV`` is left out: on a 1x1 convolution over a 1x1 image (MobileNet's last
blocks at small inputs) it vectorises the 128-wide output loop *around* the whole
reduction nest, and LLVM did not finish compiling that one PrimFunc in minutes, where
the whole MobileNetV1 compiles without it in seconds. Matmul-shaped work
goes to ``TiledContraction`` first anyway.

Weight-only computations (transposed weights, batch-norm scales) are lifted out
of ``main`` by Relax's ``LiftTransformParams`` and run once at build time, so the
artifact stores the transformed weights. ``--tune N`` replaces the rules with
MetaSchedule.

The build report counts PrimFuncs by the rule that scheduled them and by how
their loops ended up, so it says what was scheduled how.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

from targets.tvm.tiling import VECTOR_LANES, TiledContraction

TRANSFORM_PARAMS = "main_transform_params"  # what relax.transform.LiftTransformParams names it



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
    except RuntimeError:  # ScheduleError, InternalError  # a block this simple rule cannot handle keeps TVM's default loops
        return False
    return True


class _Counted(dl.ScheduleRule):
    """A rule that counts the PrimFuncs it scheduled (dlight does not say which rule won)."""

    def __init__(self, rule: dl.ScheduleRule, counts: Counter) -> None:
        self.rule, self.counts, self.name = rule, counts, type(rule).__name__

    def apply(self, func, target, tunable):
        scheduled = self.rule.apply(func, target, tunable)
        if scheduled is not None:
            self.counts[self.name] += 1
        return scheduled


def default_rules(counts: Counter | None = None) -> list:
    """The untuned rules, in the order tried; ``counts`` gets a count per rule that won."""
    rules = [TiledContraction(), dl.cpu.Reduction(), ParallelVectorize()]
    return rules if counts is None else [_Counted(rule, counts) for rule in rules]


def schedule(mod: tvm.IRModule, target: tvm.target.Target, rules: list | None
             ) -> tvm.IRModule:
    """cpu_generic's library dispatch and legalization, then dlight's rules.
    ``rules=None`` leaves TVM's default loops (for MetaSchedule to tune instead)."""
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as generic
    with target:
        # Inference-time decompositions (batch norm into a scale and shift) first, then
        # everything that reads only weights lifted into main_transform_params (run once
        # at build time, see run_transform_params): otherwise batch norm recomputes
        # sqrt(var + eps), and every linear transposes its weight, on every call.
        steps = [relax.transform.DecomposeOpsForInference(),
                 relax.transform.LiftTransformParams(), relax.transform.FoldConstant()]
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
