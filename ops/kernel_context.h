#pragma once
// What a kernel sees when it runs: local input tensors, preallocated local
// output tensors, canonical attributes, where each local tensor sits in its
// logical tensor (TensorSlice), the iteration, and its intra-op threads.
//
// Kernels never allocate outputs and never see SBP: the caller (eager
// executor, SBP check, actor runtime) sizes outputs from the plan. A kernel
// whose result depends on global position (random ops, arange, a vocabulary
// shard's id range) reads the slices. Outputs may alias inputs for
// element-wise ops (in-place optimizer updates), so such kernels read each
// element before writing it.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/device.h"
#include "core/sbp.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "ops/attr.h"

namespace tessera::ops {

class OpSchema;

struct KernelContext {
  const OpSchema* schema = nullptr;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  const AttrMap* attrs = nullptr;
  // Empty means "whole tensor" for every input / output.
  std::vector<TensorSlice> input_slices;
  std::vector<TensorSlice> output_slices;
  int64_t step = 0;               // iteration index (a key of random streams)
  ThreadPool* pool = nullptr;     // intra-op threads; null runs inline
  Device device;
  // The stream the kernel's device work goes on (core/stream.h): a CUDA
  // kernel launches onto its native() and returns without waiting; null:
  // the calling thread's default stream, waited for before returning. CPU
  // kernels run where they are called (a CPU stream calls them on its own
  // thread) and ignore it.
  Stream* stream = nullptr;
  // Bytes the op's schema asked for (OpSchema::Workspace), on the kernel's
  // device, untouched by others during the call (the actor runtime's come
  // from the memory plan's arena); undefined: the kernel allocates what it
  // needs itself (eager calls, plans without it).
  Tensor workspace;

  const Tensor& input(int i) const { return inputs[static_cast<size_t>(i)]; }
  const Tensor& output(int i) const { return outputs[static_cast<size_t>(i)]; }
  int num_inputs() const { return static_cast<int>(inputs.size()); }
  int num_outputs() const { return static_cast<int>(outputs.size()); }
  const AttrMap& attr() const { return *attrs; }
  TensorSlice input_slice(int i) const;
  TensorSlice output_slice(int i) const;
  int num_threads() const { return pool == nullptr ? 1 : pool->num_threads(); }
};

}  // namespace tessera::ops
