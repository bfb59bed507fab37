#pragma once
// models.MLP: an MLP classifier on a synthetic dataset of Gaussian clusters.
//   x (B, in_features) -> [Linear -> gelu] per hidden size -> Linear(classes)
//   -> sparse_softmax_cross_entropy vs labels (B,) -> mean = loss.
// Data: class c has a centre drawn N(0, centre_scale^2) per feature (seed
// `data_seed`); a sample of iteration i, row n picks its class uniformly and
// adds N(0, cluster_std^2) noise, from a generator seeded by (data_seed, i).
// Config keys (model.*): declared once, in Mlp::Keys() with the MlpConfig
// members they fill; the seeds left null derive from train.seed.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model.h"
#include "nlohmann/json.hpp"

namespace tessera::models {

struct MlpConfig {
  int64_t in_features = 16;
  std::vector<int64_t> hidden_sizes = {64, 64};
  int64_t num_classes = 4;
  int64_t data_seed = 0;
  int64_t init_seed = 1;
  double cluster_std = 1.0;
  double centre_scale = 2.0;
};

class Mlp final : public Model {
 public:
  explicit Mlp(MlpConfig config);
  static absl::StatusOr<std::unique_ptr<Model>> FromJson(const nlohmann::json& node);
  // The `model` keys of models.MLP and the members they fill.
  static const config::Binding<MlpConfig>& Keys();

  absl::StatusOr<graph::Graph> BuildGraph(int64_t batch) const override;
  absl::Status FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const override;
  // One layer per Linear: the hidden ones and the classifier.
  int64_t num_layers() const override { return static_cast<int64_t>(config_.hidden_sizes.size()) + 1; }
  const MlpConfig& config() const { return config_; }

 private:
  MlpConfig config_;
  std::vector<float> centres_;  // num_classes x in_features
};

}  // namespace tessera::models
