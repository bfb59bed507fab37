#include "actors/launch_order.h"

#include <algorithm>

#include "actors/actor_id.h"
#include "actors/plan.h"
#include "core/text.h"

namespace tessera::actors {
namespace {

bool IsTransfer(const proto::Task& task) {
  return task.kind() == proto::ACTOR_KIND_SEND || task.kind() == proto::ACTOR_KIND_RECV;
}

bool IsOrdered(const proto::Task& task) { return task.kind() == proto::ACTOR_KIND_COLLECTIVE || IsTransfer(task); }

const proto::LaunchOrder& LaunchOf(const proto::Task& task) {
  return IsTransfer(task) ? task.transfer().launch() : task.boxing().launch();
}

int64_t OrderOf(const proto::Task& task) { return IsTransfer(task) ? task.transfer().order() : task.boxing().order(); }

}  // namespace

int64_t OneFOneBSlot(int64_t stage, int64_t num_stages, int64_t num_micro_batches, bool backward, int64_t k) {
  const int64_t m = num_micro_batches;
  const int64_t warmup = std::clamp<int64_t>(num_stages - stage - 1, 0, m);
  if (!backward) return k < warmup ? k : warmup + 2 * (k - warmup);
  return k < m - warmup ? warmup + 2 * k + 1 : m + k;
}

LaunchKey LaunchKeyOf(const proto::Plan& plan, const proto::Task& task, int64_t act) {
  const proto::LaunchOrder& launch = LaunchOf(task);
  const int64_t m = PiecesPerIteration(task);
  const int64_t iteration = plan.start_iteration() + act / m;
  const int64_t slot = m > 1 ? OneFOneBSlot(launch.stage(), std::max(1, launch.num_stages()), m, launch.backward(), act % m) : 0;
  return {iteration, launch.epoch(), m > 1 ? 1 : 0, slot, OrderOf(task)};
}

absl::StatusOr<std::unique_ptr<CollectiveCoordinator>> CollectiveCoordinator::Build(const proto::Plan& plan) {
  std::unique_ptr<CollectiveCoordinator> out(new CollectiveCoordinator);
  out->plan_ = &plan;
  // (device, pair group, epoch) -> the directions of its per-micro-batch
  // transfers, and one task of each (for the error).
  std::map<std::tuple<std::string, std::string, int32_t>, std::map<bool, const proto::Task*>> directions;
  std::lock_guard<std::mutex> lock(out->mu_);
  for (const auto& task : plan.tasks()) {
    if (!IsOrdered(task)) continue;
    const proto::LaunchOrder& launch = LaunchOf(task);
    const int32_t stages = std::max(1, launch.num_stages());
    if (launch.stage() < 0 || launch.stage() >= stages || launch.epoch() < 0) {
      return absl::InvalidArgumentError(StrCat("task '", task.name(), "': launch order at stage ", launch.stage(), " of ",
                                               stages, ", epoch ", launch.epoch()));
    }
    if (IsTransfer(task) && PiecesPerIteration(task) > 1) {
      auto& seen = directions[{DecodeActorId(task.actor_id()).device().ToString(), task.transfer().group(), launch.epoch()}];
      seen.emplace(launch.backward(), &task);
      if (seen.size() > 1) {
        return absl::InvalidArgumentError(StrCat(
            "transfers '", seen.at(false)->name(), "' (forward) and '", seen.at(true)->name(), "' (backward) share communicator ",
            task.transfer().group(), " per micro-batch in epoch ", launch.epoch(),
            ": their order would differ between the pair's two stages"));
      }
    }
    Launcher& l = out->launchers_[task.actor_id()];
    l.task = &task;
    l.acts = plan.iterations() * PiecesPerIteration(task);
  }
  return out;
}

absl::Status CollectiveCoordinator::Use(uint64_t actor_id, const std::vector<std::string>& lanes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = launchers_.find(actor_id);
  if (it == launchers_.end()) {
    return absl::InternalError(StrCat("actor ", actor_id, " is no collective or transfer of the plan"));
  }
  Launcher& l = it->second;
  if (!l.lanes.empty()) return absl::InternalError(StrCat("task '", l.task->name(), "' registered its communicators twice"));
  const std::string device = DecodeActorId(actor_id).device().ToString();
  for (const std::string& name : lanes) {
    Lane* lane = &lanes_[StrCat(device, " ", name)];
    if (std::find(l.lanes.begin(), l.lanes.end(), lane) != l.lanes.end()) {
      return absl::InternalError(StrCat("task '", l.task->name(), "' has two steps on communicator ", name));
    }
    l.lanes.push_back(lane);
    if (l.acts > 0) lane->heads.push({LaunchKeyOf(*plan_, *l.task, 0), actor_id});
  }
  l.next_act.assign(l.lanes.size(), 0);
  return absl::OkStatus();
}

bool CollectiveCoordinator::TryLaunch(uint64_t actor_id, int64_t act, int step) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = launchers_.find(actor_id);
  if (it == launchers_.end() || step < 0 || static_cast<size_t>(step) >= it->second.lanes.size()) {
    return true;  // a step on no communicator of the sequence
  }
  Launcher& l = it->second;
  Lane& lane = *l.lanes[static_cast<size_t>(step)];
  int64_t& next = l.next_act[static_cast<size_t>(step)];
  if (next != act || lane.issuing || lane.heads.empty() || lane.heads.top().actor_id != actor_id) return false;
  lane.heads.pop();
  lane.issuing = true;
  if (++next < l.acts) lane.heads.push({LaunchKeyOf(*plan_, *l.task, next), actor_id});
  return true;
}

std::vector<uint64_t> CollectiveCoordinator::Issued(uint64_t actor_id, int step) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = launchers_.find(actor_id);
  if (it == launchers_.end() || step < 0 || static_cast<size_t>(step) >= it->second.lanes.size()) return {};
  Lane& lane = *it->second.lanes[static_cast<size_t>(step)];
  lane.issuing = false;
  if (lane.heads.empty() || lane.heads.top().actor_id == actor_id) return {};
  return {lane.heads.top().actor_id};
}

std::string CollectiveCoordinator::DescribeHead(const std::string& name, const Lane& lane) const {
  const Launcher& head = launchers_.at(lane.heads.top().actor_id);
  const auto step = static_cast<size_t>(std::find(head.lanes.begin(), head.lanes.end(), &lane) - head.lanes.begin());
  return StrCat(name, ": '", head.task->name(), "' act ", head.next_act[step], step > 0 ? StrCat(" step ", step) : "", " next",
                lane.issuing ? " (after the one issuing)" : "");
}

std::string CollectiveCoordinator::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> parts;
  for (const auto& [name, lane] : lanes_) {
    if (!lane.heads.empty()) parts.push_back(DescribeHead(name, lane));
  }
  return Join(parts, "; ");
}

std::string CollectiveCoordinator::DescribeWait(uint64_t actor_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = launchers_.find(actor_id);
  if (it == launchers_.end()) return "";
  std::vector<std::string> parts;
  for (const auto& [name, lane] : lanes_) {
    const bool used = std::find(it->second.lanes.begin(), it->second.lanes.end(), &lane) != it->second.lanes.end();
    if (used && !lane.heads.empty() && (lane.heads.top().actor_id != actor_id || lane.issuing)) {
      parts.push_back(DescribeHead(name, lane));
    }
  }
  return Join(parts, "; ");
}

}  // namespace tessera::actors
