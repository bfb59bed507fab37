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
// States:  running --(act | launch, retire)--> running
//          running --(every input Eord'ed and drained, no act in flight)-->
//                  Eord sent --(every register acked)--> done

#include <deque>
#include <mutex>

#include "absl/base/thread_annotations.h"
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
    if (task_.async_acts() && env_.stream == nullptr) {
      return absl::FailedPreconditionError("the task acts asynchronously, but the executor gave it no stream");
    }
    return runner_.Init(task_, *env_.registry, DescIds(task_.consumed_register_desc_ids()),
                        DescIds(task_.produced_register_desc_ids()));
  }

 private:
  // One act launched and not yet handed on.
  struct InFlight {
    std::vector<int32_t> consumed;  // per consumed desc: the register it reads
    std::vector<int32_t> produced;  // per produced desc: the register it writes
  };
  // Acts the stream completed, counted by its callbacks (any thread).
  struct Completions {
    std::mutex mu;
    int64_t completed ABSL_GUARDED_BY(mu) = 0;
    absl::Status error ABSL_GUARDED_BY(mu);
  };

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
      RETURN_IF_ERROR(runner_.Run(task_, lookup, act_count_, env_.start_iteration, env_.pool, DecodeActorId(id()).device()));
    }
    // Inputs go back first: they are read, and the arena monitor
    // (actors/arena.h) must see them free before a reader of the outputs
    // can take bytes they share.
    AckAll();
    for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], taken_[i]);
    ++act_count_;
    return true;
  }

  // Launches the next act on the stream when the act condition holds.
  bool Launch() {
    if (!AllConsumedReady() || !AllProducedFree()) return false;
    InFlight act;
    for (size_t i = 0; i < produced_.size(); ++i) act.produced.push_back(TakeFree(produced_[i]));
    for (Consumed& c : consumed_) {
      act.consumed.push_back(c.ready.front());
      c.ready.pop_front();
    }
    auto lookup = [this, &act](const OpRunner::Ref& r) -> const Tensor& {
      const auto slot = static_cast<size_t>(r.slot);
      if (r.where == OpRunner::Where::kConsumed) {
        return consumed_[slot].registers->registers[static_cast<size_t>(act.consumed[slot])][static_cast<size_t>(r.tensor)];
      }
      return produced_[slot].registers->registers[static_cast<size_t>(act.produced[slot])][static_cast<size_t>(r.tensor)];
    };
    const absl::Status launched = runner_.Launch(task_, lookup, act_count_, env_.start_iteration, env_.pool,
                                                 DecodeActorId(id()).device(), *env_.stream);
    // A launch that failed before enqueuing (its slices) still completes
    // through the stream, so the error surfaces in order at its retirement.
    if (!launched.ok()) env_.stream->Enqueue([launched] { return launched; });
    env_.stream->OnComplete([completions = completions_, bus = env_.bus, actor = id()](absl::Status status) {
      {
        std::lock_guard<std::mutex> lock(completions->mu);
        if (status.ok()) {
          ++completions->completed;
        } else if (completions->error.ok()) {
          completions->error = std::move(status);
        }
      }
      bus->Send(Message::Cmd(actor, Command::kResume));
    });
    in_flight_.push_back(std::move(act));
    ++act_count_;
    return true;
  }

  // Hands on the acts the stream completed, oldest first: true when any.
  absl::StatusOr<bool> Retire() {
    int64_t completed = 0;
    {
      std::lock_guard<std::mutex> lock(completions_->mu);
      if (!completions_->error.ok()) return completions_->error;
      completed = completions_->completed;
    }
    if (retired_ == completed) return false;
    while (retired_ < completed) {
      InFlight& act = in_flight_.front();
      // As AckAll: every input handed back to the arena monitor before any
      // ack leaves, then the outputs on.
      if (env_.arena != nullptr) {
        for (size_t i = 0; i < consumed_.size(); ++i) env_.arena->Release(consumed_[i].desc_id, act.consumed[i]);
      }
      for (size_t i = 0; i < consumed_.size(); ++i) {
        env_.bus->Send(Message::Ack(id(), consumed_[i].producer, consumed_[i].desc_id, act.consumed[i]));
      }
      for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], act.produced[i]);
      in_flight_.pop_front();
      ++retired_;
    }
    return true;
  }

  bool ShouldEnd() const override { return in_flight_.empty() && Actor::ShouldEnd(); }
  bool Busy() const override { return !in_flight_.empty(); }
  std::string DescribeKindWait() const override {
    if (in_flight_.empty()) return "";
    return StrCat(in_flight_.size(), " act(s) in flight on ", env_.stream->name());
  }

  OpRunner runner_;
  std::vector<int32_t> taken_;  // per produced desc: the register this act writes
  // Asynchronous acts: launched and not retired, oldest first.
  std::deque<InFlight> in_flight_;
  std::shared_ptr<Completions> completions_ = std::make_shared<Completions>();
  int64_t retired_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeComputeActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<ComputeActor>(task, env);
}

}  // namespace tessera::actors::internal
