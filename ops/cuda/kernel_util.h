#pragma once
// What every CUDA kernel's host side does first and last.

#include <string_view>

#include "absl/status/status.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cuda {

// Every tensor of the context on the kernel's GPU (else an error naming the
// device it is on), and that GPU made current on the calling thread, its
// launches bound to the context's stream (none: the thread's default one).
absl::Status OnDevice(const KernelContext& ctx);
// A launcher's result (a cudaError_t) as a status naming the kernel.
absl::Status Done(int err, std::string_view what);

}  // namespace tessera::ops::cuda
