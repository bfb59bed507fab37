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

absl::StatusOr<std::unique_ptr<CollectiveCoordinator>> CollectiveCoordinator::Build(const proto::Plan& plan,
                                                                                    LaneScope scope) {
  std::unique_ptr<CollectiveCoordinator> out(new CollectiveCoordinator);
  out->plan_ = &plan;
  out->scope_ = scope;
  std::lock_guard<std::mutex> lock(out->mu_);
  for (const auto& task : plan.tasks()) {
    if (!IsOrdered(task)) continue;
    const proto::LaunchOrder& launch = LaunchOf(task);
    const int32_t stages = std::max(1, launch.num_stages());
    if (launch.stage() < 0 || launch.stage() >= stages || launch.epoch() < 0) {
      return absl::InvalidArgumentError(StrCat("task '", task.name(), "': launch order at stage ", launch.stage(), " of ",
                                               stages, ", epoch ", launch.epoch()));
    }
    Launcher& l = out->launchers_[task.actor_id()];
    l.task = &task;
    l.pieces = PiecesPerIteration(task);
    l.acts = plan.iterations() * l.pieces;
    l.key_stage = launch.stage();
    if (task.kind() == proto::ACTOR_KIND_SEND) {
      if (task.transfer().peer_stage() < 0 || task.transfer().peer_stage() >= stages) {
        return absl::InvalidArgumentError(
            StrCat("task '", task.name(), "': peer stage ", task.transfer().peer_stage(), " of ", stages));
      }
      l.key_stage = task.transfer().peer_stage();
    }
    if (l.pieces <= 1) continue;
    if (IsTransfer(task)) {
      const bool send = task.kind() == proto::ACTOR_KIND_SEND;
      const int32_t from = send ? launch.stage() : task.transfer().peer_stage();
      const int32_t to = send ? task.transfer().peer_stage() : launch.stage();
      if (launch.backward() ? to >= from : to <= from) {
        return absl::InvalidArgumentError(StrCat("task '", task.name(), "': a ",
                                                 launch.backward() ? "backward" : "forward",
                                                 " value per micro-batch from stage ", from, " to stage ", to,
                                                 ", against the pipeline's flow (the launch order cannot place it)"));
      }
    }
    std::unique_ptr<OneFOneBClock>& clock = out->clocks_[{stages, l.pieces}];
    if (clock == nullptr) clock = std::make_unique<OneFOneBClock>(stages, l.pieces);
    l.clock = clock.get();
  }
  return out;
}

LaunchKey CollectiveCoordinator::Key(const Launcher& l, int64_t act) const {
  const int64_t iteration = plan_->start_iteration() + act / l.pieces;
  const int64_t time =
      l.clock == nullptr ? 0 : l.clock->Time(l.key_stage, LaunchOf(*l.task).backward(), act % l.pieces);
  return {iteration, LaunchOf(*l.task).epoch(), l.clock == nullptr ? 0 : 1, time, OrderOf(*l.task)};
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
  for (size_t step = 0; step < lanes.size(); ++step) {
    const std::string& name = lanes[step];
    if (std::find(lanes.begin(), lanes.begin() + static_cast<std::ptrdiff_t>(step), name) !=
        lanes.begin() + static_cast<std::ptrdiff_t>(step)) {
      return absl::InternalError(StrCat("task '", l.task->name(), "' has two steps on communicator ", name));
    }
    Lane* lane = &lanes_[scope_ == LaneScope::kDevice ? device : StrCat(device, " ", name)];
    if (scope_ == LaneScope::kDevice && step == 0) {
      auto [other, fresh] = lane->orders.emplace(OrderOf(*l.task), actor_id);
      if (!fresh) {
        return absl::InternalError(StrCat("tasks '", launchers_.at(other->second).task->name(), "' and '",
                                          l.task->name(), "' of one conversion (order ", OrderOf(*l.task),
                                          ") share device ", device, "'s launch lane"));
      }
    }
    l.lanes.push_back(lane);
    if (l.acts > 0) lane->heads.push({Key(l, 0), static_cast<int>(step), actor_id});
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
  if (next != act || lane.issuing || lane.heads.empty() || lane.heads.top().actor_id != actor_id ||
      lane.heads.top().step != step) {
    return false;
  }
  lane.heads.pop();
  lane.issuing = true;
  if (++next < l.acts) lane.heads.push({Key(l, next), step, actor_id});
  return true;
}

std::vector<uint64_t> CollectiveCoordinator::Issued(uint64_t actor_id, int step) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = launchers_.find(actor_id);
  if (it == launchers_.end() || step < 0 || static_cast<size_t>(step) >= it->second.lanes.size()) return {};
  Lane& lane = *it->second.lanes[static_cast<size_t>(step)];
  lane.issuing = false;
  if (lane.heads.empty() || (lane.heads.top().actor_id == actor_id && lane.heads.top().step == step)) return {};
  return {lane.heads.top().actor_id};
}

std::string CollectiveCoordinator::DescribeHead(const std::string& name, const Lane& lane) const {
  const Launcher& head = launchers_.at(lane.heads.top().actor_id);
  const auto step = static_cast<size_t>(lane.heads.top().step);
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
