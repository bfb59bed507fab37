#pragma once
// Renders a physical plan for `tessera plan`: actors (kind, op, device,
// stream, name), register descs (producer, consumers, quota, bytes) and the
// memory estimate per device, as text, Graphviz dot or JSON.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"
#include "nlohmann/json.hpp"

namespace tessera {

nlohmann::json PlanToJson(const proto::Plan& plan);
std::string PlanToText(const proto::Plan& plan);
// The memory table of PlanToText: per device the total and its parts, in MiB.
std::string MemoryText(const proto::Plan& plan);
std::string PlanToDot(const proto::Plan& plan);
// The plan of the config's training job in `format` (text, dot or json).
absl::StatusOr<std::string> DescribeTrainingPlan(const nlohmann::json& config, std::string_view format);

}  // namespace tessera
