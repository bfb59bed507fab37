// Sink / Callback (DESIGN §8): hands the tensors of the consumed registers
// (the loss, metrics, fetches) to the host function the task names, with
// the iteration they belong to; without a callback it only consumes.
//
// Act condition: every consumed desc has a ready register.
// Act: call the host function (the tensors are valid during the call), ack
// the inputs.
//
// States:  running --(act)--> running
//          running --(every input Eord'ed and drained)--> done (it produces
//          nothing, so no Eord to send and no register to wait for)

#include "actors/actor_id.h"
#include "actors/kinds/kinds.h"
#include "core/status.h"

namespace tessera::actors::internal {
namespace {

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
      if (DecodeActorId(id()).device_type != DeviceType::kCpu) {
        // A GPU's registers are read on the host through page-locked
        // copies, made now: a page-locked allocation during the run would
        // wait for the GPU's queued work (CUDA's implicit synchronisation),
        // an NCCL collective waiting for its peers included.
        std::vector<Tensor> metas;
        for (Consumed& c : consumed_)
          metas.insert(metas.end(), c.registers->registers[0].begin(), c.registers->registers[0].end());
        ASSIGN_OR_RETURN(staging_, PinnedLike(metas));
      }
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
      if (DecodeActorId(id()).device_type != DeviceType::kCpu) {
        // A GPU's registers: read on the host, copied over first.
        RETURN_IF_ERROR(CopyAll(staging_, inputs_));
        inputs_ = staging_;
      }
      RETURN_IF_ERROR((*sink_)(env_.start_iteration + StepOf(task_, act_count_), inputs_));
    }
    AckAll();
    ++act_count_;
    return true;
  }

  const HostCallbacks::SinkFn* sink_ = nullptr;
  std::vector<Tensor> inputs_;   // the call's tensors, reused
  std::vector<Tensor> staging_;  // on a GPU: their host copies (made at load)
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeSinkActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<SinkActor>(task, env);
}

}  // namespace tessera::actors::internal
