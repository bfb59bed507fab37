// Source / Tick (DESIGN §8): one register per piece (once per iteration, or
// per micro-batch when pieces_per_iteration > 1), filled by the host
// callback the task names; without one it is a tick, whose registers hold
// whatever they hold.
//
// Act condition: pieces left (the run's gate admitting each iteration's
// first), and every produced desc has a free register; for micro-batches
// k >= w of an iteration when it consumes window descs (RegisterDesc.window
// w: gradient accumulation's micro-batch window), a ready register of each,
// handed back as the act ends.
// Act: take a free register of each produced desc, fill them (callback),
// hand them to their consumers.
//
// States:  emitting --(act)--> emitting
//          emitting --(last piece emitted)--> Eord sent
//                   --(every register acked)--> done

#include "actors/actor_id.h"
#include "actors/kinds/kinds.h"
#include "core/status.h"

namespace tessera::actors::internal {
namespace {

class SourceActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    if (!consumed_.empty()) window_ = consumed_[0].registers->desc->window();
    if (!task_.callback().empty()) {
      auto it = env_.callbacks->sources.find(task_.callback());
      if (it == env_.callbacks->sources.end()) {
        return absl::NotFoundError(StrCat("no source callback '", task_.callback(), "'"));
      }
      fill_ = &it->second;
      if (DecodeActorId(id()).device_type != DeviceType::kCpu) {
        // A GPU's registers are filled on the host in page-locked copies,
        // made now, not during the run (sink.cc says why).
        std::vector<Tensor> metas;
        for (Produced& p : produced_)
          metas.insert(metas.end(), p.registers->registers[0].begin(), p.registers->registers[0].end());
        ASSIGN_OR_RETURN(staging_, PinnedLike(metas));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    if (act_count_ >= limit_.Total(task_, env_) || !AllProducedFree()) return false;
    const bool gated = window_ > 0 && act_count_ % PiecesPerIteration(task_) >= window_;
    if (gated && !AllConsumedReady()) return false;
    if (!limit_.MayEmit(task_, env_, act_count_)) return false;
    std::vector<int32_t> taken;
    for (Produced& p : produced_) taken.push_back(TakeFree(p));
    if (fill_ != nullptr) {
      std::vector<Tensor> outputs;
      for (size_t i = 0; i < produced_.size(); ++i) {
        const auto& tensors = produced_[i].registers->registers[static_cast<size_t>(taken[i])];
        outputs.insert(outputs.end(), tensors.begin(), tensors.end());
      }
      const int64_t piece = env_.start_iteration * PiecesPerIteration(task_) + act_count_;
      if (DecodeActorId(id()).device_type == DeviceType::kCpu) {
        RETURN_IF_ERROR((*fill_)(piece, outputs));
      } else {
        // A GPU's registers: filled on the host, then copied over.
        RETURN_IF_ERROR((*fill_)(piece, staging_));
        RETURN_IF_ERROR(CopyAll(outputs, staging_));
      }
    }
    if (gated) AckAll();
    for (size_t i = 0; i < produced_.size(); ++i) SendReady(produced_[i], taken[i]);
    ++act_count_;
    return true;
  }
  bool ShouldEnd() const override { return act_count_ >= limit_.Total(task_, env_); }

  const HostCallbacks::SourceFn* fill_ = nullptr;
  std::vector<Tensor> staging_;  // on a GPU: the host side of the fills
  int64_t window_ = 0;  // of the consumed window descs (0: none)
  EmitLimit limit_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeSourceActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<SourceActor>(task, env);
}

}  // namespace tessera::actors::internal
