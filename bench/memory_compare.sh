#!/bin/bash
# Memory of GPT-2 124M (12 layers, hidden 768, 12 heads, seq 1024, GPT-2's
# 50,257-token vocabulary, AdamW, dropout 0, synthetic tokens), side by side:
#   - what `tessera plan --format memory` predicts per device for micro-batch
#     MICRO: plain f32, with activation checkpointing, plain data parallelism
#     over 2 ranks and ZeRO stages 1-3 over them, bf16 and fp16 mixed
#     precision, and all together (checkpointing, bf16, ZeRO-2 over 2 ranks);
#   - the peak resident set of `tessera train` for 2 iterations, minus that
#     of `tessera plan` on the same config (the binary, its libraries, the
#     compiled plan): what the run adds, against the plan's total over the
#     devices (2 ranks share this machine); a variant whose plan needs more
#     than 85% of the machine's memory is planned, not run;
#   - the peak resident set of PyTorch 1.13 training the same model and
#     batch for 2 steps (bench/ddp_torch.py --world 1 --shape ...), whole
#     process (its interpreter and libraries included).
# Also the tokens/s of each run's second iteration (one sample: a rough
# figure; bench/train_compare.sh does throughput properly).
# Builds nothing: build the tessera binary first (Release).
#
#   bench/memory_compare.sh [BUILD_DIR] [MICRO] [THREADS]   (defaults: build, 8, 2)
# Environment: PYTHON (/usr/bin/python3), SKIP_TORCH=1 (no PyTorch run).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-build}
micro=${2:-8}
threads=${3:-2}
python=${PYTHON:-/usr/bin/python3}
tessera="$build/bin/tessera"
[[ -x $tessera ]] || { echo "memory_compare: $tessera not built (cmake --build $build --target tessera)" >&2; exit 1; }
export OMP_WAIT_POLICY=PASSIVE

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
config=("$root/configs/gpt2_nano.json" model.vocab_size=50257 model.hidden_size=768 model.num_layers=12
  model.num_attention_heads=12 model.ffn_hidden_size=3072 model.max_seq_length=1024 model.seq_length=1024
  model.embedding_dropout_prob=0 model.attention_dropout_prob=0 model.output_dropout_prob=0
  train.train_micro_batch_size="$micro" train.num_accumulation_steps=1 train.train_iter=2 train.log_period=1
  train.dist.intra_op_threads="$threads")

# Runs a command (its output into file $1) and prints its peak RSS in MiB
# and its exit status (Python's resource.getrusage of the child).
peak_mib() {
  local out=$1
  shift
  "$python" - "$out" "$@" <<'EOF'
import resource, subprocess, sys
out = sys.argv[1]
with open(out, "w") as f:
    code = subprocess.call(sys.argv[2:], stdout=f, stderr=subprocess.STDOUT)
print(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.1f} {code}")
EOF
}

echo "GPT-2 124M, seq 1024, micro-batch $micro, $threads threads, dropout 0 (MiB)"
printf '%-34s %10s %10s %10s\n' variant plan run_adds run_tok/s
plain_plan=""
mem_mib=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024}' /proc/meminfo)
for variant in none checkpointing dp2 zero1_dp2 zero2_dp2 zero3_dp2 bf16 fp16 all; do
  extra=()
  case $variant in
    checkpointing) extra=(train.activation_checkpoint.enabled=true) ;;
    bf16) extra=(train.amp.enabled=true train.amp.dtype=bf16) ;;
    fp16) extra=(train.amp.enabled=true train.amp.dtype=fp16) ;;
    dp2) extra=(train.dist.data_parallel_size=2) ;;
    zero?_dp2) extra=(train.zero_optimization.enabled=true "train.zero_optimization.stage=${variant:4:1}"
      train.dist.data_parallel_size=2) ;;
    all) extra=(train.activation_checkpoint.enabled=true train.amp.enabled=true train.zero_optimization.enabled=true
      train.zero_optimization.stage=2 train.dist.data_parallel_size=2) ;;
  esac
  # (A run of its own: the next variant's run found this one's checkpoints
  # in a shared directory and was refused.)
  extra+=("train.output_dir=$log/out_$variant")
  if ! "$tessera" plan "${config[@]}" "${extra[@]}" --format memory > "$log/plan" 2> "$log/err"; then
    printf '%-34s %s\n' "$variant" "not built: $(head -c 150 "$log/err")"
    continue
  fi
  plan=$(awk '/node 0 cpu:0/ {print $4}' "$log/plan")
  total=$(awk '/node [0-9]+ cpu:[0-9]+/ {t += $4} END {printf "%.1f", t}' "$log/plan")
  [[ $variant == none ]] && plain_plan=$plan
  if awk -v t="$total" -v m="$mem_mib" 'BEGIN {exit !(t > 0.85 * m)}'; then
    printf '%-34s %10s %10s %10s   (plan only: %s MiB over the devices, %s MiB here' "$variant" "$plan" "-" "-" \
      "$total" "$mem_mib"
    [[ $variant != none ]] && printf ', plan/plain plan %.3f' "$(awk -v a="$plan" -v b="$plain_plan" 'BEGIN {print a / b}')"
    echo ")"
    continue
  fi
  read -r base_mib _ < <(peak_mib "$log/plan_run" "$tessera" plan "${config[@]}" "${extra[@]}" --format memory)
  read -r run_mib code < <(peak_mib "$log/train_run" "$tessera" train "${config[@]}" "${extra[@]}")
  [[ $code == 0 ]] || { echo "memory_compare: tessera train ($variant) failed:" >&2; tail -3 "$log/train_run" >&2; exit 1; }
  rm -rf "$log/out_$variant"  # (its checkpoints: 1.4 GB each)
  adds=$(awk -v a="$run_mib" -v b="$base_mib" 'BEGIN {printf "%.1f", a - b}')
  tokens=$(grep -o 'tokens/s [0-9.]*' "$log/train_run" | tail -1 | awk '{print $2}')
  printf '%-34s %10s %10s %10s   (run/plan %.3f' "$variant" "$plan" "$adds" "$tokens" \
    "$(awk -v a="$adds" -v b="$total" 'BEGIN {print a / b}')"
  [[ $variant != none ]] && printf ', plan/plain plan %.3f' "$(awk -v a="$plan" -v b="$plain_plan" 'BEGIN {print a / b}')"
  echo ")"
  echo "$plan" > "$log/plan_$variant"
done

if [[ ${SKIP_TORCH:-0} != 1 ]]; then
  read -r torch_mib code < <(peak_mib "$log/torch" "$python" "$here/ddp_torch.py" --world 1 --threads "$threads" \
    --warmup 1 --iters 1 --shape "12,768,12,1024,$micro,50257")
  if [[ $code != 0 ]]; then
    echo "pytorch: failed (out of memory at micro-batch $micro?): $(tail -1 "$log/torch")"
  else
    torch_tokens=$(awk '/^tokens\/s/ {print $2}' "$log/torch")
    printf '%-34s %10s %10s %10s   (plain plan / PyTorch peak %.3f)\n' "pytorch 1.13 (whole process)" "-" "$torch_mib" \
      "$torch_tokens" "$(awk -v a="$plain_plan" -v b="$torch_mib" 'BEGIN {print a / b}')"
  fi
fi
