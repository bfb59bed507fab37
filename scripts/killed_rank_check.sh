#!/bin/bash
# A rank killed mid-job over two GPUs (issue 13's NCCL failure bound), for
# scripts/gpu_check.sh on real GPUs and scripts/cuda_emu_check.sh on
# emulated ones:
#   scripts/killed_rank_check.sh BUILD_DIR WORK_DIR CONFIG [KEY=VALUE...]
# starts a master and two worker processes on 127.0.0.1, one GPU each
# (cuda:0 and cuda:1: their NCCL groups span the processes), submits CONFIG
# data-parallel over both GPUs for as long as it takes, SIGKILLs the second
# worker once the job logged an iteration, and times the job's failure. It
# prints "- the job failed T s after the kill (submit exit S; bound 10 s):
# **passed**" (or **FAILED**, or why the job never trained) and a "reason:"
# line with the job's error; then whether the surviving worker was free
# again within 10 s of the kill (its ranks out of their collectives) and
# ran a next 2-iteration job on its GPU. Exits 0 when all three held.
# TRAIN_WAIT_S (default 120): how long the job may take to log its first
# iteration (emulated GPUs are slow).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: killed_rank_check.sh BUILD_DIR WORK_DIR CONFIG [KEY=VALUE...]" >&2
  exit 2
fi
build=$1 dir=$2 config=$3
shift 3
tessera=$build/bin/tessera
if [ ! -x "$tessera" ]; then
  echo "killed_rank_check.sh: $tessera is not built" >&2
  exit 2
fi
rm -rf "$dir"
mkdir -p "$dir"
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
}
trap cleanup EXIT

"$tessera" master --listen 127.0.0.1:0 > "$dir/master.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q 'listening on' "$dir/master.out" && break; sleep 0.1; done
address=$(grep -o '127.0.0.1:[0-9]*' "$dir/master.out" | head -1)
if [ -z "$address" ]; then
  echo "- **FAILED**: the master did not start: $(tail -1 "$dir/master.out")"
  exit 1
fi
"$tessera" worker --master "$address" --devices cuda:0 --id gpu-a > "$dir/a.out" 2>&1 &
pids+=($!)
"$tessera" worker --master "$address" --devices cuda:1 --id gpu-b > "$dir/b.out" 2>&1 &
worker_b=$!
pids+=("$worker_b")
wait_s=${TRAIN_WAIT_S:-120}
timeout -k 10 $((wait_s + 60)) "$tessera" submit --master "$address" "$config" train.train_iter=1000000 \
  train.dist.device_type=cuda train.dist.data_parallel_size=2 train.log_period=1 train.checkpointer.period=null \
  "train.output_dir=$dir/out" "$@" --follow > "$dir/submit.out" 2>&1 &
submit=$!
for _ in $(seq $((wait_s * 10))); do
  grep -q '^iter ' "$dir/submit.out" && break
  jobs -rp | grep -qx "$submit" || break  # submit ended (kill -0 would still see a zombie)
  sleep 0.1
done
if ! grep -q '^iter ' "$dir/submit.out"; then
  echo "- **FAILED**: the job never trained within ${wait_s} s (submit's output: $(tail -1 "$dir/submit.out"))"
  exit 1
fi
killed=$(date +%s.%N)
{ kill -9 "$worker_b"; wait "$worker_b"; } 2> /dev/null  # without bash's "Killed" notice
wait "$submit"
status=$?
took=$(awk -v a="$killed" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
passed=$(awk -v t="$took" -v s="$status" 'BEGIN { print (s == 1 && t < 10) ? 1 : 0 }')
verdict=$([ "$passed" = 1 ] && echo "**passed**" || echo "**FAILED**")
echo "- the job failed $took s after the kill (submit exit $status; bound 10 s): $verdict"
echo "  reason: $(tail -1 "$dir/submit.out" | cut -c1-300)"
# The survivor's ranks were inside collectives with the dead one: it must
# come out of them (the abort), be free again, and run the next job on its
# GPU.
free=0
for _ in $(seq 100); do
  if "$tessera" status --master "$address" 2> /dev/null | grep -q '^worker gpu-a .*(free)'; then free=1; break; fi
  sleep 0.1
done
free_after=$(awk -v a="$killed" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
in_time=$(awk -v t="$free_after" 'BEGIN { print (t < 10) ? 1 : 0 }')
if [ "$free" = 1 ] && [ "$in_time" = 1 ]; then
  echo "- the surviving worker was free again $free_after s after the kill: **passed**"
else
  echo "- the surviving worker was not free again within 10 s of the kill ($free_after s): **FAILED** ($(tail -1 "$dir/a.out" | cut -c1-200))"
  passed=0
fi
if [ "$free" = 1 ]; then
  if timeout -k 10 $((wait_s + 60)) "$tessera" submit --master "$address" "$config" train.train_iter=2 \
    train.dist.device_type=cuda train.checkpointer.period=null "train.output_dir=$dir/next" "$@" --follow \
    > "$dir/next.out" 2>&1; then
    echo "- the next job on the survivor's GPU: **passed**"
  else
    echo "- the next job on the survivor's GPU: **FAILED** ($(tail -1 "$dir/next.out" | cut -c1-300))"
    passed=0
  fi
fi
[ "$passed" = 1 ]
