#include "actors/plan.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_join.h"
#include "actors/actor_id.h"
#include "actors/init_rules.h"
#include "comm/collective/boxing.h"
#include "core/checked.h"
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

// Sorted ids, searched by bisection: validation stays O(n log n) in the
// plan's size whatever its lists hold.
template <typename Id>
class IdSet {
 public:
  template <typename Range>
  explicit IdSet(const Range& ids) : ids_(ids.begin(), ids.end()) {
    std::sort(ids_.begin(), ids_.end());
  }
  IdSet() = default;
  bool contains(Id id) const { return std::binary_search(ids_.begin(), ids_.end(), id); }
  bool has_duplicates() const { return std::adjacent_find(ids_.begin(), ids_.end()) != ids_.end(); }

 private:
  std::vector<Id> ids_;
};

// A task with its consumed and produced desc ids.
struct TaskIndex {
  const proto::Task* task = nullptr;
  IdSet<int64_t> consumed, produced;
};

// A desc with its consumers.
struct DescIndex {
  const proto::RegisterDesc* desc = nullptr;
  IdSet<uint64_t> consumers;
};

// Micro-batched refs move their slice by micro_batch_stride along
// micro_batch_axis per micro-batch: every micro-batch's part must lie inside
// the logical tensor.
absl::Status CheckMicroBatchStride(const proto::Task& task, const proto::TensorRef& ref, const TensorSlice& slice,
                                   int64_t pieces) {
  const int64_t stride = ref.micro_batch_stride();
  const int axis = ref.micro_batch_axis();
  if (axis != 0 && (stride == 0 || axis < 0 || axis >= slice.local.rank())) {
    return absl::InvalidArgumentError(StrCat(TaskName(task), ": micro_batch_axis ", axis, " with stride ", stride,
                                             " for a slice of rank ", slice.local.rank()));
  }
  if (stride == 0 || slice.offset.empty()) return absl::OkStatus();
  const auto a = static_cast<size_t>(axis);
  // offset + local <= logical is checked; the last micro-batch adds (pieces - 1) x stride.
  auto last = CheckedMul(pieces - 1, stride);
  if (stride < 0 || !last.ok() || *last > slice.logical[axis] - slice.local[axis] - slice.offset[a]) {
    return absl::InvalidArgumentError(StrCat(TaskName(task), ": micro_batch_stride ", stride, " moves ",
                                             slice.offset[a], " + ", slice.local[axis], " of axis ", axis, " for ", pieces,
                                             " micro-batches outside its logical ", slice.logical[axis]));
  }
  return absl::OkStatus();
}

// The numbers of a task that later arithmetic multiplies: pieces per
// iteration and acts per step non-negative, acts over the run within int64,
// fan-in and fan-out within the limits.
absl::Status ValidateTaskCounts(const proto::Plan& plan, const proto::Task& task) {
  const auto name = [&task] { return TaskName(task); };  // built only for an error
  if (task.pieces_per_iteration() < 0 || task.acts_per_step() < 0 || task.repeat_num() < 0) {
    return absl::InvalidArgumentError(StrCat(name(), " has pieces_per_iteration ", task.pieces_per_iteration(),
                                             ", acts_per_step ", task.acts_per_step(), ", repeat_num ",
                                             task.repeat_num(), " (none may be negative)"));
  }
  // Actors count acts over (start_iteration + iterations) x pieces (each
  // at most kMaxIterations, checked by the caller), and an acc's producer
  // makes repeat_num times as many. At least 1 iteration, so that the
  // per-iteration numbers are bounded even in a plan of none.
  const int64_t last = std::max<int64_t>(1, plan.start_iteration() + plan.iterations());
  auto acts = CheckedMul(last, PiecesPerIteration(task));
  if (acts.ok()) acts = CheckedMul(*acts, std::max<int64_t>(1, task.repeat_num()));
  if (!acts.ok()) return absl::InvalidArgumentError(StrCat(name(), ": acts over the run: ", acts.status().message()));
  for (const int size : {task.consumed_register_desc_ids_size(), task.produced_register_desc_ids_size(),
                         task.inputs_size(), task.outputs_size(), task.state_size()}) {
    if (size > comm::kMaxTaskArity) {
      return absl::InvalidArgumentError(
          StrCat(name(), " lists ", size, " descs or tensors (at most ", comm::kMaxTaskArity, " of each)"));
    }
  }
  for (const auto& state : task.state()) {
    auto meta = TensorMetaFromProto(state);
    if (!meta.ok()) return absl::InvalidArgumentError(StrCat(name(), " state: ", meta.status().message()));
  }
  return absl::OkStatus();
}

absl::Status ValidateTask(const TaskIndex& index, const std::map<int64_t, DescIndex>& descs,
                          const ops::OpRegistry& registry) {
  const proto::Task& task = *index.task;
  const auto name = [&task] { return TaskName(task); };  // built only for an error
  if (index.consumed.has_duplicates()) return absl::InvalidArgumentError(StrCat(name(), " consumes a desc twice"));
  if (index.produced.has_duplicates()) return absl::InvalidArgumentError(StrCat(name(), " produces a desc twice"));
  for (int64_t id : task.consumed_register_desc_ids()) {
    auto it = descs.find(id);
    if (it == descs.end()) return absl::InvalidArgumentError(StrCat(name(), " consumes unknown register desc ", id));
    if (!it->second.consumers.contains(task.actor_id())) {
      return absl::InvalidArgumentError(StrCat(name(), " consumes desc ", id, " which does not list it"));
    }
    if (index.produced.contains(id)) {
      return absl::InvalidArgumentError(StrCat(name(), " consumes desc ", id, " it produces"));
    }
  }
  for (int64_t id : task.produced_register_desc_ids()) {
    auto it = descs.find(id);
    if (it == descs.end()) return absl::InvalidArgumentError(StrCat(name(), " produces unknown register desc ", id));
    if (it->second.desc->producer() != task.actor_id()) {
      return absl::InvalidArgumentError(StrCat(name(), " produces desc ", id, " whose producer is another actor"));
    }
  }
  const auto desc_of = [&descs](int64_t id) -> const proto::RegisterDesc& { return *descs.at(id).desc; };
  const int64_t pieces = PiecesPerIteration(task);
  // Metas of the op's inputs / outputs, resolved through the refs.
  auto resolve = [&](const proto::TensorRef& ref, std::vector<TensorMeta>* metas,
                     bool output) -> absl::Status {
    if (ref.location_case() == proto::TensorRef::kStateIndex) {
      if (ref.state_index() < 0 || ref.state_index() >= task.state_size()) {
        return absl::InvalidArgumentError(
            StrCat(name(), " refers to state tensor ", ref.state_index(), " of ", task.state_size()));
      }
      ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(task.state(ref.state_index())));
      auto slice = TensorSliceFromProto(ref.slice(), meta.shape);
      if (!slice.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", slice.status().message()));
      RETURN_IF_ERROR(CheckMicroBatchStride(task, ref, *slice, pieces));
      meta.shape = slice->logical;
      metas->push_back(std::move(meta));
      return absl::OkStatus();
    }
    if (ref.location_case() != proto::TensorRef::kRegisterDescId) {
      return absl::InvalidArgumentError(StrCat(name(), " has a tensor ref to neither a register nor a state tensor"));
    }
    const int64_t id = ref.register_desc_id();
    bool in_own = (output ? index.produced : index.consumed).contains(id);
    // A Parameter's update writes its variable (a produced desc) and reads it.
    if (!in_own && task.kind() == proto::ACTOR_KIND_PARAMETER) in_own = index.produced.contains(id);
    if (!in_own) {
      return absl::InvalidArgumentError(StrCat(name(), " ", output ? "output" : "input", " refers to desc ", id,
                                               " which it does not ", output ? "produce" : "consume"));
    }
    const proto::RegisterDesc& desc = desc_of(id);
    if (ref.tensor_index() < 0 || ref.tensor_index() >= desc.tensors_size()) {
      return absl::InvalidArgumentError(StrCat(name(), " refers to tensor ", ref.tensor_index(), " of desc ", id,
                                               " which holds ", desc.tensors_size()));
    }
    ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc.tensors(ref.tensor_index())));
    if (ref.view_shape_size() > 0) {
      // A folded reshape: the op reads the tensor as another shape of its elements.
      proto::TensorDesc viewed = desc.tensors(ref.tensor_index());
      *viewed.mutable_shape() = ref.view_shape();
      const absl::StatusOr<TensorMeta> view = TensorMetaFromProto(viewed);
      const std::string what =
          StrCat(name(), (output ? " output" : " input"), " views tensor ", ref.tensor_index(), " of desc ", id, " ",
                 meta.shape.ToString(), " as (", absl::StrJoin(ref.view_shape(), ", "), ")");
      if (output) return absl::InvalidArgumentError(StrCat(what, ": only inputs may"));
      if (!view.ok()) return absl::InvalidArgumentError(StrCat(what, ": ", view.status().message()));
      if (view->shape.NumElements() != meta.shape.NumElements()) {
        return absl::InvalidArgumentError(StrCat(what, ", not the same number of elements"));
      }
      meta.shape = view->shape;
    }
    auto slice = TensorSliceFromProto(ref.slice(), meta.shape);
    if (!slice.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", slice.status().message()));
    RETURN_IF_ERROR(CheckMicroBatchStride(task, ref, *slice, pieces));
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
    // An Acc may also write window descs, after its sum's.
    int produced = task.produced_register_desc_ids_size();
    if (task.kind() == proto::ACTOR_KIND_ACC) {
      while (produced > 1 && desc_of(task.produced_register_desc_ids(produced - 1)).window() != 0) --produced;
    }
    if (task.consumed_register_desc_ids_size() != 1 || produced != 1) {
      return absl::InvalidArgumentError(StrCat(name(), " must consume and produce exactly one register desc"));
    }
    if (task.repeat_num() < 1) return absl::InvalidArgumentError(StrCat(name(), " needs repeat_num >= 1"));
    return absl::OkStatus();
  };
  if ((task.init_size() > 0 || task.kept_size() > 0) && task.kind() != proto::ACTOR_KIND_PARAMETER) {
    return absl::InvalidArgumentError(StrCat(name(), ": only a parameter has init rules and kept tensors"));
  }
  switch (task.kind()) {
    case proto::ACTOR_KIND_SOURCE:
      for (int64_t id : task.consumed_register_desc_ids()) {
        if (desc_of(id).window() == 0 || desc_of(id).window() != desc_of(task.consumed_register_desc_ids(0)).window()) {
          return absl::InvalidArgumentError(
              StrCat(name(), ": a source consumes nothing but window descs, all of one window"));
        }
      }
      break;
    case proto::ACTOR_KIND_SINK:
      if (task.produced_register_desc_ids_size() != 0 || task.consumed_register_desc_ids_size() == 0) {
        return absl::InvalidArgumentError(StrCat(name(), ": a sink consumes at least one desc and produces none"));
      }
      break;
    case proto::ACTOR_KIND_COMPUTE:
    case proto::ACTOR_KIND_PARAMETER: {
      if (task.kind() == proto::ACTOR_KIND_COMPUTE && task.consumed_register_desc_ids_size() == 0) {
        return absl::InvalidArgumentError(StrCat(name(), ": a compute actor consumes at least one desc"));
      }
      if (task.kind() == proto::ACTOR_KIND_PARAMETER) {
        if (task.produced_register_desc_ids_size() != 1 ||
            desc_of(task.produced_register_desc_ids(0)).register_num() != 1) {
          return absl::InvalidArgumentError(
              StrCat(name(), ": a parameter produces exactly one desc, with register_num 1"));
        }
        std::vector<TensorMeta> filled;
        for (const auto& tensor : desc_of(task.produced_register_desc_ids(0)).tensors()) {
          ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(tensor));
          filled.push_back(std::move(meta));
        }
        for (const auto& state : task.state()) {
          auto meta = TensorMetaFromProto(state);
          if (!meta.ok()) return absl::InvalidArgumentError(StrCat(name(), ": state: ", meta.status().message()));
          filled.push_back(*std::move(meta));
        }
        if (absl::Status rules = ValidateInitRules(task, registry, filled); !rules.ok()) {
          return absl::InvalidArgumentError(StrCat(name(), ": ", rules.message()));
        }
        if (task.kept_size() != 0 && task.kept_size() != static_cast<int>(filled.size())) {
          return absl::InvalidArgumentError(StrCat(name(), ": names ", task.kept_size(), " kept tensors, it holds ",
                                                   filled.size()));
        }
        for (const auto& kept : task.kept()) {
          if (kept.name().empty()) return absl::InvalidArgumentError(StrCat(name(), ": a kept tensor without a name"));
        }
      }
      if (task.op().empty()) {
        if (task.inputs_size() != 0 || task.outputs_size() != 0) {
          return absl::InvalidArgumentError(StrCat(name(), " has tensor refs but no op"));
        }
        break;
      }
      auto schema = registry.Get(task.op());
      if (!schema.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", schema.status().message()));
      // Never a silent host fallback: the op runs on its task's device.
      if (const DeviceType type = DecodeActorId(task.actor_id()).device_type; (*schema)->FindKernel(type) == nullptr) {
        return absl::InvalidArgumentError(
            StrCat(name(), ": op '", task.op(), "' has no ", DeviceTypeName(type), " kernel"));
      }
      auto attrs = AttrMapFromProto(task.attrs());
      if (!attrs.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", attrs.status().message()));
      auto canonical = (*schema)->CanonicalizeAttrs(*attrs);
      if (!canonical.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", canonical.status().message()));
      auto inferred = (*schema)->InferMeta(inputs, *canonical);
      if (!inferred.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", inferred.status().message()));
      if (*inferred != outputs) {
        std::vector<std::string> want, have;
        for (const auto& m : *inferred) want.push_back(m.ToString());
        for (const auto& m : outputs) have.push_back(m.ToString());
        return absl::InvalidArgumentError(StrCat(name(), ": op '", task.op(), "' gives outputs [", Join(want, ", "),
                                                 "] but the plan's registers hold [", Join(have, ", "), "]"));
      }
      break;
    }
    case proto::ACTOR_KIND_REPEAT: {
      RETURN_IF_ERROR(single_in_out());
      const auto& in = desc_of(task.consumed_register_desc_ids(0));
      const auto& out = desc_of(task.produced_register_desc_ids(0));
      if (task.input_tensor() < 0 || task.input_tensor() >= in.tensors_size() || out.tensors_size() != 1) {
        return absl::InvalidArgumentError(StrCat(name(), ": repeat must produce one tensor from tensor ",
                                                 task.input_tensor(), " of a register holding ", in.tensors_size()));
      }
      ASSIGN_OR_RETURN(TensorMeta a, TensorMetaFromProto(in.tensors(task.input_tensor())));
      ASSIGN_OR_RETURN(TensorMeta b, TensorMetaFromProto(out.tensors(0)));
      bool ok = a == b;  // the same tensor m times
      if (!ok && a.dtype == b.dtype && a.shape.rank() >= 1 && a.shape.rank() == b.shape.rank()) {
        Shape scaled = b.shape;
        auto rows = CheckedMul(scaled[0], task.repeat_num());
        scaled[0] = rows.ok() ? *rows : -1;
        ok = scaled == a.shape;  // m row pieces
      }
      if (!ok) {
        return absl::InvalidArgumentError(StrCat(name(), ": ", b.ToString(), " is neither ", a.ToString(), " nor 1/",
                                                 task.repeat_num(), " of its rows"));
      }
      break;
    }
    case proto::ACTOR_KIND_ACC: {
      RETURN_IF_ERROR(single_in_out());
      const auto& in = desc_of(task.consumed_register_desc_ids(0));
      const auto& out = desc_of(task.produced_register_desc_ids(0));
      const int t = task.input_tensor();
      const bool same = t >= 0 && t < in.tensors_size() && out.tensors_size() == 1 &&
                        in.tensors(t).dtype() == out.tensors(0).dtype() &&
                        ToVector(in.tensors(t).shape()) == ToVector(out.tensors(0).shape());
      if (!same) {
        return absl::InvalidArgumentError(
            StrCat(name(), ": acc must produce one tensor like tensor ", t, " of what it consumes"));
      }
      break;
    }
    case proto::ACTOR_KIND_COLLECTIVE: {
      if (task.consumed_register_desc_ids_size() != 1 || task.produced_register_desc_ids_size() != 1) {
        return absl::InvalidArgumentError(
            StrCat(name(), ": a collective consumes and produces exactly one register desc"));
      }
      const proto::BoxingDesc& boxing = task.boxing();
      comm::BoxingSpec spec;
      auto logical = TensorMetaFromProto(boxing.logical());
      auto from = ParseNdSbp(boxing.from());
      auto to = ParseNdSbp(boxing.to());
      if (!logical.ok() || !from.ok() || !to.ok()) {
        return absl::InvalidArgumentError(StrCat(name(), ": bad boxing (", boxing.from(), " -> ", boxing.to(), ")"));
      }
      spec.logical = *logical;
      spec.from = *from;
      spec.to = *to;
      spec.hierarchy.assign(boxing.hierarchy().begin(), boxing.hierarchy().end());
      if (spec.hierarchy.size() > static_cast<size_t>(comm::kMaxHierarchyAxes)) {
        return absl::InvalidArgumentError(StrCat(name(), ": boxing over ", spec.hierarchy.size(),
                                                 " hierarchy axes (at most ", comm::kMaxHierarchyAxes, ")"));
      }
      // Every axis >= 1 and their product the rank count.
      int64_t size = 1;
      for (int64_t n : spec.hierarchy) {
        if (n < 1 || size > boxing.ranks_size() / n) {
          size = -1;
          break;
        }
        size *= n;
      }
      if (spec.hierarchy.empty() || size != boxing.ranks_size() || boxing.rank_index() < 0 ||
          boxing.rank_index() >= boxing.ranks_size() || boxing.group().empty()) {
        return absl::InvalidArgumentError(StrCat(name(), ": boxing over ", boxing.ranks_size(), " ranks, hierarchy [",
                                                 Join(spec.hierarchy, ", "), "], index ", boxing.rank_index(),
                                                 boxing.group().empty() ? ", no group" : ""));
      }
      std::vector<int64_t> coords(spec.hierarchy.size());
      for (int64_t i = boxing.rank_index(), a = static_cast<int64_t>(coords.size()) - 1; a >= 0; --a) {
        coords[static_cast<size_t>(a)] = i % spec.hierarchy[static_cast<size_t>(a)];
        i /= spec.hierarchy[static_cast<size_t>(a)];
      }
      auto routine = comm::BoxingRoutine::Create(spec, coords);
      if (!routine.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", routine.status().message()));
      const auto& in = desc_of(task.consumed_register_desc_ids(0));
      const auto& out = desc_of(task.produced_register_desc_ids(0));
      const auto check = [&](const proto::RegisterDesc& desc, int tensor, const Shape& shape) -> absl::Status {
        auto meta = tensor >= 0 && tensor < desc.tensors_size() ? TensorMetaFromProto(desc.tensors(tensor))
                                                               : absl::StatusOr<TensorMeta>(absl::InvalidArgumentError("no such tensor"));
        if (!meta.ok() || meta->shape != shape || meta->dtype != spec.logical.dtype) {
          return absl::InvalidArgumentError(StrCat(name(), ": tensor ", tensor, " of register desc ", desc.id(),
                                                   " must be ", TensorMeta{spec.logical.dtype, shape}.ToString(),
                                                   " for ", spec.ToString()));
        }
        return absl::OkStatus();
      };
      RETURN_IF_ERROR(check(in, boxing.input_tensor(), routine->input_shape()));
      if (out.tensors_size() != 1) {
        return absl::InvalidArgumentError(StrCat(name(), ": a collective produces registers of one tensor"));
      }
      RETURN_IF_ERROR(check(out, 0, routine->output_shape()));
      break;
    }
    case proto::ACTOR_KIND_SEND:
    case proto::ACTOR_KIND_RECV: {
      const bool send = task.kind() == proto::ACTOR_KIND_SEND;
      if (send ? (task.consumed_register_desc_ids_size() != 1 || task.produced_register_desc_ids_size() != 0)
               : (task.consumed_register_desc_ids_size() != 0 || task.produced_register_desc_ids_size() != 1)) {
        return absl::InvalidArgumentError(
            StrCat(name(), send ? ": a send consumes one register desc and produces none"
                                : ": a recv produces one register desc and consumes none"));
      }
      const auto& desc = desc_of(send ? task.consumed_register_desc_ids(0) : task.produced_register_desc_ids(0));
      if (send ? task.transfer().input_tensor() < 0 || task.transfer().input_tensor() >= desc.tensors_size() : desc.tensors_size() != 1) {
        return absl::InvalidArgumentError(StrCat(name(), send ? ": sends a tensor its register does not hold"
                                                              : ": a recv produces registers of one tensor"));
      }
      if (task.transfer().group().empty()) {
        return absl::InvalidArgumentError(StrCat(name(), ": transfer without a group"));
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(StrCat(name(), " has no kind"));
  }
  return absl::OkStatus();
}

// Plan.ranks: each (node, device) once; every task's device is a rank; the
// ranks that boxing and transfers name exist, and a task's own place in its
// boxing is its own rank. (Without Plan.ranks, rank r is cpu:r of node 0.)
absl::Status ValidateRanks(const proto::Plan& plan) {
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> rank_of;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    const proto::RankLocation& at = plan.ranks(r);
    if (at.device_index() > FieldMax(kDeviceIndexBits) || at.node() > FieldMax(kNodeBits) ||
        !rank_of.emplace(std::pair{at.node(), at.device_index()}, static_cast<uint32_t>(r)).second) {
      return absl::InvalidArgumentError(StrCat("plan rank ", r, " at node ", at.node(), " cpu:", at.device_index(),
                                               " is invalid or given twice"));
    }
  }
  const auto rank_of_task = [&](const proto::Task& task) -> absl::StatusOr<uint32_t> {
    const ActorId id = DecodeActorId(task.actor_id());
    if (plan.ranks_size() == 0) {
      if (id.node != 0) return absl::InvalidArgumentError(StrCat(TaskName(task), " is on node ", id.node, ", but the plan lists no ranks"));
      return id.device_index;
    }
    auto it = rank_of.find({id.node, id.device_index});
    if (it == rank_of.end()) return absl::InvalidArgumentError(StrCat(TaskName(task), " is on a device that is no rank of the plan"));
    return it->second;
  };
  const auto known = [&](uint32_t rank) {
    return plan.ranks_size() == 0 ? rank <= FieldMax(kDeviceIndexBits) : rank < static_cast<uint32_t>(plan.ranks_size());
  };
  for (const auto& task : plan.tasks()) {
    ASSIGN_OR_RETURN(const uint32_t own, rank_of_task(task));
    if (task.has_transfer() && (!known(task.transfer().peer()) || task.transfer().peer() == own)) {
      return absl::InvalidArgumentError(StrCat(TaskName(task), ": transfer peer rank ", task.transfer().peer(),
                                               " is not another rank of the plan"));
    }
    if (task.kind() == proto::ACTOR_KIND_COLLECTIVE) {
      const proto::BoxingDesc& boxing = task.boxing();
      for (uint32_t rank : boxing.ranks()) {
        if (!known(rank)) return absl::InvalidArgumentError(StrCat(TaskName(task), ": boxing rank ", rank, " is no rank of the plan"));
      }
      if (boxing.rank_index() >= 0 && boxing.rank_index() < boxing.ranks_size() &&
          boxing.ranks(boxing.rank_index()) != own) {
        return absl::InvalidArgumentError(StrCat(TaskName(task), ": boxing says it is rank ", boxing.ranks(boxing.rank_index()),
                                                 ", but it runs on rank ", own));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const proto::Plan& plan, const ops::OpRegistry& registry) {
  if (plan.iterations() < 0) return absl::InvalidArgumentError("plan has negative iterations");
  if (plan.start_iteration() < 0) return absl::InvalidArgumentError("plan has a negative start_iteration");
  // (Their sum too: both at 2^62 overflowed the end's int64.)
  if (plan.iterations() > comm::kMaxIterations || plan.start_iteration() > comm::kMaxIterations - plan.iterations()) {
    return absl::InvalidArgumentError(
        StrCat("plan runs iterations ", plan.start_iteration(), " + ", plan.iterations(), " (at most 2^62 in all)"));
  }
  std::map<uint64_t, TaskIndex> tasks;
  for (const auto& task : plan.tasks()) {
    RETURN_IF_ERROR(ValidateActorId(task.actor_id()));
    TaskIndex& index = tasks[task.actor_id()];
    if (index.task != nullptr) {
      return absl::InvalidArgumentError(StrCat("two tasks have actor id ", ActorIdToString(task.actor_id())));
    }
    RETURN_IF_ERROR(ValidateTaskCounts(plan, task));
    if (task.async_acts() && !(task.kind() == proto::ACTOR_KIND_ACC ||
                               ((task.kind() == proto::ACTOR_KIND_COMPUTE || task.kind() == proto::ACTOR_KIND_PARAMETER) &&
                                !task.op().empty()))) {
      return absl::InvalidArgumentError(StrCat(
          TaskName(task), " has async_acts, which only an acc and a compute or parameter task with an op may have"));
    }
    index.task = &task;
    index.consumed = IdSet<int64_t>(task.consumed_register_desc_ids());
    index.produced = IdSet<int64_t>(task.produced_register_desc_ids());
  }
  std::map<int64_t, DescIndex> descs;
  for (const auto& desc : plan.register_descs()) {
    const auto name = [&desc] { return StrCat("register desc ", desc.id()); };
    DescIndex& index = descs[desc.id()];
    if (index.desc != nullptr) return absl::InvalidArgumentError(StrCat("two ", name(), "s"));
    index.desc = &desc;
    if (desc.register_num() < 1 || desc.register_num() > comm::kMaxRegisterNum) {
      return absl::InvalidArgumentError(
          StrCat(name(), " has register_num ", desc.register_num(), " (must be in [1, ", comm::kMaxRegisterNum, "])"));
    }
    auto producer = tasks.find(desc.producer());
    if (producer == tasks.end() || !producer->second.produced.contains(desc.id())) {
      return absl::InvalidArgumentError(
          StrCat(name(), ": producer ", ActorIdToString(desc.producer()), " is not a task producing it"));
    }
    for (uint64_t consumer : desc.consumers()) {
      auto it = tasks.find(consumer);
      if (it == tasks.end() || !it->second.consumed.contains(desc.id())) {
        return absl::InvalidArgumentError(
            StrCat(name(), ": consumer ", ActorIdToString(consumer), " is not a task consuming it"));
      }
      // A register lives on its producer's device: crossing to another
      // device (or node) goes through a Send/Recv or a collective.
      const ActorId from = DecodeActorId(desc.producer()), to = DecodeActorId(consumer);
      if (from.node != to.node || from.device() != to.device()) {
        return absl::InvalidArgumentError(StrCat(name(), ": producer ", ActorIdToString(desc.producer()), " and consumer ",
                                                 ActorIdToString(consumer), " are on different devices (a register "
                                                 "never leaves its device; use a transfer or a collective)"));
      }
    }
    index.consumers = IdSet<uint64_t>(desc.consumers());
    if (index.consumers.has_duplicates()) return absl::InvalidArgumentError(StrCat(name(), " lists a consumer twice"));
    int64_t bytes = 0;
    for (const auto& tensor : desc.tensors()) {
      auto meta = TensorMetaFromProto(tensor);
      absl::StatusOr<int64_t> sum = meta.ok() ? CheckedByteSize(*meta) : meta.status();
      if (sum.ok()) sum = CheckedAdd(bytes, *sum);
      if (!sum.ok()) return absl::InvalidArgumentError(StrCat(name(), ": ", sum.status().message()));
      bytes = *sum;
    }
    if (desc.window() != 0) {
      bool sources = true;
      for (uint64_t consumer : desc.consumers()) sources &= tasks.at(consumer).task->kind() == proto::ACTOR_KIND_SOURCE;
      if (desc.window() < 0 || desc.tensors_size() != 0 || producer->second.task->kind() != proto::ACTOR_KIND_ACC ||
          desc.consumers().empty() || !sources) {
        return absl::InvalidArgumentError(StrCat(name(), " has window ", desc.window(),
                                                 ": a window desc holds no tensors and goes from an acc to sources"));
      }
    }
    const bool view = producer->second.task->kind() == proto::ACTOR_KIND_REPEAT;
    if (desc.bytes_per_register() != (view ? 0 : bytes)) {
      return absl::InvalidArgumentError(StrCat(name(), " says ", desc.bytes_per_register(),
                                               " bytes per register, its tensors hold ", view ? 0 : bytes));
    }
  }
  for (const auto& task : plan.tasks()) RETURN_IF_ERROR(ValidateTask(tasks.at(task.actor_id()), descs, registry));
  RETURN_IF_ERROR(ValidateRanks(plan));
  // Piece rates: what a consumer expects per iteration from each consumed
  // desc. The products fit: ValidateTaskCounts bounded them over the run.
  for (const auto& task : plan.tasks()) {
    const int64_t pieces = PiecesPerIteration(task);
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
      const proto::Task& producer = *tasks.at(descs.at(id).desc->producer()).task;
      if (const int32_t window = descs.at(id).desc->window(); window != 0) {
        // The Acc's micro-batches are the Source's, more than the window.
        const int64_t micro = PiecesPerIteration(producer) * producer.repeat_num();
        if (micro != pieces || pieces <= window) {
          return absl::InvalidArgumentError(StrCat(TaskName(task), " reads window desc ", id, " (window ", window, ") from ",
                                                   TaskName(producer), ", which sums ", micro,
                                                   " micro-batches an iteration, but the source runs ", pieces,
                                                   " piece(s) per iteration"));
        }
        continue;
      }
      if (PiecesPerIteration(producer) != expected) {
        return absl::InvalidArgumentError(StrCat(TaskName(task), " expects ", expected, " piece(s) per iteration from desc ", id,
                                                 " but ", TaskName(producer), " produces ", PiecesPerIteration(producer)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::actors
