#include "scheduler/mesh.h"

#include <algorithm>
#include <utility>

#include "core/status.h"
#include "core/text.h"

namespace tessera::scheduler {
namespace {

// LiBai's layer -> stage rule (libai/utils/distributed.py,
// _init_placement_group) in closed form: the layer count is padded, cut into
// runs of `per_stage`, the last `remainder` stages taking one more, and the
// table cut to the model's `num_layers` entries.
struct LayerRuns {
  int64_t num_layers = 0;
  int64_t num_stages = 1;
  int64_t per_stage = 0;
  int64_t remainder = 0;

  LayerRuns(int64_t layers, int64_t stages) : num_layers(layers), num_stages(stages) {
    int64_t padded = layers;
    // The last stage also holds the head and the loss: when layers divide
    // evenly over >= 4 stages, pad the count so the middle stages take more.
    if (stages >= 4 && layers >= 8 && layers % stages == 0) padded += std::min(stages - 1, layers / stages);
    per_stage = padded / stages;  // >= 1: layers >= stages
    remainder = padded % stages;
  }
  // Stages [0, short_stages) take per_stage layers each, the rest one more.
  int64_t short_stages() const { return num_stages - remainder; }
  int64_t StageOf(int64_t layer) const {
    const int64_t in_short = short_stages() * per_stage;
    if (layer < in_short) return layer / per_stage;
    return short_stages() + (layer - in_short) / (per_stage + 1);
  }
  // Layers of stage s in the cut table.
  int64_t CountOf(int64_t s) const {
    const int64_t first =
        s < short_stages() ? s * per_stage : short_stages() * per_stage + (s - short_stages()) * (per_stage + 1);
    const int64_t count = per_stage + (s < short_stages() ? 0 : 1);
    return std::clamp<int64_t>(num_layers - first, 0, count);
  }
};

// The config keys behind the sizes, for errors.
constexpr const char* kSizeKeys =
    " (train.dist.data_parallel_size, tensor_parallel_size, pipeline_parallel_size, num_devices)";

// A custom stage list: one stage per layer, in [0, pipeline), never going
// back (activations flow from a stage to the next), every stage holding a
// layer (a stage without one would run nothing of the model's layers).
absl::Status CheckCustomStages(const ParallelConfig& config) {
  const std::vector<int64_t>& stages = config.custom_stage_of_layer;
  const std::string what = "train.dist.custom_pipeline_stage_id";
  const int64_t layers = config.pipeline_num_layers;
  if (layers <= 0) return absl::InvalidArgumentError(StrCat(what, " needs pipeline_num_layers (the model's layers)"));
  if (static_cast<int64_t>(stages.size()) != layers) {
    return absl::InvalidArgumentError(
        StrCat(what, " has ", stages.size(), " entries, one per layer is needed: the model has ", layers, " layers"));
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i] < 0 || stages[i] >= config.pipeline) {
      return absl::InvalidArgumentError(StrCat(what, "[", i, "] = ", stages[i], " is outside the ", config.pipeline,
                                               " pipeline stages (valid: 0..", config.pipeline - 1, ")"));
    }
    if (i > 0 && stages[i] < stages[i - 1]) {
      return absl::InvalidArgumentError(StrCat(what, "[", i, "] = ", stages[i], " comes after stage ", stages[i - 1],
                                               ": stages must not decrease from one layer to the next"));
    }
  }
  for (int64_t s = 0; s < config.pipeline; ++s) {
    if (std::find(stages.begin(), stages.end(), s) == stages.end()) {
      return absl::InvalidArgumentError(StrCat(what, " gives stage ", s, " no layer (every one of the ",
                                               config.pipeline, " stages needs at least one)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceMesh> DeviceMesh::Make(const ParallelConfig& config) {
  if (config.world_size <= 0) {
    return absl::InvalidArgumentError(StrCat("world size must be positive, got ", config.world_size));
  }
  if (config.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        StrCat("world size ", config.world_size, " is more than the ", kMaxWorldSize, " devices a mesh may hold"));
  }
  if (config.tensor <= 0 || config.pipeline <= 0 || (config.data <= 0 && config.data != -1)) {
    return absl::InvalidArgumentError(StrCat("parallel sizes must be positive (data may be -1 = derived), got data ",
                                             config.data, ", tensor ", config.tensor, ", pipeline ", config.pipeline));
  }
  // Each size divides the world, so none exceeds it (and products of two fit).
  if (config.tensor > config.world_size || config.pipeline > config.world_size || config.data > config.world_size) {
    return absl::InvalidArgumentError(StrCat(
        "parallel sizes data ", config.data == -1 ? std::string("(derived)") : StrCat(config.data), ", tensor ",
        config.tensor, ", pipeline ", config.pipeline, " do not fit in the world size ", config.world_size, kSizeKeys));
  }
  const int64_t model = config.tensor * config.pipeline;
  if (config.world_size % model != 0) {
    return absl::InvalidArgumentError(StrCat("world size ", config.world_size,
                                             " is not divisible by tensor parallel size ", config.tensor,
                                             " x pipeline parallel size ", config.pipeline, kSizeKeys));
  }
  const int64_t data = config.data == -1 ? config.world_size / model : config.data;
  if (data * model != config.world_size) {
    return absl::InvalidArgumentError(StrCat("data ", data, " x tensor ", config.tensor, " x pipeline ",
                                             config.pipeline, " parallel sizes = ", data * model,
                                             " devices, but the world size is ", config.world_size));
  }
  DeviceMesh mesh;
  mesh.device_type_ = config.device_type;
  mesh.data_ = data;
  mesh.tensor_ = config.tensor;
  mesh.num_stages_ = config.pipeline;
  if (config.pipeline > 1) {
    if (config.pipeline_num_layers <= 0) {
      return absl::InvalidArgumentError(StrCat("pipeline parallel size ", config.pipeline,
                                               " needs pipeline_num_layers (the number of layers to spread "
                                               "over the stages)"));
    }
    if (config.pipeline_num_layers < config.pipeline) {
      return absl::InvalidArgumentError(StrCat("more pipeline stages (", config.pipeline, ") than layers (",
                                               config.pipeline_num_layers,
                                               "): lower train.dist.pipeline_parallel_size"));
    }
    mesh.num_layers_ = config.pipeline_num_layers;
  }
  if (!config.custom_stage_of_layer.empty()) {
    RETURN_IF_ERROR(CheckCustomStages(config));
    if (config.pipeline > 1) mesh.custom_stage_of_layer_ = config.custom_stage_of_layer;
  }
  const int64_t per_stage = mesh.ranks_per_stage();
  for (int64_t s = 0; s < mesh.num_stages_; ++s) {
    std::vector<int64_t> ranks(static_cast<size_t>(per_stage));
    for (int64_t i = 0; i < per_stage; ++i) ranks[static_cast<size_t>(i)] = s * per_stage + i;
    std::vector<int64_t> hierarchy = {data, config.tensor};
    ASSIGN_OR_RETURN(Placement placement,
                     Placement::Create(config.device_type, std::move(ranks), std::move(hierarchy)));
    mesh.stage_placements_.push_back(std::move(placement));
  }
  return mesh;
}

absl::StatusOr<int64_t> DeviceMesh::StageOfLayer(int64_t layer_idx) const {
  if (num_stages_ == 1) return 0;
  if (layer_idx == -1) return num_stages_ - 1;
  if (layer_idx < 0 || layer_idx >= pipeline_num_layers()) {
    return absl::InvalidArgumentError(StrCat("layer_idx ", layer_idx, " is outside the ", pipeline_num_layers(),
                                             " pipeline layers (valid: 0..", pipeline_num_layers() - 1,
                                             ", or -1 for the last stage)"));
  }
  if (!custom_stage_of_layer_.empty()) return custom_stage_of_layer_[static_cast<size_t>(layer_idx)];
  return LayerRuns(num_layers_, num_stages_).StageOf(layer_idx);
}

std::vector<int64_t> DeviceMesh::LayersPerStage() const {
  if (num_layers_ == 0) return {};
  std::vector<int64_t> counts;
  if (!custom_stage_of_layer_.empty()) {
    counts.assign(static_cast<size_t>(num_stages_), 0);
    for (int64_t s : custom_stage_of_layer_) ++counts[static_cast<size_t>(s)];
    return counts;
  }
  const LayerRuns runs(num_layers_, num_stages_);
  for (int64_t s = 0; s < num_stages_; ++s) counts.push_back(runs.CountOf(s));
  return counts;
}

const Placement& DeviceMesh::stage_placement(int64_t stage) const {
  TESSERA_CHECK(stage >= 0 && stage < num_stages_, "stage ", stage, " outside [0, ", num_stages_, ")");
  return stage_placements_[static_cast<size_t>(stage)];
}

int64_t DeviceMesh::RankOf(int64_t stage, int64_t data, int64_t tensor) const {
  TESSERA_CHECK(stage >= 0 && stage < num_stages_ && data >= 0 && data < data_ && tensor >= 0 && tensor < tensor_,
                "mesh position (stage ", stage, ", data ", data, ", tensor ", tensor, ") outside [", num_stages_, ", ",
                data_, ", ", tensor_, "]");
  return stage * ranks_per_stage() + data * tensor_ + tensor;
}

absl::StatusOr<MeshCoordinates> DeviceMesh::CoordinatesOf(int64_t rank) const {
  if (rank < 0 || rank >= world_size()) {
    return absl::InvalidArgumentError(StrCat("rank ", rank, " is outside the world of ", world_size(), " ranks"));
  }
  const int64_t local = rank % ranks_per_stage();
  return MeshCoordinates{rank / ranks_per_stage(), local / tensor_, local % tensor_};
}

std::string DeviceMesh::ToString() const {
  std::string out = StrCat(DeviceTypeName(device_type_), ", ", world_size(), " ranks: pipeline ", num_stages_,
                           " x data ", data_, " x tensor ", tensor_);
  if (num_layers_ > 0) out += StrCat("; layers per stage [", Join(LayersPerStage(), ", "), "]");
  return out;
}

}  // namespace tessera::scheduler
