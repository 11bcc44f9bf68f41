#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD unpacked under .gm/, or
# the checkout): a layer's q/k/v product, attention and o as ONE launch
# (targets/aoti/kernels/qkv_attention_o_triton.py, not wired) in the fp16 decode chain
# beside the library's "dependent + join + attention-o joined 4 splits 4 rows".
#
#   bash bench/pending/qkv_chain.sh [WHEELS_DIR]
#   INT8=1 TESTS=0 bash bench/pending/qkv_chain.sh   (then the int8 chain: --int8, its
#       base "... 8 splits 4 rows", the int8 variants; ~1.5 min more)
#
# One call (~3 min warm; timeout_s 600; with the int8 chain after it in the same call:
# `bash bench/pending/qkv_chain.sh; INT8=1 TESTS=0 bash bench/pending/qkv_chain.sh`): the GPU tests, each file with its own timeout
# and a line in $OUT/summary.txt as it ends (the kernel against the composed references,
# four 1.1B-shaped layers in a CUDA graph, plain and dependent; the chain's variants),
# then the chain, 40 rounds in turns: the base, the joined launch at three
# configurations (each grid resident at once: bench/decode_chain_qkv.py) and the first
# without its cache prefetch, the base "+ nothing changed" last; each variant's ratio to
# the base. Decide: a variant at <= 0.985 of the base with "nothing changed" within 0.3%
# of 1 goes to the library (a pass joining q/k/v's row_gemv into decode_attention_o, as
# targets/aoti/passes/attention_o.py joins o); else its figures in bench/RESULTS.md and
# the kernel deleted.
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/qkv-chain-out).
set -u
OUT=${OUT:-/tmp/qkv-chain-out}
TAG=$([ "${INT8:-0}" = 1 ] && echo _int8)
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d "$WHL" ] && [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHL"/*.whl || echo "wheels not installed"
fi
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T | tee -a "$OUT/summary.txt"
run_tests() {  # name seconds test-file [pytest args]: a log, a summary line as it ends
  timeout "$2" python3 -m pytest "$3" "${@:4}" -q -p no:cacheprovider -p no:logging \
      --tb=short > "$OUT/t-$1.log" 2>&1
  echo "$3 ${*:4} rc $? $(tail -1 "$OUT/t-$1.log")" | tee -a "$OUT/summary.txt"
}
if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: the chain alone
  run_tests layers 240 tests/targets/aoti/test_qkv_attention_o.py -m cuda &
  run_tests small 240 tests/targets/aoti/test_qkv_attention_o.py -m "not cuda" &
  run_tests chain 240 tests/bench/test_decode_chain_qkv.py &
  wait
  date -u +%T | tee -a "$OUT/summary.txt"
fi
BASE="dependent + join + attention-o joined 4 splits 4 rows"
OWN=("8 rows 1024 ahead" "8 rows 256 ahead" "16 rows 512 ahead"
     "8 rows 1024 ahead cache after the wait")
FLAGS=""
if [ "${INT8:-0}" = 1 ]; then
  BASE="dependent + join + attention-o joined 8 splits 4 rows"
  OWN=("int8 32 rows 256 ahead" "int8 32 rows 128 ahead" "int8 32 rows 256 ahead 4 splits")
  FLAGS="--int8"
fi
VARIANTS="$BASE"
for V in "${OWN[@]}"; do
  VARIANTS="$VARIANTS,dependent + join + qkv-attention-o $V"
done
VARIANTS="$VARIANTS,$BASE + nothing changed"
timeout ${CHAIN_S:-300} python3 bench/decode_chain_cuda.py $FLAGS --rounds 40 \
    --variants "$VARIANTS" --out "$OUT/qkv_chain$TAG.jsonl" > "$OUT/chain$TAG.log" 2>&1
echo "chain$TAG rc $?" | tee -a "$OUT/summary.txt"
grep -E "max\|diff\||own us" "$OUT/chain$TAG.log" | cut -c1-220
# each variant's median against the base's (the first), in turns
grep -E "^in turns" "$OUT/chain$TAG.log" | tee -a "$OUT/summary.txt"
date -u +%T | tee -a "$OUT/summary.txt"
