// Collective (DESIGN §7, §8): one rank's part of a boxing conversion. It
// launches the boxing routine over its communicators (one per hierarchy
// axis, shared with the device's other collectives over the same ranks; a
// later step of an n-D routine on one of its own) and, when the routine
// completes, hands the output on and acks the input. Each collective step
// waits for its turn on its communicator in the coordinator's order
// (actors/launch_order.h) and, once issued, wakes the next in line.
//
// Its routine's scratch lies in the arena where the memory plan put it
// (Task.scratch_offset), in use from the launch to the completion; a plan
// without one gets scratch allocated once, here.
//
// Act condition: the input register is ready, an output register is free,
// and the coordinator admits the act's first step; later steps are admitted
// through the routine's step gate (from the previous step's completion).
//
// States:  idle --(ready, not admitted)--> waiting --(resume: admitted)-->
//          in flight --(callback, resume)--> idle (output handed on, input
//          acked); a failed routine fails the job.
//          idle --(input Eord'ed and drained)--> Eord sent
//               --(outputs acked)--> done

#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "actors/actor_id.h"
#include "actors/async_slot.h"
#include "actors/kinds/kinds.h"
#include "comm/collective/boxing.h"
#include "core/status.h"

namespace tessera::actors::internal {
namespace {

// Coordinates of position `index` in a row-major mesh of shape `hierarchy`.
std::vector<int64_t> Coordinates(int64_t index, const std::vector<int64_t>& hierarchy) {
  std::vector<int64_t> coords(hierarchy.size(), 0);
  for (size_t a = hierarchy.size(); a-- > 0;) {
    coords[a] = index % hierarchy[a];
    index /= hierarchy[a];
  }
  return coords;
}

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
    // Scratch: the plan's, in the arena; else allocated here, once.
    if (env_.arena != nullptr) scratch_ = env_.arena->Scratch(id());
    if (!scratch_.defined() && routine_->ScratchBytes() > 0) {
      ASSIGN_OR_RETURN(scratch_, Tensor::Empty(Shape{(routine_->ScratchBytes() + 3) / 4}, DType::kF32,
                                               DecodeActorId(id()).device()));
    }
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
      if (env_.arena != nullptr) env_.arena->ReleaseScratch(id());
      AckFront(in);  // first: see ComputeActor
      SendReady(out, taken_);
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
    if (env_.arena != nullptr) env_.arena->ClaimScratch(id());
    routine_->Launch(tensors[input], out.registers->registers[static_cast<size_t>(taken_)][0], comms_,
                     slot_.Callback(env_.bus, id()), std::move(gate), scratch_);
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
  std::string DescribeKindWait() const override {
    std::string turn = env_.coordinator == nullptr ? "" : env_.coordinator->DescribeWait(id());
    if (!turn.empty()) turn = StrCat(" (", turn, ")");
    if (waiting_) return StrCat("its turn in the launch order", turn);
    if (!slot_.in_flight()) return "";
    std::lock_guard<std::mutex> lock(pending_->mu);
    if (pending_->issue) return StrCat("its turn for collective step ", pending_->step, turn);
    return StrCat("its collective (act ", act_count_, ") in flight");
  }
  bool Busy() const override { return slot_.in_flight() || waiting_; }

  std::optional<comm::BoxingRoutine> routine_;
  Tensor scratch_;  // the routine's scratch (the plan's arena bytes, or its own)
  comm::BoxingComms comms_;
  std::vector<std::shared_ptr<comm::Communicator>> owned_;
  AsyncSlot slot_;
  int32_t taken_ = 0;
  bool waiting_ = false;  // ready, but not yet admitted by the coordinator
  // A collective step after the first, held until the coordinator's turn.
  // Written by the routine's step gate (the previous step's completion, any
  // thread) and by the actor's thread on a resume.
  struct PendingStep {
    std::mutex mu;
    int step ABSL_GUARDED_BY(mu) = 0;
    int64_t act ABSL_GUARDED_BY(mu) = 0;
    std::function<void()> issue ABSL_GUARDED_BY(mu);
  };
  std::unique_ptr<PendingStep> pending_ = std::make_unique<PendingStep>();
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeCollectiveActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<CollectiveActor>(task, env);
}

}  // namespace tessera::actors::internal
