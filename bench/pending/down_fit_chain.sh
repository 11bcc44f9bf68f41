#!/bin/bash
# On the GPU machine, from a tree's root (the checkout or a `git archive` under .gm/):
# the int8 decode chain with down split along K in tiles that fit its parts (1,408
# columns as 1,024 + 256 + 128, not one masked 2,048-column tile: bench/down_fit_rows.py),
# and split so that its parts are a power of two (11 of 512, the library's kernel), each
# fitted form beside the library kernel in the same shape, 60 rounds in turns over the
# base a library runs now (the layer's attention and o in one launch), "nothing changed"
# (the base's graph again) last. First the kernel's tests (exact integer sums, the
# folds, two layers replayed in a CUDA graph). No build: about 2 minutes on a warm H200.
#
#   bash bench/pending/down_fit_chain.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends for the tests' helpers (default: .whl beside the
# tree's .gm/, or ./.whl; the chain runs without them); logs and rows under $OUT
# (default /tmp/down-fit-out). Decide: a change at <= 0.985 of the base with "nothing
# changed" within 0.3% of 1 (the same call) goes into the library's split rule
# (split_gemv_triton.py: _part_sums in fit_pieces' tiles, split_config's AHEAD the part's
# width, or its rows a program / parts where an "8 rows" or "11 parts" form wins and
# beats its "library" twin) and is A/B'd on a real 1.1B int8 build (21 runs in turns,
# tokens as HEAD's); one that misses is deleted from the variants with its figure.
set -u
OUT=${OUT:-/tmp/down-fit-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d "$WHL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHL"/*.whl || echo "wheels not installed"
fi
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
timeout 120 python3 -m pytest tests/bench/test_down_fit_rows.py -q -p no:cacheprovider \
    > "$OUT/tests.log" 2>&1
echo "tests rc $?"; tail -2 "$OUT/tests.log"
date -u +%T
timeout ${CHAIN_S:-300} python3 bench/decode_chain_cuda.py \
    --int8 --rounds 60 --variants "$(python3 bench/down_fit_rows.py --chain)" \
    --out "$OUT/chain.jsonl" > "$OUT/chain.log" 2>&1
echo "chain rc $?"
grep -E "max\|diff\||own us" "$OUT/chain.log" | cut -c1-170
grep -E "^in turns" "$OUT/chain.log"
date -u +%T
