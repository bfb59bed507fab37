#include "ops/eager.h"

#include "core/status.h"
#include "core/text.h"

namespace tessera::ops {

absl::Status RunKernel(const OpSchema& schema, KernelContext& ctx) {
  const KernelFn* kernel = schema.FindKernel(ctx.device.type);
  if (kernel == nullptr) {
    return absl::UnimplementedError(
        StrCat("op '", schema.name(), "' has no kernel for device ", ctx.device.ToString()));
  }
  ctx.schema = &schema;
  absl::Status status = (*kernel)(ctx);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        StrCat("op '", schema.name(), "' on ", ctx.device.ToString(), ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> RunOp(std::string_view op, const std::vector<Tensor>& inputs,
                                          const AttrMap& attrs, const EagerOptions& options) {
  const OpRegistry& registry = options.registry ? *options.registry : BuiltinOps();
  ASSIGN_OR_RETURN(const OpSchema* schema, registry.Get(op));
  ASSIGN_OR_RETURN(AttrMap canonical, schema->CanonicalizeAttrs(attrs));
  std::vector<TensorMeta> metas;
  for (const Tensor& t : inputs) {
    if (!t.defined()) return absl::InvalidArgumentError(StrCat("op '", op, "': an input is undefined"));
    metas.push_back(t.meta());
  }
  ASSIGN_OR_RETURN(std::vector<TensorMeta> out_metas, schema->InferMeta(metas, canonical));
  KernelContext ctx;
  ctx.inputs = inputs;
  ctx.attrs = &canonical;
  ctx.step = options.step;
  ctx.pool = options.pool;
  ctx.device = options.device;
  for (const TensorMeta& m : out_metas) {
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(m.shape, m.dtype, options.device));
    ctx.outputs.push_back(std::move(t));
  }
  RETURN_IF_ERROR(RunKernel(*schema, ctx));
  return std::move(ctx.outputs);
}

ValueId EagerGradEmitter::Add(Tensor tensor) {
  values_.push_back(std::move(tensor));
  return static_cast<ValueId>(values_.size() - 1);
}

absl::StatusOr<std::vector<ValueId>> EagerGradEmitter::Emit(std::string_view op, const std::vector<ValueId>& inputs,
                                                            const AttrMap& attrs) {
  std::vector<Tensor> tensors;
  for (ValueId v : inputs) tensors.push_back(Get(v));
  ASSIGN_OR_RETURN(std::vector<Tensor> outputs, RunOp(op, tensors, attrs, options_));
  std::vector<ValueId> ids;
  for (Tensor& t : outputs) ids.push_back(Add(std::move(t)));
  return ids;
}

absl::StatusOr<std::vector<Tensor>> EagerGradients(std::string_view op, const std::vector<Tensor>& inputs,
                                                   const std::vector<Tensor>& outputs,
                                                   const std::vector<Tensor>& output_grads,
                                                   const AttrMap& attrs, const EagerOptions& options) {
  const OpRegistry& registry = options.registry ? *options.registry : BuiltinOps();
  ASSIGN_OR_RETURN(const OpSchema* schema, registry.Get(op));
  if (!schema->differentiable()) {
    return absl::InvalidArgumentError(StrCat("op '", op, "' has no gradient rule"));
  }
  ASSIGN_OR_RETURN(AttrMap canonical, schema->CanonicalizeAttrs(attrs));
  EagerGradEmitter emitter(options);
  std::vector<ValueId> in_ids, out_ids, grad_ids;
  for (const Tensor& t : inputs) in_ids.push_back(emitter.Add(t));
  for (const Tensor& t : outputs) out_ids.push_back(emitter.Add(t));
  for (const Tensor& t : output_grads) grad_ids.push_back(t.defined() ? emitter.Add(t) : kNoValue);
  GradBuilder builder(emitter, schema->name(), in_ids, out_ids, grad_ids, canonical);
  schema->grad()(builder);
  RETURN_IF_ERROR(builder.status());
  std::vector<Tensor> grads;
  for (ValueId g : builder.input_grads()) grads.push_back(g == kNoValue ? Tensor() : emitter.Get(g));
  return grads;
}

}  // namespace tessera::ops
