// FoldReshapes (lowering.h): reshapes as views of their input register.
//
// A reshape's kernel copies its local input, element for element, into a
// register of another shape: the bytes are the same. When every reader of
// that register is a compute (whose OpRunner can read a tensor through a
// view), the reshape task and its register leave the plan and the readers
// read the reshape's input register with TensorRef.view_shape set to the
// reshaped local shape. Chains fold into one view of the first input.
//
// The input register now lives until the reshape's readers are done, so it
// keeps as many registers as the reshape's had, if more (a value read in
// the backward keeps one per micro-batch in flight, lower.h): the quota
// rule the lowering would have given it had the readers read it directly.
// A Parameter's variable keeps its one register: a reshape of it whose
// readers want more stays a copy. Register desc ids are renumbered to stay
// their index in the plan.

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler::lowering {
namespace {

bool Contains(const google::protobuf::RepeatedField<int64_t>& ids, int64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

absl::Status Inconsistent(const proto::Task& task, int64_t desc) {
  return absl::InternalError(
      StrCat("folding reshapes: task '", task.name(), "' and register desc ", desc, " disagree on reading it"));
}

bool ReadsDesc(const proto::TensorRef& ref, int64_t desc) {
  return ref.location_case() == proto::TensorRef::kRegisterDescId && ref.register_desc_id() == desc;
}

}  // namespace

absl::Status FoldReshapes(proto::Plan& plan) {
  std::unordered_map<uint64_t, int> task_at;
  for (int i = 0; i < plan.tasks_size(); ++i) task_at[plan.tasks(i).actor_id()] = i;
  std::unordered_map<int64_t, int> desc_at;
  for (int i = 0; i < plan.register_descs_size(); ++i) desc_at[plan.register_descs(i).id()] = i;
  const auto task = [&](uint64_t actor) -> proto::Task* {
    auto it = task_at.find(actor);
    return it == task_at.end() ? nullptr : plan.mutable_tasks(it->second);
  };
  const auto desc = [&](int64_t id) -> proto::RegisterDesc* {
    auto it = desc_at.find(id);
    return it == desc_at.end() ? nullptr : plan.mutable_register_descs(it->second);
  };

  std::vector<bool> task_gone(static_cast<size_t>(plan.tasks_size()), false);
  std::vector<bool> desc_gone(static_cast<size_t>(plan.register_descs_size()), false);
  for (int r = 0; r < plan.tasks_size(); ++r) {
    const proto::Task& reshape = plan.tasks(r);
    if (reshape.kind() != proto::ACTOR_KIND_COMPUTE || reshape.op() != "reshape" || reshape.inputs_size() != 1 ||
        reshape.outputs_size() != 1 || reshape.consumed_register_desc_ids_size() != 1 ||
        reshape.produced_register_desc_ids_size() != 1 ||
        reshape.inputs(0).location_case() != proto::TensorRef::kRegisterDescId) {
      continue;
    }
    const proto::TensorRef in = reshape.inputs(0);
    proto::RegisterDesc* from = desc(in.register_desc_id());
    proto::RegisterDesc* out = desc(reshape.produced_register_desc_ids(0));
    const proto::Task* source = from == nullptr ? nullptr : task(from->producer());
    if (from == nullptr || out == nullptr || source == nullptr || out->tensors_size() != 1 || out->window() != 0 ||
        from->window() != 0 || out->consumers_size() == 0 || !ReadsDesc(reshape.outputs(0), out->id())) {
      continue;
    }
    if (source->kind() == proto::ACTOR_KIND_PARAMETER && out->register_num() > from->register_num()) continue;
    bool foldable = true;
    for (uint64_t c : out->consumers()) {
      const proto::Task* reader = task(c);
      foldable = foldable && reader != nullptr && reader->kind() == proto::ACTOR_KIND_COMPUTE && !reader->op().empty();
      for (int k = 0; foldable && k < reader->outputs_size(); ++k) foldable = !ReadsDesc(reader->outputs(k), out->id());
    }
    if (!foldable) continue;

    const auto& shape = out->tensors(0).shape();
    for (uint64_t c : out->consumers()) {
      proto::Task* reader = task(c);
      for (proto::TensorRef& ref : *reader->mutable_inputs()) {
        if (!ReadsDesc(ref, out->id())) continue;
        ref.set_register_desc_id(from->id());
        ref.set_tensor_index(in.tensor_index());
        // A reader of a later reshape of the chain, folded first, keeps its own shape.
        if (ref.view_shape_size() == 0) ref.mutable_view_shape()->Assign(shape.begin(), shape.end());
      }
      auto* ids = reader->mutable_consumed_register_desc_ids();
      const auto read = std::find(ids->begin(), ids->end(), out->id());
      if (read == ids->end()) return Inconsistent(*reader, out->id());
      if (Contains(*ids, from->id())) {
        ids->erase(read);
      } else {
        *read = from->id();
        from->add_consumers(c);
      }
    }
    auto* readers = from->mutable_consumers();
    const auto reading = std::find(readers->begin(), readers->end(), reshape.actor_id());
    if (reading == readers->end()) return Inconsistent(reshape, from->id());
    readers->erase(reading);
    from->set_register_num(std::max(from->register_num(), out->register_num()));
    task_gone[static_cast<size_t>(r)] = true;
    desc_gone[static_cast<size_t>(desc_at.at(out->id()))] = true;
  }

  // Compact, renumbering the descs left by their new index.
  std::unordered_map<int64_t, int64_t> renumber;
  proto::Plan folded;
  for (int i = 0; i < plan.register_descs_size(); ++i) {
    if (desc_gone[static_cast<size_t>(i)]) continue;
    proto::RegisterDesc* d = folded.add_register_descs();
    *d = std::move(*plan.mutable_register_descs(i));
    renumber[d->id()] = folded.register_descs_size() - 1;
    d->set_id(folded.register_descs_size() - 1);
  }
  const auto new_id = [&](int64_t id) -> absl::StatusOr<int64_t> {
    auto it = renumber.find(id);
    if (it == renumber.end()) return absl::InternalError(StrCat("folding reshapes: desc ", id, " was taken out"));
    return it->second;
  };
  for (int i = 0; i < plan.tasks_size(); ++i) {
    if (task_gone[static_cast<size_t>(i)]) continue;
    proto::Task* t = folded.add_tasks();
    *t = std::move(*plan.mutable_tasks(i));
    for (auto* ids : {t->mutable_consumed_register_desc_ids(), t->mutable_produced_register_desc_ids()}) {
      for (int64_t& id : *ids) {
        ASSIGN_OR_RETURN(id, new_id(id));
      }
    }
    for (auto* refs : {t->mutable_inputs(), t->mutable_outputs()}) {
      for (proto::TensorRef& ref : *refs) {
        if (ref.location_case() != proto::TensorRef::kRegisterDescId) continue;
        ASSIGN_OR_RETURN(const int64_t id, new_id(ref.register_desc_id()));
        ref.set_register_desc_id(id);
      }
    }
  }
  plan.clear_register_descs();
  plan.clear_tasks();
  plan.mutable_register_descs()->Swap(folded.mutable_register_descs());
  plan.mutable_tasks()->Swap(folded.mutable_tasks());
  return absl::OkStatus();
}

}  // namespace tessera::scheduler::lowering
