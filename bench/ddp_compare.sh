#!/bin/bash
# Data-parallel GPT-2 over 2 processes (gloo), side by side in one run
# (DESIGN §13: Tessera at least 1.5x PyTorch DDP): bench/ddp_bench against
# bench/ddp_torch.py, alternated A/B/A/B so that drifts of a shared machine hit
# both; prints every run, the medians, their spread and the ratio; then the
# 64 MB all-reduce of bench/gloo_bench (ours against gloo's own ring) and of
# torch.distributed (gloo), with the ratio of ours to torch's. Checks that
# both sides count the same parameters.
# Builds nothing: build ddp_bench and gloo_bench first (Release).
#
#   bench/ddp_compare.sh [BUILD_DIR] [ROUNDS]     (defaults: build, 3)
# Environment: WARMUP (5), ITERS (20), PYTHON (/usr/bin/python3);
# BREAKDOWN=N (0): N more rounds of the controls that say where the time goes:
# each side in one process without data parallelism, alone and as two
# unrelated jobs at once (the same two-process load as the DP run, no
# all-reduce); the bench's per-thread lines split each iteration into time on
# a CPU, runnable waiting for one (the machine's other work) and blocked.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
rounds=${2:-3}
warmup=${WARMUP:-5}
iters=${ITERS:-20}
python=${PYTHON:-/usr/bin/python3}
ours="$build/bin/ddp_bench"
gloo="$build/bin/gloo_bench"
for exe in "$ours" "$gloo"; do
  [[ -x $exe ]] || { echo "ddp_compare: $exe not built (cmake --build $build --target ddp_bench gloo_bench)" >&2; exit 1; }
done
export OMP_WAIT_POLICY=PASSIVE

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# field, stats, median
source "$here/compare_lib.sh"

echo "ddp_compare: $rounds rounds, warm-up $warmup, $iters timed iterations; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
tessera_rates=() torch_rates=() tessera_cpu=() torch_cpu=()
tessera_params='' torch_params=''
for ((round = 1; round <= rounds; ++round)); do
  "$ours" --dp 2 --warmup "$warmup" --iters "$iters" > "$log/tessera.$round"
  sed "s/^/  [tessera $round] /" "$log/tessera.$round"
  tessera_rates+=("$(field "$log/tessera.$round" tokens/s)")
  tessera_cpu+=("$(field "$log/tessera.$round" cpu_ms_per_iteration)")
  tessera_params=$(field "$log/tessera.$round" parameters)

  "$python" "$here/ddp_torch.py" --world 2 --warmup "$warmup" --iters "$iters" > "$log/torch.$round"
  sed "s/^/  [torch   $round] /" "$log/torch.$round"
  torch_rates+=("$(field "$log/torch.$round" tokens/s)")
  torch_cpu+=("$(field "$log/torch.$round" cpu_ms_per_iteration)")
  torch_params=$(field "$log/torch.$round" parameters)
  echo "  round $round: tessera ${tessera_rates[-1]} tokens/s, torch ${torch_rates[-1]} tokens/s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
if [[ $tessera_params != "$torch_params" ]]; then
  echo "ddp_compare: parameter counts differ: tessera $tessera_params, torch $torch_params" >&2
  exit 1
fi
tessera_median=$(median "${tessera_rates[@]}")
torch_median=$(median "${torch_rates[@]}")
echo "GPT-2 data-parallel, 2 processes x 1 thread, $tessera_params parameters on both sides (tokens/s, global):"
echo "  tessera  $(stats "${tessera_rates[@]}")"
echo "  torch    $(stats "${torch_rates[@]}")"
awk -v a="$tessera_median" -v b="$torch_median" 'BEGIN { printf "  ratio tessera/torch %.2fx (target >= 1.5x)\n", a / b }'
# CPU time of the sink's / rank 0's process per iteration (all its threads):
# what the other work of a shared machine inflates least.
echo "CPU ms per iteration of one process (rank 0), all its threads:"
echo "  tessera  $(stats "${tessera_cpu[@]}")"
echo "  torch    $(stats "${torch_cpu[@]}")"
awk -v a="$(median "${tessera_cpu[@]}")" -v b="$(median "${torch_cpu[@]}")" \
  'BEGIN { printf "  ratio torch/tessera %.2fx (tessera faster when > 1)\n", b / a }'

breakdown=${BREAKDOWN:-0}
for ((round = 1; round <= breakdown; ++round)); do
  echo "breakdown round $round; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  "$ours" --dp 1 --warmup "$warmup" --iters "$iters" > "$log/b" && sed 's/^/  [tessera 1 process] /' "$log/b"
  "$ours" --dp 1 --independent --warmup "$warmup" --iters "$iters" > "$log/b" && sed 's/^/  [tessera 2 independent] /' "$log/b"
  "$python" "$here/ddp_torch.py" --world 1 --warmup "$warmup" --iters "$iters" > "$log/b" && sed 's/^/  [torch 1 process] /' "$log/b"
  "$python" "$here/ddp_torch.py" --world 1 --warmup "$warmup" --iters "$iters" > "$log/b1" &
  "$python" "$here/ddp_torch.py" --world 1 --warmup "$warmup" --iters "$iters" > "$log/b2"
  wait
  sed 's/^/  [torch 2 independent, a] /' "$log/b1"
  sed 's/^/  [torch 2 independent, b] /' "$log/b2"
done

echo "all-reduce of 64 MB between 2 processes:"
"$gloo" --mb 64 --reps 7 > "$log/gloo"
sed 's/^/  /' "$log/gloo"
"$python" "$here/ddp_torch.py" --world 2 --warmup 1 --iters 1 --allreduce-mb 64 --allreduce-reps 7 |
  grep '^torch.distributed' > "$log/torch_allreduce"
sed 's/^/  /' "$log/torch_allreduce"
ours_gbs=$(awk '/tessera gloo Communicator/ { print $4 }' "$log/gloo")
torch_gbs=$(awk '{ for (i = 2; i <= NF; ++i) if ($i == "GB/s") print $(i - 1) }' "$log/torch_allreduce")
awk -v a="$ours_gbs" -v b="$torch_gbs" 'BEGIN { printf "  ratio tessera/torch.distributed %.2fx\n", a / b }'
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
