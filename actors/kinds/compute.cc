// Compute (DESIGN §8): runs its op, or nothing (a relay), once per act.
//
// Act condition: every consumed desc has a ready register and every
// produced desc a free one (the base condition, actors/actor.h).
// Act: take a free register of each produced desc, run the kernel on the
// front ready registers, ack the inputs, hand the outputs on.
//
// States:  running --(act)--> running
//          running --(every input Eord'ed and drained)--> Eord sent
//                  --(every register acked)--> done

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
    return runner_.Init(task_, *env_.registry, DescIds(task_.consumed_register_desc_ids()),
                        DescIds(task_.produced_register_desc_ids()));
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
    // Inputs go back first: they are read, and the arena monitor
    // (actors/arena.h) must see them free before a reader of the outputs
    // can take bytes they share.
    AckAll();
    for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], taken_[i]);
    ++act_count_;
    return true;
  }

  OpRunner runner_;
  std::vector<int32_t> taken_;  // per produced desc: the register this act writes
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeComputeActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<ComputeActor>(task, env);
}

}  // namespace tessera::actors::internal
