#pragma once
// DeviceMesh: how a job's ranks are arranged for data, tensor and pipeline
// parallelism (DESIGN §4, §7), the way LiBai's distributed utilities do it:
//
//   - the world is cut into `pipeline` contiguous blocks of ranks, one per
//     pipeline stage: stage s holds ranks [s*dp*tp, (s+1)*dp*tp);
//   - inside a stage the ranks form a 2-D mesh [dp, tp] (hierarchy axis 0 =
//     data parallel, axis 1 = tensor parallel), row-major:
//     rank = s*dp*tp + d*tp + t. With dp = tp = 2 stage 0 is ranks {0,1,2,3};
//     {0,2} and {1,3} are the data-parallel groups, {0,1} and {2,3} the
//     tensor-parallel ones (LiBai's layout);
//   - a layer index picks its stage by LiBai's balancing rule
//     (get_layer_placement): layers are cut into equal runs, the remainder
//     going one layer each to the LAST stages; and when pipeline >= 4,
//     layers >= 8 and layers divide evenly, the count is first padded by
//     min(pipeline - 1, layers / pipeline) so that the last stage, which also
//     holds the head and the loss, gets fewer layers (24 layers on 4 stages:
//     [6, 7, 7, 4]). Layer -1 is the last stage.
//
// A DeviceMesh is an immutable value; safe to read from any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/placement.h"

namespace tessera::scheduler {

// The most devices a mesh may hold: far beyond any cluster Tessera runs,
// and it keeps the rank tables small whatever a config says.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 16;

// The `train.dist` numbers.
struct ParallelConfig {
  DeviceType device_type = DeviceType::kCpu;
  int64_t data = -1;  // -1 = derived: world_size / (tensor * pipeline)
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t world_size = 1;
  // Number of layers the model's layer_idx values range over; required (and
  // >= pipeline) when pipeline > 1 or a custom stage list is given, ignored
  // otherwise.
  int64_t pipeline_num_layers = 0;
  // The stage of each layer (`train.dist.custom_pipeline_stage_id`); empty:
  // LiBai's balancing rule. Else one entry per layer, each in
  // [0, pipeline), never decreasing, every stage holding a layer.
  std::vector<int64_t> custom_stage_of_layer = {};
};

// Where a rank sits in the mesh.
struct MeshCoordinates {
  int64_t stage = 0;
  int64_t data = 0;    // index along the data-parallel axis
  int64_t tensor = 0;  // index along the tensor-parallel axis
  bool operator==(const MeshCoordinates&) const = default;
};

class DeviceMesh {
 public:
  // Validates the config. Errors (one line each): a world size above
  // kMaxWorldSize; a non-positive size; a
  // world size not divisible by tensor x pipeline; an explicit data size
  // whose product with the others is not the world size; pipeline > 1
  // without pipeline_num_layers; more stages than layers; a custom stage
  // list of another length than the layers, with a stage outside the
  // pipeline, going back a stage or leaving one without layers.
  static absl::StatusOr<DeviceMesh> Make(const ParallelConfig& config);

  DeviceType device_type() const { return device_type_; }
  int64_t world_size() const { return num_stages_ * data_ * tensor_; }
  int64_t data_parallel_size() const { return data_; }
  int64_t tensor_parallel_size() const { return tensor_; }
  int64_t num_stages() const { return num_stages_; }
  // 0 when there is one stage.
  int64_t pipeline_num_layers() const { return num_layers_; }
  int64_t ranks_per_stage() const { return data_ * tensor_; }
  // Every stage's hierarchy: {data_parallel_size, tensor_parallel_size}.
  std::vector<int64_t> hierarchy() const { return {data_, tensor_}; }

  // The stage of a layer. With one stage every index is stage 0. With several: 0 <= layer_idx <
  // pipeline_num_layers by the custom list or else the balancing rule, -1 =
  // the last stage, anything else an error naming the index and the layer
  // count.
  absl::StatusOr<int64_t> StageOfLayer(int64_t layer_idx) const;
  // How many of the pipeline_num_layers layers each stage holds ({} with one
  // stage).
  std::vector<int64_t> LayersPerStage() const;

  // Stage s's ranks as a [dp, tp] placement. `stage` must be valid (CHECKed).
  const Placement& stage_placement(int64_t stage) const;
  // Global rank of a mesh position (each index must be in range: CHECKed).
  int64_t RankOf(int64_t stage, int64_t data, int64_t tensor) const;
  // Mesh position of a global rank; error when outside [0, world_size).
  absl::StatusOr<MeshCoordinates> CoordinatesOf(int64_t rank) const;

  // "cpu, 8 ranks: pipeline 2 x data 2 x tensor 2; layers per stage [3, 3]"
  std::string ToString() const;

 private:
  DeviceMesh() = default;

  DeviceType device_type_ = DeviceType::kCpu;
  int64_t data_ = 1;
  int64_t tensor_ = 1;
  int64_t num_stages_ = 1;
  int64_t num_layers_ = 0;  // pipeline_num_layers (0 with one stage); stages follow by formula
  std::vector<int64_t> custom_stage_of_layer_;  // or, when not empty, from this list
  std::vector<Placement> stage_placements_;
};

}  // namespace tessera::scheduler
