#pragma once
// The actor kinds, internal to actors/: one factory per kind, which
// Actor::Create dispatches to, and what several kinds share. Each kind lives
// in its own file here, which opens with its act condition and states (the
// base protocol is in actors/actor.h).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/actor.h"
#include "actors/plan.h"
#include "comm/proto/plan.pb.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::actors::internal {

// Each builds its kind for `task` (Actor::Create's contract).
absl::StatusOr<std::unique_ptr<Actor>> MakeSourceActor(const proto::Task& task, const ActorEnvironment& env);
absl::StatusOr<std::unique_ptr<Actor>> MakeComputeActor(const proto::Task& task, const ActorEnvironment& env);
absl::StatusOr<std::unique_ptr<Actor>> MakeParameterActor(const proto::Task& task, const ActorEnvironment& env);
absl::StatusOr<std::unique_ptr<Actor>> MakeRepeatActor(const proto::Task& task, const ActorEnvironment& env);
absl::StatusOr<std::unique_ptr<Actor>> MakeAccActor(const proto::Task& task, const ActorEnvironment& env);
absl::StatusOr<std::unique_ptr<Actor>> MakeSinkActor(const proto::Task& task, const ActorEnvironment& env);
absl::StatusOr<std::unique_ptr<Actor>> MakeCollectiveActor(const proto::Task& task, const ActorEnvironment& env);
// Send and Recv.
absl::StatusOr<std::unique_ptr<Actor>> MakeTransferActor(const proto::Task& task, const ActorEnvironment& env);

// Constructs `Kind`, binds its registers (Actor::Init), then runs its own
// `absl::Status InitKind()`; an error names the actor.
template <typename Kind>
absl::StatusOr<std::unique_ptr<Actor>> MakeActor(const proto::Task& task, const ActorEnvironment& env) {
  auto actor = std::make_unique<Kind>(task, env);
  absl::Status status = actor->Init();
  if (status.ok()) status = actor->InitKind();
  if (!status.ok()) return actor->Annotate(status);
  return std::unique_ptr<Actor>(std::move(actor));
}

inline std::vector<int64_t> DescIds(const google::protobuf::RepeatedField<int64_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// Host callbacks (a Source's fill, a Sink's read, a Parameter's
// initialiser and finalizer) see host memory. For an actor on a GPU they get
// page-locked host tensors of the registers' metas (Tensor::PinnedHost),
// copied to or from the device around the call; on a CPU, the registers'
// own tensors.
inline absl::StatusOr<std::vector<Tensor>> PinnedLike(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> host;
  for (const Tensor& t : tensors) {
    ASSIGN_OR_RETURN(Tensor h, Tensor::PinnedHost(t.shape(), t.dtype()));
    host.push_back(std::move(h));
  }
  return host;
}
// dst[i] = src[i], across devices (waits for the copies).
inline absl::Status CopyAll(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  for (size_t i = 0; i < dst.size(); ++i) {
    Tensor to = dst[i];
    RETURN_IF_ERROR(to.CopyFrom(src[i]));
  }
  return absl::OkStatus();
}

// The kernel step of act `acts` of `task`.
inline int64_t StepOf(const proto::Task& task, int64_t acts) { return acts / std::max<int64_t>(1, task.acts_per_step()); }

// Registers a source (or a recv) emits over the whole run.
inline int64_t TotalPieces(const proto::Task& task, int64_t iterations) { return iterations * PiecesPerIteration(task); }

// The pieces an actor that starts iterations on its own (Source, Parameter,
// Recv) emits: the run's, until the run's gate (ActorEnvironment::gate)
// refuses an iteration; then the pieces emitted before it.
class EmitLimit {
 public:
  // Whether the actor, having emitted `pieces`, may emit the next: pieces
  // left, and at an iteration's first piece the gate admits the iteration
  // (a refusal ends the actor there). Ask only when about to emit.
  bool MayEmit(const proto::Task& task, const ActorEnvironment& env, int64_t pieces) {
    if (pieces >= Total(task, env)) return false;
    const int64_t per = PiecesPerIteration(task);
    if (env.gate != nullptr && pieces % per == 0 && !env.gate->Admit(pieces / per)) {
      stopped_at_ = pieces;
      return false;
    }
    return true;
  }
  int64_t Total(const proto::Task& task, const ActorEnvironment& env) const {
    return stopped_at_ >= 0 ? stopped_at_ : TotalPieces(task, env.iterations);
  }

 private:
  int64_t stopped_at_ = -1;
};

}  // namespace tessera::actors::internal
