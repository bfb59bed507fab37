// Compute (DESIGN §8): runs its op, or nothing (a relay), once per act.
//
// Act condition: every consumed desc has a ready register and every
// produced desc a free one (the base condition, actors/actor.h).
// Act: take a free register of each produced desc, run the kernel on the
// front ready registers, ack the inputs, hand the outputs on.
//
// Asynchronous acts (Task.async_acts, DESIGN §8 "Async devices"): the act
// takes its registers (the front ready ones leave the ready queues), enqueues
// the kernel on the device's stream (core/stream.h) and asks the stream to
// call back when it completed. The callback (on the stream's thread) counts
// the completion and wakes the actor with Cmd(resume); on its own thread the
// actor then retires its completed acts in order: acks their inputs, hands
// their outputs on. Until then nobody sees the outputs, and the inputs stay
// held, so no consumer reads data that is not ready and no producer
// overwrites data a kernel still reads. Meanwhile the actor launches its
// next acts whenever the act condition holds again: its quotas bound how
// many are in flight.
//
// A task with Task.scratch_bytes gives its kernel that workspace
// (KernelContext::workspace): the plan's bytes in the arena (scratch_offset),
// or its own allocated once.
//
// States:  running --(act | launch, retire)--> running
//          running --(every input Eord'ed and drained, no act in flight)-->
//                  Eord sent --(every register acked)--> done

#include "actors/actor_id.h"
#include "actors/kinds/kinds.h"
#include "actors/kinds/op_runner.h"
#include "core/status.h"

namespace tessera::actors::internal {
namespace {

class ComputeActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    taken_.resize(produced_.size());
    RETURN_IF_ERROR(runner_.Init(task_, *env_.registry, DescIds(task_.consumed_register_desc_ids()),
                                 DescIds(task_.produced_register_desc_ids())));
    if (env_.profile != nullptr)
      runner_.set_profile(env_.profile, DecodeActorId(id()).device().ToString(), env_.iterations);
    if (task_.scratch_bytes() <= 0 || !runner_.has_op()) return absl::OkStatus();
    // The kernel's workspace: the plan's, in the arena; else allocated here, once.
    Tensor workspace;
    if (env_.arena != nullptr) workspace = env_.arena->Scratch(id());
    if (!workspace.defined()) {
      ASSIGN_OR_RETURN(workspace, Tensor::Empty(Shape{(task_.scratch_bytes() + 3) / 4}, DType::kF32,
                                                DecodeActorId(id()).device()));
    }
    runner_.set_workspace(std::move(workspace));
    uses_workspace_ = true;
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    if (task_.async_acts()) {
      ASSIGN_OR_RETURN(const bool retired, Retire());
      return retired || Launch();
    }
    if (!AllConsumedReady() || !AllProducedFree()) return false;
    for (size_t i = 0; i < produced_.size(); ++i) taken_[i] = TakeFree(produced_[i]);
    if (runner_.has_op()) {
      auto lookup = [this](const OpRunner::Ref& r) -> const Tensor& {
        if (r.where == OpRunner::Where::kConsumed) return FrontTensors(consumed_[static_cast<size_t>(r.slot)])[static_cast<size_t>(r.tensor)];
        return produced_[static_cast<size_t>(r.slot)].registers->registers[static_cast<size_t>(taken_[static_cast<size_t>(r.slot)])][static_cast<size_t>(r.tensor)];
      };
      ClaimWorkspace();
      const absl::Status ran =
          runner_.Run(task_, lookup, act_count_, env_.start_iteration, env_.pool, DecodeActorId(id()).device());
      ReleaseWorkspace();
      RETURN_IF_ERROR(ran);
    }
    // Inputs go back first: they are read, and the arena monitor
    // (actors/arena.h) must see them free before a reader of the outputs
    // can take bytes they share.
    AckAll();
    for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], taken_[i]);
    ++act_count_;
    return true;
  }

  // Launches the next act on the stream when the act condition holds; its
  // registers are handed on when the stream completed it.
  bool Launch() {
    if (!AllConsumedReady() || !AllProducedFree()) return false;
    std::vector<int32_t> consumed, produced;  // per desc: the register the act reads / writes
    for (size_t i = 0; i < produced_.size(); ++i) produced.push_back(TakeFree(produced_[i]));
    for (Consumed& c : consumed_) {
      consumed.push_back(c.ready.front());
      c.ready.pop_front();
    }
    auto lookup = [&](const OpRunner::Ref& r) -> const Tensor& {
      const auto slot = static_cast<size_t>(r.slot);
      if (r.where == OpRunner::Where::kConsumed) {
        return consumed_[slot].registers->registers[static_cast<size_t>(consumed[slot])][static_cast<size_t>(r.tensor)];
      }
      return produced_[slot].registers->registers[static_cast<size_t>(produced[slot])][static_cast<size_t>(r.tensor)];
    };
    ClaimWorkspace();
    const absl::Status launched = runner_.Launch(task_, lookup, act_count_, env_.start_iteration, env_.pool,
                                                 DecodeActorId(id()).device(), *env_.stream);
    // A launch that failed before enqueuing (its slices) still goes through
    // the stream, so the error surfaces in order.
    if (!launched.ok()) env_.stream->Enqueue([launched] { return launched; });
    Defer([this, consumed = std::move(consumed), produced = std::move(produced)] {
      ReleaseWorkspace();
      // As AckAll: every input back to the arena monitor before any ack.
      if (env_.arena != nullptr) {
        for (size_t i = 0; i < consumed_.size(); ++i) env_.arena->Release(consumed_[i].desc_id, consumed[i]);
      }
      for (size_t i = 0; i < consumed_.size(); ++i) {
        env_.bus->Send(Message::Ack(id(), consumed_[i].producer, consumed_[i].desc_id, consumed[i]));
      }
      for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], produced[i]);
    });
    ++act_count_;
    return true;
  }

  bool ShouldEnd() const override { return acts_in_flight() == 0 && Actor::ShouldEnd(); }

  // The arena monitor sees the workspace in use while any act is in flight
  // (the acts on one stream run one after another, so they share it); the
  // memory planner keeps it apart from everything live over those acts.
  void ClaimWorkspace() {
    if (uses_workspace_ && env_.arena != nullptr && workspace_users_++ == 0) env_.arena->ClaimScratch(id());
  }
  void ReleaseWorkspace() {
    if (uses_workspace_ && env_.arena != nullptr && --workspace_users_ == 0) env_.arena->ReleaseScratch(id());
  }

  OpRunner runner_;
  bool uses_workspace_ = false;
  int64_t workspace_users_ = 0;  // acts holding the workspace (actor thread only)
  std::vector<int32_t> taken_;  // per produced desc: the register this act writes
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeComputeActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<ComputeActor>(task, env);
}

}  // namespace tessera::actors::internal
