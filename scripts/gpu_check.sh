#!/bin/bash
# The prepared check for a machine with an NVIDIA GPU (issue 13), sized to
# finish within one device call on one GPU and 16 cores (its last, optional
# steps, the 124M run and PyTorch's, get what is left of
# GPU_CHECK_BUDGET_S, 550 s by default):
#   1. what the machine has (nvidia-smi, nvcc, cores);
#   2. configure a Release build with CUDA and build the CUDA tests only
#      (cuda_kernels_test: tessera_ops and tessera_core, a few minutes);
#   3. run them: every op with a CUDA kernel against its CPU kernel on
#      cuda:0, and kernels enqueued on a CUDA stream completing through its
#      callback (tests/ops/cuda_kernels_test.cc); what eager module
#      loading (CUDA_MODULE_LOADING=EAGER, Tessera's default) costs a
#      process against lazy (one GEMM case, twice each); a training loop through the
#      actor runtime on cuda:0 against the CPU (tests/actors/cuda_runtime_test.cc);
#      the NCCL communicator (tests/comm/nccl_test.cc: one rank, a missing
#      peer, boxing on the GPU; two ranks and boxing over NCCL where there
#      are two GPUs);
#   4. build `tessera` and gpu_equivalence_test (gpt2_nano in-process: one
#      GPU against the CPU, layouts over the GPUs present against one GPU),
#      run it, and train gpt2_nano (and bert_tiny and mlp_demo in
#      f32) for 20 iterations on cuda:0 and
#      on the CPU: the losses must agree (f32, TF32 off: rtol 1e-4; bf16 AMP:
#      rtol 2e-2; f32 with model.fused_attention and model.bias_gelu_fusion:
#      rtol 1e-4; bf16 with both, the attention on tensor cores: rtol
#      2e-2), with tokens/s
#      of both; the fused attention op against the unfused ops on cuda:0
#      (bench/attention_bench.cc); matmul_bias_gelu and matmul_bias
#      (cuBLASLt's epilogues) against matmul + bias_gelu / bias_add, and the
#      bf16 4096^3 TFLOP/s against the
#      data-sheet peak (bench/linear_gelu_bench.cc); memory-bound kernels
#      at GPT-2 124M's shapes against a device-to-device copy
#      (bench/kernel_bench.cc); then GPT-2 124M's shapes
#      in bf16 with bias_gelu_fusion, and fused attention unless the bench
#      found it slower there than the unfused ops, on cuda:0 at the
#      largest micro-batch whose planned memory fits (tokens/s, MFU against
#      the GPU's data-sheet bf16 peak; at micro-batch 8, then without
#      fusion, if that fails);
#   4b. where the machine has several GPUs: gpt2_nano under data, tensor
#      and pipeline parallelism on them against the one-GPU losses;
#   4c. where the machine has two GPUs: a worker process per GPU, one of
#      them SIGKILLed while a data-parallel job trains: the job must fail
#      within 10 s, the survivor be freed and run the next job
#      (scripts/killed_rank_check.sh);
#   4d. PyTorch on the same GPU (bench/torch_bench.py, where python3 has
#      torch with CUDA, as on the device machines): GPT-2 124M eager and
#      compiled, tokens/s against Tessera's; scaled_dot_product_attention
#      at attention_bench's shapes;
#   4e. with time left, the 124M job for 4 iterations with
#      TESSERA_PROFILE_OPS (actors/op_profile.h): the ops taking the most
#      device time per step, and the kernels' share of the step.
#   5. write a short report, gpu_report.md, in $OUT when set (the device
#      tool's output folder), else in the build folder.
#
#   scripts/gpu_check.sh [BUILD_DIR]   (default build-gpu)
# On a machine that cannot build Tessera (the device machines lent here have
# CUDA and cmake but not the Debian libraries, and no registry): run
# scripts/gpu_bundle.sh where it builds and carry gpu-bundle.tar.xz; with
# that archive in the repository root the check uses its prebuilt binaries
# and libraries instead of building.
# Exit status: 0 when every check passes, 1 otherwise (the report names the
# failing steps). Only a build, an unusable GPU or a broken bundle stops the
# check early: a failed test or job is reported and the rest still runs, as
# a lent machine gives one run.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
report_dir=${OUT:-$build}
# Runs and bench outputs: not in $OUT (the device tool returns only a few
# files from it: the report and the log).
work_dir=$(mktemp -d /tmp/tessera-gpu-check.XXXXXX)
trap 'rm -rf "$work_dir"' EXIT
mkdir -p "$build" "$report_dir"
report="$report_dir/gpu_report.md"
log="$report_dir/gpu_check.log"
: > "$log"

section() { printf '\n## %s\n\n' "$1" >> "$report"; }
# The whole check stays inside one device call (600 s at most): the last,
# optional sections get what is left of GPU_CHECK_BUDGET_S.
check_deadline=$(($(date +%s) + ${GPU_CHECK_BUDGET_S:-550}))
seconds_left() { echo $((check_deadline - $(date +%s))); }
# min(N, what is left less a reserve of 60 s), at least 10: a step's timeout.
budget() { local left=$(($(seconds_left) - 60)); ((left < $1)) || left=$1; ((left > 10)) || left=10; echo "$left"; }
late_failures=()  # checks that failed without stopping the script
fail() {
  printf '**FAILED: %s** (the last lines of %s):\n\n```\n%s\n```\n' "$1" "$(basename "$log")" "$(tail -25 "$log")" >> "$report"
  echo "gpu_check: $1 failed; see $report" >&2
  exit 1
}

# Runs test binary $1 (output to the log) and reports "$2: **status** in N
# s", then the lines of its output matching $3 (none when $3 is empty).
# status: passed or FAILED, or $4 when given and a case skipped (the tests
# whose skips mean no usable GPU); what a failure means is the caller's.
run_test() {
  local bin=$1 what=$2 lines=$3 on_skip=${4:-} t0 mark
  t0=$(date +%s)
  mark=$(wc -l < "$log")
  # Bounded: a hung test must not take the device call's whole time.
  if timeout -k 10 "$(budget 180)" "$build/bin/$bin" >> "$log" 2>&1; then status=passed; else status=FAILED; fi
  if [[ $status == passed && -n $on_skip ]] && tail -n +"$((mark + 1))" "$log" | grep -q '^\[  SKIPPED \]'; then
    status=$on_skip
  fi
  {
    echo "$what: **$status** in $(($(date +%s) - t0)) s"
    if [[ -n $lines ]]; then
      echo
      echo '```'
      tail -n +"$((mark + 1))" "$log" | grep -E "$lines" | head -40
      echo '```'
    fi
  } >> "$report"
}

# The check runs Tessera's default module loading (its processes set
# CUDA_MODULE_LOADING=EAGER when it is unset; nccl_test checks that): a value
# the machine's environment sets (some containers set LAZY) is reported and
# dropped.
inherited_module_loading=${CUDA_MODULE_LOADING-(unset)}
unset CUDA_MODULE_LOADING
printf '# Tessera GPU check, %s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" > "$report"
section "Machine"
{
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
  (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | xargs -I{} sh -c '{} --version 2>&1 | tail -1'
  echo "cores: $(nproc)"
  echo "CUDA_MODULE_LOADING in the environment: $inherited_module_loading (unset for the check)"
  echo '```'
} >> "$report"
# Without a GPU nothing here can pass: said at once, before minutes of build.
if ! nvidia-smi -L > /dev/null 2>&1 && ! compgen -G '/dev/nvidia[0-9]*' > /dev/null; then
  fail "finding a GPU: no NVIDIA GPU on this machine (nvidia-smi lists none, no /dev/nvidia*); this check is for a GPU machine (scripts/cuda_emu_check.sh runs the CUDA code paths on the CPU)"
fi

section "Build"
start=$(date +%s)
# build_targets T...: builds them, or, with a prebuilt bundle, checks they
# are in it.
if [[ -f "$root/gpu-bundle.tar.xz" ]]; then
  # A machine that cannot build Tessera (scripts/gpu_bundle.sh, run where it
  # builds, made the archive): its binaries and libraries, CUDA's own
  # libraries found on this machine.
  bundle=/tmp/tessera-gpu-bundle
  rm -rf "$bundle"
  mkdir -p "$bundle"
  tar -C "$bundle" -xJf "$root/gpu-bundle.tar.xz" || fail "unpacking gpu-bundle.tar.xz"
  build=$bundle/gpu-bundle
  cuda_dirs=""
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=$(find /usr/local /opt /usr/lib /usr/lib64 -name "$lib" -print -quit 2>/dev/null)
    [[ -n $found ]] || fail "the prebuilt bundle needs $lib, which this machine lacks"
    [[ ":$cuda_dirs:" == *":$(dirname "$found"):"* ]] || cuda_dirs="$cuda_dirs:$(dirname "$found")"
  done
  export LD_LIBRARY_PATH="$build/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The tests read configs/ where they were built.
  source_dir=$(cat "$build/source_dir")
  if [[ ! -e $source_dir ]]; then
    mkdir -p "$(dirname "$source_dir")" && ln -s "$root" "$source_dir" || fail "linking $source_dir to $root"
  fi
  build_targets() {
    for t in "$@"; do [[ -x "$build/bin/$t" ]] || { echo "$t is not in the bundle" >> "$log"; return 1; }; done
  }
  "$build/bin/tessera" --help > /dev/null 2>> "$log" || fail "the prebuilt tessera does not start here (libraries?)"
  echo "prebuilt bundle of commit $(cut -c1-7 "$build/commit") (this tree: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)); CUDA libraries from${cuda_dirs//:/ }" >> "$report"
else
  build_targets() { cmake --build "$build" --target "$@" -j "$(nproc)" >> "$log" 2>&1; }
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_BUILD_BENCH=ON \
    -DTESSERA_BUILD_EXAMPLES=OFF >> "$log" 2>&1 ||
    fail "cmake configure (are the Debian packages installed? scripts/install_deps.sh; else carry scripts/gpu_bundle.sh's archive)"
fi
build_targets cuda_kernels_test cuda_runtime_test nccl_test || fail "build of cuda_kernels_test, cuda_runtime_test and nccl_test"
echo "configure and build: $(($(date +%s) - start)) s" >> "$report"

section "CUDA kernels against the CPU's"
run_test cuda_kernels_test "cuda_kernels_test" \
  '^\[ +(OK|FAILED|SKIPPED) +\]|Skipped|Failure|Expected|Which is|output [0-9]+ element' "skipped its GPU cases"
# A kernel that disagrees with the CPU stops nothing else: one run on the
# lent machine is all there is, so the jobs and benchmarks below still report
# what they measure. Skipped GPU cases (no usable GPU) end the check.
case $status in
  passed) ;;
  FAILED) late_failures+=("cuda_kernels_test") ;;
  *) fail "cuda_kernels_test ($status; no usable GPU?)" ;;
esac

section "Module loading: EAGER against LAZY"
# Tessera sets CUDA_MODULE_LOADING=EAGER when it is unset (core/cuda_allocator.cc:
# under lazy loading a kernel's first launch may wait for a collective
# waiting for peers). What that costs a process: one GEMM case of
# cuda_kernels_test (cuBLAS, cuBLASLt and Tessera's modules) under each.
{
  for mode in EAGER LAZY EAGER LAZY; do
    t0=$(date +%s%N)
    if CUDA_MODULE_LOADING=$mode timeout -k 5 "$(budget 60)" "$build/bin/cuda_kernels_test" \
      --gtest_filter=CudaKernels.GemmsMatchTheCpuForEveryTranspose >> "$log" 2>&1; then r=ok; else r=FAILED; fi
    echo "- $mode: $(( ($(date +%s%N) - t0) / 1000000 )) ms ($r)"
  done
} >> "$report"

section "The actor runtime on cuda:0"
run_test cuda_runtime_test "cuda_runtime_test (a training loop, async computes, staged feeds and fetches, against the CPU; a GPU plan's NCCL communicators)" "" skipped
[[ $status == passed ]] || late_failures+=("cuda_runtime_test ($status)")

section "The NCCL communicator"
run_test nccl_test "nccl_test (one rank's ops and abort, a peer that never comes, boxing's local steps on the GPU against the CPU; two ranks' every op and every 1-D boxing over NCCL where there are 2 GPUs)" \
  '^\[ +(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is'
[[ $status == passed ]] || late_failures+=("nccl_test")

section "Whole jobs on cuda:0 against the CPU"
start=$(date +%s)
build_targets tessera gpu_equivalence_test || fail "build of tessera and gpu_equivalence_test"
echo "build of tessera and gpu_equivalence_test: $(($(date +%s) - start)) s" >> "$report"
run_test gpu_equivalence_test "gpu_equivalence_test (gpt2_nano: one GPU against the CPU, rtol 1e-4; layouts over the GPUs present against one GPU, rtol 1e-5)" \
  '^\[ +(OK|FAILED|SKIPPED) +\]|Failure|step [0-9]+:'
# Not fatal: the jobs and benchmarks below still say what they measure.
[[ $status == passed ]] || late_failures+=("gpu_equivalence_test")
# tokens/s of the last logged line of a run's output; speed: "tokens/s N",
# or "samples/s N" for a model without tokens (mlp_demo).
tokens() { grep -o 'tokens/s [0-9]*' "$1" | tail -1 | cut -d' ' -f2; }
speed() { grep -o '\(tokens\|samples\)/s [0-9]*' "$1" | tail -1; }
compare() {  # name rtol extra-overrides... (CONFIG=file: another config than gpt2_nano)
  local name=$1 rtol=$2 config=${CONFIG:-$root/configs/gpt2_nano.json}
  shift 2
  local dir="$work_dir/runs/$name"
  rm -rf "$dir"
  mkdir -p "$work_dir/runs"
  for device in cpu cuda; do
    timeout -k 10 "$(budget 120)" "$build/bin/tessera" train "$config" train.train_iter=20 train.log_period=1 \
      train.checkpointer.period=null "train.output_dir=$dir/$device" "train.dist.device_type=$device" "$@" \
      > "$dir.$device.out" 2>&1 < /dev/null || {
      cat "$dir.$device.out" >> "$log"
      echo "- $name on $device: **FAILED** (the log says why)" >> "$report"
      late_failures+=("$name on $device")
      return
    }
  done
  "$root/scripts/compare_losses.sh" "$name" "$rtol" 20 "$dir/cuda" "$dir/cpu" >> "$report" ||
    late_failures+=("$name: GPU losses differ from the CPU's")
  echo "  CPU $(speed "$dir.cpu.out"), GPU $(speed "$dir.cuda.out")" >> "$report"
}
compare f32 1e-4
compare bf16 2e-2 train.amp.enabled=true train.amp.dtype=bf16
compare f32-fused 1e-4 model.fused_attention=true model.bias_gelu_fusion=true
compare bf16-fused 2e-2 train.amp.enabled=true train.amp.dtype=bf16 model.fused_attention=true model.bias_gelu_fusion=true
CONFIG=$root/configs/bert_tiny.json compare bert_tiny-f32 1e-4
CONFIG=$root/configs/mlp_demo.json compare mlp_demo-f32 1e-4
echo "whole jobs: $(($(date +%s) - start)) s" >> "$report"

section "Layouts over several GPUs against one GPU"
# gpt2_nano's f32 losses under data, tensor and pipeline parallelism on
# cuda:0 .. cuda:N-1 (collectives and transfers on NCCL, boxing on the
# GPUs) against the one-GPU run above (rtol 1e-4).
start=$(date +%s)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if (( gpus < 2 )); then
  echo "- skipped: this machine has $gpus GPU(s)" >> "$report"
else
  several() {  # name devices overrides...
    local name=$1 needed=$2 dir="$work_dir/runs/several-$1"
    shift 2
    if (( gpus < needed )); then
      echo "- $name: skipped (needs $needed GPUs)" >> "$report"
      return
    fi
    rm -rf "$dir"
    timeout -k 10 "$(budget 120)" "$build/bin/tessera" train "$root/configs/gpt2_nano.json" train.train_iter=20 train.log_period=1 \
      train.checkpointer.period=null "train.output_dir=$dir" train.dist.device_type=cuda "$@" \
      > "$dir.out" 2>&1 < /dev/null || {
      cat "$dir.out" >> "$log"
      echo "- $name on $needed GPUs: **FAILED** (the log says why)" >> "$report"
      late_failures+=("$name on $needed GPUs")
      return
    }
    "$root/scripts/compare_losses.sh" "$name" 1e-4 20 "$dir" "$work_dir/runs/f32/cuda" >> "$report" ||
      late_failures+=("$name: losses differ from one GPU's")
    echo "  tokens/s: $(tokens "$dir.out")" >> "$report"
  }
  several dp2 2 train.dist.data_parallel_size=2 train.train_micro_batch_size=8 train.num_accumulation_steps=1
  several tp2 2 train.dist.tensor_parallel_size=2
  several pp2 2 train.dist.pipeline_parallel_size=2 train.num_accumulation_steps=2 train.train_micro_batch_size=8
  several dp2xtp2xpp2 8 train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2 \
    train.dist.pipeline_parallel_size=2 train.num_accumulation_steps=2 train.train_micro_batch_size=4
fi
echo "in $(($(date +%s) - start)) s" >> "$report"

section "A killed rank of a job over two GPUs"
# A master and two worker processes, one GPU each (their NCCL groups span
# processes); a long data-parallel gpt2_nano job; one worker SIGKILLed once
# the job trains: the job must fail within 10 s (the issue's bound), not hang.
if (( gpus < 2 )); then
  echo "- skipped: this machine has $gpus GPU(s)" >> "$report"
else
  "$root/scripts/killed_rank_check.sh" "$build" "$work_dir/runs/killed" "$root/configs/gpt2_nano.json" \
    train.train_micro_batch_size=8 >> "$report" 2>> "$log" || late_failures+=("killed rank")
fi

section "Fused attention on cuda:0 against the unfused ops"
start=$(date +%s)
if build_targets attention_bench &&
    timeout -k 10 "$(budget 120)" "$build/bin/attention_bench" --quick --device cuda > "$work_dir/attention_bench.out" 2>&1 &&
    timeout -k 10 "$(budget 120)" "$build/bin/attention_bench" --quick --device cuda --amp --dropout 0.1 \
      >> "$work_dir/attention_bench.out" 2>&1; then
  { echo '```'; cat "$work_dir/attention_bench.out"; echo '```'; } >> "$report"
  # GPT-2 124M's case under AMP with attention dropout 0.1, as the 124M run
  # below trains (the second run), fused / unfused forward and backward
  # together, both in bf16 (the fused op on its tensor-core kernels, the
  # unfused products on cuBLAS's): the 124M run takes the faster.
  attention_ratio=$(awk '/^GPT-2 124M mb 8/ { for (i = 1; i < NF; ++i) if ($i == "fwd+bwd") r = $(i + 1) }
    END { print r }' "$work_dir/attention_bench.out" | tr -d x)
  [[ -n $attention_ratio ]] &&
    echo "- GPT-2 124M's attention under AMP, dropout 0.1, fused / unfused: ${attention_ratio}x" >> "$report"
else
  cat "$work_dir/attention_bench.out" >> "$log" 2>/dev/null
  echo "- **FAILED** (the last lines of $(basename "$log") say why)" >> "$report"
  late_failures+=("attention_bench")
fi
echo "in $(($(date +%s) - start)) s" >> "$report"

section "matmul_bias_gelu and matmul_bias (cuBLASLt epilogues) on cuda:0 against matmul + bias_gelu / bias_add"
start=$(date +%s)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$gpu" in
  *H200* | *H100*) peak=989.4e12 ;;
  *A100*) peak=312e12 ;;
  *) peak=0 ;;
esac
if build_targets linear_gelu_bench &&
    timeout -k 10 "$(budget 120)" "$build/bin/linear_gelu_bench" --device cuda --dtype bf16 > "$work_dir/linear_gelu_bench.out" 2>&1 &&
    timeout -k 10 "$(budget 120)" "$build/bin/linear_gelu_bench" --device cuda --dtype f32 >> "$work_dir/linear_gelu_bench.out" 2>&1; then
  { echo '```'; cat "$work_dir/linear_gelu_bench.out"; echo '```'; } >> "$report"
  # The bf16 4096^3 row's TFLOP/s as a fraction of the data-sheet bf16 peak (target >= 0.8).
  awk -v peak="$peak" '/bf16/ { bf16 = 1 } /f32/ && !/bf16/ { bf16 = 0 }
    bf16 && /^4096\^3/ { for (i = 1; i <= NF; ++i) if ($i == "TFLOP/s") t = $(i - 1) }
    END { if (t != "" && peak > 0) printf "- bf16 4096^3 GEMM with the GELU epilogue: %.1f TFLOP/s, %.2f of the data-sheet peak (target >= 0.8)\n", t, t * 1e12 / peak }' \
    "$work_dir/linear_gelu_bench.out" >> "$report"
else
  cat "$work_dir/linear_gelu_bench.out" >> "$log" 2>/dev/null
  echo "- **FAILED** (the last lines of $(basename "$log") say why)" >> "$report"
  late_failures+=("linear_gelu_bench")
fi
echo "in $(($(date +%s) - start)) s" >> "$report"

section "Memory-bound kernels on cuda:0 against a device-to-device copy"
# GPT-2 124M's shapes at micro-batch 64 (bench/kernel_bench.cc): GB/s of
# each kernel over the copy's, in the same run (1: as fast as a copy).
start=$(date +%s)
if build_targets kernel_bench &&
    timeout -k 10 "$(budget 120)" "$build/bin/kernel_bench" --device cuda > "$work_dir/kernel_bench.out" 2>&1; then
  { echo '```'; cat "$work_dir/kernel_bench.out"; echo '```'; } >> "$report"
else
  cat "$work_dir/kernel_bench.out" >> "$log" 2>/dev/null
  echo "- **FAILED** (the last lines of $(basename "$log") say why)" >> "$report"
  late_failures+=("kernel_bench")
fi
echo "in $(($(date +%s) - start)) s" >> "$report"

section "GPT-2 124M, bf16, on cuda:0"
# GPT-2 124M's shapes on gpt2_nano's synthetic data (no corpus needed), seq
# 1024, the largest micro-batch that fits (the issue's): the largest of 128,
# 64, 32, 16 whose planned memory (`tessera plan --format memory`: weights,
# optimizer state, the arena of activations and gradients) stays within 80 %
# of the GPU's (the rest: CUDA's context, cuBLAS's and NCCL's buffers), else
# 8. Tokens/s of the last logged iterations and MFU against the GPU's dense
# bf16 peak from its data sheet (a spec figure, not measured here).
# PyTorch's own run of the same step, at the same micro-batch, follows.
start=$(date +%s)
big="$work_dir/runs/gpt2_124m"
rm -rf "$big"
mkdir -p "$work_dir/runs"
L=12 H=768 T=1024 V=50257 B=8
shape=(train.dist.device_type=cuda train.amp.enabled=true "model.num_layers=$L" "model.hidden_size=$H"
  model.num_attention_heads=12 "model.ffn_hidden_size=$((4 * H))" "model.max_seq_length=$T" "model.seq_length=$T"
  "model.vocab_size=$V")
# Fused attention unless the bench above found it slower than the unfused
# ops at these shapes.
fused=(model.bias_gelu_fusion=true)
attention="bias_gelu_fusion and unfused attention (fused / unfused ${attention_ratio:-}x in the bench above)"
if [[ -z ${attention_ratio:-} ]] || awk -v r="$attention_ratio" 'BEGIN { exit !(r <= 1) }'; then
  fused+=(model.fused_attention=true)
  attention="fused attention and bias_gelu_fusion"
fi
memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')
if [[ $memory =~ ^[0-9]+$ ]]; then
  for b in 128 64 32 16; do
    planned=$("$build/bin/tessera" plan "$root/configs/gpt2_nano.json" --format memory "${shape[@]}" "${fused[@]}" \
      train.train_micro_batch_size=$b 2>> "$log" | awk '$1 == "node" && $3 == "cuda:0" { print $4 }')
    if [[ -n $planned ]] && awk -v p="$planned" -v m="$memory" 'BEGIN { exit !(p <= 0.8 * m) }'; then
      B=$b
      echo "- micro-batch $B: planned $planned MiB of the GPU's $memory MiB" >> "$report"
      break
    fi
  done
fi
train_124m() {  # micro-batch, extra overrides...
  local b=$1
  shift
  rm -rf "$big"
  timeout -k 10 "$(budget 200)" "$build/bin/tessera" train "$root/configs/gpt2_nano.json" train.train_iter=12 train.log_period=4 \
    train.checkpointer.period=null "train.output_dir=$big" "${shape[@]}" train.train_micro_batch_size=$b "$@" \
    > "$big.out" 2>&1 < /dev/null
}
# As chosen above at the micro-batch chosen; failing that, at 8; then with
# neither fusion at 8.
trained=0
train_124m $B "${fused[@]}" || trained=$?
if [[ $trained != 0 && $B != 8 ]]; then
  cat "$big.out" >> "$log"
  echo "- micro-batch $B with $attention: **FAILED** (the log says why); micro-batch 8:" >> "$report"
  B=8
  trained=0
  train_124m $B "${fused[@]}" || trained=$?
fi
if [[ $trained != 0 ]]; then
  cat "$big.out" >> "$log"
  echo "- with $attention: **FAILED** (the log says why); unfused:" >> "$report"
  attention="unfused attention and MLP"
  trained=0
  train_124m $B || trained=$?
fi
if [[ $trained == 0 ]]; then
  echo "- $attention, micro-batch $B" >> "$report"
  awk -v r="$(tokens "$big.out")" -v peak="$peak" -v gpu="$gpu" -v L=$L -v H=$H -v T=$T -v V=$V 'BEGIN {
    p = V * H + T * H + L * (12 * H * H + 13 * H) + 2 * H; f = 6 * p + 12 * L * H * T
    printf "- %d parameters, %.1f MFLOP per token; %s tokens/s", p, f / 1e6, r
    if (peak > 0) printf ", MFU %.1f%% of %s'"'"'s %.0f TFLOP/s dense bf16 (data sheet)", 100 * r * f / peak, gpu, peak / 1e12
    printf " (target: >= 55%%)\n" }' >> "$report"
else
  cat "$big.out" >> "$log"
  echo "- **FAILED** (the last lines of $(basename "$log") say why)" >> "$report"
fi
echo "in $(($(date +%s) - start)) s" >> "$report"

section "PyTorch on the same GPU"
# bench/torch_bench.py: the same GPT-2 124M step (bf16 autocast, AdamW,
# dropout 0.1, micro-batch $B, seq $T) eager and with torch.compile, and
# scaled_dot_product_attention at attention_bench's shapes. The device
# machines' python3 holds PyTorch with CUDA.
start=$(date +%s)
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >> "$log" 2>&1; then
  ours=$(tokens "$big.out")
  for mode in eager compile; do
    flag=""
    [[ $mode == compile ]] && flag="--compile"
    limit=$(($(seconds_left) - 40))  # sdpa's run after it
    if ((limit < 30)); then
      echo "- PyTorch $mode: skipped (out of time: $(seconds_left) s of the check's budget left)" >> "$report"
      continue
    fi
    if timeout -k 10 "$limit" python3 "$root/bench/torch_bench.py" gpt2 --batch $B --seq $T $flag > "$work_dir/torch_$mode.out" 2>&1; then
      line=$(grep '^torch gpt2' "$work_dir/torch_$mode.out" | tail -1)
      theirs=$(echo "$line" | grep -o 'tokens/s [0-9]*' | cut -d' ' -f2)
      echo "- $line" >> "$report"
      if [[ -n $ours && -n $theirs ]]; then
        awk -v a="$ours" -v b="$theirs" -v m="$mode" \
          'BEGIN { printf "  Tessera (%s tokens/s) / PyTorch %s: %.2fx (target: faster than eager)\n", a, m, a / b }' >> "$report"
      fi
    else
      cat "$work_dir/torch_$mode.out" >> "$log"
      echo "- PyTorch $mode: **FAILED** (the log says why)" >> "$report"
    fi
  done
  if (($(seconds_left) < 15)); then
    echo "- scaled_dot_product_attention: skipped (out of time)" >> "$report"
  elif timeout -k 10 "$(seconds_left)" python3 "$root/bench/torch_bench.py" sdpa > "$work_dir/torch_sdpa.out" 2>&1; then
    { echo '```'; cat "$work_dir/torch_sdpa.out"; echo '```'; } >> "$report"
  else
    cat "$work_dir/torch_sdpa.out" >> "$log"
    echo "- scaled_dot_product_attention: **FAILED** (the log says why)" >> "$report"
  fi
else
  echo "- skipped: this machine's python3 has no PyTorch that sees a GPU" >> "$report"
fi
echo "in $(($(date +%s) - start)) s" >> "$report"

section "Where GPT-2 124M's step goes"
# The 124M job again, 4 iterations at the same micro-batch, with
# TESSERA_PROFILE_OPS (actors/op_profile.h): each kernel's device time
# between CUDA events, the first iteration left out; the ops taking the most
# time per step. Last, and only with time left: the events and callbacks
# cost some speed, so the run above is not profiled.
start=$(date +%s)
if [[ ${trained:-1} != 0 ]]; then
  echo "- skipped: the 124M run above failed" >> "$report"
elif (($(seconds_left) < 90)); then
  echo "- skipped (out of time: $(seconds_left) s of the check's budget left)" >> "$report"
else
  profile="$work_dir/op_profile.tsv"
  rm -f "$profile"
  if TESSERA_PROFILE_OPS="$profile" timeout -k 10 "$(budget 200)" "$build/bin/tessera" train "$root/configs/gpt2_nano.json"       train.train_iter=4 train.log_period=4 train.checkpointer.period=null "train.output_dir=$big-profile" "${shape[@]}"       train.train_micro_batch_size=$B "${fused[@]}" > "$big-profile.out" 2>&1 < /dev/null && [[ -s $profile ]]; then
    echo "- $attention, micro-batch $B; ms per step (3 timed steps) and share of the kernels' time:" >> "$report"
    { echo '```'
      awk -F'\t' '/^# / || $1 == "op" { next } { total += $4; rows[++n] = $0 }
        END { printf "%-36s %8s %10s %7s\n", "op", "acts", "ms/step", "share"
              for (i = 1; i <= n && i <= 15; ++i) { split(rows[i], f, "\t"); printf "%-36s %8.1f %10.2f %6.1f%%\n", f[1], f[3] / 3, f[4] / 3, 100 * f[6] }
              printf "%-36s %8s %10.2f\n", "all kernels", "", total / 3 }' "$profile"
      echo '```'; } >> "$report"
    # Against the step time of the unprofiled run: what the kernels leave
    # is the host's launches, gaps between kernels and waits.
    awk -F'\t' -v r="$(tokens "$big.out")" -v b=$B -v t=$T '/^# / || $1 == "op" { next } { total += $4 }
      END { if (r > 0) printf "- kernels %.1f ms of the run above'"'"'s %.1f ms step (%.0f%%)\n", total / 3, 1000 * b * t / r, 100 * total / 3 / (1000 * b * t / r) }' \
      "$profile" >> "$report"
  else
    cat "$big-profile.out" >> "$log"
    echo "- **FAILED** (the log says why)" >> "$report"
  fi
fi
echo "in $(($(date +%s) - start)) s" >> "$report"
if (( ${#late_failures[@]} > 0 )); then
  failed=$(printf '%s; ' "${late_failures[@]}")
  printf '\n**FAILED: %s** (see %s)\n' "${failed%; }" "$(basename "$log")" >> "$report"
  echo "gpu_check: ${failed%; } failed; see $report" >&2
  exit 1
fi
echo "gpu_check: passed; report in $report"
