#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD unpacked under .gm/, or
# the checkout): what session 80 left unmeasured about int8 products over x's int8 codes.
#
#   bash bench/pending/x_codes_next.sh [WHEELS_DIR]     (~4 min warm; timeout_s 600)
#
# 1. GPU tests, each file with its own limit and a line in $OUT/summary.txt as it ends:
#    test_generation_cuda.py's int8 test (a tiny llama built at int8-weight, its step over
#    x's codes, validated; graphs decode as plain launches), the split kernel's codes
#    (test_split_gemv_dot4.py), the head's (test_head_argmax_codes.py).
# 2. The int8 chain, 60 rounds in turns: gate/up over x's codes at 8 rows (the library),
#    then with down split over x's codes at 16 and 32 rows (0.9462 and 0.9372 against
#    0.9477 in 30 rounds, inside that run's spread), "nothing changed" last. Decide: a
#    down form at <= 0.985 of gate/up alone with "nothing changed" within 0.3% of 1 goes
#    to the library (gemv_config's x_qblock branch returning split_config's parts at its
#    rows for a splittable product; the decode pass marking int8 down), then an A/B on
#    two ~1.1B int8-weight builds (bench/decode_step_cuda.py, variants x-float and after).
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/x-codes-out).
set -u
OUT=${OUT:-/tmp/x-codes-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d "$WHL" ] && [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHL"/*.whl || echo "wheels not installed"
fi
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
run_tests() {  # name seconds cores pytest-args...: a log, a summary line as it ends
  timeout "$2" taskset -c "$3" python3 -m pytest "${@:4}" -q -p no:cacheprovider \
      -p no:logging --tb=short > "$OUT/t-$1.log" 2>&1
  echo "$1 rc $? $(tail -1 "$OUT/t-$1.log")" | tee -a "$OUT/summary.txt"
}
run_tests generation 300 0-7 \
    "tests/targets/aoti/test_generation_cuda.py::test_an_int8_weight_step_reads_x_codes_and_validates" &
run_tests kernels 200 8-15 tests/targets/aoti/test_split_gemv_dot4.py \
    tests/targets/aoti/test_head_argmax_codes.py tests/targets/aoti/test_int8_dot4.py &
wait
B="dependent + join + attention-o joined 8 splits 4 rows"
G="$B + dot4 q32 gate/up 8 rows"
V="$G,$G + down 11 parts 16 rows,$G + down 11 parts 32 rows,$B + nothing changed"
timeout 200 python3 bench/decode_chain_cuda.py --int8 --rounds 60 --variants "$V" \
    --out "$OUT/down_codes.jsonl" > "$OUT/chain.log" 2>&1
echo "chain rc $?" | tee -a "$OUT/summary.txt"
grep -E "^in turns" "$OUT/chain.log" | tee -a "$OUT/summary.txt"
