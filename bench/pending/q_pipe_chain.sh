#!/bin/bash
# On the GPU machine, from a tree's root (the checkout or a `git archive` under .gm/):
# int8 and int4 products whose weights stream through shared memory (cp.async, TURNS
# blocks of rows a program: bench/q_pipe_rows.py, bench/q_pipe_int4.py) in the 22-layer
# decode chain, 60 rounds in turns. First the kernels' tests (compiled, on the
# GPU, and two chains of dependent launches replayed in a CUDA graph), then each width's
# every change against "dependent + join" ("int4 dependent + join"), "nothing changed"
# the control; then the few likeliest over the base a library runs now (the layer's
# attention and o in one launch). No build: about 4 minutes on a warm H200 (Triton compiles
# each configuration once; a chain run stops at $CHAIN_S, default 240 s).
#
#   bash bench/pending/q_pipe_chain.sh [WHEELS_DIR]
#
# WHEELS_DIR: pydantic and friends for the tests' helpers (default: .whl beside the
# tree's .gm/, or ./.whl; the chains run without them); logs and rows under $OUT
# (default /tmp/q-pipe-out). Decide: a change at <= 0.985 of its base with "nothing
# changed" within 0.3% of 1 (the same call), over both bases, is wired behind
# gemv_config (int4_config) and A/B'd on a real 1.1B build of its width.
set -u
OUT=${OUT:-/tmp/q-pipe-out}
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
timeout 120 python3 -m pytest tests/bench/test_decode_q_pipe.py -q -p no:cacheprovider \
    > "$OUT/tests.log" 2>&1
echo "tests rc $?"; tail -2 "$OUT/tests.log"
chain() {  # WIDTH LABEL VARIANTS: one chain run, its summary lines
  date -u +%T
  timeout ${CHAIN_S:-240} python3 bench/decode_chain_cuda.py --$1 --rounds 60 --variants "$3" \
      --out "$OUT/chain-$2.jsonl" > "$OUT/chain-$2.log" 2>&1
  echo "chain $2 rc $?"
  grep -E "max\|diff\||own us" "$OUT/chain-$2.log" | cut -c1-170
  grep -E "^in turns" "$OUT/chain-$2.log"
}
# the likeliest changes by the weight bytes they keep in flight a multiprocessor
# (python bench/decode_q_pipe.py), over the base a library runs now
AO8="dependent + join + attention-o joined 8 splits 4 rows"
AO4="int4 dependent + join + attention-o joined 4 splits 4 rows"
LIKELY8="nothing changed;gate/up 2 rows one tile x once 3 stages 2 turns"
LIKELY8+=";gate/up 2 rows one tile 3 stages 4 turns;head 8 rows one tile x once 3 stages 4 turns"
LIKELY8+=";down 2 rows 1024-column tiles 5 stages"
LIKELY4="nothing changed;gate/up 4 rows 5 stages 2 turns"
LIKELY4+=";head 8 rows 8 groups 4 stages 4 turns"
LIKELY4+=";down 4 rows first row held 8 warps 3 stages 2 turns"
Q="python3 bench/decode_q_pipe.py"
chain int8 int8 "$($Q --chain int8)"
chain int4 int4 "$($Q --chain int4)"
chain int8 int8-ao "$($Q --chain int8 --base "$AO8" --only "$LIKELY8")"
chain int4 int4-ao "$($Q --chain int4 --base "$AO4" --only "$LIKELY4")"
date -u +%T
