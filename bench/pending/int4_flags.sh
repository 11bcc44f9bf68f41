#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD under .gm/, or the
# checkout): the cuda target's decode flags at int4 weights (Generation.int4_fused, off
# in the library): the greedy token in the head's kernel over int4 rows (and with it the
# advancing token kernel, advance_inputs being on), each layer's attention and o as one
# launch over int4 o rows, storing the rows. One call, ~350 s warm (~450 s cold; run it
# with timeout_s 600): the GPU tests of the int4 kernels and of the kernels they share
# code with, beside two ~1.1B int4-weight builds side by side (`after`: HEAD's flags;
# `int4-fused`: the same with int4_fused), the two libraries' kernel difference, the A/B
# in turns (21 runs) and each build's per-kernel table.
#
#   bash bench/pending/int4_flags.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/int4-flags-out). Decide: `int4-fused` >= 1.005
# of `after` with `tokens are argmax` True (and the tests rc 0) turns int4_fused on for
# cuda (targets/aoti/cuda.py); below it, it stays off, its figure in bench/RESULTS.md.
# Expected: the passes' `argmax_in_head: 1`, `attention_o: 22`, `inputs_advanced: 1`
# (0, 0, 0 in `after`); the library difference attention_store_kernel_gdc ->
# attention_o_store_kernel_gdc, int4_head_argmax_kernel_gdc and
# slot_token_advance_kernel_gdc added, torch's argmax reduction gone, copies_added 0.
set -u
OUT=${OUT:-/tmp/int4-flags-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
D=/tmp/int4-flags
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
(for F in tests/targets/aoti/test_decode_attention_o_int4.py \
          tests/targets/aoti/test_head_argmax_int4.py tests/targets/aoti/test_int4_fused_pass.py \
          tests/targets/aoti/test_decode_attention_o.py tests/targets/aoti/test_head_argmax.py; do
   timeout 150 python3 -m pytest $F -q -p no:cacheprovider -p no:logging --tb=short \
       --show-capture=no -rf > "$OUT/t-$(basename $F .py).log" 2>&1
   echo "$F rc $? $(tail -1 "$OUT/t-$(basename $F .py).log")"; done) &
C=(0-7 8-15)
i=0; for V in after int4-fused; do build fp16-int4-weight $V ${C[$i]} & i=$((i+1)); done
wait
date -u +%T
grep -h '"build"' "$OUT"/build-*.log | cut -c1-1200
A=$D/llama-1b-fp16-int4-weight-after.artifact F=$D/llama-1b-fp16-int4-weight-int4-fused.artifact
python3 bench/library_kernels.py "$A" "$F" | tail -1 | tee "$OUT/kernels-difference.json"
timeout 150 python3 bench/decode_ab_cuda.py --engine "after=$A" --engine "int4-fused=$F" \
    --runs 21 --out "$OUT/ab-int4.jsonl" 2>&1 | grep -v "^W12"
date -u +%T
for V in after int4-fused; do  # each build's kernels a step (torch.profiler, 20 replays)
  timeout 90 python3 bench/decode_step_cuda.py --out $D --builds fp16-int4-weight \
      --variant $V --measure-only 2>&1 | grep -v "^W12" | tail -32
done
cp $D/decode-step.jsonl "$OUT/" 2>/dev/null
date -u +%T
