#pragma once
// What every CUDA kernel's host side does first and last.

#include <cstddef>
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
// The context's workspace (OpSchema::Workspace), null and 0 when it has
// none: the launchers then allocate what they need on the stream.
inline void* WorkspaceOf(const KernelContext& ctx) {
  return ctx.workspace.defined() ? ctx.workspace.raw_data() : nullptr;
}
inline size_t WorkspaceBytesOf(const KernelContext& ctx) {
  return ctx.workspace.defined() ? ctx.workspace.NumBytes() : 0;
}

}  // namespace tessera::ops::cuda
