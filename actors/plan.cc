#include "actors/plan.h"

#include <map>
#include <set>

#include "actors/actor_id.h"
#include "comm/collective/boxing.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/text.h"

namespace tessera::actors {
namespace {

template <typename Repeated>
std::vector<int64_t> ToVector(const Repeated& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

std::string TaskName(const proto::Task& task) {
  return StrCat("task '", task.name(), "' (", ActorIdToString(task.actor_id()), ")");
}

size_t Count(const google::protobuf::RepeatedField<int64_t>& ids, int64_t id) {
  size_t n = 0;
  for (int64_t x : ids) n += x == id;
  return n;
}

}  // namespace

namespace {

absl::Status ValidateTask(const proto::Task& task, const std::map<int64_t, const proto::RegisterDesc*>& descs,
                          const ops::OpRegistry& registry) {
  const std::string name = TaskName(task);
  for (int64_t id : task.consumed_register_desc_ids()) {
    auto it = descs.find(id);
    if (it == descs.end()) return absl::InvalidArgumentError(StrCat(name, " consumes unknown register desc ", id));
    bool listed = false;
    for (uint64_t c : it->second->consumers()) listed |= c == task.actor_id();
    if (!listed) return absl::InvalidArgumentError(StrCat(name, " consumes desc ", id, " which does not list it"));
    if (Count(task.consumed_register_desc_ids(), id) != 1) {
      return absl::InvalidArgumentError(StrCat(name, " consumes desc ", id, " twice"));
    }
  }
  for (int64_t id : task.produced_register_desc_ids()) {
    auto it = descs.find(id);
    if (it == descs.end()) return absl::InvalidArgumentError(StrCat(name, " produces unknown register desc ", id));
    if (it->second->producer() != task.actor_id()) {
      return absl::InvalidArgumentError(StrCat(name, " produces desc ", id, " whose producer is another actor"));
    }
  }
  // Metas of the op's inputs / outputs, resolved through the refs.
  auto resolve = [&](const proto::TensorRef& ref, std::vector<TensorMeta>* metas,
                     bool output) -> absl::Status {
    if (ref.location_case() == proto::TensorRef::kStateIndex) {
      if (ref.state_index() < 0 || ref.state_index() >= task.state_size()) {
        return absl::InvalidArgumentError(StrCat(name, " refers to state tensor ", ref.state_index(), " of ",
                                                 task.state_size()));
      }
      ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(task.state(ref.state_index())));
      auto slice = TensorSliceFromProto(ref.slice(), meta.shape);
      if (!slice.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", slice.status().message()));
      meta.shape = slice->logical;
      metas->push_back(std::move(meta));
      return absl::OkStatus();
    }
    const int64_t id = ref.register_desc_id();
    const auto& own = output ? task.produced_register_desc_ids() : task.consumed_register_desc_ids();
    bool in_own = Count(own, id) > 0;
    // A Parameter's update writes its variable (a produced desc) and reads it.
    if (!in_own && task.kind() == proto::ACTOR_KIND_PARAMETER) in_own = Count(task.produced_register_desc_ids(), id) > 0;
    if (!in_own) {
      return absl::InvalidArgumentError(StrCat(name, " ", output ? "output" : "input", " refers to desc ", id,
                                               " which it does not ", output ? "produce" : "consume"));
    }
    const proto::RegisterDesc& desc = *descs.at(id);
    if (ref.tensor_index() < 0 || ref.tensor_index() >= desc.tensors_size()) {
      return absl::InvalidArgumentError(StrCat(name, " refers to tensor ", ref.tensor_index(), " of desc ", id,
                                               " which holds ", desc.tensors_size()));
    }
    ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc.tensors(ref.tensor_index())));
    auto slice = TensorSliceFromProto(ref.slice(), meta.shape);
    if (!slice.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", slice.status().message()));
    // Ops are checked on logical shapes: a shard of a split tensor carries
    // its logical shape in its slice.
    meta.shape = slice->logical;
    metas->push_back(std::move(meta));
    return absl::OkStatus();
  };
  std::vector<TensorMeta> inputs, outputs;
  for (const auto& ref : task.inputs()) RETURN_IF_ERROR(resolve(ref, &inputs, false));
  for (const auto& ref : task.outputs()) RETURN_IF_ERROR(resolve(ref, &outputs, true));

  const auto single_in_out = [&]() -> absl::Status {
    if (task.consumed_register_desc_ids_size() != 1 || task.produced_register_desc_ids_size() != 1) {
      return absl::InvalidArgumentError(StrCat(name, " must consume and produce exactly one register desc"));
    }
    if (task.repeat_num() < 1) return absl::InvalidArgumentError(StrCat(name, " needs repeat_num >= 1"));
    return absl::OkStatus();
  };
  switch (task.kind()) {
    case proto::ACTOR_KIND_SOURCE:
      if (task.consumed_register_desc_ids_size() != 0) {
        return absl::InvalidArgumentError(StrCat(name, ": a source consumes nothing"));
      }
      break;
    case proto::ACTOR_KIND_SINK:
      if (task.produced_register_desc_ids_size() != 0 || task.consumed_register_desc_ids_size() == 0) {
        return absl::InvalidArgumentError(StrCat(name, ": a sink consumes at least one desc and produces none"));
      }
      break;
    case proto::ACTOR_KIND_COMPUTE:
    case proto::ACTOR_KIND_PARAMETER: {
      if (task.kind() == proto::ACTOR_KIND_COMPUTE && task.consumed_register_desc_ids_size() == 0) {
        return absl::InvalidArgumentError(StrCat(name, ": a compute actor consumes at least one desc"));
      }
      if (task.kind() == proto::ACTOR_KIND_PARAMETER) {
        if (task.produced_register_desc_ids_size() != 1 || descs.at(task.produced_register_desc_ids(0))->register_num() != 1) {
          return absl::InvalidArgumentError(StrCat(name, ": a parameter produces exactly one desc, with register_num 1"));
        }
      }
      if (task.op().empty()) {
        if (task.inputs_size() != 0 || task.outputs_size() != 0) {
          return absl::InvalidArgumentError(StrCat(name, " has tensor refs but no op"));
        }
        break;
      }
      auto schema = registry.Get(task.op());
      if (!schema.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", schema.status().message()));
      auto attrs = AttrMapFromProto(task.attrs());
      if (!attrs.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", attrs.status().message()));
      auto canonical = (*schema)->CanonicalizeAttrs(*attrs);
      if (!canonical.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", canonical.status().message()));
      auto inferred = (*schema)->InferMeta(inputs, *canonical);
      if (!inferred.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", inferred.status().message()));
      if (*inferred != outputs) {
        std::vector<std::string> want, have;
        for (const auto& m : *inferred) want.push_back(m.ToString());
        for (const auto& m : outputs) have.push_back(m.ToString());
        return absl::InvalidArgumentError(StrCat(name, ": op '", task.op(), "' gives outputs [", Join(want, ", "),
                                                 "] but the plan's registers hold [", Join(have, ", "), "]"));
      }
      break;
    }
    case proto::ACTOR_KIND_REPEAT: {
      RETURN_IF_ERROR(single_in_out());
      const auto& in = *descs.at(task.consumed_register_desc_ids(0));
      const auto& out = *descs.at(task.produced_register_desc_ids(0));
      if (task.input_tensor() < 0 || task.input_tensor() >= in.tensors_size() || out.tensors_size() != 1) {
        return absl::InvalidArgumentError(StrCat(name, ": repeat must produce one tensor from tensor ", task.input_tensor(),
                                                 " of a register holding ", in.tensors_size()));
      }
      ASSIGN_OR_RETURN(TensorMeta a, TensorMetaFromProto(in.tensors(task.input_tensor())));
      ASSIGN_OR_RETURN(TensorMeta b, TensorMetaFromProto(out.tensors(0)));
      bool ok = a == b;  // the same tensor m times
      if (!ok && a.dtype == b.dtype && a.shape.rank() >= 1 && a.shape.rank() == b.shape.rank()) {
        Shape scaled = b.shape;
        scaled[0] *= task.repeat_num();
        ok = scaled == a.shape;  // m row pieces
      }
      if (!ok) {
        return absl::InvalidArgumentError(StrCat(name, ": ", b.ToString(), " is neither ", a.ToString(), " nor 1/",
                                                 task.repeat_num(), " of its rows"));
      }
      break;
    }
    case proto::ACTOR_KIND_ACC: {
      RETURN_IF_ERROR(single_in_out());
      const auto& in = *descs.at(task.consumed_register_desc_ids(0));
      const auto& out = *descs.at(task.produced_register_desc_ids(0));
      const int t = task.input_tensor();
      const bool same = t >= 0 && t < in.tensors_size() && out.tensors_size() == 1 &&
                        in.tensors(t).dtype() == out.tensors(0).dtype() &&
                        ToVector(in.tensors(t).shape()) == ToVector(out.tensors(0).shape());
      if (!same) return absl::InvalidArgumentError(StrCat(name, ": acc must produce one tensor like tensor ", t, " of what it consumes"));
      break;
    }
    case proto::ACTOR_KIND_COLLECTIVE: {
      if (task.consumed_register_desc_ids_size() != 1 || task.produced_register_desc_ids_size() != 1) {
        return absl::InvalidArgumentError(StrCat(name, ": a collective consumes and produces exactly one register desc"));
      }
      const proto::BoxingDesc& boxing = task.boxing();
      comm::BoxingSpec spec;
      auto logical = TensorMetaFromProto(boxing.logical());
      auto from = ParseNdSbp(boxing.from());
      auto to = ParseNdSbp(boxing.to());
      if (!logical.ok() || !from.ok() || !to.ok()) {
        return absl::InvalidArgumentError(StrCat(name, ": bad boxing (", boxing.from(), " -> ", boxing.to(), ")"));
      }
      spec.logical = *logical;
      spec.from = *from;
      spec.to = *to;
      spec.hierarchy.assign(boxing.hierarchy().begin(), boxing.hierarchy().end());
      int64_t size = 1;
      for (int64_t n : spec.hierarchy) size *= n;
      if (spec.hierarchy.empty() || size != boxing.ranks_size() || boxing.rank_index() < 0 ||
          boxing.rank_index() >= boxing.ranks_size() || boxing.group().empty()) {
        return absl::InvalidArgumentError(StrCat(name, ": boxing over ", boxing.ranks_size(), " ranks, hierarchy [",
                                                 Join(spec.hierarchy, ", "), "], index ", boxing.rank_index(),
                                                 boxing.group().empty() ? ", no group" : ""));
      }
      std::vector<int64_t> coords(spec.hierarchy.size());
      for (int64_t i = boxing.rank_index(), a = static_cast<int64_t>(coords.size()) - 1; a >= 0; --a) {
        coords[static_cast<size_t>(a)] = i % spec.hierarchy[static_cast<size_t>(a)];
        i /= spec.hierarchy[static_cast<size_t>(a)];
      }
      auto routine = comm::BoxingRoutine::Create(spec, coords);
      if (!routine.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", routine.status().message()));
      const auto& in = *descs.at(task.consumed_register_desc_ids(0));
      const auto& out = *descs.at(task.produced_register_desc_ids(0));
      const auto check = [&](const proto::RegisterDesc& desc, int tensor, const Shape& shape) -> absl::Status {
        auto meta = tensor >= 0 && tensor < desc.tensors_size() ? TensorMetaFromProto(desc.tensors(tensor))
                                                               : absl::StatusOr<TensorMeta>(absl::InvalidArgumentError("no such tensor"));
        if (!meta.ok() || meta->shape != shape || meta->dtype != spec.logical.dtype) {
          return absl::InvalidArgumentError(StrCat(name, ": tensor ", tensor, " of register desc ", desc.id(), " must be ",
                                                   TensorMeta{spec.logical.dtype, shape}.ToString(), " for ", spec.ToString()));
        }
        return absl::OkStatus();
      };
      RETURN_IF_ERROR(check(in, boxing.input_tensor(), routine->input_shape()));
      if (out.tensors_size() != 1) return absl::InvalidArgumentError(StrCat(name, ": a collective produces registers of one tensor"));
      RETURN_IF_ERROR(check(out, 0, routine->output_shape()));
      break;
    }
    case proto::ACTOR_KIND_SEND:
    case proto::ACTOR_KIND_RECV: {
      const bool send = task.kind() == proto::ACTOR_KIND_SEND;
      if (send ? (task.consumed_register_desc_ids_size() != 1 || task.produced_register_desc_ids_size() != 0)
               : (task.consumed_register_desc_ids_size() != 0 || task.produced_register_desc_ids_size() != 1)) {
        return absl::InvalidArgumentError(StrCat(name, send ? ": a send consumes one register desc and produces none"
                                                            : ": a recv produces one register desc and consumes none"));
      }
      const auto& desc = *descs.at(send ? task.consumed_register_desc_ids(0) : task.produced_register_desc_ids(0));
      if (send ? task.transfer().input_tensor() < 0 || task.transfer().input_tensor() >= desc.tensors_size() : desc.tensors_size() != 1) {
        return absl::InvalidArgumentError(StrCat(name, send ? ": sends a tensor its register does not hold" : ": a recv produces registers of one tensor"));
      }
      if (task.transfer().group().empty()) return absl::InvalidArgumentError(StrCat(name, ": transfer without a group"));
      break;
    }
    default:
      return absl::InvalidArgumentError(StrCat(name, " has no kind"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const proto::Plan& plan, const ops::OpRegistry& registry) {
  if (plan.iterations() < 0) return absl::InvalidArgumentError("plan has negative iterations");
  if (plan.start_iteration() < 0) return absl::InvalidArgumentError("plan has a negative start_iteration");
  std::map<uint64_t, const proto::Task*> tasks;
  for (const auto& task : plan.tasks()) {
    RETURN_IF_ERROR(ValidateActorId(task.actor_id()));
    if (!tasks.emplace(task.actor_id(), &task).second) {
      return absl::InvalidArgumentError(StrCat("two tasks have actor id ", ActorIdToString(task.actor_id())));
    }
  }
  std::map<int64_t, const proto::RegisterDesc*> descs;
  for (const auto& desc : plan.register_descs()) {
    const std::string name = StrCat("register desc ", desc.id());
    if (!descs.emplace(desc.id(), &desc).second) return absl::InvalidArgumentError(StrCat("two ", name, "s"));
    if (desc.register_num() < 1) return absl::InvalidArgumentError(StrCat(name, " has register_num < 1"));
    auto producer = tasks.find(desc.producer());
    if (producer == tasks.end() || Count(producer->second->produced_register_desc_ids(), desc.id()) != 1) {
      return absl::InvalidArgumentError(StrCat(name, ": producer ", ActorIdToString(desc.producer()),
                                               " is not a task producing it once"));
    }
    std::set<uint64_t> seen;
    for (uint64_t consumer : desc.consumers()) {
      auto it = tasks.find(consumer);
      if (it == tasks.end() || Count(it->second->consumed_register_desc_ids(), desc.id()) != 1) {
        return absl::InvalidArgumentError(
            StrCat(name, ": consumer ", ActorIdToString(consumer), " is not a task consuming it"));
      }
      if (!seen.insert(consumer).second) return absl::InvalidArgumentError(StrCat(name, " lists a consumer twice"));
    }
    int64_t bytes = 0;
    for (const auto& tensor : desc.tensors()) {
      auto meta = TensorMetaFromProto(tensor);
      if (!meta.ok()) return absl::InvalidArgumentError(StrCat(name, ": ", meta.status().message()));
      bytes += meta->shape.NumElements() * static_cast<int64_t>(DTypeSize(meta->dtype));
    }
    const bool view = producer->second->kind() == proto::ACTOR_KIND_REPEAT;
    if (desc.bytes_per_register() != (view ? 0 : bytes)) {
      return absl::InvalidArgumentError(StrCat(name, " says ", desc.bytes_per_register(), " bytes per register, its tensors hold ",
                                               view ? 0 : bytes));
    }
  }
  for (const auto& task : plan.tasks()) RETURN_IF_ERROR(ValidateTask(task, descs, registry));
  // Piece rates: what a consumer expects per iteration from each consumed desc.
  for (const auto& task : plan.tasks()) {
    const int64_t pieces = PiecesPerIteration(task);
    if (task.pieces_per_iteration() < 0) {
      return absl::InvalidArgumentError(StrCat(TaskName(task), " has pieces_per_iteration ", task.pieces_per_iteration()));
    }
    if (task.kind() == proto::ACTOR_KIND_PARAMETER && !task.op().empty() && pieces != 1) {
      return absl::InvalidArgumentError(StrCat(TaskName(task), ": a parameter with an update runs once per iteration, not ",
                                               pieces, " times"));
    }
    int64_t expected = pieces;
    if (task.kind() == proto::ACTOR_KIND_REPEAT) {
      if (pieces % task.repeat_num() != 0) {
        return absl::InvalidArgumentError(StrCat(TaskName(task), ": ", pieces, " pieces per iteration is not a multiple of repeat_num ",
                                                 task.repeat_num()));
      }
      expected = pieces / task.repeat_num();
    } else if (task.kind() == proto::ACTOR_KIND_ACC) {
      expected = pieces * task.repeat_num();
    }
    for (int64_t id : task.consumed_register_desc_ids()) {
      const proto::Task& producer = *tasks.at(descs.at(id)->producer());
      if (PiecesPerIteration(producer) != expected) {
        return absl::InvalidArgumentError(StrCat(TaskName(task), " expects ", expected, " piece(s) per iteration from desc ", id,
                                                 " but ", TaskName(producer), " produces ", PiecesPerIteration(producer)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::actors
