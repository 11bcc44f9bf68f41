#!/bin/bash
# On the GPU machine, from a tree's root (the checkout or a `git archive` under .gm/):
# each layer's gate/up and down as ONE launch with no barrier (kernels/mlp_triton.py:
# down split along the intermediate rows inside gate/up's row loop, the programs'
# partials added into one accumulator by atomics, the last program joining), in the
# fp16 decode chain beside the library's four launches a layer.
#
#   bash bench/pending/mlp_chain.sh [WHEELS_DIR]
#   INT8=1 TESTS=0 bash bench/pending/mlp_chain.sh   (then the int8 chain: --int8, its
#       base "... 8 splits 4 rows", the same variants over int8 rows; ~2 min more)
#
# One call (about 3 minutes warm; timeout_s 600): the GPU tests in three lanes (the
# kernel against the reference composition, three 1.1B-shaped layers replayed in a CUDA
# graph, plain and dependent, both accumulators; the chain's variants), then the fp16
# chain, 60 rounds in turns: the base ("dependent + join + attention-o joined 4 splits 4 rows", the library's
# fp16 configuration), the fused MLP with an fp32 accumulator at 5 grids and an int64
# (fixed point) one at 3, "nothing changed" last; each variant's ratio to the base.
# Decide: a fused variant at <= 0.985 of the base with "nothing changed" within 0.3% of 1
# goes to the library (the int64 form if within 0.3% of the fp32 one: deterministic).
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/mlp-chain-out).
set -u
OUT=${OUT:-/tmp/mlp-chain-out}
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
date -u +%T
lane() {  # lane cores name test-file [-m ...]: its GPU tests on those cores, a log
  timeout 200 taskset -c $1 python3 -m pytest $3 "${@:4}" -q -p no:cacheprovider \
      -p no:logging --tb=short > "$OUT/t-$2.log" 2>&1
  echo "$3 ${*:4} rc $? $(tail -1 "$OUT/t-$2.log")"
}
if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: the chain alone (a second call's int8 run)
  # three lanes: each test compiles its own kernels (some 60 in all)
  lane 0-5 small tests/targets/aoti/test_mlp_triton.py -m "not cuda" &
  lane 6-10 layers tests/targets/aoti/test_mlp_triton.py -m cuda &
  lane 11-15 chain tests/bench/test_decode_chain_mlp.py &
  wait
  date -u +%T
fi
BASE="dependent + join + attention-o joined 4 splits 4 rows"
FLAGS=""
if [ "${INT8:-0}" = 1 ]; then
  BASE="dependent + join + attention-o joined 8 splits 4 rows"
  FLAGS="--int8"
fi
VARIANTS="$BASE"
for V in "fp32 1/SM 2 rows 8 warps" "fp32 2/SM 2 rows 8 warps" "fp32 1/SM 4 rows 8 warps" \
         "fp32 2/SM 4 rows 8 warps" "fp32 3/SM 2 rows 8 warps" "int64 1/SM 2 rows 8 warps" "int64 2/SM 2 rows 8 warps" "int64 1/SM 4 rows 8 warps"; do
  VARIANTS="$VARIANTS,$BASE + fused MLP $V"
done
VARIANTS="$VARIANTS,$BASE + nothing changed"
timeout ${CHAIN_S:-300} python3 bench/decode_chain_cuda.py $FLAGS --rounds 60 \
    --variants "$VARIANTS" --out "$OUT/mlp_chain$TAG.jsonl" > "$OUT/chain$TAG.log" 2>&1
echo "chain rc $?"
grep -E "max\|diff\||own us" "$OUT/chain$TAG.log" | cut -c1-220
# each variant's median against the base's (the first), in turns
grep -E "^in turns" "$OUT/chain$TAG.log"
date -u +%T
