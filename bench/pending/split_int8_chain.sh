#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD under .gm/, or the
# checkout itself): the GPU tests of the split-K kernel, then the decode chain's split-K
# variants (fp16) and int8 row-loop and split-K variants (--int8), each list in turns
# against "dependent + join" (the library's choice). About 90 s on a warm H200.
#
#   bash bench/pending/split_int8_chain.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends for pytest (default: .whl beside the tree's .gm/, or
# ./.whl); results and logs go under $OUT (default /tmp/split-int8-out).
set -u
OUT=${OUT:-/tmp/split-int8-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/split-int8-triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || echo "wheels not installed: the tests may skip"
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
timeout 150 python3 -m pytest tests/targets/aoti/test_split_gemv.py \
    tests/bench/test_decode_chain_split.py -q -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests rc $?"; tail -3 "$OUT/tests.log"
date -u +%T

D="dependent + join"
FP16="$D,$D + nothing changed,$D + split down 2 parts 4 rows,$D + split down 4 parts 4 rows"
FP16="$FP16,$D + split down 2 parts 8 rows 8 warps,$D + split down 2 parts 4 rows whole part ahead"
FP16="$FP16,$D + split down 4 parts 4 rows whole part ahead"
FP16="$FP16,$D + split down 4 parts 8 rows 8 warps whole part ahead"
FP16="$FP16,$D + split down 4 parts 2 rows whole part ahead,$D + split o 2 parts 2 rows 4 warps"
FP16="$FP16,$D + o 2 rows 4 warps,$D + o 2 rows 4 warps + split down 2 parts 4 rows"
FP16="$FP16,$D + o 2 rows 4 warps + split down 4 parts 8 rows 8 warps whole part ahead"
timeout 240 python3 bench/decode_chain_cuda.py --rounds 30 --out "$OUT/chain-fp16.jsonl" \
    --variants "$FP16" > "$OUT/chain-fp16.log" 2>&1
echo "fp16 chain rc $?"; grep -E "in turns|Error" "$OUT/chain-fp16.log"
date -u +%T

L="$D + int8 row loop"
INT8="$D,$D + nothing changed,$L gate/up 2 rows 4 turns,$L gate/up 2 rows 5 turns"
INT8="$INT8,$L gate/up 2 rows 6 turns,$L gate/up 1 row 5 turns,$L gate/up 4 rows 3 turns"
INT8="$INT8,$L gate/up 4 rows 8 warps 4 turns,$L down 2 rows 4096 ahead 2 turns"
INT8="$INT8,$L down 2 rows 2048 ahead 2 turns,$L down 1 row 4096 ahead 4 turns"
INT8="$INT8,$L o 2 rows 2 turns,$L q/k/v 2 rows 2 turns,$L everywhere"
INT8="$INT8,$D + int8 split down 2 parts 4 rows whole part ahead"
INT8="$INT8,$D + int8 split down 2 parts 8 rows 8 warps whole part ahead"
INT8="$INT8,$D + int8 split down 4 parts 4 rows whole part ahead"
INT8="$INT8,$D + int8 split o 2 parts 4 rows whole part ahead"
timeout 240 python3 bench/decode_chain_cuda.py --int8 --rounds 30 \
    --out "$OUT/chain-int8.jsonl" --variants "$INT8" > "$OUT/chain-int8.log" 2>&1
echo "int8 chain rc $?"; grep -E "in turns|Error" "$OUT/chain-int8.log"
date -u +%T
