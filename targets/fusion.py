"""Which graph fusion passes run, in which order, for targets whose backend gains from
them (ONNX Runtime and TVM import what they are given; Inductor folds batch norm, matches
attention and fuses pointwise ops itself, so the AOTInductor targets skip these).

The order, and why:
1. RemoveNoOps: an eval dropout, clone or transpose pair between a conv and its batch
   norm, or inside the attention chain, would hide the patterns the next passes look for.
2. FoldBatchNorm: before merging, so a linear followed by a batch norm merges as the
   plain linear it becomes.
3. MergeParallelLinears: independent of 4 (it changes how q, k, v are computed, not the
   matmul/softmax chain that reads them).
4. AttentionToSDPA (written, tested, in no target's list yet: see below).
Quantization and the --dtype cast run after all of them (targets.base.pipeline): batch
norm folded in float32 before the weights are rounded, and one cast of the final graph.
"""

from __future__ import annotations

from passes.cleanup.remove_noops import RemoveNoOps
from passes.fusion.fold_batchnorm import FoldBatchNorm
from passes.fusion.merge_linears import MergeParallelLinears

# AttentionToSDPA (passes/fusion/attention_to_sdpa.py) is left out: the zoo encoder ran
# slower with it on onnx and tvm. It is for backends with a fused attention kernel.
GRAPH_FUSIONS = (RemoveNoOps, FoldBatchNorm, MergeParallelLinears)
