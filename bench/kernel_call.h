#pragma once
// One op's kernel on tensors allocated once, before any timing, as the
// actor runtime runs it (registers and workspaces come from the arena, so
// no act allocates): what the kernel benches time.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/registry.h"

namespace tessera::bench {

struct KernelCall {
  const ops::OpSchema* schema = nullptr;
  ops::AttrMap attrs;
  ops::KernelContext ctx;
};

// `op` on `inputs` (on `device`) with its outputs and the workspace its
// schema asks for allocated there.
inline std::unique_ptr<KernelCall> MakeKernelCall(const std::string& op, std::vector<Tensor> inputs,
                                                  const ops::AttrMap& attrs, ThreadPool* pool, Device device) {
  auto call = std::make_unique<KernelCall>();
  call->schema = ops::BuiltinOps().Find(op);
  TESSERA_CHECK(call->schema != nullptr, "no op ", op);
  auto canonical = call->schema->CanonicalizeAttrs(attrs);
  TESSERA_CHECK(canonical.ok(), canonical.status().ToString());
  call->attrs = *std::move(canonical);
  std::vector<TensorMeta> in_metas;
  for (const Tensor& t : inputs) in_metas.push_back(t.meta());
  auto out_metas = call->schema->InferMeta(in_metas, call->attrs);
  TESSERA_CHECK(out_metas.ok(), out_metas.status().ToString());
  for (const TensorMeta& m : *out_metas) {
    auto t = Tensor::Empty(m.shape, m.dtype, device);
    TESSERA_CHECK(t.ok(), t.status().ToString());
    call->ctx.outputs.push_back(*std::move(t));
  }
  if (const int64_t bytes = call->schema->WorkspaceBytes(in_metas, *out_metas, call->attrs, device.type); bytes > 0) {
    auto workspace = Tensor::Empty(Shape{(bytes + 7) / 8}, DType::kI64, device);
    TESSERA_CHECK(workspace.ok(), workspace.status().ToString());
    call->ctx.workspace = *std::move(workspace);
  }
  call->ctx.inputs = std::move(inputs);
  call->ctx.attrs = &call->attrs;
  call->ctx.pool = pool;
  call->ctx.device = device;
  return call;
}

inline void Run(KernelCall& call) {
  const absl::Status status = ops::RunKernel(*call.schema, call.ctx);
  TESSERA_CHECK(status.ok(), call.schema->name(), ": ", status.ToString());
}

}  // namespace tessera::bench
