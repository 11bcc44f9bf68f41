#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD under .gm/, or the
# checkout itself): the fp16-pair int4 kernel (bench/int4_rows_pairs.py) on the GPU: its
# tests (its PTX against reference.row_gemv, the int4 chain's pairs variant against the
# default), then the 22-layer int4 decode chain in turns against "int4 dependent + join":
# every product in pairs (8, 4, 16 rows a thread, 4 where 8 leave few warps), then one
# product at a time, then Nsight Compute's executed instructions of the pairs kernels
# (1 layer) against the offline count (bench/int4_rows_count.py). About 150-200 s on a
# warm H200.
#
#   bash bench/pending/int4_pairs_chain.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends for pytest (default: .whl beside the tree's .gm/, or
# ./.whl); results and logs go under $OUT (default /tmp/int4-pairs-out).
set -u
OUT=${OUT:-/tmp/int4-pairs-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/int4-pairs-triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || echo "wheels not installed: the tests may skip"
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
timeout 120 python3 -m pytest tests/bench/test_int4_rows_pairs.py -q -p no:cacheprovider \
    > "$OUT/tests.log" 2>&1
echo "tests rc $?"; tail -3 "$OUT/tests.log"
date -u +%T

D="int4 dependent + join"
V="$D,$D + pairs,$D + pairs 4 rows,$D + pairs 16 rows,$D + pairs mixed rows"
V="$V,$D + q/k/v pairs,$D + o pairs"
V="$V,$D + gate/up pairs,$D + down pairs,$D + head pairs,$D + nothing changed"
timeout 200 python3 bench/decode_chain_cuda.py --int4 --rounds 30 \
    --out "$OUT/chain-int4.jsonl" --variants "$V" > "$OUT/chain-int4.log" 2>&1
echo "int4 chain rc $?"; grep -E "in turns|Error|TB/s|own us" "$OUT/chain-int4.log"
date -u +%T

timeout 150 ncu --clock-control none --metrics smsp__inst_executed.sum,gpu__time_duration.sum \
    -k regex:int4_pairs_kernel --launch-count 5 --csv python3 bench/decode_chain_cuda.py \
    --int4 --layers 1 --variants "$D + pairs" > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
echo "ncu rc $?"; grep -E "inst_executed|duration" "$OUT/ncu.csv" | cut -c1-220
date -u +%T
