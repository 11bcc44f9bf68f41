#!/bin/bash
# On the GPU machine, from a tree's root (the checkout or a `git archive` under .gm/):
# the int8 kernels that still convert each weight with an I2F, each with its rows read as
# int32 words instead (a byte permute and an fp32 subtract a weight:
# int8_words_triton.py's pieces, behind each kernel's WORDS constexpr, off in the
# library): down's split, o's rows in the attention + o launch, the head with its token.
#
#   bash bench/pending/int8_words_rest.sh [WHEELS_DIR]                   (PHASE=1)
#   PHASE=2 WORDS=attention_o_ahead,split bash bench/pending/int8_words_rest.sh
#
# PHASE=1 (about 2 minutes warm, no build; timeout_s 600): the GPU tests (the kernels'
# exact sums, two chain layers replayed in a CUDA graph), then the int8 decode chain, 60
# rounds in turns: "dependent + join + attention-o joined 8 splits 4 rows" (the base),
# each kernel's words form beside its I2F twin (down's twin is the base; o's and the
# head's are the library's launches as an int8 build runs them), all three together
# beside the twins together, "nothing changed" last; each kernel's own us in the table.
# Decide: a words form at <= 0.985 of its twin with "nothing changed" within 0.3% of 1
# goes to PHASE=2 (the head, one call a step, can show only in its own us).
# PHASE=2 (one call, ~420 s warm; timeout_s 600): two ~1.1B int8 builds side by side,
# `base` (the library as is) and `words` (EDGE_EXPORTER_INT8_WORDS=$WORDS: the kernels
# PHASE=1 passed), their kernels' difference, decode_ab_cuda 21 runs in turns, each
# build's per-kernel table. `words` >= 1.005 of `base` with `tokens are argmax` True:
# put those kernels in int8_words_triton.WORDS_DEFAULT; else they stay off, the figures
# in bench/RESULTS.md.
# WHEELS_DIR: pydantic and friends (default: .whl beside the tree's .gm/, or ./.whl);
# logs and rows under $OUT (default /tmp/int8-words-rest-out).
set -u
OUT=${OUT:-/tmp/int8-words-rest-out}
WHL=${1:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
PHASE=${PHASE:-1}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CXX=${CXX:-/usr/bin/g++}
if [ -d "$WHL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHL"/*.whl || echo "wheels not installed"
fi
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
if [ "$PHASE" = 1 ]; then
  for F in tests/targets/aoti/test_int8_words_rest.py tests/bench/test_int8_words_rest.py; do
    timeout 240 python3 -m pytest $F -q -p no:cacheprovider -p no:logging --tb=short \
        > "$OUT/t-$(basename $(dirname $F))-$(basename $F .py).log" 2>&1
    echo "$F rc $? $(tail -1 "$OUT/t-$(basename $(dirname $F))-$(basename $F .py).log")"
  done
  date -u +%T
  timeout ${CHAIN_S:-300} python3 bench/decode_chain_cuda.py \
      --int8 --rounds 60 --variants "$(python3 bench/int8_words_rest.py --chain)" \
      --out "$OUT/chain.jsonl" > "$OUT/chain.log" 2>&1
  echo "chain rc $?"
  grep -E "max\|diff\||own us" "$OUT/chain.log" | cut -c1-200
  grep -E "^in turns" "$OUT/chain.log"
  date -u +%T
  exit 0
fi
# PHASE=2: the 1.1B int8 A/B of the kernels PHASE=1 passed
: "${WORDS:?name the kernels PHASE=1 passed, e.g. WORDS=attention_o_ahead,split}"
D=/tmp/int8-words-rest
mkdir -p $D/base $D/words
[ -d $D/llama-1b ] || python3 -c "from pathlib import Path; from bench.generation_cuda import big_checkpoint; big_checkpoint(Path('$D/llama-1b'), '1b', 0.02)"
for V in base words; do ln -sfn $D/llama-1b $D/$V/llama-1b; done
build() {  # build name cores [environment]: one ~1.1B int8 build, its own caches
  env $3 TRITON_CACHE_DIR=$D/t$1 TORCHINDUCTOR_CACHE_DIR=$D/i$1 \
      TORCHINDUCTOR_COMPILE_THREADS=8 timeout 360 taskset -c $2 python3 \
      bench/decode_step_cuda.py --out $D/$1 --builds fp16-int8-weight --validate \
      --build-only > "$OUT/build-$1.log" 2>&1
  echo "build $1 rc $?"
}
build base 0-7 "" &
build words 8-15 "EDGE_EXPORTER_INT8_WORDS=$WORDS" &
wait
date -u +%T
grep -h '"build"' "$OUT"/build-*.log | cut -c1-600
A=$D/base/llama-1b-fp16-int8-weight-after.artifact
W=$D/words/llama-1b-fp16-int8-weight-after.artifact
python3 bench/library_kernels.py "$A" "$W" | tail -1 | tee "$OUT/kernels-difference.json"
# the same kernels either way (WORDS is a constexpr): the words builds' PTX holds the
# byte permute's exponent word, the base's none (none in both: no PTX packaged)
python3 - "$A" "$W" <<'PY'
import io, sys, zipfile
def count(data):
    found = 0
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for name in z.namelist():
            inner = z.read(name)
            found += count(inner) if name.endswith(".pt2") else b"0x4B000000" in inner
    return found
for path in sys.argv[1:]:
    print(path, "members with the words' permute:", count(open(path, "rb").read()))
PY
timeout 150 python3 bench/decode_ab_cuda.py --engine "base=$A" --engine "words=$W" \
    --runs 21 --out "$OUT/ab-int8.jsonl" 2>&1 | grep -v "^W12"
date -u +%T
for V in base words; do  # each build's kernels a step (torch.profiler, 20 replays)
  timeout 90 python3 bench/decode_step_cuda.py --out $D/$V --builds fp16-int8-weight \
      --measure-only 2>&1 | grep -v "^W12" | tail -14
done
date -u +%T
