#!/bin/bash
# The CUDA code paths on the CPU: builds Tessera against its CUDA emulator
# (TESSERA_CUDA_EMULATOR=ON, cmake/cuda_emu/: the CUDA runtime, cuBLAS /
# cuBLASLt, NCCL and CUB's sort run on host threads; kernels run block by
# block, CUDA threads as fibers) and runs the tests of label cuda on
# emulated GPUs: every CUDA kernel against its CPU kernel, the actor runtime
# on cuda:0, the NCCL communicator, and gpt2_nano on one emulated GPU
# against the CPU and under DP / TP / PP / 2x2x1 / 2x2x2 against one GPU.
# It checks the logic of the GPU path (indexing, launches, streams, events,
# cuBLAS's column-major mapping, collectives), not its speed nor anything
# of a real GPU's hardware; scripts/gpu_check.sh is the check on a GPU.
#
#   scripts/cuda_emu_check.sh [BUILD_DIR] [--quick]   (default build-emu)
# --quick: what CI runs (the emulator's own tests, the kernels, the runtime
# and NCCL tests, not the gpt2_nano trainings: those take several minutes).
# Exit status: ctest's.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-emu
quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "cuda_emu_check.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) build=$arg ;;
  esac
done

tests=(cuda_emu_test cublas_emu_test nccl_emu_test cuda_kernels_test cuda_runtime_test nccl_test)
if [ "$quick" = 0 ]; then
  tests+=(gpu_equivalence_test)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA_EMULATOR=ON \
  -DTESSERA_BUILD_BENCH=OFF -DTESSERA_BUILD_EXAMPLES=OFF
targets=("${tests[@]}")
if [ "$quick" = 0 ]; then
  targets+=(tessera)  # gpu_equivalence_test runs the binary
fi
cmake --build "$build" --target "${targets[@]}"
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
# Eight emulated GPUs (the 2x2x2 layout); deadlines scaled for emulated
# kernels.
TESSERA_CUDA_EMU_DEVICES=8 TESSERA_TEST_DEADLINE_SCALE=10 \
  ctest --test-dir "$build" -R "$regex" --output-on-failure
