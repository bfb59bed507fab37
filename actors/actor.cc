#include "actors/actor.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include "actors/actor_id.h"
#include "actors/init_rules.h"
#include "actors/plan.h"
#include "comm/collective/boxing.h"
#include "core/status.h"
#include "core/text.h"
#include "ops/eager.h"

namespace tessera::actors {
namespace {

// Runs a task's op on tensors named by its TensorRefs, which resolve to the
// front register of a consumed desc, the register being written of a
// produced desc, or one of the actor's own state tensors.
class OpRunner {
 public:
  enum class Where : uint8_t { kConsumed, kProduced, kState };
  struct Ref {
    Where where;
    int slot;    // index into consumed / produced / state
    int tensor;  // tensor index within the register
  };

  absl::Status Init(const proto::Task& task, const ops::OpRegistry& registry,
                    const std::vector<int64_t>& consumed_ids, const std::vector<int64_t>& produced_ids) {
    if (task.op().empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(schema_, registry.Get(task.op()));
    ASSIGN_OR_RETURN(ops::AttrMap attrs, AttrMapFromProto(task.attrs()));
    ASSIGN_OR_RETURN(attrs_, schema_->CanonicalizeAttrs(attrs));
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
      inputs_.push_back(r);
    }
    for (const auto& ref : task.outputs()) {
      ASSIGN_OR_RETURN(Ref r, resolve(ref));
      outputs_.push_back(r);
    }
    ctx_.inputs.resize(inputs_.size());
    ctx_.outputs.resize(outputs_.size());
    ctx_.attrs = &attrs_;
    any_slice_ = any_slice;
    return absl::OkStatus();
  }

  bool has_op() const { return schema_ != nullptr; }
  const std::vector<Ref>& inputs() const { return inputs_; }
  const std::vector<Ref>& outputs() const { return outputs_; }

  // `lookup(ref)` gives the tensor each ref names for this act.
  // `act` counts the task's acts: the kernel step is act / acts_per_step and
  // the micro-batch index act % pieces_per_iteration.
  template <typename Lookup>
  absl::Status Run(const proto::Task& task, Lookup&& lookup, int64_t act, int64_t start_iteration, ThreadPool* pool,
                   const Device& device) {
    for (size_t i = 0; i < inputs_.size(); ++i) ctx_.inputs[i] = lookup(inputs_[i]);
    for (size_t i = 0; i < outputs_.size(); ++i) ctx_.outputs[i] = lookup(outputs_[i]);
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
    return ops::RunKernel(*schema_, ctx_);
  }

 private:
  const ops::OpSchema* schema_ = nullptr;
  ops::AttrMap attrs_;
  std::vector<Ref> inputs_, outputs_;
  bool any_slice_ = false;
  std::vector<int64_t> base_input_offsets_, base_output_offsets_;  // offset[0] of micro-batch 0
  ops::KernelContext ctx_;
};

std::vector<int64_t> Ids(const google::protobuf::RepeatedField<int64_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

int64_t StepOf(const proto::Task& task, int64_t acts) {
  return acts / std::max<int64_t>(1, task.acts_per_step());
}

// Registers a source or constant emits over the whole run.
int64_t TotalPieces(const proto::Task& task, int64_t iterations) { return iterations * PiecesPerIteration(task); }

// Source / Tick: one register per iteration, then Eord. Without a callback
// it is a tick (its registers' contents are whatever they hold).
class SourceActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    if (!task_.callback().empty()) {
      auto it = env_.callbacks->sources.find(task_.callback());
      if (it == env_.callbacks->sources.end()) {
        return absl::NotFoundError(StrCat("no source callback '", task_.callback(), "'"));
      }
      fill_ = &it->second;
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    if (act_count_ >= TotalPieces(task_, env_.iterations) || !AllProducedFree()) return false;
    std::vector<int32_t> taken;
    for (Produced& p : produced_) taken.push_back(TakeFree(p));
    if (fill_ != nullptr) {
      std::vector<Tensor> outputs;
      for (size_t i = 0; i < produced_.size(); ++i) {
        const auto& tensors = produced_[i].registers->registers[static_cast<size_t>(taken[i])];
        outputs.insert(outputs.end(), tensors.begin(), tensors.end());
      }
      RETURN_IF_ERROR((*fill_)(env_.start_iteration * PiecesPerIteration(task_) + act_count_, outputs));
    }
    for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], taken[i]);
    ++act_count_;
    return true;
  }
  bool ShouldEnd() const override { return act_count_ >= TotalPieces(task_, env_.iterations); }

  const HostCallbacks::SourceFn* fill_ = nullptr;
};

// Compute: runs its op (or nothing: a relay) when every input is ready and
// every output has a free register.
class ComputeActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    taken_.resize(produced_.size());
    return runner_.Init(task_, *env_.registry, Ids(task_.consumed_register_desc_ids()),
                        Ids(task_.produced_register_desc_ids()));
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    if (!AllConsumedReady() || !AllProducedFree()) return false;
    for (size_t i = 0; i < produced_.size(); ++i) taken_[i] = TakeFree(produced_[i]);
    if (runner_.has_op()) {
      auto lookup = [this](const OpRunner::Ref& r) -> const Tensor& {
        if (r.where == OpRunner::Where::kConsumed) return FrontTensors(consumed_[static_cast<size_t>(r.slot)])[static_cast<size_t>(r.tensor)];
        return produced_[static_cast<size_t>(r.slot)].registers->registers[static_cast<size_t>(taken_[static_cast<size_t>(r.slot)])][static_cast<size_t>(r.tensor)];
      };
      RETURN_IF_ERROR(runner_.Run(task_, lookup, act_count_, env_.start_iteration, env_.pool, DecodeActorId(id()).device()));
    }
    for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], taken_[i]);
    for (Consumed& c : consumed_) AckFront(c);
    ++act_count_;
    return true;
  }

  OpRunner runner_;
  std::vector<int32_t> taken_;
};

// Parameter: its produced register (register_num 1) is the variable. Emits
// it once per iteration; when every reader acked and the gradient (consumed
// descs) arrived, runs the update op in place, then emits again.
class ParameterActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    for (const auto& desc : task_.state()) {
      ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc));
      ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(meta.shape, meta.dtype, DecodeActorId(id()).device()));
      state_.push_back(std::move(t));
    }
    // A host initializer (a run going on from trained values) takes
    // precedence over the plan's init rules.
    std::vector<Tensor> all = Variable();
    all.insert(all.end(), state_.begin(), state_.end());
    auto host = task_.callback().empty() ? env_.callbacks->initializers.end()
                                         : env_.callbacks->initializers.find(task_.callback());
    if (host != env_.callbacks->initializers.end()) {
      RETURN_IF_ERROR(host->second(all));
    } else if (task_.init_size() > 0) {
      RETURN_IF_ERROR(RunInitRules(task_, *env_.registry, all));
    } else if (!task_.callback().empty()) {
      return absl::NotFoundError(StrCat("no initializer callback '", task_.callback(), "' and no init rules"));
    }
    return runner_.Init(task_, *env_.registry, Ids(task_.consumed_register_desc_ids()),
                        Ids(task_.produced_register_desc_ids()));
  }

 private:
  std::vector<Tensor>& Variable() { return produced_[0].registers->registers[0]; }

  absl::StatusOr<bool> ActOnce() override {
    Produced& variable = produced_[0];
    if (awaiting_update_) {
      if (!AllConsumedReady() || !variable.all_free()) return false;
      if (runner_.has_op()) {
        auto lookup = [this](const OpRunner::Ref& r) -> const Tensor& {
          if (r.where == OpRunner::Where::kConsumed) return FrontTensors(consumed_[static_cast<size_t>(r.slot)])[static_cast<size_t>(r.tensor)];
          if (r.where == OpRunner::Where::kState) return state_[static_cast<size_t>(r.slot)];
          return Variable()[static_cast<size_t>(r.tensor)];
        };
        RETURN_IF_ERROR(runner_.Run(task_, lookup, emitted_ - 1, env_.start_iteration, env_.pool, DecodeActorId(id()).device()));
      }
      for (Consumed& c : consumed_) AckFront(c);
      awaiting_update_ = false;
      if (emitted_ >= TotalPieces(task_, env_.iterations)) RETURN_IF_ERROR(Finalize());
      return true;
    }
    if (emitted_ >= TotalPieces(task_, env_.iterations) || !variable.all_free()) return false;
    SendReady(variable, TakeFree(variable));
    ++emitted_;
    ++act_count_;
    awaiting_update_ = !consumed_.empty();
    return true;
  }
  bool ShouldEnd() const override { return emitted_ >= TotalPieces(task_, env_.iterations); }
  absl::Status CheckEnd() const override {
    if (awaiting_update_ && AllConsumedExhausted()) {
      return absl::FailedPreconditionError("gradient stream ended before the last update");
    }
    return absl::OkStatus();
  }

  // Hands the trained variable and state to the host's finalizer, if any.
  absl::Status Finalize() {
    auto it = env_.callbacks->finalizers.find(task_.callback());
    if (task_.callback().empty() || it == env_.callbacks->finalizers.end()) return absl::OkStatus();
    std::vector<Tensor> all = Variable();
    all.insert(all.end(), state_.begin(), state_.end());
    return it->second(all);
  }

  OpRunner runner_;
  std::vector<Tensor> state_;
  int64_t emitted_ = 0;
  bool awaiting_update_ = false;
};

// Repeat: hands out repeat_num pieces of tensor `input_tensor` of each
// consumed register without copying: the same tensor m times, or (when the
// produced tensor has 1/m of the rows) consecutive row slices. The consumed register is acked
// once all its pieces were emitted and came back.
class RepeatActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() { return absl::OkStatus(); }

 private:
  absl::StatusOr<bool> ActOnce() override {
    Consumed& in = consumed_[0];
    Produced& out = produced_[0];
    if (in.ready.empty()) return false;
    if (pieces_ == task_.repeat_num()) {
      if (!out.all_free()) return false;
      AckFront(in);
      pieces_ = 0;
      return true;
    }
    if (out.free.empty()) return false;
    const int32_t index = TakeFree(out);
    const Tensor& source = FrontTensors(in)[static_cast<size_t>(task_.input_tensor())];
    Tensor& view = out.registers->registers[static_cast<size_t>(index)][0];
    const auto& dims = out.registers->desc->tensors(0).shape();
    if (dims.empty() || source.shape().rank() == 0 || dims[0] == source.shape()[0]) {
      view = source;
    } else {
      ASSIGN_OR_RETURN(view, source.SliceRows(pieces_ * dims[0], dims[0]));
    }
    SendReady(out, index);
    ++pieces_;
    ++act_count_;
    return true;
  }

  int64_t pieces_ = 0;  // pieces of the front consumed register emitted
};

// Acc: sums tensor `input_tensor` of repeat_num consumed registers into one
// produced register.
class AccActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    ASSIGN_OR_RETURN(add_, env_.registry->Get("add"));
    ctx_.attrs = &no_attrs_;
    ctx_.inputs.resize(2);
    ctx_.outputs.resize(1);
    ctx_.device = DecodeActorId(id()).device();
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    Consumed& in = consumed_[0];
    Produced& out = produced_[0];
    if (in.ready.empty() || (count_ == 0 && out.free.empty())) return false;
    if (count_ == 0) index_ = TakeFree(out);
    const Tensor& piece = FrontTensors(in)[static_cast<size_t>(task_.input_tensor())];
    Tensor& sum = out.registers->registers[static_cast<size_t>(index_)][0];
    if (count_ == 0) {
      RETURN_IF_ERROR(sum.CopyFrom(piece));
    } else {
      ctx_.inputs[0] = sum;
      ctx_.inputs[1] = piece;
      ctx_.outputs[0] = sum;
      ctx_.pool = env_.pool;
      RETURN_IF_ERROR(ops::RunKernel(*add_, ctx_));
    }
    AckFront(in);
    ++act_count_;
    if (++count_ == task_.repeat_num()) {
      SendReady(out, index_);
      count_ = 0;
    }
    return true;
  }
  absl::Status CheckEnd() const override {
    if (count_ != 0) {
      return absl::FailedPreconditionError(
          StrCat("input ended after ", count_, " of ", task_.repeat_num(), " pieces"));
    }
    return absl::OkStatus();
  }

  const ops::OpSchema* add_ = nullptr;
  ops::AttrMap no_attrs_;
  ops::KernelContext ctx_;
  int64_t count_ = 0;
  int32_t index_ = 0;
};

// Sink / Callback: hands the consumed registers' tensors to a host function.
class SinkActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    if (!task_.callback().empty()) {
      auto it = env_.callbacks->sinks.find(task_.callback());
      if (it == env_.callbacks->sinks.end()) {
        return absl::NotFoundError(StrCat("no sink callback '", task_.callback(), "'"));
      }
      sink_ = &it->second;
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    if (!AllConsumedReady()) return false;
    if (sink_ != nullptr) {
      inputs_.clear();
      for (Consumed& c : consumed_) {
        const auto& tensors = FrontTensors(c);
        inputs_.insert(inputs_.end(), tensors.begin(), tensors.end());
      }
      RETURN_IF_ERROR((*sink_)(env_.start_iteration + StepOf(task_, act_count_), inputs_));
    }
    for (Consumed& c : consumed_) AckFront(c);
    ++act_count_;
    return true;
  }

  const HostCallbacks::SinkFn* sink_ = nullptr;
  std::vector<Tensor> inputs_;
};

// The completion of an actor's asynchronous operation: filled by the
// communicator's callback (any thread), which then wakes the actor with
// Cmd(resume); read by the actor on its own thread.
class AsyncSlot {
 public:
  // The callback for one launch: records the status and wakes the actor.
  comm::DoneFn Callback(MessageBus* bus, uint64_t actor_id) {
    std::shared_ptr<State> state = state_;
    return [state, bus, actor_id](absl::Status status) {
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->done = true;
        state->status = std::move(status);
      }
      bus->Send(Message::Cmd(actor_id, Command::kResume));
    };
  }
  void Launched() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->done = false;
    in_flight_ = true;
  }
  bool in_flight() const { return in_flight_; }
  // The result once the callback ran; nullopt while still in flight.
  std::optional<absl::Status> Take() {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) return std::nullopt;
    in_flight_ = false;
    state_->done = false;
    return std::move(state_->status);
  }

 private:
  struct State {
    std::mutex mu;
    bool done = false;
    absl::Status status;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  bool in_flight_ = false;  // actor thread only
};

// Coordinates of position `index` in a row-major mesh of shape `hierarchy`.
std::vector<int64_t> Coordinates(int64_t index, const std::vector<int64_t>& hierarchy) {
  std::vector<int64_t> coords(hierarchy.size(), 0);
  for (size_t a = hierarchy.size(); a-- > 0;) {
    coords[a] = index % hierarchy[a];
    index /= hierarchy[a];
  }
  return coords;
}

// Collective: one rank's part of a boxing conversion. Acts when its input
// register is ready, an output register is free and the coordinator admits
// it: launches the boxing routine over its communicators (one per hierarchy
// axis, shared with the device's other collectives over the same ranks; a
// later step of an n-D routine on one of its own) and, when the routine
// completes, hands the output on and acks the input. Each step waits for its
// turn on its communicator and, once issued, wakes the next in line.
class CollectiveActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    const proto::BoxingDesc& desc = task_.boxing();
    if (consumed_.size() != 1 || produced_.size() != 1) {
      return absl::InvalidArgumentError("a collective consumes and produces exactly one register desc");
    }
    if (!env_.join) return absl::FailedPreconditionError("the executor provides no communicators");
    comm::BoxingSpec spec;
    ASSIGN_OR_RETURN(spec.logical, TensorMetaFromProto(desc.logical()));
    ASSIGN_OR_RETURN(spec.from, ParseNdSbp(desc.from()));
    ASSIGN_OR_RETURN(spec.to, ParseNdSbp(desc.to()));
    spec.hierarchy.assign(desc.hierarchy().begin(), desc.hierarchy().end());
    int64_t size = 1;
    for (int64_t n : spec.hierarchy) size *= n;
    if (size != desc.ranks_size() || desc.rank_index() < 0 || desc.rank_index() >= desc.ranks_size()) {
      return absl::InvalidArgumentError(StrCat("boxing of ", desc.ranks_size(), " ranks on hierarchy [",
                                               Join(spec.hierarchy, ", "), "] at index ", desc.rank_index()));
    }
    const std::vector<int64_t> coords = Coordinates(desc.rank_index(), spec.hierarchy);
    ASSIGN_OR_RETURN(routine_, comm::BoxingRoutine::Create(spec, coords));
    // Axis a's group: the ranks that differ from this one only in axis a.
    std::vector<std::string> groups;
    std::vector<std::vector<uint32_t>> axis_members;
    for (size_t a = 0; a < spec.hierarchy.size(); ++a) {
      std::vector<uint32_t> members;
      for (int64_t i = 0; i < size; ++i) {
        std::vector<int64_t> c = Coordinates(i, spec.hierarchy);
        c[a] = coords[a];
        if (c == coords) members.push_back(desc.ranks(static_cast<int>(i)));
      }
      groups.push_back(StrCat(desc.group(), "/", Join(members, ",")));
      axis_members.push_back(members);
      ASSIGN_OR_RETURN(std::shared_ptr<comm::Communicator> communicator,
                       env_.join(groups.back(), members, static_cast<int>(coords[a])));
      comms_.axis.push_back(communicator.get());
      owned_.push_back(std::move(communicator));
    }
    // Collective step i >= 1 gets a communicator of its own, "<group>#i"
    // (see launch_order.h).
    std::vector<std::string> lanes;
    const std::vector<int> axes = routine_->CollectiveAxes();
    for (size_t i = 0; i < axes.size(); ++i) {
      const auto a = static_cast<size_t>(axes[i]);
      if (i == 0) {
        lanes.push_back(groups[a]);
        comms_.steps.push_back(comms_.axis[a]);
        continue;
      }
      lanes.push_back(StrCat(groups[a], "#", i));
      ASSIGN_OR_RETURN(std::shared_ptr<comm::Communicator> communicator,
                       env_.join(lanes.back(), axis_members[a], static_cast<int>(coords[a])));
      comms_.steps.push_back(communicator.get());
      owned_.push_back(std::move(communicator));
    }
    if (env_.coordinator == nullptr) return absl::OkStatus();
    return env_.coordinator->Use(id(), lanes);
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    Consumed& in = consumed_[0];
    Produced& out = produced_[0];
    if (slot_.in_flight()) {
      std::optional<absl::Status> result = slot_.Take();
      if (!result) {
        TryPendingStep();  // a resume may mean a later step's turn came
        return false;
      }
      RETURN_IF_ERROR(*result);
      SendReady(out, taken_);
      AckFront(in);
      ++act_count_;
      return true;
    }
    if (!AllConsumedReady() || !AllProducedFree()) return false;
    waiting_ = env_.coordinator != nullptr && !env_.coordinator->TryLaunch(id(), act_count_);
    if (waiting_) return false;  // woken with Cmd(resume) once it heads its lanes
    taken_ = TakeFree(out);
    slot_.Launched();
    const std::vector<Tensor>& tensors = FrontTensors(in);
    const auto input = static_cast<size_t>(task_.boxing().input_tensor());
    if (input >= tensors.size()) return absl::InvalidArgumentError(StrCat("no tensor ", input, " in the consumed register"));
    comm::StepGate gate;
    if (env_.coordinator != nullptr) {
      gate = [this, act = act_count_](int step, std::function<void()> issue) {
        {
          std::lock_guard<std::mutex> lock(pending_->mu);
          pending_->step = step;
          pending_->act = act;
          pending_->issue = std::move(issue);
        }
        TryPendingStep();
      };
    }
    routine_->Launch(tensors[input], out.registers->registers[static_cast<size_t>(taken_)][0], comms_,
                     slot_.Callback(env_.bus, id()), std::move(gate));
    Issued(0);  // the first collective step (if any) was issued inside Launch
    return true;
  }
  // Lets the next collective on step `step`'s communicator go, waking it.
  void Issued(int step) {
    if (env_.coordinator == nullptr) return;
    for (uint64_t next : env_.coordinator->Issued(id(), step)) env_.bus->Send(Message::Cmd(next, Command::kResume));
  }
  // Issues the later step the routine is holding, if its turn has come (any
  // thread: the previous step's completion, or the actor's on a resume).
  void TryPendingStep() {
    std::function<void()> issue;
    int step = 0;
    {
      std::lock_guard<std::mutex> lock(pending_->mu);
      if (!pending_->issue || !env_.coordinator->TryLaunch(id(), pending_->act, pending_->step)) return;
      issue = std::move(pending_->issue);
      pending_->issue = nullptr;
      step = pending_->step;
    }
    issue();
    Issued(step);
  }
  bool ShouldEnd() const override { return !slot_.in_flight() && Actor::ShouldEnd(); }
  bool Busy() const override { return slot_.in_flight() || waiting_; }

  std::optional<comm::BoxingRoutine> routine_;
  comm::BoxingComms comms_;
  std::vector<std::shared_ptr<comm::Communicator>> owned_;
  AsyncSlot slot_;
  int32_t taken_ = 0;
  bool waiting_ = false;  // ready, but not yet admitted by the coordinator
  // A collective step after the first, held until the coordinator's turn.
  struct PendingStep {
    std::mutex mu;
    int step = 0;
    int64_t act = 0;
    std::function<void()> issue;
  };
  std::unique_ptr<PendingStep> pending_ = std::make_unique<PendingStep>();
};

// Send / Recv: a pipeline edge between two devices. Every transfer between
// the same two ranks shares the pair's communicator (sender rank 0, receiver
// rank 1), which pairs the k-th Send with the k-th Recv; the coordinator
// issues them in the plan's order on both sides (launch_order.h). A send
// acts when its input register is ready, a recv when a register is free,
// and either only once the coordinator admits it; the register is acked
// (send) or handed on (recv) when the transfer completes.
class TransferActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    sender_ = task_.kind() == proto::ACTOR_KIND_SEND;
    if (sender_ ? (consumed_.size() != 1 || !produced_.empty()) : (!consumed_.empty() || produced_.size() != 1)) {
      return absl::InvalidArgumentError(sender_ ? "a send consumes one register desc and produces none"
                                                : "a recv produces one register desc and consumes none");
    }
    if (!env_.join) return absl::FailedPreconditionError("the executor provides no communicators");
    const uint32_t peer = task_.transfer().peer();
    const std::vector<uint32_t> members = sender_ ? std::vector<uint32_t>{env_.rank, peer}
                                                  : std::vector<uint32_t>{peer, env_.rank};
    ASSIGN_OR_RETURN(communicator_, env_.join(task_.transfer().group(), members, sender_ ? 0 : 1));
    if (env_.coordinator == nullptr) return absl::OkStatus();
    return env_.coordinator->Use(id(), {task_.transfer().group()});
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    if (slot_.in_flight()) {
      std::optional<absl::Status> result = slot_.Take();
      if (!result) return false;
      RETURN_IF_ERROR(*result);
      if (sender_) {
        AckFront(consumed_[0]);
      } else {
        SendReady(produced_[0], taken_);
      }
      ++act_count_;
      return true;
    }
    if (sender_ ? !AllConsumedReady() : (act_count_ >= TotalPieces(task_, env_.iterations) || !AllProducedFree())) {
      return false;
    }
    if (sender_) {
      const auto input = static_cast<size_t>(task_.transfer().input_tensor());
      if (input >= FrontTensors(consumed_[0]).size()) {
        return absl::InvalidArgumentError(StrCat("no tensor ", input, " in the consumed register"));
      }
    } else if (produced_[0].registers->registers[static_cast<size_t>(produced_[0].free.front())].size() != 1) {
      return absl::InvalidArgumentError("a recv carries registers of one tensor");
    }
    waiting_ = env_.coordinator != nullptr && !env_.coordinator->TryLaunch(id(), act_count_);
    if (waiting_) return false;  // woken with Cmd(resume) once it heads its lane
    slot_.Launched();
    if (sender_) {
      const Tensor& input = FrontTensors(consumed_[0])[static_cast<size_t>(task_.transfer().input_tensor())];
      communicator_->Send(input, 1, slot_.Callback(env_.bus, id()));
    } else {
      taken_ = TakeFree(produced_[0]);
      communicator_->Recv(produced_[0].registers->registers[static_cast<size_t>(taken_)][0], 0,
                          slot_.Callback(env_.bus, id()));
    }
    // Issued: the pair's next transfer in the plan's order may go.
    if (env_.coordinator != nullptr) {
      for (uint64_t next : env_.coordinator->Issued(id())) env_.bus->Send(Message::Cmd(next, Command::kResume));
    }
    return true;
  }
  bool ShouldEnd() const override {
    if (slot_.in_flight()) return false;
    return sender_ ? Actor::ShouldEnd() : act_count_ >= TotalPieces(task_, env_.iterations);
  }
  bool Busy() const override { return slot_.in_flight() || waiting_; }

  bool sender_ = false;
  std::shared_ptr<comm::Communicator> communicator_;
  AsyncSlot slot_;
  int32_t taken_ = 0;
  bool waiting_ = false;  // ready, but not yet admitted by the coordinator
};

template <typename Kind>
absl::StatusOr<std::unique_ptr<Actor>> Make(const proto::Task& task, const ActorEnvironment& env) {
  std::unique_ptr<Kind> actor(new Kind(task, env));
  auto status = actor->Init();
  if (status.ok()) status = actor->InitKind();
  if (!status.ok()) {
    return absl::Status(status.code(), StrCat(actor->Describe(), ": ", status.message()));
  }
  return std::unique_ptr<Actor>(std::move(actor));
}

}  // namespace

Actor::Actor(const proto::Task& task, const ActorEnvironment& env) : task_(task), env_(env) {}

absl::StatusOr<std::unique_ptr<Actor>> Actor::Create(const proto::Task& task, const ActorEnvironment& env) {
  switch (task.kind()) {
    case proto::ACTOR_KIND_SOURCE: return Make<SourceActor>(task, env);
    case proto::ACTOR_KIND_COMPUTE: return Make<ComputeActor>(task, env);
    case proto::ACTOR_KIND_PARAMETER: return Make<ParameterActor>(task, env);
    case proto::ACTOR_KIND_REPEAT: return Make<RepeatActor>(task, env);
    case proto::ACTOR_KIND_ACC: return Make<AccActor>(task, env);
    case proto::ACTOR_KIND_SINK: return Make<SinkActor>(task, env);
    case proto::ACTOR_KIND_COLLECTIVE: return Make<CollectiveActor>(task, env);
    case proto::ACTOR_KIND_SEND:
    case proto::ACTOR_KIND_RECV: return Make<TransferActor>(task, env);
    default: break;
  }
  return absl::InvalidArgumentError(StrCat("task '", task.name(), "' has unknown kind ", static_cast<int>(task.kind())));
}

absl::Status Actor::Init() {
  for (int64_t desc_id : task_.consumed_register_desc_ids()) {
    auto it = env_.registers->find(desc_id);
    if (it == env_.registers->end()) return absl::InvalidArgumentError(StrCat("no registers for desc ", desc_id));
    Consumed c;
    c.desc_id = desc_id;
    c.producer = it->second.desc->producer();
    c.registers = &it->second;
    consumed_.push_back(std::move(c));
  }
  for (int64_t desc_id : task_.produced_register_desc_ids()) {
    auto it = env_.registers->find(desc_id);
    if (it == env_.registers->end()) return absl::InvalidArgumentError(StrCat("no registers for desc ", desc_id));
    Produced p;
    p.desc_id = desc_id;
    p.registers = &it->second;
    p.consumers.assign(it->second.desc->consumers().begin(), it->second.desc->consumers().end());
    p.reading_count.assign(it->second.registers.size(), 0);
    for (size_t i = 0; i < it->second.registers.size(); ++i) p.free.push_back(static_cast<int32_t>(i));
    produced_.push_back(std::move(p));
  }
  return absl::OkStatus();
}

std::string Actor::Describe() const {
  const ActorId actor_id = DecodeActorId(id());
  std::string out = StrCat("actor '", name(), "'");
  if (!task_.op().empty()) out += StrCat(" (op '", task_.op(), "')");
  return StrCat(out, " on ", actor_id.device().ToString(), " [", actor_id.ToString(), "]");
}

absl::Status Actor::Annotate(const absl::Status& status) const {
  return absl::Status(status.code(), StrCat(Describe(), ": ", status.message()));
}

bool Actor::ShouldEnd() const { return !consumed_.empty() && AllConsumedExhausted(); }

bool Actor::AllConsumedReady() const {
  for (const Consumed& c : consumed_) {
    if (c.ready.empty()) return false;
  }
  return true;
}
bool Actor::AllProducedFree() const {
  for (const Produced& p : produced_) {
    if (p.free.empty()) return false;
  }
  return true;
}
bool Actor::AllConsumedExhausted() const {
  for (const Consumed& c : consumed_) {
    if (!c.exhausted()) return false;
  }
  return true;
}

int32_t Actor::TakeFree(Produced& p) {
  const int32_t index = p.free.front();
  p.free.pop_front();
  return index;
}

void Actor::SendReady(Produced& p, int32_t index) {
  if (p.consumers.empty()) {
    p.free.push_back(index);
    return;
  }
  p.reading_count[static_cast<size_t>(index)] = static_cast<int32_t>(p.consumers.size());
  for (uint64_t consumer : p.consumers) env_.bus->Send(Message::Ready(id(), consumer, p.desc_id, index));
}

void Actor::AckFront(Consumed& c) {
  const int32_t index = c.ready.front();
  c.ready.pop_front();
  env_.bus->Send(Message::Ack(id(), c.producer, c.desc_id, index));
}

absl::Status Actor::Apply(const Message& message) {
  switch (message.type) {
    case MessageType::kCommand:
      if (message.command == Command::kStart) started_ = true;
      return absl::OkStatus();
    case MessageType::kRegisterReady:
    case MessageType::kEord:
      for (Consumed& c : consumed_) {
        if (c.desc_id != message.register_desc_id) continue;
        if (c.eord) return absl::InternalError(StrCat("message after Eord: ", message.ToString()));
        if (message.type == MessageType::kEord) {
          c.eord = true;
        } else {
          c.ready.push_back(message.register_index);
        }
        return absl::OkStatus();
      }
      break;
    case MessageType::kRegisterAck:
      for (Produced& p : produced_) {
        if (p.desc_id != message.register_desc_id) continue;
        const auto index = static_cast<size_t>(message.register_index);
        if (index >= p.reading_count.size() || p.reading_count[index] <= 0) {
          return absl::InternalError(StrCat("ack of a register nobody reads: ", message.ToString()));
        }
        if (--p.reading_count[index] == 0) p.free.push_back(message.register_index);
        return absl::OkStatus();
      }
      break;
  }
  return absl::InternalError(StrCat("message for a desc the actor does not have: ", message.ToString()));
}

absl::Status Actor::MaybeEnd() {
  if (!eord_sent_ && ShouldEnd()) {
    RETURN_IF_ERROR(CheckEnd());
    for (const Produced& p : produced_) {
      for (uint64_t consumer : p.consumers) env_.bus->Send(Message::Eord(id(), consumer, p.desc_id));
    }
    eord_sent_ = true;
  }
  bool all_eord = true;
  for (const Consumed& c : consumed_) all_eord &= c.eord;
  bool all_returned = true;
  for (const Produced& p : produced_) all_returned &= p.all_free();
  if (eord_sent_ && all_eord && AllConsumedExhausted() && all_returned) {
    RETURN_IF_ERROR(CheckEnd());
    done_ = true;
  } else if (all_eord && !consumed_.empty() && !AllConsumedExhausted() && all_returned && !Busy()) {
    // Nothing can arrive any more that would let the actor act again.
    return absl::FailedPreconditionError("inputs ended with unmatched registers (uneven register streams)");
  }
  return absl::OkStatus();
}

absl::Status Actor::Handle(const Message& message) {
  absl::Status status = Apply(message);
  if (status.ok() && started_ && !done_) {
    while (true) {
      absl::StatusOr<bool> progressed = ActOnce();
      if (!progressed.ok()) {
        status = progressed.status();
        break;
      }
      if (!*progressed) break;
    }
    if (status.ok()) status = MaybeEnd();
  }
  if (!status.ok()) return Annotate(status);
  return absl::OkStatus();
}

std::string Message::ToString() const {
  switch (type) {
    case MessageType::kRegisterReady:
      return StrCat("ready(desc ", register_desc_id, ", #", register_index, ") ", src, " -> ", dst);
    case MessageType::kRegisterAck:
      return StrCat("ack(desc ", register_desc_id, ", #", register_index, ") ", src, " -> ", dst);
    case MessageType::kEord:
      return StrCat("eord(desc ", register_desc_id, ") ", src, " -> ", dst);
    case MessageType::kCommand:
      return StrCat(command == Command::kStart ? "start" : command == Command::kStop ? "stop" : "resume", " -> ", dst);
  }
  return "?";
}

}  // namespace tessera::actors
