#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD under .gm/, or the
# checkout): what the cuda target's decode turned on without a measurement at every
# width. PHASE=1 (one call, ~400 s warm): the decode kernels' GPU tests beside four
# ~1.1B builds side by side: int8 weights as the target is (`after`) and without the
# attention + o launch storing the rows (`rows-written`), int4 weights as the target is
# and with its decode flags off (`flags-off`). PHASE=2 (the next call, on the same warm
# machine: /tmp keeps the builds; ~150 s): each width's A/B in turns (21 runs) and the
# greedy loop on the int8 artifact's own graph (the runtime's loop against the graph
# replayed back to back and the copy-engine loop it replaced).
#
#   PHASE=1 bash bench/pending/decode_confirm.sh [WHEELS_DIR]
#   PHASE=2 bash bench/pending/decode_confirm.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/confirm-out). Decide: `after` >= 1.005 of the
# other build at its width with `tokens are argmax` True keeps the flags as they are;
# below it, turn the flag off for that width (targets/aoti/cuda.py) and say so in
# bench/RESULTS.md. The tests must all pass (the store library tests' copy checks were
# fixed without a GPU).
set -u
OUT=${OUT:-/tmp/confirm-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
D=/tmp/confirm
mkdir -p "$OUT" $D
export PYTHONUNBUFFERED=1 CXX=${CXX:-/usr/bin/g++}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || echo "wheels not installed: the build may fail"
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
build() {  # build variant cores: one ~1.1B build, its log under $OUT
  TRITON_CACHE_DIR=$D/t$1$2 TORCHINDUCTOR_CACHE_DIR=$D/i$1$2 TORCHINDUCTOR_COMPILE_THREADS=4 \
      timeout 480 taskset -c $3 python3 bench/decode_step_cuda.py --out $D --builds $1 \
      --variant $2 --validate --build-only > "$OUT/build-$1-$2.log" 2>&1
  echo "build $1 $2 rc $?"
}
if [ "${PHASE:-1}" = 1 ]; then
  [ -d $D/llama-1b ] || python3 -c "from pathlib import Path; from bench.generation_cuda import big_checkpoint; big_checkpoint(Path('$D/llama-1b'), '1b', 0.02)"
  # one file at a time, logging quiet: a failure's text, not Inductor's debug records
  (for F in test_decode_attention_o test_decode_attention_o_store test_decode_attention_store \
            test_attention_store test_head_argmax test_dependent_launch; do
     timeout 150 python3 -m pytest tests/targets/aoti/$F.py -q -p no:cacheprovider \
         -p no:logging --tb=short --show-capture=no -rf > "$OUT/t-$F.log" 2>&1
     echo "$F rc $? $(tail -1 "$OUT/t-$F.log")"; done) &
  C=(0-3 4-7 8-11 12-15)
  i=0; for V in after rows-written; do build fp16-int8-weight $V ${C[$i]} & i=$((i+1)); done
  for V in after flags-off; do build fp16-int4-weight $V ${C[$i]} & i=$((i+1)); done
  wait
  date -u +%T
  grep -h '"build"' "$OUT"/build-*.log | cut -c1-700
else
  for PAIR in fp16-int8-weight:rows-written fp16-int4-weight:flags-off; do
    B=${PAIR%%:*} V=${PAIR##*:}
    timeout 120 python3 bench/decode_ab_cuda.py --engine "after=$D/llama-1b-$B-after.artifact" \
        --engine "$V=$D/llama-1b-$B-$V.artifact" --runs 21 --out "$OUT/ab-$B.jsonl" \
        2>&1 | grep -v "^W12"
  done
  timeout 90 python3 bench/greedy_loop_cuda.py \
      --artifact $D/llama-1b-fp16-int8-weight-after.artifact --out "$OUT/greedy.jsonl" \
      2>&1 | grep -v "^W12" | tail -14
fi
date -u +%T
