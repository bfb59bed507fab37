// Send / Recv (DESIGN §8): a pipeline edge between two devices. Every
// transfer between the same two ranks shares the pair's communicator
// (sender rank 0, receiver rank 1), which pairs the k-th Send with the k-th
// Recv; the coordinator issues them in the plan's order on both sides
// (actors/launch_order.h).
//
// Act condition: a send — its input register is ready; a recv — acts left
// and a free register; either — the coordinator admits the act.
// Act: issue the Send / Recv (then wake the pair's next transfer in line);
// when it completes, ack the input (send) or hand the register on (recv).
//
// States:  idle --(ready, not admitted)--> waiting --(resume: admitted)-->
//          in flight --(callback, resume)--> idle; a failed transfer fails
//          the job.
//          idle --(send: input Eord'ed and drained; recv: last act)-->
//          Eord sent --(registers acked)--> done

#include <optional>

#include "actors/async_slot.h"
#include "actors/kinds/kinds.h"
#include "core/status.h"

namespace tessera::actors::internal {
namespace {

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
    if (sender_ ? !AllConsumedReady() : (act_count_ >= limit_.Total(task_, env_) || !AllProducedFree())) {
      return false;
    }
    if (!sender_ && !limit_.MayEmit(task_, env_, act_count_)) return false;
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
    return sender_ ? Actor::ShouldEnd() : act_count_ >= limit_.Total(task_, env_);
  }
  bool Busy() const override { return slot_.in_flight() || waiting_; }
  std::string DescribeKindWait() const override {
    if (waiting_) {
      const std::string turn = env_.coordinator->DescribeWait(id());
      return StrCat("its turn in the launch order", turn.empty() ? "" : StrCat(" (", turn, ")"));
    }
    if (!slot_.in_flight()) return "";
    return StrCat("its ", sender_ ? "send to" : "receive from", " rank ", task_.transfer().peer(), " (act ", act_count_,
                  ") in flight on ", task_.transfer().group());
  }

  bool sender_ = false;
  std::shared_ptr<comm::Communicator> communicator_;
  AsyncSlot slot_;
  int32_t taken_ = 0;
  bool waiting_ = false;  // ready, but not yet admitted by the coordinator
  EmitLimit limit_;  // a recv's pieces
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeTransferActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<TransferActor>(task, env);
}

}  // namespace tessera::actors::internal
