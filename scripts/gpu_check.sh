#!/bin/bash
# The prepared check for a machine with an NVIDIA GPU (issue 13), sized to
# finish well within 8 minutes on one GPU and 16 cores, so it can run twice
# in an issue's device time:
#   1. what the machine has (nvidia-smi, nvcc, cores);
#   2. configure a Release build with CUDA and build the CUDA tests only
#      (cuda_kernels_test: tessera_ops and tessera_core, a few minutes);
#   3. run them: every op with a CUDA kernel against its CPU kernel on
#      cuda:0 (tests/ops/cuda_kernels_test.cc);
#   4. write a short report, gpu_report.md, in $OUT when set (the device
#      tool's output folder), else in the build folder.
# Not in it yet, because it is not built yet (issue 13): whole jobs on
# `train.dist.device_type=cuda` against the CPU, NCCL, the benchmarks. The
# report says so rather than reporting them.
#
#   scripts/gpu_check.sh [BUILD_DIR]   (default build-gpu)
# Exit status: 0 when the CUDA tests pass, 1 otherwise (the report names the
# failing step).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
report_dir=${OUT:-$build}
mkdir -p "$build" "$report_dir"
report="$report_dir/gpu_report.md"
log="$report_dir/gpu_check.log"
: > "$log"

section() { printf '\n## %s\n\n' "$1" >> "$report"; }
fail() {
  printf '**FAILED: %s** (the last lines of %s):\n\n```\n%s\n```\n' "$1" "$(basename "$log")" "$(tail -25 "$log")" >> "$report"
  echo "gpu_check: $1 failed; see $report" >&2
  exit 1
}

printf '# Tessera GPU check, %s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" > "$report"
section "Machine"
{
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
  (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | xargs -I{} sh -c '{} --version 2>&1 | tail -1'
  echo "cores: $(nproc)"
  echo '```'
} >> "$report"

section "Build"
start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_BUILD_BENCH=OFF \
  -DTESSERA_BUILD_EXAMPLES=OFF >> "$log" 2>&1 || fail "cmake configure (are the Debian packages installed? scripts/install_deps.sh)"
cmake --build "$build" --target cuda_kernels_test -j "$(nproc)" >> "$log" 2>&1 || fail "build of cuda_kernels_test"
echo "configure and build: $(($(date +%s) - start)) s" >> "$report"

section "CUDA kernels against the CPU's"
start=$(date +%s)
if "$build/bin/cuda_kernels_test" >> "$log" 2>&1; then status=passed; else status=FAILED; fi
[[ $status == passed ]] && grep -q '^\[  SKIPPED \]' "$log" && status="skipped its GPU cases"
{
  echo "cuda_kernels_test: **$status** in $(($(date +%s) - start)) s"
  echo
  echo '```'
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|Skipped|Failure|Expected|Which is|output [0-9]+ element' "$log" | head -40
  echo '```'
} >> "$report"
[[ $status == passed ]] || fail "cuda_kernels_test ($status; no usable GPU?)"

section "Not checked here (not built yet)"
cat >> "$report" <<'EOF'
- whole training jobs on `train.dist.device_type=cuda` against the CPU run (the runtime does not place registers on GPUs yet);
- the NCCL communicator and its failure handling;
- cuBLASLt GEMM and fused attention benchmarks, GPT-2 124M bf16 tokens/s and MFU against PyTorch.
EOF
echo "gpu_check: passed; report in $report"
