#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` under .gm/, PYTHONPATH=/tmp/site:.
# with pydantic and friends installed there): the chain's attention + o variants now
# launch the library's kernel (attention_o_triton.launch_decode_attention_o with a
# `config`), the bench's own copy of it deleted. Nothing here decides a default: it checks
# that the chain's bases still run and time as they did with the copy.
#
#   bash bench/pending/ao_dedupe_gpu.sh        (~90-150 s warm, not run yet; timeout_s 600)
#
# 1. The GPU tests of the touched test files, three lanes side by side (the library's
#    file's two AOTInductor compiles in a lane of their own): rc 0 each.
# 2. decode_chain_cuda.py, 20 rounds in turns, fp16, --int8 and --int4: each base and
#    the base again ("+ nothing changed", a graph of its own).
# Expect: max|diff| vs plain launch about 1.0e-2 fp16, 6-8e-3 int8, 9.8e-3 int4; "nothing
# changed" within ~0.5% of 1; the attention+o own us near the bench copy's (fp16 4 splits
# 5.70, int8 8 splits 5.34-5.47, int4 6.46; chains 683.6 / ~606 / 473.0 us).
set -u
OUT=${OUT:-/tmp/ao-dedupe-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-/tmp/site:.}
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
lane() {  # lane cores name test-file [-k ...]: its GPU tests on those cores, a log
  timeout 200 taskset -c $1 python3 -m pytest $3 "${@:4}" -q -p no:cacheprovider \
      -p no:logging --tb=short > "$OUT/t-$2.log" 2>&1
  echo "$3 ${*:4} rc $? $(tail -1 "$OUT/t-$2.log")"
}
lane 0-5 kernel tests/targets/aoti/test_decode_attention_o.py -k "not library" &
lane 6-10 library tests/targets/aoti/test_decode_attention_o.py -k library &
lane 11-15 chain tests/bench/test_decode_attention_o.py &
wait
date -u +%T
BASE="dependent + join + attention-o joined"
for RUN in "fp16:|$BASE 4 splits 4 rows" "int8:--int8|$BASE 8 splits 4 rows" \
           "int4:--int4|int4 $BASE 4 splits 4 rows"; do
  NAME=${RUN%%:*}; REST=${RUN#*:}; FLAG=${REST%%|*}; V=${REST#*|}
  timeout 90 python3 bench/decode_chain_cuda.py $FLAG --rounds 20 \
      --variants "$V,$V + nothing changed" --out "$OUT/chain-$NAME.jsonl" \
      > "$OUT/chain-$NAME.log" 2>&1
  echo "chain $NAME rc $?"
  grep -E "max\|diff\||own us|^in turns" "$OUT/chain-$NAME.log" | cut -c1-220
done
date -u +%T
