#include "models/mlp.h"

#include <cmath>
#include <random>
#include <utility>

#include "core/status.h"
#include "graph/builder.h"
#include "models/bert.h"
#include "models/gpt2.h"

namespace tessera::models {

const std::vector<ModelType>& BuiltinModelTypes() {
  static const auto* const types = new std::vector<ModelType>{
      {"models.BERT", Bert::Keys().section(), &Bert::FromJson},
      {"models.GPT2", Gpt2::Keys().section(), &Gpt2::FromJson},
      {"models.MLP", Mlp::Keys().section(), &Mlp::FromJson},
  };
  return *types;
}

absl::Status RegisterBuiltinModels(Registry<Model>& registry) {
  for (const ModelType& type : BuiltinModelTypes()) RETURN_IF_ERROR(registry.Register(type.name, type.factory));
  return absl::OkStatus();
}

namespace {

constexpr int64_t kMaxCentres = int64_t{1} << 26;

config::Binding<MlpConfig> MakeKeys() {
  config::Binding<MlpConfig> b("An MLP classifier on synthetic Gaussian clusters.");
  b.Field("in_features", &MlpConfig::in_features, {.min = 1, .max = 1 << 24, .doc = "input features"});
  b.Field("hidden_sizes", &MlpConfig::hidden_sizes,
          {.min = 1, .max = 1 << 24, .max_length = 256, .doc = "width of each hidden layer (each Linear + GELU)"});
  b.Field("num_classes", &MlpConfig::num_classes, {.min = 2, .max = 1 << 24, .doc = "classes (clusters)"});
  b.Field("data_seed", &MlpConfig::data_seed,
          {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of the clusters and samples; `null`: derived from train.seed"});
  b.Field("init_seed", &MlpConfig::init_seed,
          {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of parameter init; `null`: derived from train.seed"});
  b.Field("cluster_std", &MlpConfig::cluster_std, {.min = 0, .max = 1e6, .exclusive_min = true, .doc = "standard deviation of a sample around its centre"});
  b.Field("centre_scale", &MlpConfig::centre_scale, {.min = 0, .max = 1e6, .exclusive_min = true, .doc = "standard deviation of the cluster centres"});
  return b;
}

}  // namespace

const config::Binding<MlpConfig>& Mlp::Keys() {
  static const auto* const keys = new config::Binding<MlpConfig>(MakeKeys());
  return *keys;
}

Mlp::Mlp(MlpConfig config) : config_(std::move(config)) {
  std::mt19937_64 rng(static_cast<uint64_t>(config_.data_seed) * 7919 + 17);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(config_.centre_scale));
  centres_.resize(static_cast<size_t>(config_.num_classes * config_.in_features));
  for (float& c : centres_) c = normal(rng);
}

absl::StatusOr<std::unique_ptr<Model>> Mlp::FromJson(const nlohmann::json& node) {
  ASSIGN_OR_RETURN(MlpConfig c, ReadModelKeys(Keys(), node));
  // The cluster centres are a table of num_classes × in_features floats.
  if (c.num_classes * c.in_features > kMaxCentres) {
    return absl::InvalidArgumentError(StrCat("models.MLP: num_classes ", c.num_classes, " x in_features ", c.in_features,
                                             " cluster-centre coordinates; at most ", kMaxCentres, " are supported"));
  }
  return std::make_unique<Mlp>(std::move(c));
}

absl::StatusOr<graph::Graph> Mlp::BuildGraph(int64_t batch) const {
  if (batch < 1) return absl::InvalidArgumentError(StrCat("models.MLP: batch size ", batch, " must be >= 1"));
  graph::GraphBuilder b;
  graph::Sym h = b.Input("x", {DType::kF32, Shape{batch, config_.in_features}});
  graph::Sym labels = b.Input("labels", {DType::kI64, Shape{batch}});
  int64_t fan_in = config_.in_features;
  int64_t tensor_id = 0;
  std::vector<int64_t> sizes = config_.hidden_sizes;
  sizes.push_back(config_.num_classes);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto scope = b.Scope(StrCat("fc", i + 1), static_cast<int64_t>(i));
    const double std = 1.0 / std::sqrt(static_cast<double>(fan_in));
    graph::Sym w = b.Variable("weight", {fan_in, sizes[i]}, graph::InitRule::Normal(0, std, config_.init_seed, tensor_id++));
    graph::Sym bias = b.Variable("bias", {sizes[i]}, graph::InitRule::Zeros());
    h = graph::Matmul(h, w) + bias;
    if (i + 1 < sizes.size()) h = graph::Gelu(h);
    fan_in = sizes[i];
  }
  b.MarkLoss(graph::ReduceMean(graph::SparseSoftmaxCrossEntropy(h, labels)));
  return b.Finish();
}

absl::Status Mlp::FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const {
  if (input != "x" && input != "labels") return absl::NotFoundError(StrCat("models.MLP has no input '", input, "'"));
  const Shape& shape = out.meta().shape;
  const bool is_x = input == "x";
  if (out.dtype() != (is_x ? DType::kF32 : DType::kI64) || shape.rank() != (is_x ? 2 : 1) ||
      (is_x && shape[1] != config_.in_features)) {
    return absl::InvalidArgumentError(StrCat("models.MLP input '", input, "' is ",
                                             is_x ? StrCat("f32 (batch, ", config_.in_features, ")") : "i64 (batch,)",
                                             ", the tensor to fill is ", out.meta().ToString()));
  }
  const int64_t batch = shape[0];
  // Both inputs draw from the same stream, so x and labels agree.
  std::mt19937_64 rng(static_cast<uint64_t>(config_.data_seed) * 1000003 + static_cast<uint64_t>(iteration) * 7 + 1);
  std::uniform_int_distribution<int64_t> pick(0, config_.num_classes - 1);
  std::normal_distribution<float> noise(0.0f, static_cast<float>(config_.cluster_std));
  std::vector<int64_t> labels(static_cast<size_t>(batch));
  std::vector<float> xs(static_cast<size_t>(batch * config_.in_features));
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t c = pick(rng);
    labels[static_cast<size_t>(n)] = c;
    for (int64_t f = 0; f < config_.in_features; ++f) {
      xs[static_cast<size_t>(n * config_.in_features + f)] =
          centres_[static_cast<size_t>(c * config_.in_features + f)] + noise(rng);
    }
  }
  Tensor target = out;
  if (is_x) return target.CopyFrom(Tensor::FromVector(Shape{batch, config_.in_features}, xs));
  return target.CopyFrom(Tensor::FromVector(Shape{batch}, labels));
}

}  // namespace tessera::models
