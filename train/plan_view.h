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
// The plan of the config's training job in `format` (text, memory, dot or
// json). text, memory and json add the evaluation plan's memory (with
// train.evaluation) and what each node's host holds at a run's peaks:
// training, and an evaluation beside the trained parameters and optimizer
// state kept for the next segment (and the fullest GPU's part); text and
// memory compare a one-node job with what this machine can give now
// (core/storage.h) and warn when it is too little.
absl::StatusOr<std::string> DescribeTrainingPlan(const nlohmann::json& config, std::string_view format);

}  // namespace tessera
