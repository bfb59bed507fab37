#include "scheduler/lower.h"

#include <utility>

#include "comm/proto/actor_id.h"
#include "comm/proto/plan_codec.h"
#include "core/checked.h"
#include "core/status.h"
#include "core/text.h"
#include "scheduler/lowering/graph_facts.h"
#include "scheduler/lowering/lowering.h"

namespace tessera::scheduler {
namespace {

// Where each global rank runs: ranks fill node 0's devices, then node 1's...
// (DESIGN §4); without devices_per_node, every rank is on node 0 from
// cpu:device_index.
absl::StatusOr<std::vector<proto::RankLocation>> RankLocations(const LowerOptions& options, int64_t world_size) {
  const auto max_devices = static_cast<int64_t>(comm::FieldMax(comm::kDeviceIndexBits)) + 1;
  std::vector<proto::RankLocation> locations;
  if (options.devices_per_node.empty()) {
    const int64_t last_device = int64_t{options.device_index} + world_size - 1;
    if (last_device >= max_devices) {
      return absl::InvalidArgumentError(StrCat(
          world_size, " devices", options.device_index > 0 ? StrCat(" from cpu:", options.device_index) : "",
          " on one node: actor ids hold at most ", max_devices, " (device index is ", comm::kDeviceIndexBits, " bits)"));
    }
    for (int64_t r = 0; r < world_size; ++r) {
      locations.emplace_back().set_device_index(static_cast<uint32_t>(options.device_index + r));
    }
    return locations;
  }
  if (options.device_index != 0) {
    return absl::InvalidArgumentError("scheduler: device_index must be 0 when the devices span nodes");
  }
  const auto max_nodes = static_cast<int64_t>(comm::FieldMax(comm::kNodeBits)) + 1;
  if (static_cast<int64_t>(options.devices_per_node.size()) > max_nodes) {
    return absl::InvalidArgumentError(StrCat("scheduler: ", options.devices_per_node.size(),
                                             " nodes, but actor ids hold at most ", max_nodes));
  }
  int64_t total = 0;
  for (size_t node = 0; node < options.devices_per_node.size(); ++node) {
    const int64_t devices = options.devices_per_node[node];
    if (devices < 1 || devices > max_devices) {
      return absl::InvalidArgumentError(StrCat("scheduler: node ", node, " has ", devices, " devices; each node holds 1 to ",
                                               max_devices));
    }
    total += devices;
    for (int64_t d = 0; d < devices && static_cast<int64_t>(locations.size()) < world_size; ++d) {
      proto::RankLocation& location = locations.emplace_back();
      location.set_node(static_cast<uint32_t>(node));
      location.set_device_index(static_cast<uint32_t>(d));
    }
  }
  if (total != world_size) {
    return absl::InvalidArgumentError(StrCat("scheduler: the nodes hold ", total, " devices, the job needs ", world_size));
  }
  return locations;
}

}  // namespace

absl::Status CheckLowerOptions(const graph::Graph& graph, const LowerOptions& options) {
  if (options.default_quota < 1 || options.source_quota < 1 || options.default_quota > comm::kMaxRegisterNum ||
      options.source_quota > comm::kMaxRegisterNum) {
    return absl::InvalidArgumentError(StrCat("scheduler: quotas must be in [1, ", comm::kMaxRegisterNum, "], got ",
                                             options.default_quota, " and source ", options.source_quota));
  }
  if (options.zero_stage < 0 || options.zero_stage > 3) {
    return absl::InvalidArgumentError(StrCat("scheduler: zero_stage must be 0 to 3, got ", options.zero_stage));
  }
  ASSIGN_OR_RETURN(const DeviceMesh mesh, DeviceMesh::Make(options.parallel));
  // (Without devices_per_node, not yet the device count: a job compiled
  // before its nodes are known may span more devices than one node holds.)
  if (!options.devices_per_node.empty()) RETURN_IF_ERROR(RankLocations(options, mesh.world_size()).status());
  if (const auto max_devices = static_cast<int64_t>(comm::FieldMax(comm::kDeviceIndexBits)) + 1;
      int64_t{options.device_index} >= max_devices) {
    return absl::InvalidArgumentError(StrCat("scheduler: device_index ", options.device_index,
                                             " is past a node's devices (actor ids hold ", max_devices, ")"));
  }
  for (const graph::Node& node : graph.nodes()) {
    if (node.layer_idx == graph::kUnassignedLayer) continue;
    if (absl::Status stage = mesh.StageOfLayer(node.layer_idx).status(); !stage.ok()) {
      return absl::InvalidArgumentError(
          StrCat("scheduler: node ", node.id, " (scope '", node.scope, "'): ", stage.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LoweredPlan> LowerToPlan(const graph::Graph& graph, const LowerOptions& options) {
  if (options.iterations < 1) return absl::InvalidArgumentError(StrCat("scheduler: iterations must be >= 1, got ", options.iterations));
  if (options.start_iteration < 0) return absl::InvalidArgumentError(StrCat("scheduler: start_iteration must be >= 0, got ", options.start_iteration));
  if (options.iterations > comm::kMaxIterations || options.start_iteration > comm::kMaxIterations) {
    return absl::InvalidArgumentError(StrCat("scheduler: iterations ", options.iterations, " from ",
                                             options.start_iteration, ": each must be at most 2^62"));
  }
  RETURN_IF_ERROR(CheckLowerOptions(graph, options));
  if (graph.losses().empty() && graph.fetches().empty()) {
    return absl::InvalidArgumentError("scheduler: the graph has no loss and no fetch");
  }
  ASSIGN_OR_RETURN(lowering::Rates rates, lowering::InferRates(graph));
  // Acts are counted over the whole run (start_iteration + iterations) x
  // micro-batches (actors/actor.cc); the count must fit.
  ASSIGN_OR_RETURN(const int64_t last_iteration,
                   CheckedAdd(options.start_iteration, options.iterations, "scheduler: start_iteration + iterations"));
  RETURN_IF_ERROR(
      CheckedMul(last_iteration, rates.num_micro_batches, "scheduler: iterations x micro-batches").status());
  ASSIGN_OR_RETURN(const DeviceMesh mesh, DeviceMesh::Make(options.parallel));
  ASSIGN_OR_RETURN(std::vector<proto::RankLocation> locations, RankLocations(options, mesh.world_size()));
  SbpInferOptions sbp_options;
  sbp_options.zero_stage = options.zero_stage;
  absl::StatusOr<SbpAssignment> inferred = InferSbp(graph, mesh, sbp_options);
  if (!inferred.ok()) {
    // The usual cause where the config's batch checks do not run (a C++
    // program's graph): a batch the data-parallel ranks cannot split evenly.
    const int64_t data = mesh.data_parallel_size();
    for (const graph::ValueId input : graph.Inputs()) {
      const graph::Value& value = graph.value(input);
      if (data > 1 && value.meta.shape.rank() >= 1 && value.meta.shape[0] % data != 0) {
        return absl::Status(inferred.status().code(),
                            StrCat(inferred.status().message(), " (input '", value.name, "' has batch ",
                                   value.meta.shape[0], ", which the ", data,
                                   " data-parallel ranks cannot split evenly: make it a multiple of ", data, ")"));
      }
    }
    return inferred.status();
  }
  const SbpAssignment& sbp = *inferred;
  for (const BoxingEdge& edge : sbp.edges) {
    if (edge.kind == BoxingEdgeKind::kVariableUpdate) {
      // (The variable's name: the update value is an op's, unnamed.)
      const graph::Node& variable = graph.node(edge.consumer);
      const std::string name = variable.outputs.empty() ? "?" : graph.value(variable.outputs[0]).name;
      if (edge.from.stage != edge.to.stage) {
        return absl::InvalidArgumentError(
            StrCat("scheduler: variable '", name, "' is on pipeline stage ", edge.to.stage,
                   " but its update is made on stage ", edge.from.stage,
                   ": give the variable the layer of the stage that updates it (a Scope's layer_idx, or kLastLayer)"));
      }
      return absl::InternalError(
          StrCat("scheduler: the update of variable '", name, "' needs boxing: ", edge.description));
    }
  }
  ASSIGN_OR_RETURN(const lowering::GraphFacts facts, lowering::CollectGraphFacts(graph, std::move(rates)));
  return lowering::Lowering(graph, options, mesh, sbp, facts, std::move(locations)).Run();
}

}  // namespace tessera::scheduler
