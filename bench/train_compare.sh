#!/bin/bash
# Training throughput in one process with THREADS kernel threads, side by
# side: bench/ddp_bench --dp 1 (train.dist.intra_op_threads=THREADS) against
# bench/ddp_torch.py --world 1 --threads THREADS (PyTorch from Debian,
# OMP_WAIT_POLICY=PASSIVE), on the same GPT-2: 4 layers, hidden 256, 4 heads,
# seq 128, batch 8, vocab 8192, AdamW, tied head (both sides print and must
# agree on the parameter count). Rounds alternate A/B so that drifts of a
# shared machine hit both. Prints tokens/s of each (median of the rounds),
# the ratio, and each as a fraction of this CPU's FP32 FMA peak for THREADS
# threads, measured in the same run (gemm_bench --peak), with model FLOPs per
# token = 6 · parameters + 12 · layers · hidden · seq (the attention's two
# products, forward and backward).
# Builds nothing: build ddp_bench and gemm_bench first (Release).
#
#   bench/train_compare.sh [BUILD_DIR] [ROUNDS] [THREADS]   (defaults: build, 3, 2)
# Environment: WARMUP (5), ITERS (20), PYTHON (/usr/bin/python3),
# SHAPE=L,H,NH,T,B,V (layers, hidden, heads, seq, micro-batch, vocabulary)
# for another model on both sides: 12,768,12,1024,4,50257 is GPT-2 124M at
# micro-batch 4 (then WARMUP=1 ITERS=3 keep a round to minutes).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
rounds=${2:-3}
threads=${3:-2}
warmup=${WARMUP:-5}
iters=${ITERS:-20}
python=${PYTHON:-/usr/bin/python3}
ours="$build/bin/ddp_bench"
peak_bench="$build/bin/gemm_bench"
for exe in "$ours" "$peak_bench"; do
  [[ -x $exe ]] || { echo "train_compare: $exe not built (cmake --build $build --target ddp_bench gemm_bench)" >&2; exit 1; }
done
export OMP_WAIT_POLICY=PASSIVE
ours_shape=() torch_shape=()
if [[ -n ${SHAPE:-} ]]; then
  IFS=, read -r layers hidden heads seq micro vocab <<<"$SHAPE"
  [[ -n $vocab && "$layers$hidden$heads$seq$micro$vocab" =~ ^[0-9]+$ ]] ||
    { echo "train_compare: SHAPE must be L,H,NH,T,B,V (six integers), not '$SHAPE'" >&2; exit 1; }
  for kv in num_layers=$layers hidden_size=$hidden num_attention_heads=$heads ffn_hidden_size=$((4 * hidden)) \
    max_seq_length=$seq seq_length=$seq vocab_size=$vocab; do
    ours_shape+=(--set "model.$kv")
  done
  ours_shape+=(--set "train.train_micro_batch_size=$micro")
  torch_shape=(--shape "$SHAPE")
fi

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# field, median
source "$here/compare_lib.sh"

"$peak_bench" --peak "$threads" > "$log/peak"
peak=$(field "$log/peak" peak_gflops)

ours_rates=() torch_rates=()
for ((r = 1; r <= rounds; ++r)); do
  "$ours" --dp 1 --warmup "$warmup" --iters "$iters" --set "train.dist.intra_op_threads=$threads" "${ours_shape[@]}" > "$log/ours" 2>&1 ||
    { cat "$log/ours" >&2; exit 1; }
  "$python" "$here/ddp_torch.py" --world 1 --threads "$threads" --warmup "$warmup" --iters "$iters" "${torch_shape[@]}" > "$log/torch" 2>&1 ||
    { cat "$log/torch" >&2; exit 1; }
  ours_rates+=("$(field "$log/ours" tokens/s)")
  torch_rates+=("$(field "$log/torch" tokens/s)")
  echo "round $r: tessera ${ours_rates[-1]} tokens/s, pytorch ${torch_rates[-1]} tokens/s"
done

params=$(field "$log/ours" parameters)
torch_params=$(field "$log/torch" parameters)
[[ $params == "$torch_params" ]] || { echo "train_compare: parameters differ: tessera $params, pytorch $torch_params" >&2; exit 1; }
# "tessera gpt2 layers=4 hidden=256 heads=4 seq=128 ..." -> the dimensions.
dims=$(grep -m1 '^tessera gpt2' "$log/ours")
dim() { sed -E "s/.* $1=([0-9]+).*/\1/" <<<"$dims"; }
flops_per_token=$((6 * params + 12 * $(dim layers) * $(dim hidden) * $(dim seq)))
ours_median=$(median "${ours_rates[@]}")
torch_median=$(median "${torch_rates[@]}")
awk -v o="$ours_median" -v t="$torch_median" -v f="$flops_per_token" -v p="$peak" -v th="$threads" -v n="$params" 'BEGIN {
  printf "model: %d parameters, %.3f MFLOP per token; FP32 FMA peak of %d threads: %.1f GFLOP/s\n", n, f / 1e6, th, p
  printf "tessera %.1f tokens/s (%.1f%% of peak)\n", o, 100 * o * f / (p * 1e9)
  printf "pytorch %.1f tokens/s (%.1f%% of peak)\n", t, 100 * t * f / (p * 1e9)
  printf "ratio tessera / pytorch: %.2fx\n", o / t
}'
