// CUDA embedding and its gradient (ops/cuda/launch.h). The gradient sums in
// id order without atomics: ids are stably sorted by row (CUB's radix sort),
// then each (row, channel) adds its row's occurrences in order, as the CPU
// does.

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

__device__ int64_t IdAt(const void* ids, int id_bytes, int64_t n) {
  return id_bytes == 4 ? static_cast<int64_t>(static_cast<const int32_t*>(ids)[n])
                       : static_cast<const int64_t*>(ids)[n];
}

// The lowest position of an id outside [0, vocab) into *bad (N: none).
__global__ void FindBadId(const void* ids, int id_bytes, int64_t N, int64_t vocab, unsigned long long* bad) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t id = IdAt(ids, id_bytes, n);
    if (id < 0 || id >= vocab) atomicMin(bad, static_cast<unsigned long long>(n));
  }
}

// Checks the ids; *bad_out = first bad position or -1. The ids are an
// input register, complete before the act: checked on the thread's default
// stream, so the host waits for this check alone, not for the kernels
// queued on the bound stream.
int CheckIds(const void* ids, int id_bytes, int64_t N, int64_t vocab, int64_t* bad_out) {
  *bad_out = -1;
  if (N == 0) return 0;
  unsigned long long* bad = nullptr;
  cudaError_t err = cudaMallocAsync(&bad, sizeof(*bad), cudaStreamPerThread);
  if (err != cudaSuccess) return static_cast<int>(err);
  const unsigned long long none = static_cast<unsigned long long>(N);
  err = cudaMemcpyAsync(bad, &none, sizeof(none), cudaMemcpyHostToDevice, cudaStreamPerThread);
  if (err == cudaSuccess) {
    FindBadId<<<Blocks(N), kThreads, 0, cudaStreamPerThread>>>(ids, id_bytes, N, vocab, bad);
    err = cudaGetLastError();
  }
  unsigned long long found = none;
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(&found, bad, sizeof(found), cudaMemcpyDeviceToHost, cudaStreamPerThread);
  cudaFreeAsync(bad, cudaStreamPerThread);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (found < none) *bad_out = static_cast<int64_t>(found);
  return 0;
}

__global__ void Gather(const float* weight, const void* ids, int id_bytes, float* y, int64_t N, int64_t V, int64_t C,
                       int64_t row_begin) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const int64_t row = IdAt(ids, id_bytes, n) - row_begin;
    y[i] = row >= 0 && row < V ? weight[row * C + c] : 0.0f;
  }
}

__global__ void RowsOfIds(const void* ids, int id_bytes, int64_t N, int64_t row_begin, int64_t* rows) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    rows[n] = IdAt(ids, id_bytes, n) - row_begin;
  }
}

__global__ void Iota(int64_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = i;
  }
}

// Thread (k, c) with k the first of its row's run in the sorted order sums
// the run's dy rows, in id order, into dweight[row, c].
__global__ void SumRuns(const float* dy, const int64_t* rows, const int64_t* order, float* dweight, int64_t N,
                        int64_t V, int64_t C) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = i / C, c = i % C;
    const int64_t row = rows[k];
    if ((k > 0 && rows[k - 1] == row) || row < 0 || row >= V) continue;
    float sum = 0.0f;
    for (int64_t j = k; j < N && rows[j] == row; ++j) sum += dy[order[j] * C + c];
    dweight[row * C + c] = sum;
  }
}

}  // namespace

int LaunchEmbedding(const float* weight, const void* ids, int id_bytes, float* y, int64_t N, int64_t V, int64_t C,
                    int64_t row_begin, int64_t vocab, int64_t* bad) {
  if (const int err = CheckIds(ids, id_bytes, N, vocab, bad); err != 0 || *bad >= 0) return err;
  if (N * C == 0) return 0;
  Gather<<<Blocks(N * C), kThreads, 0, CurrentStream()>>>(weight, ids, id_bytes, y, N, V, C, row_begin);
  return Finish();
}

int LaunchEmbeddingGrad(const float* dy, const void* ids, int id_bytes, float* dweight, int64_t N, int64_t V, int64_t C,
                        int64_t row_begin, int64_t vocab, int64_t* bad) {
  if (const int err = CheckIds(ids, id_bytes, N, vocab, bad); err != 0 || *bad >= 0) return err;
  if (V * C > 0) {
    const cudaError_t err = cudaMemsetAsync(dweight, 0, sizeof(float) * V * C, CurrentStream());
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  if (N * C == 0) return Finish();
  // Buffers ordered on the stream: cudaMalloc and cudaFree (Thrust's
  // device_vector, its sort's temporaries) wait for the whole device, NCCL's
  // kernels on the collective stream included, which may wait for a peer
  // that needs this rank's next kernels: a hang (found on the CUDA
  // emulator under tensor parallelism).
  const cudaStream_t stream = CurrentStream();
  size_t sort_bytes = 0;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), N, 0, 64, stream);
  // The sort's temporaries, then rows, order, the sorted rows and order.
  const size_t temp_bytes = (sort_bytes + 255) / 256 * 256;
  char* buffer = nullptr;
  if (err == cudaSuccess) err = cudaMallocAsync(&buffer, temp_bytes + 4 * N * sizeof(int64_t), stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  int64_t* rows = reinterpret_cast<int64_t*>(buffer + temp_bytes);
  int64_t* order = rows + N;
  int64_t* sorted_rows = order + N;
  int64_t* sorted_order = sorted_rows + N;
  RowsOfIds<<<Blocks(N), kThreads, 0, stream>>>(ids, id_bytes, N, row_begin, rows);
  Iota<<<Blocks(N), kThreads, 0, stream>>>(order, N);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    err = cub::DeviceRadixSort::SortPairs(buffer, sort_bytes, rows, sorted_rows, order, sorted_order, N, 0, 64, stream);
  }
  if (err == cudaSuccess) {
    SumRuns<<<Blocks(N * C), kThreads, 0, stream>>>(dy, sorted_rows, sorted_order, dweight, N, V, C);
    err = cudaGetLastError();
  }
  cudaFreeAsync(buffer, stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  return Finish();
}

}  // namespace tessera::ops::cuda
