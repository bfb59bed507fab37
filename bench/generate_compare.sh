#!/bin/bash
# Greedy generation with a KV cache, Tessera against PyTorch, side by side in
# one run (target: Tessera >= 1.5x): bench/generate_bench (train/generate.h)
# against tests/train/gpt2_reference.py's `bench` mode (PyTorch eager, its own
# preallocated past_key_values-style cache, the same prompt) in two forms:
# "addmm", the layers as Hugging Face's GPT-2 writes them (Conv1D = addmm,
# the head F.linear), and "addmv", a decoding step written for one token
# (matrix-vector products, which this torch runs much faster than addmm on
# one row). Both run on the same
# checkpoint of DESIGN §13's CPU GPT-2 (4 layers, hidden 256, 4 heads, FFN
# 1024, vocabulary 8192, 512 positions), trained for 2 iterations with
# `tessera train` into $WORK unless one is there. Each side generates
# NEW_TOKENS tokens after a PROMPT_LEN-token prompt (the prompt's forward
# counted) and reports the best of REPEATS runs; the sides alternate A/B for
# ROUNDS rounds per thread count, so that drifts of a shared machine hit all.
# Prints every run, the medians, the ratios, and how many leading greedy
# tokens the sides agree on (a barely trained model has near-ties, so
# they may part after a while; tests/train/generate_test.cc checks exactness).
# Builds nothing: build tessera and generate_bench first (Release).
#
#   bench/generate_compare.sh [BUILD_DIR] [ROUNDS]      (defaults: build, 3)
# Environment: THREADS ("1 2": kernel threads of each side, torch.set_num_threads
# and OpenBLAS's equal to ours), NEW_TOKENS (256), PROMPT_LEN (16), REPEATS (5),
# WORK (/tmp/tessera_generate_compare), PYTHON (/usr/bin/python3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/.." && pwd)
build=${1:-build}
rounds=${2:-3}
threads_list=${THREADS:-1 2}
new_tokens=${NEW_TOKENS:-256}
prompt_len=${PROMPT_LEN:-16}
repeats=${REPEATS:-5}
work=${WORK:-/tmp/tessera_generate_compare}
python=${PYTHON:-/usr/bin/python3}
tessera="$build/bin/tessera"
ours="$build/bin/generate_bench"
reference="$source_dir/tests/train/gpt2_reference.py"
for exe in "$tessera" "$ours"; do
  [[ -x $exe ]] || { echo "generate_compare: $exe not built (cmake --build $build --target tessera generate_bench)" >&2; exit 1; }
done
export OMP_WAIT_POLICY=PASSIVE

model="$work/model"
if [[ ! -f $model/checkpoints/iter_0000002/index.json ]]; then
  rm -rf "$model"
  mkdir -p "$work"
  "$tessera" train "$source_dir/configs/gpt2_nano.json" model.vocab_size=8192 model.hidden_size=256 \
    model.num_layers=4 model.num_attention_heads=4 model.ffn_hidden_size=1024 model.max_seq_length=512 \
    model.seq_length=128 train.train_iter=2 train.output_dir="$model" > "$work/train.log" 2>&1 ||
    { cat "$work/train.log" >&2; exit 1; }
fi
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# field, stats, median
source "$here/compare_lib.sh"
# agree A B: the number of leading comma-separated ids A and B share.
agree() { awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, ","); split(b, y, ","); for (i = 1; i <= n && x[i] == y[i]; ++i); print i - 1 }'; }

echo "generate_compare: $rounds rounds, $new_tokens new tokens after $prompt_len, best of $repeats; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
summary=()
for threads in $threads_list; do
  tessera_rates=() addmm_rates=() addmv_rates=()
  for ((round = 1; round <= rounds; ++round)); do
    args=(--prompt-len "$prompt_len" --new-tokens "$new_tokens" --threads "$threads" --repeats "$repeats")
    "$ours" --checkpoint "$model" "${args[@]}" > "$log/tessera"
    for step in addmm addmv; do
      OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$python" "$reference" "$model" bench "${args[@]}" \
        --step "$step" > "$log/$step"
    done
    tessera_rates+=("$(field "$log/tessera" tokens/s)")
    addmm_rates+=("$(field "$log/addmm" tokens/s)")
    addmv_rates+=("$(field "$log/addmv" tokens/s)")
    same=$(agree "$(field "$log/tessera" ids)" "$(field "$log/addmm" ids)")
    echo "  [$threads thread(s), round $round] tessera ${tessera_rates[-1]}, torch addmm ${addmm_rates[-1]}," \
      "torch addmv ${addmv_rates[-1]} tokens/s; greedy ids agree on the first $same of $new_tokens;" \
      "load average $(cut -d' ' -f1-3 /proc/loadavg)"
  done
  echo "greedy generation, $threads thread(s) per side (tokens/s):"
  echo "  tessera      $(stats "${tessera_rates[@]}")"
  echo "  torch addmm  $(stats "${addmm_rates[@]}")"
  echo "  torch addmv  $(stats "${addmv_rates[@]}")"
  ours_median=$(median "${tessera_rates[@]}")
  ratio() { awk -v a="$ours_median" -v b="$(median "$@")" 'BEGIN { printf "%.2f", a / b }'; }
  addmm_ratio=$(ratio "${addmm_rates[@]}")
  addmv_ratio=$(ratio "${addmv_rates[@]}")
  echo "  ratio tessera/torch: ${addmm_ratio}x against addmm, ${addmv_ratio}x against addmv (target >= 1.5x)"
  line="$threads thread(s): tessera $ours_median, torch addmm $(median "${addmm_rates[@]}"),"
  summary+=("$line torch addmv $(median "${addmv_rates[@]}") tokens/s; ratios ${addmm_ratio}x, ${addmv_ratio}x")
done
echo "summary:"
printf '  %s\n' "${summary[@]}"
