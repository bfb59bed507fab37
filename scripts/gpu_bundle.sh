#!/bin/bash
# Packs what scripts/gpu_check.sh needs to run on a GPU machine that cannot
# build Tessera (the device machines lent to this project have CUDA, cmake
# and PyTorch but none of the Debian libraries Tessera links, and no
# registry to install them from): the GPU check's binaries, built here and
# stripped, and the shared libraries they load that such a machine lacks
# (gRPC, protobuf, abseil, oneDNN, gloo, spdlog, fmt, ...), in one archive,
# gpu-bundle.tar.xz in the repository root (git-ignored), to carry with the
# run. CUDA's own libraries (cudart, cuBLAS, cuBLASLt, NCCL) are left out:
# the GPU machine has them (the check finds them there), and NCCL and
# cuBLASLt alone are larger than a run may carry.
#
# The binaries are built for any x86-64 with AVX2 and FMA (x86-64-v3), not
# for this machine's processor (-march=native could use instructions the
# GPU machine's lacks), in a build folder of their own.
#
#   scripts/gpu_bundle.sh [BUILD_DIR]   (default build-bundle; about 20 min
#                                        on 2 cores the first time)
# Prints the archive's size; fails when it is over 60 MiB (a run carries
# at most 64 MiB, the working tree included).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bundle}
targets=(tessera cuda_kernels_test cuda_runtime_test nccl_test gpu_equivalence_test attention_bench linear_gelu_bench
  kernel_bench)
command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  { echo "gpu_bundle: no nvcc: the GPU binaries cannot be built here" >&2; exit 1; }
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_BUILD_BENCH=ON \
  -DTESSERA_BUILD_EXAMPLES=OFF -DTESSERA_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" > /dev/null
cmake --build "$build" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu-bundle/bin" "$stage/gpu-bundle/lib"
for t in "${targets[@]}"; do strip -o "$stage/gpu-bundle/bin/$t" "$build/bin/$t"; done
# The libraries they load, but not the C runtime, the C++ runtime (the GPU
# machine's are newer) or CUDA's.
for t in "${targets[@]}"; do ldd "$build/bin/$t"; done | awk '$3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r soname path; do
    case "$soname" in
      libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libstdc++.so.* | libgcc_s.so.* | \
        ld-linux* | libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.*) ;;
      *) cp -L "$path" "$stage/gpu-bundle/lib/$soname" ;;
    esac
  done
# The source path the tests were built with (they read configs/ there).
grep '^CMAKE_HOME_DIRECTORY:' "$build/CMakeCache.txt" | cut -d= -f2 > "$stage/gpu-bundle/source_dir"
git -C "$root" rev-parse HEAD > "$stage/gpu-bundle/commit"
tar -C "$stage" -cf - gpu-bundle | xz -T0 -9 > "$root/gpu-bundle.tar.xz"
bytes=$(stat -c %s "$root/gpu-bundle.tar.xz")
echo "gpu_bundle: $root/gpu-bundle.tar.xz, $((bytes / 1048576)) MiB ($(ls "$stage/gpu-bundle/bin" | wc -l) binaries, $(ls "$stage/gpu-bundle/lib" | wc -l) libraries, commit $(cut -c1-7 "$stage/gpu-bundle/commit"))"
if (( bytes > 60 * 1048576 )); then
  echo "gpu_bundle: over 60 MiB: a device run carries at most 64 MiB with the working tree" >&2
  exit 1
fi
