#pragma once
// What the emulator's parts (runtime.cc, kernel.cc, cublas.cc, nccl.cc)
// share: queueing work on a stream.

#include <functional>
#include <string>

#include "cuda_runtime_api.h"

namespace cuda_emu {

// Work on a stream: runs on the stream's own host thread, in queue order,
// with the stream's device current there. A task's error is the stream's
// sticky error: the stream skips its later tasks (events recorded after it
// still complete) and cudaStreamSynchronize, cudaEventSynchronize and
// cudaStreamQuery return it.
using Task = std::function<cudaError_t()>;

// Queues `task` on `stream` (cudaStreamPerThread, cudaStreamLegacy and 0:
// the calling thread's default stream on its current device). Returns
// cudaErrorInvalidResourceHandle for a destroyed or unknown stream, else
// cudaSuccess (the task's own error comes later, as above).
cudaError_t Enqueue(cudaStream_t stream, Task task);

// Lazy loading (CUDA_MODULE_LOADING: LAZY, the default since CUDA 12.2, or
// EAGER): the first use of a function (a kernel; for cuBLAS, a GEMM of new
// types, epilogue or shape) on a device loads it there, and a load may
// synchronise the device's context: it waits for every stream of the
// device, and every other call that queues work for the device waits
// behind it. The emulator always synchronises, the worst case the CUDA
// documentation warns of: a kernel that spins until one launched later
// runs (NCCL's, waiting for its peers) may then never finish. Under EAGER
// (or once loaded) LoadFunction returns at once.
bool LazyLoading();
void LoadFunction(int device, const std::string& function);
// Loads `module` on `device` once, whatever the mode, as above: a library's
// modules when it starts on a device (all its kernels under EAGER).
void LoadModule(int device, const std::string& module);
// A kernel's function name for LoadFunction.
std::string FunctionName(const void* kernel);

// Under TESSERA_CUDA_EMU_NCCL_CONCURRENT (nccl.cc): the NCCL ops running on
// `device` now (0 without the bound).
int RunningNcclOps(int device);

// The device a stream belongs to (special streams: the calling thread's
// current device); -1 for an unknown stream.
int StreamDevice(cudaStream_t stream);

// The calling thread's current device (cudaSetDevice's; 0 at first).
int CurrentDevice();

// How many devices the emulator has (TESSERA_CUDA_EMU_DEVICES).
int DeviceCount();

// Sets the calling thread's last error (cudaGetLastError's) unless one is
// already set; returns `error`.
cudaError_t SetLastError(cudaError_t error);

}  // namespace cuda_emu
