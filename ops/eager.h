#pragma once
// Eager execution of single ops on one device: canonicalise attributes, infer
// shapes, allocate outputs, run the kernel. Used by tests, benchmarks, tools
// and for evaluating gradient rules op by op (EagerGradEmitter). The actor
// runtime does not use this path: it runs kernels on preallocated registers.

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "ops/grad.h"
#include "ops/registry.h"

namespace tessera::ops {

struct EagerOptions {
  const OpRegistry* registry = nullptr;  // null = BuiltinOps()
  ThreadPool* pool = nullptr;
  int64_t step = 0;
  Device device;
};

absl::StatusOr<std::vector<Tensor>> RunOp(std::string_view op, const std::vector<Tensor>& inputs,
                                          const AttrMap& attrs = {}, const EagerOptions& options = {});

// Runs the schema's kernel for ctx.device on ctx's preallocated outputs;
// `ctx.attrs` must be canonical. Errors are prefixed with the op and device.
absl::Status RunKernel(const OpSchema& schema, KernelContext& ctx);

// A GradEmitter that evaluates every emitted op immediately.
class EagerGradEmitter final : public GradEmitter {
 public:
  explicit EagerGradEmitter(EagerOptions options = {}) : options_(options) {}

  ValueId Add(Tensor tensor);
  const Tensor& Get(ValueId value) const { return values_[static_cast<size_t>(value)]; }

  absl::StatusOr<std::vector<ValueId>> Emit(std::string_view op, const std::vector<ValueId>& inputs,
                                            const AttrMap& attrs) override;
  TensorMeta Meta(ValueId value) const override { return Get(value).meta(); }

 private:
  EagerOptions options_;
  std::vector<Tensor> values_;
};

// Runs `op`'s gradient rule eagerly: returns one tensor per input, undefined
// where the rule gives no gradient. `output_grads` entries may be undefined.
absl::StatusOr<std::vector<Tensor>> EagerGradients(std::string_view op, const std::vector<Tensor>& inputs,
                                                   const std::vector<Tensor>& outputs,
                                                   const std::vector<Tensor>& output_grads,
                                                   const AttrMap& attrs, const EagerOptions& options = {});

}  // namespace tessera::ops
