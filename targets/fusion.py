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
4. AttentionToSDPA.
Quantization and the --dtype cast run after all of them (targets.base.pipeline): batch
norm folded in float32 before the weights are rounded, and one cast of the final graph.
"""

from __future__ import annotations

from passes.attention_to_sdpa import AttentionToSDPA
from passes.fold_batchnorm import FoldBatchNorm
from passes.merge_linears import MergeParallelLinears
from passes.remove_noops import RemoveNoOps

ONNX_FUSIONS = (RemoveNoOps, FoldBatchNorm, MergeParallelLinears, AttentionToSDPA)
# No AttentionToSDPA for TVM: the zoo encoder ran slower with it (0.97x, 1000 calls,
# interleaved; bench/RESULTS.md), with TVM 0.27's import of SDPA and our schedule rules.
TVM_FUSIONS = (RemoveNoOps, FoldBatchNorm, MergeParallelLinears)
