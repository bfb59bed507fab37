#include "tests/actors/sequential_plan.h"

#include "actors/init_rules.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "actors/actor_id.h"
#include "actors/plan.h"
#include "core/status.h"
#include "core/text.h"
#include "ops/eager.h"

namespace tessera::actors::testing {
namespace {

class Interpreter {
 public:
  Interpreter(const proto::Plan& plan, const RuntimeOptions& options, const ops::OpRegistry& registry)
      : plan_(plan), options_(options), registry_(registry) {}

  absl::Status Run() {
    RETURN_IF_ERROR(Allocate());
    RETURN_IF_ERROR(Order());
    for (const proto::Task* task : order_) {
      if (task->kind() == proto::ACTOR_KIND_PARAMETER) RETURN_IF_ERROR(Initialize(*task));
    }
    int64_t m = 1;
    for (const proto::Task* task : order_) m = std::max(m, PiecesPerIteration(*task));
    for (int64_t it = plan_.start_iteration(); it < plan_.start_iteration() + plan_.iterations(); ++it) {
      for (const proto::Task* task : order_) {
        if (PiecesPerIteration(*task) == 1 && !after_acc_.contains(task) && task->kind() != proto::ACTOR_KIND_ACC) {
          RETURN_IF_ERROR(Act(*task, it, 0));
        }
      }
      for (int64_t k = 0; k < m; ++k) {
        for (const proto::Task* task : order_) {
          if (PiecesPerIteration(*task) > 1 || task->kind() == proto::ACTOR_KIND_ACC) RETURN_IF_ERROR(Act(*task, it, k));
        }
      }
      for (const proto::Task* task : order_) {
        if (PiecesPerIteration(*task) == 1 && after_acc_.contains(task)) RETURN_IF_ERROR(Act(*task, it, 0));
      }
      for (const proto::Task* task : order_) {
        if (task->kind() == proto::ACTOR_KIND_PARAMETER && !task->op().empty()) RETURN_IF_ERROR(RunOp(*task, it, 0));
      }
    }
    for (const proto::Task* task : order_) {
      if (task->kind() != proto::ACTOR_KIND_PARAMETER || task->op().empty()) continue;
      auto it = options_.callbacks.finalizers.find(task->callback());
      if (it == options_.callbacks.finalizers.end()) continue;
      std::vector<Tensor> all = registers_.at(task->produced_register_desc_ids(0));
      const auto& state = state_[task->actor_id()];
      all.insert(all.end(), state.begin(), state.end());
      RETURN_IF_ERROR(it->second(all));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Allocate() {
    for (const auto& task : plan_.tasks()) tasks_[task.actor_id()] = &task;
    for (const auto& desc : plan_.register_descs()) {
      descs_[desc.id()] = &desc;
      std::vector<Tensor>& tensors = registers_[desc.id()];
      for (int t = 0; t < desc.tensors_size(); ++t) {
        ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc.tensors(t)));
        ASSIGN_OR_RETURN(Tensor tensor, Tensor::Zeros(meta.shape, meta.dtype));
        tensors.push_back(std::move(tensor));
      }
    }
    for (const auto& task : plan_.tasks()) {
      for (const auto& desc : task.state()) {
        ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc));
        ASSIGN_OR_RETURN(Tensor tensor, Tensor::Zeros(meta.shape, meta.dtype));
        state_[task.actor_id()].push_back(std::move(tensor));
      }
    }
    return absl::OkStatus();
  }

  // Topological order over desc edges, leaving out the edges into
  // parameters (their update runs at the end of the iteration) and window
  // descs (control only: micro-batch k's accs already run before k + 1).
  absl::Status Order() {
    std::map<const proto::Task*, int> pending;
    std::map<const proto::Task*, std::vector<const proto::Task*>> next;
    for (const auto& task : plan_.tasks()) {
      pending[&task] = 0;
      if (task.kind() == proto::ACTOR_KIND_PARAMETER) continue;
      for (int64_t id : task.consumed_register_desc_ids()) {
        if (descs_.at(id)->window() != 0) continue;
        ++pending[&task];
        next[tasks_.at(descs_.at(id)->producer())].push_back(&task);
      }
    }
    std::vector<const proto::Task*> ready;
    for (const auto& task : plan_.tasks()) {
      if (pending[&task] == 0) ready.push_back(&task);
    }
    while (!ready.empty()) {
      const proto::Task* task = ready.front();
      ready.erase(ready.begin());
      order_.push_back(task);
      for (const proto::Task* n : next[task]) {
        if (--pending[n] == 0) ready.push_back(n);
      }
    }
    if (order_.size() != static_cast<size_t>(plan_.tasks_size())) return absl::InvalidArgumentError("plan has a cycle");
    for (const proto::Task* task : order_) {
      bool after = false;
      for (int64_t id : task->consumed_register_desc_ids()) {
        if (descs_.at(id)->window() != 0) continue;
        const proto::Task* producer = tasks_.at(descs_.at(id)->producer());
        after |= producer->kind() == proto::ACTOR_KIND_ACC || after_acc_.contains(producer);
      }
      if (after && task->kind() != proto::ACTOR_KIND_PARAMETER) after_acc_.insert(task);
    }
    return absl::OkStatus();
  }

  absl::Status Initialize(const proto::Task& task) {
    std::vector<Tensor> all = registers_.at(task.produced_register_desc_ids(0));
    const auto& state = state_[task.actor_id()];
    all.insert(all.end(), state.begin(), state.end());
    auto it = task.callback().empty() ? options_.callbacks.initializers.end()
                                      : options_.callbacks.initializers.find(task.callback());
    if (it != options_.callbacks.initializers.end()) return it->second(all);
    if (task.init_size() > 0) {
      return RunInitRules(task, options_.registry ? *options_.registry : ops::BuiltinOps(), all);
    }
    if (task.callback().empty()) return absl::OkStatus();
    return absl::NotFoundError(StrCat("no initializer '", task.callback(), "' and no init rules"));
  }

  std::vector<Tensor> Concat(const google::protobuf::RepeatedField<int64_t>& ids) {
    std::vector<Tensor> out;
    for (int64_t id : ids) out.insert(out.end(), registers_.at(id).begin(), registers_.at(id).end());
    return out;
  }

  absl::Status Act(const proto::Task& task, int64_t iteration, int64_t micro) {
    const int64_t piece = iteration * PiecesPerIteration(task) + micro;
    switch (task.kind()) {
      case proto::ACTOR_KIND_SOURCE: {
        if (task.callback().empty()) return absl::OkStatus();
        auto it = options_.callbacks.sources.find(task.callback());
        if (it == options_.callbacks.sources.end()) return absl::NotFoundError(StrCat("no source '", task.callback(), "'"));
        return it->second(piece, Concat(task.produced_register_desc_ids()));
      }
      case proto::ACTOR_KIND_SINK: {
        if (task.callback().empty()) return absl::OkStatus();
        auto it = options_.callbacks.sinks.find(task.callback());
        if (it == options_.callbacks.sinks.end()) return absl::NotFoundError(StrCat("no sink '", task.callback(), "'"));
        return it->second(piece / std::max<int64_t>(1, task.acts_per_step()), Concat(task.consumed_register_desc_ids()));
      }
      case proto::ACTOR_KIND_COMPUTE:
        return task.op().empty() ? absl::OkStatus() : RunOp(task, iteration, micro);
      case proto::ACTOR_KIND_PARAMETER:
        return absl::OkStatus();  // its register holds the variable
      case proto::ACTOR_KIND_REPEAT: {
        const Tensor& in = registers_.at(task.consumed_register_desc_ids(0)).at(static_cast<size_t>(task.input_tensor()));
        const int64_t out_id = task.produced_register_desc_ids(0);
        Tensor& out = registers_.at(out_id).at(0);
        const auto& dims = descs_.at(out_id)->tensors(0).shape();
        if (dims.empty() || in.shape().rank() == 0 || dims[0] == in.shape()[0]) {
          out = in;
        } else {
          ASSIGN_OR_RETURN(out, in.SliceRows(micro * dims[0], dims[0]));
        }
        return absl::OkStatus();
      }
      case proto::ACTOR_KIND_ACC: {
        const Tensor& in = registers_.at(task.consumed_register_desc_ids(0)).at(static_cast<size_t>(task.input_tensor()));
        Tensor& sum = registers_.at(task.produced_register_desc_ids(0)).at(0);
        if (micro == 0) return sum.CopyFrom(in);
        ASSIGN_OR_RETURN(const ops::OpSchema* add, registry_.Get("add"));
        ops::AttrMap no_attrs;
        ops::KernelContext ctx;
        ctx.schema = add;
        ctx.attrs = &no_attrs;
        ctx.inputs = {sum, in};
        ctx.outputs = {sum};
        ctx.pool = PoolOf(task);
        return ops::RunKernel(*add, ctx);
      }
      default:
        return absl::InvalidArgumentError(StrCat("task '", task.name(), "' has no kind"));
    }
  }

  // The intra-op threads the runtime would give the task's device.
  ThreadPool* PoolOf(const proto::Task& task) const {
    auto it = options_.device_pools.find(DecodeActorId(task.actor_id()).device_index);
    return it != options_.device_pools.end() ? it->second : options_.pool;
  }

  absl::StatusOr<Tensor> Resolve(const proto::Task& task, const proto::TensorRef& ref) {
    if (ref.location_case() == proto::TensorRef::kStateIndex) return state_.at(task.actor_id()).at(static_cast<size_t>(ref.state_index()));
    return registers_.at(ref.register_desc_id()).at(static_cast<size_t>(ref.tensor_index()));
  }

  absl::StatusOr<TensorSlice> SliceOf(const proto::TensorRef& ref, const Tensor& tensor, int64_t micro) {
    ASSIGN_OR_RETURN(TensorSlice slice, TensorSliceFromProto(ref.slice(), tensor.shape()));
    if (ref.micro_batch_stride() != 0 && !slice.offset.empty()) {
      slice.offset.at(static_cast<size_t>(ref.micro_batch_axis())) += micro * ref.micro_batch_stride();
    }
    return slice;
  }

  absl::Status RunOp(const proto::Task& task, int64_t iteration, int64_t micro) {
    ASSIGN_OR_RETURN(const ops::OpSchema* schema, registry_.Get(task.op()));
    ASSIGN_OR_RETURN(ops::AttrMap given, AttrMapFromProto(task.attrs()));
    ASSIGN_OR_RETURN(ops::AttrMap attrs, schema->CanonicalizeAttrs(given));
    ops::KernelContext ctx;
    ctx.schema = schema;
    ctx.attrs = &attrs;
    bool any_slice = false;
    for (const auto& ref : task.inputs()) any_slice |= ref.slice().logical_shape_size() > 0;
    for (const auto& ref : task.outputs()) any_slice |= ref.slice().logical_shape_size() > 0;
    for (const auto& ref : task.inputs()) {
      ASSIGN_OR_RETURN(Tensor t, Resolve(task, ref));
      if (any_slice) {
        ASSIGN_OR_RETURN(TensorSlice s, SliceOf(ref, t, micro));
        ctx.input_slices.push_back(std::move(s));
      }
      ctx.inputs.push_back(std::move(t));
    }
    for (const auto& ref : task.outputs()) {
      ASSIGN_OR_RETURN(Tensor t, Resolve(task, ref));
      if (any_slice) {
        ASSIGN_OR_RETURN(TensorSlice s, SliceOf(ref, t, micro));
        ctx.output_slices.push_back(std::move(s));
      }
      ctx.outputs.push_back(std::move(t));
    }
    const int64_t act = iteration * PiecesPerIteration(task) + micro;
    ctx.step = act / std::max<int64_t>(1, task.acts_per_step());
    ctx.pool = PoolOf(task);
    ctx.device = DecodeActorId(task.actor_id()).device();
    const absl::Status status = ops::RunKernel(*schema, ctx);
    if (!status.ok()) return absl::Status(status.code(), StrCat("task '", task.name(), "': ", status.message()));
    return absl::OkStatus();
  }

  const proto::Plan& plan_;
  const RuntimeOptions& options_;
  const ops::OpRegistry& registry_;
  std::map<uint64_t, const proto::Task*> tasks_;
  std::map<int64_t, const proto::RegisterDesc*> descs_;
  std::map<int64_t, std::vector<Tensor>> registers_;  // one register per desc
  std::map<uint64_t, std::vector<Tensor>> state_;     // parameters' optimizer state
  std::vector<const proto::Task*> order_;
  std::set<const proto::Task*> after_acc_;
};

}  // namespace

absl::Status RunPlanSequentially(std::string_view plan_bytes, const RuntimeOptions& options) {
  ASSIGN_OR_RETURN(proto::Plan plan, ParsePlan(plan_bytes));
  const ops::OpRegistry& registry = options.registry != nullptr ? *options.registry : ops::BuiltinOps();
  RETURN_IF_ERROR(ValidatePlan(plan, registry));
  Interpreter interpreter(plan, options, registry);
  return interpreter.Run();
}

}  // namespace tessera::actors::testing
