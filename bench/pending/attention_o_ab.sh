#!/bin/bash
# On the GPU machine, from a tree's root (a `git archive` of HEAD under .gm/, or the
# checkout): each decode layer's attention and o (+ residual) as one launch (the patch
# bench/pending/attention_o.patch: the op decode_attention_o, the decode pass's join
# behind the cuda target's generation facet's attention_o, off by default; the script
# turns it on only in its `attention-o` build). In order: the patch applied to the tree;
# the confirming chain call (the bench's own kernel in the 22-layer chain, fp16 and int8
# at 100 rounds, int4 at 60); the op's GPU tests (CUDA graph of dependent layers at the
# ~1.1B's shape, the library's kernels); `after` and `attention-o` builds side by side;
# the kernels each decode library loads; their decode in turns (21 runs, tokens against
# the first engine's and each its step's argmax); each one's per-kernel table. About
# 350 s on a warm H200.
#
#   bash bench/pending/attention_o_ab.sh [BUILD [WHEELS_DIR]]
#
# BUILD: fp16 (default) or fp16-int8-weight; WHEELS_DIR: pydantic and friends (default:
# .whl beside the tree's .gm/, or ./.whl); logs and rows under $OUT (default /tmp/ao-out).
# CHAIN=0 skips the chain call (already made); TESTS=0 the GPU tests.
set -u
BUILD=${1:-fp16}
OUT=${OUT:-/tmp/ao-out}
WHL=${2:-$(if [ -d ../../.whl ]; then echo ../../.whl; else echo .whl; fi)}
PATCH=bench/pending/attention_o.patch
NEW=attention-o  # the patch's variant of decode_step_cuda.py (not in the tree before it)
D=/tmp/ao
mkdir -p "$OUT" $D
export PYTHONUNBUFFERED=1 CXX=${CXX:-/usr/bin/g++}
# the patch, once (a tree it is applied to reverses cleanly), to this folder: git looks
# for no repository above it (one there would take the patch's paths as its own)
export GIT_CEILING_DIRECTORIES=$(dirname "$PWD")
if git apply --reverse --check $PATCH 2>/dev/null; then echo "patch already applied"
elif git apply $PATCH; then echo "patch applied"
else echo "the patch does not apply to this tree"; exit 1; fi
# the builds' variants in the (patched) tree; the loops name the patch's through $NEW, so
# tests/bench/test_decode_step_variants.py checks this script against the unpatched tree
for V in after; do grep -q "\"$V\"" bench/decode_step_cuda.py || { echo "no $V"; exit 1; }; done
grep -q "\"$NEW\"" bench/decode_step_cuda.py || { echo "no $NEW variant"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHL"/*.whl || echo "wheels not installed: the build may fail"
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
date -u +%T
if [ "${CHAIN:-1}" = 1 ]; then
  # decides first: joined 4 splits <= 0.98 of "dependent + join" again (8 splits at
  # int8), with "nothing changed" within 0.3% of 1
  J="dependent + join" O="attention-o joined"
  L="$J,$J + $O 4 splits 4 rows,$J + $O 8 splits 4 rows,$J + nothing changed"
  for P in "" --int8; do
    timeout 100 python3 bench/decode_chain_cuda.py $P --rounds 100 --variants "$L" \
        --out "$OUT/chain.jsonl" 2>&1 | grep -v "^W1201" | tail -8
  done
  timeout 100 python3 bench/decode_chain_cuda.py --int4 --rounds 60 --out "$OUT/chain.jsonl" \
      --variants "int4 $J,int4 $J + $O 4 splits 4 rows,int4 $J + nothing changed" \
      2>&1 | grep -v "^W1201" | tail -6
  date -u +%T
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 python3 -m pytest tests/targets/aoti/test_decode_attention_o.py \
      tests/targets/aoti/test_decode_attention_join.py \
      tests/targets/aoti/test_dependent_launch.py -q -p no:cacheprovider > "$OUT/tests.log" 2>&1
  echo "tests rc $?"; tail -2 "$OUT/tests.log"
fi
[ -d $D/llama-1b ] || python3 -c "from pathlib import Path; from bench.generation_cuda \
import big_checkpoint; big_checkpoint(Path('$D/llama-1b'), '1b', 0.02)"
date -u +%T
for V in after $NEW; do
  C=0-7; [ $V = $NEW ] && C=8-15
  (TRITON_CACHE_DIR=$D/t$V TORCHINDUCTOR_CACHE_DIR=$D/i$V TORCHINDUCTOR_COMPILE_THREADS=8 \
   timeout 380 taskset -c $C python3 bench/decode_step_cuda.py --out $D --builds $BUILD \
   --variant $V --validate --build-only > "$OUT/build-$V.log" 2>&1; echo "build $V rc $?") &
done
wait
date -u +%T
# the attention-o build's passes: "attention_o": 22 under row_linears_as_kernels
grep -h '"build"' "$OUT"/build-*.log | cut -c1-900
A=$D/llama-1b-$BUILD-after.artifact B=$D/llama-1b-$BUILD-$NEW.artifact
# decide: the decode library swaps attention_join_kernel_gdc for attention_o_kernel_gdc
# (row_gemv_kernel_gdc stays for the other products), no copies added
python3 bench/library_kernels.py "$A" "$B" > "$OUT/libraries.jsonl"
echo "libraries rc $?"; tail -1 "$OUT/libraries.jsonl"
timeout 150 python3 bench/decode_ab_cuda.py --engine "after=$A" --engine "$NEW=$B" \
    --runs 21 --out "$OUT/ab.jsonl" 2>&1 | grep -v "^W1201"
date -u +%T
for V in after $NEW; do
  timeout 75 python3 bench/decode_step_cuda.py --out $D --builds $BUILD --variant $V \
      --measure-only 2>&1 | grep -v "^W1201" | tail -14
done
cp $D/decode-step.jsonl "$OUT/step.jsonl" 2>/dev/null
date -u +%T
