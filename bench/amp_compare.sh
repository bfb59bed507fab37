#!/bin/bash
# Mixed precision against f32 on bench/train_compare.sh's GPT-2 (4 layers,
# hidden 256, 4 heads, seq 128, batch 8, vocab 8192, AdamW, tied head):
# bench/ddp_bench --dp 1 with THREADS kernel threads, f32, bf16 and fp16
# (train.amp.enabled, train.amp.dtype), rounds alternating so that drifts of
# a shared machine hit all three. Prints tokens/s of each (median of the
# rounds), the ratios to f32, the losses of the last round (first -> last
# iteration), and whether this
# CPU multiplies bf16 natively (AVX512-BF16, AMX-BF16 from /proc/cpuinfo;
# without AVX512-BF16 the bf16 products are widened to f32: no speed-up is
# possible, the figure shows the casts' cost).
# Builds nothing: build ddp_bench first (Release).
#
#   bench/amp_compare.sh [BUILD_DIR] [ROUNDS] [THREADS]   (defaults: build, 3, 2)
# Environment: WARMUP (5), ITERS (20).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
rounds=${2:-3}
threads=${3:-2}
warmup=${WARMUP:-5}
iters=${ITERS:-20}
ours="$build/bin/ddp_bench"
[[ -x $ours ]] || { echo "amp_compare: $ours not built (cmake --build $build --target ddp_bench)" >&2; exit 1; }
export OMP_WAIT_POLICY=PASSIVE

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# field, median
source "$here/compare_lib.sh"

flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]] && echo yes || echo no; }
echo "cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); avx512_bf16 $(has avx512_bf16), amx_bf16 $(has amx_bf16)"

f32_rates=() bf16_rates=() fp16_rates=()
for ((r = 1; r <= rounds; ++r)); do
  for dtype in f32 bf16 fp16; do
    amp=(--set train.amp.enabled=false)
    [[ $dtype != f32 ]] && amp=(--set train.amp.enabled=true --set "train.amp.dtype=$dtype")
    "$ours" --dp 1 --warmup "$warmup" --iters "$iters" --set "train.dist.intra_op_threads=$threads" "${amp[@]}" \
      > "$log/$dtype" 2>&1 || { cat "$log/$dtype" >&2; exit 1; }
  done
  f32_rates+=("$(field "$log/f32" tokens/s)")
  bf16_rates+=("$(field "$log/bf16" tokens/s)")
  fp16_rates+=("$(field "$log/fp16" tokens/s)")
  echo "round $r: f32 ${f32_rates[-1]}, bf16 ${bf16_rates[-1]}, fp16 ${fp16_rates[-1]} tokens/s"
done
losses() { grep -m1 -o 'loss [0-9.]* -> [0-9.]*' "$log/$1"; }
echo "last round's losses: f32 $(losses f32), bf16 $(losses bf16), fp16 $(losses fp16)"
awk -v f="$(median "${f32_rates[@]}")" -v b="$(median "${bf16_rates[@]}")" -v h="$(median "${fp16_rates[@]}")" 'BEGIN {
  printf "tokens/s: f32 %.1f, bf16 %.1f (%.2fx f32), fp16 %.1f (%.2fx f32)\n", f, b, b / f, h, h / f
}'
