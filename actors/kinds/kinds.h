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
  if (!status.ok()) return absl::Status(status.code(), StrCat(actor->Describe(), ": ", status.message()));
  return std::unique_ptr<Actor>(std::move(actor));
}

inline std::vector<int64_t> DescIds(const google::protobuf::RepeatedField<int64_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// The kernel step of act `acts` of `task`.
inline int64_t StepOf(const proto::Task& task, int64_t acts) { return acts / std::max<int64_t>(1, task.acts_per_step()); }

// Registers a source (or a recv) emits over the whole run.
inline int64_t TotalPieces(const proto::Task& task, int64_t iterations) { return iterations * PiecesPerIteration(task); }

}  // namespace tessera::actors::internal
