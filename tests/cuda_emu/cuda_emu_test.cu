// The CUDA emulator's runtime and kernels (cmake/cuda_emu/): what Tessera's
// CUDA code relies on behaves as on a GPU, or the emulator would let bugs
// through (a stream that ran its work at once would hide a missing wait).
// A .cu file: its launches go through the emulator's front end
// (rewrite_launches.pl) as Tessera's kernels do.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_emu/internal.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace {

using namespace std::chrono_literals;

// A block sums its values through shared memory and __syncthreads, then its
// first warp finishes with shuffles.
__global__ void BlockSum(const float* x, float* out, int n) {
  __shared__ float partial[256];
  const int t = static_cast<int>(threadIdx.x);
  float v = 0.0f;
  for (int i = static_cast<int>(blockIdx.x * blockDim.x) + t; i < n; i += static_cast<int>(gridDim.x * blockDim.x)) {
    v += x[i];
  }
  partial[t] = v;
  __syncthreads();
  for (int s = static_cast<int>(blockDim.x) / 2; s >= 32; s /= 2) {
    if (t < s) partial[t] += partial[t + s];
    __syncthreads();
  }
  if (t < 32) {
    float w = partial[t];
    for (int o = 16; o > 0; o /= 2) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (t == 0) atomicAdd(out, w);
  }
}

__global__ void Broadcast(float* y) {
  extern __shared__ float tile[];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  tile[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  y[threadIdx.x] = __shfl_sync(0xffffffffu, tile[blockDim.x - 1 - threadIdx.x], 3) + static_cast<float>(lane) * 0.0f;
}

__global__ void Sleepy(int* flag) {
  std::this_thread::sleep_for(50ms);
  *flag = 1;
}

__global__ void Trapping() { __trap(); }

__global__ void SetOne(int* flag) { *flag = 1; }

// Blocks a stream until `open` is set.
void HoldUntilOpen(void* open) {
  while (!static_cast<std::atomic<bool>*>(open)->load()) std::this_thread::sleep_for(1ms);
}

// Whether `flag` is set within 10 s: for what happens at once, on a loaded
// machine too.
bool SetSoon(const std::atomic<bool>& flag) {
  for (int i = 0; i < 10000 && !flag.load(); ++i) std::this_thread::sleep_for(1ms);
  return flag.load();
}

// With `waits`, that `flag` stays unset for 100 ms (its thread waits for a
// held stream), else that it is set soon.
void ExpectWaits(bool waits, const std::atomic<bool>& flag, const char* what) {
  if (waits) {
    std::this_thread::sleep_for(100ms);
    EXPECT_FALSE(flag.load()) << what;
  } else {
    EXPECT_TRUE(SetSoon(flag)) << what;
  }
}

TEST(CudaEmu, BlocksSynchroniseAndWarpsShuffle) {
  const int n = 5000;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>(i % 7);
  float* x = nullptr;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&x, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(out, 0, sizeof(float), cudaStreamPerThread), cudaSuccess);
  BlockSum<<<3, 256, 0, cudaStreamPerThread>>>(x, out, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  float sum = 0.0f;
  ASSERT_EQ(cudaMemcpyAsync(&sum, out, sizeof(float), cudaMemcpyDeviceToHost, cudaStreamPerThread), cudaSuccess);
  double expected = 0.0;
  for (float v : host) expected += v;
  EXPECT_EQ(sum, static_cast<float>(expected));
  cudaFree(x);
  cudaFree(out);
}

TEST(CudaEmu, DynamicSharedMemoryAndShuffleFromALane) {
  float* y = nullptr;
  ASSERT_EQ(cudaMalloc(&y, 64 * sizeof(float)), cudaSuccess);
  ::cuda_emu::Bind(Broadcast, 1, 64, 64 * sizeof(float), cudaStreamPerThread)(y);
  std::vector<float> host(64);
  ASSERT_EQ(cudaMemcpy(host.data(), y, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  // Lane 3 of warp w read tile[63 - (32 w + 3)].
  for (int t = 0; t < 64; ++t) EXPECT_EQ(host[static_cast<size_t>(t)], static_cast<float>(63 - ((t / 32) * 32 + 3)));
  cudaFree(y);
}

TEST(CudaEmu, LaunchLimitsAreTheGpus) {
  float* y = nullptr;
  ASSERT_EQ(cudaMalloc(&y, 2048 * sizeof(float)), cudaSuccess);
  Broadcast<<<1, 2048, 0, cudaStreamPerThread>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  Broadcast<<<1, 32, 64 * 1024, cudaStreamPerThread>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "64 KiB of dynamic shared memory without the attribute";
  ASSERT_EQ(cudaFuncSetAttribute(Broadcast, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024), cudaSuccess);
  Broadcast<<<1, 32, 64 * 1024, cudaStreamPerThread>>>(y);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  cudaFree(y);
}

TEST(CudaEmu, StreamsRunLaterAndInOrderEventsWait) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int* flag = nullptr;
  ASSERT_EQ(cudaMallocHost(&flag, sizeof(int)), cudaSuccess);
  *flag = 0;
  Sleepy<<<1, 1, 0, stream>>>(flag);
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, stream), cudaSuccess);
  EXPECT_EQ(std::atomic_ref<int>(*flag).load(), 0) << "the launch returned before its kernel ran";
  EXPECT_EQ(cudaEventQuery(event), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(event), cudaSuccess);
  EXPECT_EQ(*flag, 1);
  EXPECT_EQ(cudaEventQuery(event), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(event), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  cudaFreeHost(flag);
}

TEST(CudaEmu, AFailedKernelIsTheStreamsErrorAndSkipsItsLaterWork) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int* flag = nullptr;
  ASSERT_EQ(cudaMallocHost(&flag, sizeof(int)), cudaSuccess);
  *flag = 0;
  Trapping<<<2, 64, 0, stream>>>();
  Sleepy<<<1, 1, 0, stream>>>(flag);
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, stream), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(event), cudaErrorAssert);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorAssert);
  EXPECT_EQ(*flag, 0);
  cudaGetLastError();
  cudaEventDestroy(event);
  cudaStreamDestroy(stream);
  cudaFreeHost(flag);
}

TEST(CudaEmu, PageableCopiesWaitForTheStream) {
  int* flag = nullptr;
  ASSERT_EQ(cudaMalloc(&flag, sizeof(int)), cudaSuccess);
  Sleepy<<<1, 1, 0, cudaStreamPerThread>>>(flag);
  int got = 0;
  ASSERT_EQ(cudaMemcpyAsync(&got, flag, sizeof(int), cudaMemcpyDeviceToHost, cudaStreamPerThread), cudaSuccess);
  EXPECT_EQ(got, 1) << "a copy into pageable memory returns once done";
  cudaFree(flag);
}

TEST(CudaEmu, DeviceMemoryStartsAsNaNAndDevicesAreChecked) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4 * sizeof(float)), cudaSuccess);
  float host[4];
  ASSERT_EQ(cudaMemcpy(host, d, sizeof(host), cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : host) EXPECT_TRUE(std::isnan(v));
  cudaFree(d);
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_GE(count, 1);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaFree(reinterpret_cast<void*>(0x1000)), cudaErrorInvalidDevicePointer);
  cudaGetLastError();
}

// Lazy loading (CUDA_MODULE_LOADING unset or LAZY): a kernel's first launch
// on a device waits for everything queued on the device, on any stream, and
// other threads' work for the device waits behind it; its later launches do
// not wait; so does a cuBLAS GEMM of new types, epilogue or shape. Under
// EAGER (ctest cuda_emu_test_eager) only cuBLAS's start on a device (its
// first handle there) waits. A stream held by a host function stands for an
// NCCL kernel waiting for its peers.
TEST(CudaEmu, AKernelsFirstLaunchWaitsForTheDeviceUnderLazyLoading) {
  const bool lazy = cuda_emu::LazyLoading();
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  EXPECT_EQ(lazy, mode == nullptr || std::string(mode) != "EAGER");
  cudaStream_t held = nullptr, other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  int* flag = nullptr;
  ASSERT_EQ(cudaMallocHost(&flag, sizeof(int)), cudaSuccess);
  // Sleepy is loaded already (an earlier test, or here); SetOne is not.
  Sleepy<<<1, 1, 0, other>>>(flag);
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  std::atomic<bool> open{false};
  ASSERT_EQ(cudaLaunchHostFunc(held, HoldUntilOpen, &open), cudaSuccess);
  std::atomic<bool> first_returned{false}, loaded_returned{false};
  std::thread first([&] {
    SetOne<<<1, 1, 0, other>>>(flag);
    first_returned = true;
  });
  ExpectWaits(lazy, first_returned, "a first launch under lazy loading waits for the held stream");
  // Another thread's launch of a loaded kernel: behind the load, if any.
  std::thread loaded([&] {
    Sleepy<<<1, 1, 0, other>>>(flag);
    loaded_returned = true;
  });
  ExpectWaits(lazy, loaded_returned, "other work for the device waits behind a load");
  EXPECT_EQ(first_returned.load(), !lazy);
  open = true;
  first.join();
  loaded.join();
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  // Loaded now: the next launch behind a held stream returns at once.
  std::atomic<bool> open_again{false};
  ASSERT_EQ(cudaLaunchHostFunc(held, HoldUntilOpen, &open_again), cudaSuccess);
  std::atomic<bool> again_returned{false};
  std::thread again([&] {
    SetOne<<<1, 1, 0, other>>>(flag);
    again_returned = true;
  });
  EXPECT_TRUE(SetSoon(again_returned)) << "a loaded kernel's launch does not wait";
  open_again = true;
  again.join();
  // A function's load is per device: another device has not loaded SetOne.
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices > 1) {
    std::atomic<bool> open_third{false}, third_returned{false};
    std::thread third([&] {
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      cudaStream_t held1 = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&held1, cudaStreamNonBlocking), cudaSuccess);
      ASSERT_EQ(cudaLaunchHostFunc(held1, HoldUntilOpen, &open_third), cudaSuccess);
      std::thread launcher([&] {
        ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
        SetOne<<<1, 1, 0, cudaStreamPerThread>>>(flag);
        third_returned = true;
        cudaStreamSynchronize(cudaStreamPerThread);
      });
      ExpectWaits(lazy, third_returned, "device 1 loads SetOne on its own first launch");
      open_third = true;
      launcher.join();
      cudaStreamDestroy(held1);
    });
    third.join();
  }
  // cuBLAS: under EAGER its start on a device (the first handle there) loads
  // its modules, waiting for the device; under LAZY the start does not wait,
  // a GEMM of new types, epilogue or shape does.
  float* m = nullptr;
  ASSERT_EQ(cudaMalloc(&m, 8 * sizeof(float)), cudaSuccess);
  std::atomic<bool> open_blas{false}, created{false}, multiplied{false};
  ASSERT_EQ(cudaLaunchHostFunc(held, HoldUntilOpen, &open_blas), cudaSuccess);
  cublasHandle_t blas = nullptr;
  std::thread gemm([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
    created = true;
    ASSERT_EQ(cublasSetStream(blas, other), CUBLAS_STATUS_SUCCESS);
    const float alpha = 1, beta = 0;
    EXPECT_EQ(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, m, 2, m, 2, &beta, m + 4, 2),
              CUBLAS_STATUS_SUCCESS);
    multiplied = true;
  });
  ExpectWaits(!lazy, created, "cuBLAS's start under eager loading waits for the held stream");
  if (lazy) ExpectWaits(true, multiplied, "a new GEMM under lazy loading waits for the held stream");
  open_blas = true;
  gemm.join();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cublasDestroy(blas), CUBLAS_STATUS_SUCCESS);
  cudaFree(m);
  cudaStreamDestroy(held);
  cudaStreamDestroy(other);
  cudaFreeHost(flag);
}

TEST(CudaEmu, SixteenBitFloatsRoundToNearestEven) {
  EXPECT_EQ(__float2half_rn(1.0f).__x, 0x3c00);
  EXPECT_EQ(__float2half_rn(65504.0f).__x, 0x7bff);
  EXPECT_EQ(__float2half_rn(65519.0f).__x, 0x7bff);
  EXPECT_EQ(__float2half_rn(65520.0f).__x, 0x7c00);
  EXPECT_EQ(__float2half_rn(std::ldexp(1.0f, -24)).__x, 0x0001);
  EXPECT_EQ(__float2half_rn(std::ldexp(1.0f, -25)).__x, 0x0000);  // a tie to even: zero
  EXPECT_EQ(__float2half_rn(std::ldexp(3.0f, -25)).__x, 0x0002);
  EXPECT_EQ(__float2half_rn(1.0f + std::ldexp(1.0f, -11)).__x, 0x3c00);  // tie to even
  EXPECT_EQ(__float2half_rn(1.0f + std::ldexp(3.0f, -11)).__x, 0x3c02);
  EXPECT_EQ(__half2float(__half(-65504.0f)), -65504.0f);
  EXPECT_TRUE(std::isnan(__half2float(__float2half_rn(NAN))));
  EXPECT_EQ(__float2bfloat16_rn(1.0f + std::ldexp(1.0f, -8)).__x, 0x3f80);  // tie to even
  EXPECT_EQ(__float2bfloat16_rn(1.0f + std::ldexp(3.0f, -8)).__x, 0x3f82);
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16_rn(NAN))));
  // Integers round once: 2^24 + 1 as bf16 is 2^24, 65520 as f16 overflows.
  EXPECT_EQ(__bfloat162float(__ll2bfloat16_rn((1ll << 24) + 1)), 16777216.0f);
  EXPECT_EQ(__bfloat162float(__ll2bfloat16_rn(257)), 256.0f);
  EXPECT_EQ(__bfloat162float(__ll2bfloat16_rn(259)), 260.0f);
  EXPECT_TRUE(std::isinf(__half2float(__ll2half_rn(65520))));
  EXPECT_EQ(__half2float(__ll2half_rn(-2049)), -2048.0f);
}

}  // namespace
