#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD unpacked under .gm/, or
# the checkout): the streaming persistent MLP kernel (bench/persistent_mlp_stream.py, in
# Gluon: o -> gate/up -> down in one launch, TMA filling a ring of weight tiles that runs
# on across the grid barriers), checked, then timed in the 22-layer chain.
#
#   bash bench/pending/stream_mlp_chain.sh [WHEELS_DIR]     (~3 min warm; timeout_s 600)
#
# 1. --check (stop here if it fails): one layer at small and real shapes against
#    reference.row_gemv (fp16 tolerance, 20 repeats bit-equal, the barrier count), then
#    22 kernels alone in turns against bench/persistent_mlp.py's (30 rounds).
# 2. Stage stamps (GPU clock a stage, median program over 22 layers): each stream
#    configuration and persistent_mlp.py's best.
# 3. The chain, 60 rounds in turns: "dependent + join" (the mlp hook's own baseline: the
#    same launches up to the attention), the chain's best ("attention-o joined 4 splits
#    4 rows": o inside the attention's launch), persistent_mlp.py's best, the four stream
#    configurations. Decide: a stream configuration under the attention-o baseline (both
#    medians in this run, the spread read from the two baselines) goes on (step(), then
#    the library's pass); else its stage stamps say where the time goes.
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/stream-mlp-out).
set -u
OUT=${OUT:-/tmp/stream-mlp-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d "$WHL" ] && [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHL"/*.whl || echo "wheels not installed"
fi
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader \
    | tee -a "$OUT/summary.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$OUT/summary.txt"
timeout 300 python3 bench/persistent_mlp_stream.py --check --rounds 30 > "$OUT/check.log" 2>&1
rc=$?
echo "check rc $rc" | tee -a "$OUT/summary.txt"
grep -E "^(ok|FAIL|chain|stage)" "$OUT/check.log" | tee -a "$OUT/summary.txt"
if [ "$rc" != 0 ]; then
  tail -30 "$OUT/check.log" >> "$OUT/summary.txt"
  exit 1
fi
S="stream 32K x6 8w,stream 32K x4 8w,stream 16K x12 4w,stream 64K x3 8w,2/SM 8w balanced"
timeout 120 python3 bench/decode_chain_persistent.py "$S" > "$OUT/stamps.log" 2>&1
echo "stamps rc $?" | tee -a "$OUT/summary.txt"
grep -E "^(stream|2/SM)" "$OUT/stamps.log" | tee -a "$OUT/summary.txt"
B="dependent + join"
M="$B + stream MLP"
V="$B,$B + attention-o joined 4 splits 4 rows,$B + persistent MLP 2/SM 8w balanced"
V="$V,$M 32K x6 8w,$M 32K x4 8w,$M 16K x12 4w,$M 64K x3 8w"
timeout 240 python3 bench/decode_chain_cuda.py --rounds 60 --variants "$V" \
    --out "$OUT/chain.jsonl" > "$OUT/chain.log" 2>&1
echo "chain rc $?" | tee -a "$OUT/summary.txt"
grep -E "^in turns|max\|diff\|" "$OUT/chain.log" | cut -c1-160 | tee -a "$OUT/summary.txt"
