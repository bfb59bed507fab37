#!/bin/bash
# The CUDA code paths on the CPU: builds Tessera against its CUDA emulator
# (TESSERA_CUDA_EMULATOR=ON, cmake/cuda_emu/: the CUDA runtime, cuBLAS /
# cuBLASLt, NCCL and CUB's sort run on host threads; kernels run block by
# block, CUDA threads as fibers) and runs the tests of label cuda on
# emulated GPUs: every CUDA kernel against its CPU kernel, the actor runtime
# on cuda:0, the NCCL communicator (also with every op on a non-blocking
# communicator answering ncclInProgress first, as real NCCL may), and
# gpt2_nano on one emulated GPU
# against the CPU and under DP / TP / PP / 2x2x1 / 2x2x2 against one GPU
# (those layouts again with one NCCL op at a time per GPU);
# then whole jobs through the binary on emulated cuda:0 against the CPU
# (gpt2_nano in bf16 and fp16 AMP, with fused attention and bias_gelu
# fusion; bert_tiny; mlp_demo); then across processes, a worker process
# per emulated GPU: gpt2_nano data-parallel and pipelined against one
# GPU, and a rank SIGKILLed mid-job failing the job within 10 s. It checks
# the logic of the GPU path (indexing, launches, streams, events, cuBLAS's column-major
# mapping, collectives), not its speed nor anything of a real GPU's
# hardware; scripts/gpu_check.sh is the check on a GPU.
#
#   scripts/cuda_emu_check.sh [BUILD_DIR] [--quick]   (default build-emu)
# --quick: what CI runs (the emulator's own tests, the kernels, the runtime
# and NCCL tests, not the trainings: those take about six minutes more).
# Exit status: 0 when every test and comparison passed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-emu
quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "cuda_emu_check.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) build=$arg ;;
  esac
done

tests=(cuda_emu_test cuda_emu_test_eager cublas_emu_test nccl_emu_test nccl_emu_test_enqueuing nccl_emu_test_concurrent
  cuda_kernels_test cuda_runtime_test nccl_test nccl_test_enqueuing)
if [ "$quick" = 0 ]; then
  tests+=(gpu_equivalence_test)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA_EMULATOR=ON \
  -DTESSERA_BUILD_BENCH=OFF -DTESSERA_BUILD_EXAMPLES=OFF
# The *_enqueuing tests run those binaries again with the emulator's
# ncclInProgress ops, cuda_emu_test_eager with eager module loading,
# nccl_emu_test_concurrent with one NCCL op at a time per device.
targets=()
for t in "${tests[@]}"; do [[ $t == *_enqueuing || $t == *_eager || $t == *_concurrent ]] || targets+=("$t"); done
if [ "$quick" = 0 ]; then
  targets+=(tessera)  # gpu_equivalence_test runs the binary
fi
cmake --build "$build" --target "${targets[@]}"
regex="^($(IFS='|'; echo "${tests[*]}"))\$"
# Eight emulated GPUs (the 2x2x2 layout); deadlines scaled for emulated
# kernels.
export TESSERA_CUDA_EMU_DEVICES=8
# The emulator narrows its GPUs by CUDA_VISIBLE_DEVICES as CUDA does; the
# check wants all 8 (a worker narrows its own).
unset CUDA_VISIBLE_DEVICES
TESSERA_TEST_DEADLINE_SCALE=10 ctest --test-dir "$build" -R "$regex" --output-on-failure
[ "$quick" = 1 ] && exit 0

# The layouts again with one NCCL op at a time per emulated GPU
# (TESSERA_CUDA_EMU_NCCL_CONCURRENT=1): a GPU may run only one of its NCCL
# kernels at a time, so its ops on all communicators must run in one order
# on every rank (the launch order's one lane per GPU, and the GPU's
# NcclSequence: docs/architecture.md, the NCCL communicator).
TESSERA_CUDA_EMU_NCCL_CONCURRENT=1 TESSERA_TEST_DEADLINE_SCALE=10 \
  "$build/bin/gpu_equivalence_test" --gtest_filter='GpuEquivalence.LayoutsOverGpusGiveTheOneGpuLosses'

# Whole jobs through the binary, on emulated cuda:0 against the CPU (the
# jobs of scripts/gpu_check.sh, 6 iterations each instead of 20).
runs=$(mktemp -d /tmp/tessera-cuda-emu.XXXXXX)
failed=0
job() {  # name rtol config overrides...
  local name=$1 rtol=$2 config=$3
  shift 3
  for device in cpu cuda; do
    "$build/bin/tessera" train "$root/configs/$config" train.train_iter=6 train.log_period=1 \
      train.checkpointer.period=null "train.output_dir=$runs/$name/$device" "train.dist.device_type=$device" "$@" \
      > "$runs/$name.$device.out" 2>&1 < /dev/null || { echo "- $name on $device: **FAILED**"; tail -3 "$runs/$name.$device.out"; }
  done
  "$root/scripts/compare_losses.sh" "$name" "$rtol" 6 "$runs/$name/cuda" "$runs/$name/cpu" || failed=1
}
job bf16 2e-2 gpt2_nano.json train.amp.enabled=true train.amp.dtype=bf16
job fp16 2e-2 gpt2_nano.json train.amp.enabled=true train.amp.dtype=fp16
job f32-fused 1e-4 gpt2_nano.json model.fused_attention=true model.bias_gelu_fusion=true
job bf16-fused 2e-2 gpt2_nano.json train.amp.enabled=true train.amp.dtype=bf16 model.fused_attention=true model.bias_gelu_fusion=true
job bert_tiny-f32 1e-4 bert_tiny.json
job mlp_demo-f32 1e-4 mlp_demo.json

# Across processes: a master and a worker process per emulated GPU, their
# NCCL groups meeting through the master's KV (the emulator's NCCL joins
# ranks of different processes over 127.0.0.1), each GPU running one NCCL
# op at a time. gpt2_nano data-parallel over the two (8 samples each), and
# pipelined over them (2 stages, 4 micro-batches of 4: the split node
# plans' transfers in one order), must give the one-GPU losses (16
# samples); then a rank SIGKILLed mid-job must
# fail the job within 10 s (the emulated NCCL leaves the survivor's
# collective waiting, as NVLink or shared memory would: Tessera's own
# failure handling has to end it).
"$build/bin/tessera" train "$root/configs/gpt2_nano.json" train.train_iter=6 train.log_period=1 \
  train.checkpointer.period=null "train.output_dir=$runs/dp2/one" train.dist.device_type=cuda train.train_micro_batch_size=16 \
  > "$runs/dp2.one.out" 2>&1 < /dev/null || { echo "- dp2 on one GPU: **FAILED**"; tail -3 "$runs/dp2.one.out"; }
"$build/bin/tessera" master --listen 127.0.0.1:0 > "$runs/master.out" 2>&1 &
master=$!
for _ in $(seq 100); do grep -q 'listening on' "$runs/master.out" && break; sleep 0.1; done
address=$(grep -o '127.0.0.1:[0-9]*' "$runs/master.out" | head -1)
TESSERA_CUDA_EMU_NCCL_CONCURRENT=1 "$build/bin/tessera" worker --master "$address" --devices cuda:0 --id emu-a \
  > "$runs/a.out" 2>&1 &
worker_a=$!
TESSERA_CUDA_EMU_NCCL_CONCURRENT=1 "$build/bin/tessera" worker --master "$address" --devices cuda:1 --id emu-b \
  > "$runs/b.out" 2>&1 &
worker_b=$!
timeout 600 "$build/bin/tessera" submit --master "$address" "$root/configs/gpt2_nano.json" train.train_iter=6 \
  train.log_period=1 train.checkpointer.period=null "train.output_dir=$runs/dp2/two" train.dist.device_type=cuda \
  train.dist.data_parallel_size=2 train.train_micro_batch_size=8 --follow > "$runs/dp2.two.out" 2>&1 ||
  { echo "- dp2 over two worker processes: **FAILED**"; tail -3 "$runs/dp2.two.out"; }
timeout 600 "$build/bin/tessera" submit --master "$address" "$root/configs/gpt2_nano.json" train.train_iter=6 \
  train.log_period=1 train.checkpointer.period=null "train.output_dir=$runs/pp2/two" train.dist.device_type=cuda \
  train.dist.pipeline_parallel_size=2 train.train_micro_batch_size=4 train.num_accumulation_steps=4 --follow \
  > "$runs/pp2.two.out" 2>&1 || { echo "- pp2 over two worker processes: **FAILED**"; tail -3 "$runs/pp2.two.out"; }
kill "$worker_a" "$worker_b" "$master" 2> /dev/null || true
wait "$worker_a" "$worker_b" "$master" 2> /dev/null || true
"$root/scripts/compare_losses.sh" dp2-two-processes 1e-5 6 "$runs/dp2/two" "$runs/dp2/one" || failed=1
"$root/scripts/compare_losses.sh" pp2-two-processes 1e-5 6 "$runs/pp2/two" "$runs/dp2/one" || failed=1
TRAIN_WAIT_S=300 "$root/scripts/killed_rank_check.sh" "$build" "$runs/killed" "$root/configs/gpt2_nano.json" \
  train.train_micro_batch_size=8 || failed=1
rm -rf "$runs"
exit $failed
