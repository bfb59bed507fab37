#include "actors/kinds/op_runner.h"

#include <algorithm>

#include "actors/plan.h"
#include "core/checked.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::actors::internal {

absl::Status OpRunner::Init(const proto::Task& task, const ops::OpRegistry& registry,
                            const std::vector<int64_t>& consumed_ids, const std::vector<int64_t>& produced_ids) {
  if (task.op().empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(schema_, registry.Get(task.op()));
  ASSIGN_OR_RETURN(ops::AttrMap attrs, AttrMapFromProto(task.attrs()));
  ASSIGN_OR_RETURN(ops::AttrMap canonical, schema_->CanonicalizeAttrs(attrs));
  attrs_ = std::make_shared<const ops::AttrMap>(std::move(canonical));
  const auto resolve = [&](const proto::TensorRef& ref) -> absl::StatusOr<Ref> {
    if (ref.location_case() == proto::TensorRef::kStateIndex) return Ref{Where::kState, ref.state_index(), 0};
    for (size_t i = 0; i < consumed_ids.size(); ++i) {
      if (consumed_ids[i] == ref.register_desc_id()) return Ref{Where::kConsumed, static_cast<int>(i), ref.tensor_index()};
    }
    for (size_t i = 0; i < produced_ids.size(); ++i) {
      if (produced_ids[i] == ref.register_desc_id()) return Ref{Where::kProduced, static_cast<int>(i), ref.tensor_index()};
    }
    return absl::InvalidArgumentError(StrCat("tensor ref to desc ", ref.register_desc_id(), " of no register of the task"));
  };
  bool any_slice = false;
  for (const auto& ref : task.inputs()) any_slice |= ref.slice().logical_shape_size() > 0;
  for (const auto& ref : task.outputs()) any_slice |= ref.slice().logical_shape_size() > 0;
  for (const auto& ref : task.inputs()) {
    ASSIGN_OR_RETURN(Ref r, resolve(ref));
    if (ref.view_shape_size() > 0) {
      // (ValidatePlan checked it: the tensor's element count, in rank.)
      if (ref.view_shape_size() > kMaxTensorRank) return absl::InvalidArgumentError("a view of too many dimensions");
      r.view = Shape(std::vector<int64_t>(ref.view_shape().begin(), ref.view_shape().end()));
    }
    inputs_.push_back(std::move(r));
  }
  for (const auto& ref : task.outputs()) {
    ASSIGN_OR_RETURN(Ref r, resolve(ref));
    outputs_.push_back(r);
  }
  ctx_.inputs.resize(inputs_.size());
  ctx_.outputs.resize(outputs_.size());
  ctx_.attrs = attrs_.get();
  any_slice_ = any_slice;
  return absl::OkStatus();
}

absl::Status OpRunner::Prepare(const proto::Task& task, int64_t act, int64_t start_iteration, ThreadPool* pool,
                               const Device& device) {
  if (any_slice_ && ctx_.input_slices.empty()) {
    // Slices are fixed by the plan (but for the micro-batch offset below);
    // built on the first act.
    for (int i = 0; i < task.inputs_size(); ++i) {
      ASSIGN_OR_RETURN(TensorSlice s, TensorSliceFromProto(task.inputs(i).slice(), ctx_.inputs[static_cast<size_t>(i)].shape()));
      ctx_.input_slices.push_back(std::move(s));
    }
    for (int i = 0; i < task.outputs_size(); ++i) {
      ASSIGN_OR_RETURN(TensorSlice s, TensorSliceFromProto(task.outputs(i).slice(), ctx_.outputs[static_cast<size_t>(i)].shape()));
      ctx_.output_slices.push_back(std::move(s));
    }
    base_input_offsets_.clear();
    base_output_offsets_.clear();
    // ValidatePlan checked that a stride's axis is one of its slice's.
    for (int i = 0; i < task.inputs_size(); ++i) {
      const auto& s = ctx_.input_slices[static_cast<size_t>(i)];
      base_input_offsets_.push_back(s.offset.empty() ? 0 : s.offset[static_cast<size_t>(task.inputs(i).micro_batch_axis())]);
    }
    for (int i = 0; i < task.outputs_size(); ++i) {
      const auto& s = ctx_.output_slices[static_cast<size_t>(i)];
      base_output_offsets_.push_back(s.offset.empty() ? 0 : s.offset[static_cast<size_t>(task.outputs(i).micro_batch_axis())]);
    }
  }
  const int64_t pieces = PiecesPerIteration(task);
  if (any_slice_ && pieces > 1) {
    const int64_t micro = act % pieces;
    for (int i = 0; i < task.inputs_size(); ++i) {
      const int64_t stride = task.inputs(i).micro_batch_stride();
      auto& s = ctx_.input_slices[static_cast<size_t>(i)];
      if (stride != 0 && !s.offset.empty()) {
        s.offset[static_cast<size_t>(task.inputs(i).micro_batch_axis())] = base_input_offsets_[static_cast<size_t>(i)] + micro * stride;
      }
    }
    for (int i = 0; i < task.outputs_size(); ++i) {
      const int64_t stride = task.outputs(i).micro_batch_stride();
      auto& s = ctx_.output_slices[static_cast<size_t>(i)];
      if (stride != 0 && !s.offset.empty()) {
        s.offset[static_cast<size_t>(task.outputs(i).micro_batch_axis())] = base_output_offsets_[static_cast<size_t>(i)] + micro * stride;
      }
    }
  }
  ctx_.step = start_iteration + act / std::max<int64_t>(1, task.acts_per_step());
  ctx_.pool = pool;
  ctx_.device = device;
  return absl::OkStatus();
}

}  // namespace tessera::actors::internal
