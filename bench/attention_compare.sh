#!/bin/bash
# Causal attention forward and backward on the CPU, Tessera's fused op
# (flash_attention and its gradient op, bench/attention_bench.cc) against
# PyTorch on the same machine in the same run (bench/attention_torch.py:
# 1.13's scaled_dot_product_attention and the eager q kᵀ / softmax / @ v),
# same shapes, same thread counts (1 and 2; PyTorch in one process per
# count, its OpenBLAS held to it too). Prints each side's median
# milliseconds and the ratios Tessera / PyTorch (< 1: Tessera is faster).
# Builds nothing: build attention_bench first (Release).
#
#   bench/attention_compare.sh [BUILD_DIR]     (default: build)
# Environment: PYTHON (/usr/bin/python3), QUICK=1 (3 repeats instead of 7).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
python=${PYTHON:-/usr/bin/python3}
ours="$build/bin/attention_bench"
[[ -x $ours ]] || { echo "attention_compare: $ours not built (cmake --build $build --target attention_bench)" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null || { echo "attention_compare: $python has no torch (apt-get install python3-torch)" >&2; exit 1; }
quick=()
[[ ${QUICK:-0} == 1 ]] && quick=(--quick)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ours" --tsv "${quick[@]}" > "$tmp/ours.tsv"
for threads in 1 2; do
  "$python" "$here/attention_torch.py" "${quick[@]}" --threads=$threads > "$tmp/torch$threads.tsv"
done
paste -d'\n' "$tmp/torch1.tsv" "$tmp/torch2.tsv" > "$tmp/torch.tsv"  # (case by case, as ours)

echo "causal attention, CPU, median ms (forward / backward); ratios Tessera fused / PyTorch"
paste "$tmp/ours.tsv" "$tmp/torch.tsv" | awk -F'\t' '
  $1 != $7 || $2 != $8 { print "attention_compare: the two sides ran different cases" > "/dev/stderr"; exit 1 }
  {
    printf "%-32s %d thr  Tessera fused %8.2f / %8.2f (unfused %8.2f / %8.2f)  PyTorch sdpa %8.2f / %8.2f  eager %8.2f / %8.2f\n",
      $1, $2, $3, $4, $5, $6, $9, $10, $11, $12
    printf "%-32s        fwd+bwd: vs sdpa %.2fx, vs eager %.2fx\n", "", ($3 + $4) / ($9 + $10), ($3 + $4) / ($11 + $12)
  }'
