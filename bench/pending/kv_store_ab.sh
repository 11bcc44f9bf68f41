#!/bin/bash
# On the GPU machine, from a tree's root (the checkout or a `git archive` under .gm/): the
# decode step's new K/V rows stored by the attention's joined kernel (the cuda target's
# generation facet's store_rows, off by default), A/B on real ~1.1B builds from one tree:
# the store form's GPU tests, then `after` and `kv-store` builds side by side, the
# kernels each decode library loads (the store build must add no copy of a cache
# buffer), their decode in turns (21 runs, tokens against the first engine's and each
# its step's argmax) and each one's per-kernel table (the cache write's index, stack and
# remainder kernels gone). About 270 s on a warm H200.
#
#   bash bench/pending/kv_store_ab.sh [BUILD [WHEELS_DIR]]
#
# BUILD: fp16 (default) or fp16-int8-weight; WHEELS_DIR: pydantic and friends (default:
# .whl beside the tree's .gm/, or ./.whl); logs and rows under $OUT (default /tmp/kv-out).
set -u
BUILD=${1:-fp16}
OUT=${OUT:-/tmp/kv-out}
WHL=${2:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
D=/tmp/kv
mkdir -p "$OUT" $D
export PYTHONUNBUFFERED=1 CXX=${CXX:-/usr/bin/g++}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || echo "wheels not installed: the build may fail"
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
timeout 150 python3 -m pytest tests/targets/aoti/test_decode_attention_store.py \
    tests/targets/aoti/test_attention_store.py tests/targets/aoti/test_dependent_launch.py \
    -q -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests rc $?"; tail -2 "$OUT/tests.log"
[ -d $D/llama-1b ] || python3 -c "from pathlib import Path; from bench.generation_cuda import big_checkpoint; big_checkpoint(Path('$D/llama-1b'), '1b', 0.02)"
date -u +%T
for V in after kv-store; do
  C=0-7; [ $V = kv-store ] && C=8-15
  (TRITON_CACHE_DIR=$D/t$V TORCHINDUCTOR_CACHE_DIR=$D/i$V TORCHINDUCTOR_COMPILE_THREADS=8 \
   timeout 380 taskset -c $C python3 bench/decode_step_cuda.py --out $D --builds $BUILD \
   --variant $V --validate --build-only > "$OUT/build-$V.log" 2>&1; echo "build $V rc $?") &
done
wait
date -u +%T
grep -h '"build"' "$OUT"/build-*.log | cut -c1-900
A=$D/llama-1b-$BUILD-after.artifact B=$D/llama-1b-$BUILD-kv-store.artifact
# decide: only the join kernel swapped for the store form, no copies added
python3 bench/library_kernels.py "$A" "$B" > "$OUT/libraries.jsonl"
echo "libraries rc $?"; tail -1 "$OUT/libraries.jsonl"
timeout 150 python3 bench/decode_ab_cuda.py --engine "after=$A" --engine "kv-store=$B" \
    --runs 21 --out "$OUT/ab.jsonl" 2>&1 | grep -v "^W1201"
date -u +%T
for V in after kv-store; do
  timeout 75 python3 bench/decode_step_cuda.py --out $D --builds $BUILD --variant $V \
      --measure-only 2>&1 | grep -v "^W1201" | tail -14
done
cp $D/decode-step.jsonl "$OUT/step.jsonl" 2>/dev/null
date -u +%T
