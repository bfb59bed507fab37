#include "actors/init_rules.h"

#include <string>

#include "comm/proto/plan_codec.h"
#include "core/status.h"
#include "ops/eager.h"

namespace tessera::actors {
namespace {

struct Rule {
  const ops::OpSchema* schema = nullptr;
  ops::AttrMap attrs;                 // canonical
  std::vector<TensorMeta> logical;    // the op's outputs
};

absl::StatusOr<Rule> ReadRule(const proto::InitRule& rule, const ops::OpRegistry& registry) {
  Rule out;
  ASSIGN_OR_RETURN(out.schema, registry.Get(rule.op()));
  ASSIGN_OR_RETURN(const ops::AttrMap attrs, comm::AttrMapFromProto(rule.attrs()));
  ASSIGN_OR_RETURN(out.attrs, out.schema->CanonicalizeAttrs(attrs));
  ASSIGN_OR_RETURN(out.logical, out.schema->InferMeta({}, out.attrs));
  return out;
}

}  // namespace

absl::Status ValidateInitRules(const proto::Task& task, const ops::OpRegistry& registry,
                               const std::vector<TensorMeta>& tensors) {
  size_t next = 0;
  for (int r = 0; r < task.init_size(); ++r) {
    const proto::InitRule& rule = task.init(r);
    const auto where = [&]() { return StrCat("init rule ", r, " (", rule.op(), ")"); };
    auto read = ReadRule(rule, registry);
    if (!read.ok()) return absl::InvalidArgumentError(StrCat(where(), ": ", read.status().message()));
    if (static_cast<size_t>(rule.slices_size()) != read->logical.size()) {
      return absl::InvalidArgumentError(StrCat(where(), " has ", rule.slices_size(), " slices for ",
                                               read->logical.size(), " outputs"));
    }
    for (int k = 0; k < rule.slices_size(); ++k, ++next) {
      if (next >= tensors.size()) {
        return absl::InvalidArgumentError(StrCat(where(), " writes more than the task's ", tensors.size(), " tensors"));
      }
      const TensorMeta& target = tensors[next];
      const TensorMeta& logical = read->logical[static_cast<size_t>(k)];
      if (target.dtype != logical.dtype) {
        return absl::InvalidArgumentError(StrCat(where(), " output ", k, " is ", logical.ToString(), ", but tensor ",
                                                 next, " is ", target.ToString()));
      }
      auto slice = comm::TensorSliceFromProto(rule.slices(k), target.shape);
      if (!slice.ok()) return absl::InvalidArgumentError(StrCat(where(), " output ", k, ": ", slice.status().message()));
      if (slice->logical != logical.shape) {
        return absl::InvalidArgumentError(StrCat(where(), " output ", k, " is ", logical.ToString(), ", but its slice is of ",
                                                 slice->logical.ToString()));
      }
    }
  }
  if (task.init_size() > 0 && next != tensors.size()) {
    return absl::InvalidArgumentError(StrCat("init rules write ", next, " of the task's ", tensors.size(), " tensors"));
  }
  return absl::OkStatus();
}

absl::Status RunInitRules(const proto::Task& task, const ops::OpRegistry& registry, const std::vector<Tensor>& tensors) {
  size_t next = 0;
  for (const proto::InitRule& rule : task.init()) {
    ASSIGN_OR_RETURN(Rule read, ReadRule(rule, registry));
    ops::KernelContext ctx;
    ctx.schema = read.schema;
    ctx.attrs = &read.attrs;
    for (int k = 0; k < rule.slices_size(); ++k, ++next) {
      if (next >= tensors.size()) return absl::InternalError("init rules write more tensors than the task has");
      ctx.outputs.push_back(tensors[next]);
      ASSIGN_OR_RETURN(TensorSlice slice, comm::TensorSliceFromProto(rule.slices(k), tensors[next].shape()));
      ctx.output_slices.push_back(std::move(slice));
    }
    if (!ctx.outputs.empty()) ctx.device = ctx.outputs[0].device();
    RETURN_IF_ERROR(ops::RunKernel(*read.schema, ctx));
  }
  return absl::OkStatus();
}

}  // namespace tessera::actors
