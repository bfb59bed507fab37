#include "actors/launch_order.h"

#include <algorithm>

#include "actors/actor_id.h"
#include "actors/plan.h"
#include "core/text.h"

namespace tessera::actors {

int64_t OneFOneBSlot(int64_t stage, int64_t num_stages, int64_t num_micro_batches, bool backward, int64_t k) {
  const int64_t m = num_micro_batches;
  const int64_t warmup = std::clamp<int64_t>(num_stages - stage - 1, 0, m);
  if (!backward) return k < warmup ? k : warmup + 2 * (k - warmup);
  return k < m - warmup ? warmup + 2 * k + 1 : m + k;
}

LaunchKey LaunchKeyOf(const proto::Plan& plan, const proto::Task& task, int64_t act) {
  const proto::LaunchOrder& launch = task.boxing().launch();
  const int64_t m = PiecesPerIteration(task);
  const int64_t iteration = plan.start_iteration() + act / m;
  const int64_t slot = m > 1 ? OneFOneBSlot(launch.stage(), std::max(1, launch.num_stages()), m, launch.backward(), act % m) : 0;
  return {iteration, launch.epoch(), m > 1 ? 1 : 0, slot, task.boxing().order()};
}

absl::StatusOr<std::unique_ptr<CollectiveCoordinator>> CollectiveCoordinator::Build(const proto::Plan& plan) {
  std::unique_ptr<CollectiveCoordinator> out(new CollectiveCoordinator);
  out->plan_ = &plan;
  for (const auto& task : plan.tasks()) {
    if (task.kind() != proto::ACTOR_KIND_COLLECTIVE) continue;
    const proto::LaunchOrder& launch = task.boxing().launch();
    const int32_t stages = std::max(1, launch.num_stages());
    if (launch.stage() < 0 || launch.stage() >= stages || launch.epoch() < 0) {
      return absl::InvalidArgumentError(StrCat("task '", task.name(), "': launch order at stage ", launch.stage(), " of ",
                                               stages, ", epoch ", launch.epoch()));
    }
    Collective& c = out->collectives_[task.actor_id()];
    c.task = &task;
    c.acts = plan.iterations() * PiecesPerIteration(task);
  }
  return out;
}

absl::Status CollectiveCoordinator::Use(uint64_t actor_id, const std::vector<std::string>& lanes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = collectives_.find(actor_id);
  if (it == collectives_.end()) return absl::InternalError(StrCat("actor ", actor_id, " is not a collective of the plan"));
  Collective& c = it->second;
  if (!c.lanes.empty()) return absl::InternalError(StrCat("collective '", c.task->name(), "' registered its communicators twice"));
  const std::string device = DecodeActorId(actor_id).device().ToString();
  for (const std::string& name : lanes) {
    Lane* lane = &lanes_[StrCat(device, " ", name)];
    if (std::find(c.lanes.begin(), c.lanes.end(), lane) != c.lanes.end()) {
      return absl::InternalError(StrCat("collective '", c.task->name(), "' has two steps on communicator ", name));
    }
    c.lanes.push_back(lane);
    if (c.acts > 0) lane->heads.push({LaunchKeyOf(*plan_, *c.task, 0), actor_id});
  }
  c.next_act.assign(c.lanes.size(), 0);
  return absl::OkStatus();
}

bool CollectiveCoordinator::TryLaunch(uint64_t actor_id, int64_t act, int step) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = collectives_.find(actor_id);
  if (it == collectives_.end() || step < 0 || static_cast<size_t>(step) >= it->second.lanes.size()) {
    return true;  // a step on no communicator of the sequence
  }
  Collective& c = it->second;
  Lane& lane = *c.lanes[static_cast<size_t>(step)];
  int64_t& next = c.next_act[static_cast<size_t>(step)];
  if (next != act || lane.issuing || lane.heads.empty() || lane.heads.top().actor_id != actor_id) return false;
  lane.heads.pop();
  lane.issuing = true;
  if (++next < c.acts) lane.heads.push({LaunchKeyOf(*plan_, *c.task, next), actor_id});
  return true;
}

std::vector<uint64_t> CollectiveCoordinator::Issued(uint64_t actor_id, int step) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = collectives_.find(actor_id);
  if (it == collectives_.end() || step < 0 || static_cast<size_t>(step) >= it->second.lanes.size()) return {};
  Lane& lane = *it->second.lanes[static_cast<size_t>(step)];
  lane.issuing = false;
  if (lane.heads.empty() || lane.heads.top().actor_id == actor_id) return {};
  return {lane.heads.top().actor_id};
}

std::string CollectiveCoordinator::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> parts;
  for (const auto& [name, lane] : lanes_) {
    if (lane.heads.empty()) continue;
    const Collective& head = collectives_.at(lane.heads.top().actor_id);
    const auto step = static_cast<size_t>(std::find(head.lanes.begin(), head.lanes.end(), &lane) - head.lanes.begin());
    parts.push_back(StrCat(name, ": '", head.task->name(), "' act ", head.next_act[step], step > 0 ? StrCat(" step ", step) : "", " next",
                           lane.issuing ? " (after the one issuing)" : ""));
  }
  return Join(parts, "; ");
}

}  // namespace tessera::actors
