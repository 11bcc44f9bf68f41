#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD under .gm/, or the
# checkout): the greedy step's ends in the head's token kernel (Generation.advance_inputs,
# off in the library). One call, ~350 s warm (~450 s cold; run it with timeout_s 600):
# the GPU tests of the advancing token kernel, its op in an AOTInductor library and the
# decode graph that sees it, beside two ~1.1B fp16 builds side by side (`after`: HEAD's
# flags; `step-ends`: the same with advance_inputs), the two libraries' kernel
# difference, the A/B in turns (21 runs), each build's per-kernel table and the greedy
# loop on the step-ends artifact's own graph.
#
#   bash bench/pending/step_ends.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/step-ends-out). Decide: `step-ends` >= 1.005 of
# `after` with `tokens are argmax` True (and the tests rc 0) turns advance_inputs on for
# cuda (targets/aoti/cuda.py); below it, it stays off, its figure in bench/RESULTS.md.
# Expected: the library difference exactly slot_token_kernel_gdc ->
# slot_token_advance_kernel_gdc, copies_added 0; the passes' `inputs_advanced: 1`; the
# step's memcpy32_post and the position's add gone from the per-kernel table.
set -u
OUT=${OUT:-/tmp/step-ends-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
D=/tmp/step-ends
mkdir -p "$OUT" $D
export PYTHONUNBUFFERED=1 CXX=${CXX:-/usr/bin/g++}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || echo "wheels not installed: the build may fail"
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
build() {  # build variant cores: one ~1.1B build, its log under $OUT
  TRITON_CACHE_DIR=$D/t$1$2 TORCHINDUCTOR_CACHE_DIR=$D/i$1$2 TORCHINDUCTOR_COMPILE_THREADS=8 \
      timeout 330 taskset -c $3 python3 bench/decode_step_cuda.py --out $D --builds $1 \
      --variant $2 --validate --build-only > "$OUT/build-$1-$2.log" 2>&1
  echo "build $1 $2 rc $?"
}
[ -d $D/llama-1b ] || python3 -c "from pathlib import Path; from bench.generation_cuda import big_checkpoint; big_checkpoint(Path('$D/llama-1b'), '1b', 0.02)"
# one file at a time, logging quiet: a failure's text, not Inductor's debug records
(for F in tests/targets/aoti/test_head_argmax_advance.py tests/runtime/test_decode_graph_advance.py \
          tests/targets/aoti/test_head_argmax.py tests/targets/aoti/test_decode_argmax_advance.py; do
   timeout 150 python3 -m pytest $F -q -p no:cacheprovider -p no:logging --tb=short \
       --show-capture=no -rf > "$OUT/t-$(basename $F .py).log" 2>&1
   echo "$F rc $? $(tail -1 "$OUT/t-$(basename $F .py).log")"; done) &
C=(0-7 8-15)
i=0; for V in after step-ends; do build fp16 $V ${C[$i]} & i=$((i+1)); done
wait
date -u +%T
grep -h '"build"' "$OUT"/build-*.log | cut -c1-900
A=$D/llama-1b-fp16-after.artifact S=$D/llama-1b-fp16-step-ends.artifact
python3 bench/library_kernels.py "$A" "$S" | tail -1 | tee "$OUT/kernels-difference.json"
timeout 150 python3 bench/decode_ab_cuda.py --engine "after=$A" --engine "step-ends=$S" \
    --runs 21 --out "$OUT/ab-fp16.jsonl" 2>&1 | grep -v "^W12"
date -u +%T
for V in after step-ends; do  # each build's kernels a step (torch.profiler, 20 replays)
  timeout 90 python3 bench/decode_step_cuda.py --out $D --builds fp16 --variant $V \
      --measure-only 2>&1 | grep -v "^W12" | tail -32
done
cp $D/decode-step.jsonl "$OUT/" 2>/dev/null
timeout 60 python3 bench/greedy_loop_cuda.py --artifact "$S" --out "$OUT/greedy.jsonl" \
    2>&1 | grep -v "^W12" | tail -14
date -u +%T
