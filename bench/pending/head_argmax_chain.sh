#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD under .gm/, or the
# checkout itself): the head-with-argmax kernel's GPU tests, the head and its tail alone
# in turns (bench/head_argmax_triton.py), then the 22-layer decode chain ending with the
# token, fp16 and int8, in turns: torch's argmax after the head (the runtime's
# greedy_tail) first, against the token taken inside the head (then torch's position
# add, or the position advanced in the head too). About 70 s on a warm H200.
#
#   bash bench/pending/head_argmax_chain.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends for pytest (default: .whl beside the tree's .gm/, or
# ./.whl); results and logs go under $OUT (default /tmp/head-argmax-out).
set -u
OUT=${OUT:-/tmp/head-argmax-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/head-argmax-triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || echo "wheels not installed: the tests may skip"
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
timeout 120 python3 -m pytest tests/bench/test_head_argmax.py -q -p no:cacheprovider \
    > "$OUT/tests.log" 2>&1
echo "tests rc $?"; tail -3 "$OUT/tests.log"
date -u +%T
timeout 90 python3 bench/head_argmax_triton.py --rounds 30 > "$OUT/head.log" 2>&1
echo "head alone rc $?"; grep -E "in turns|Error" "$OUT/head.log"
date -u +%T

D="dependent + join"
V="$D + torch argmax,$D + head argmax,$D + head argmax and position,$D"
timeout 150 python3 bench/decode_chain_cuda.py --rounds 30 --out "$OUT/chain-fp16.jsonl" \
    --variants "$V" > "$OUT/chain-fp16.log" 2>&1
echo "fp16 chain rc $?"; grep -E "in turns|Error|TB/s" "$OUT/chain-fp16.log"
date -u +%T
timeout 150 python3 bench/decode_chain_cuda.py --int8 --rounds 30 \
    --out "$OUT/chain-int8.jsonl" --variants "$V" > "$OUT/chain-int8.log" 2>&1
echo "int8 chain rc $?"; grep -E "in turns|Error|TB/s" "$OUT/chain-int8.log"
date -u +%T
