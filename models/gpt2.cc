#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <type_traits>
#include <string>
#include <utility>

#include "core/philox.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "graph/builder.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/transformer.h"

namespace tessera::models {
namespace {

// The GPT-2 module tree (names as Hugging Face's GPT2Model).
class Gpt2Network : public nn::Module {
 public:
  explicit Gpt2Network(const Gpt2Config& c)
      : Module(graph::kUnassignedLayer),
        wte_(c.vocab_size, c.hidden_size, {.layer_idx = 0, .init_std = c.initializer_range}),
        wpe_(c.max_seq_length, c.hidden_size, {.layer_idx = 0, .init_std = c.initializer_range}),
        drop_(c.embedding_dropout_prob, /*layer_idx=*/0),
        ln_f_(c.hidden_size, {.eps = c.layernorm_epsilon, .layer_idx = -1}) {
    set_seeds({.init = c.init_seed, .dropout = c.dropout_seed});
    RegisterModule("wte", wte_);
    RegisterModule("wpe", wpe_);
    RegisterModule("drop", drop_);
    const double output_std = c.use_scaled_init_for_output_weights
                                  ? c.initializer_range / std::sqrt(2.0 * static_cast<double>(c.num_layers))
                                  : c.initializer_range;
    for (int64_t i = 0; i < c.num_layers; ++i) {
      blocks_.push_back(std::make_unique<nn::TransformerLayer>(
          c.hidden_size, c.num_attention_heads, c.ffn_hidden_size,
          nn::TransformerLayerOptions{.causal = true,
                                      .attention_dropout_prob = c.attention_dropout_prob,
                                      .output_dropout_prob = c.output_dropout_prob,
                                      .layernorm_epsilon = c.layernorm_epsilon,
                                      .layer_idx = i,
                                      .init_std = c.initializer_range,
                                      .output_init_std = output_std}));
      RegisterModule(StrCat("h.", i), *blocks_.back());
    }
    RegisterModule("ln_f", ln_f_);
    RegisterModule("lm_head", head_);  // no parameters: tied to wte
    RegisterModule("loss", loss_);
  }

  // input_ids, labels (B, T) i64 -> the mean loss (scalar).
  nn::Sym Forward(const nn::Sym& input_ids, const nn::Sym& labels) {
    nn::GraphBuilder* b = Prepare(input_ids);
    if (b == nullptr) return nn::Sym();
    const int64_t B = input_ids.shape()[0], T = input_ids.shape()[1];
    nn::Sym h;
    {
      auto scope = b->Scope("embeddings", /*layer_idx=*/0);
      const nn::Sym positions = b->Apply("arange", {}, {{"n", T}, {"dtype", DType::kI64}});  // (T,)
      h = wte_(input_ids) + wpe_(positions);  // (B, T, C); wte's lookup is P over tp
      b->SetHints(h, std::nullopt, nn::BatchSplit());  // the residual stream: (S(0), B), as in the blocks
      h = drop_(h);
    }
    for (auto& block : blocks_) h = (*block)(h);
    // Last stage: ln_f, the head and the loss have layer_idx -1.
    h = ln_f_(h);
    const int64_t C = h.shape()[2];
    const nn::Sym logits = head_(graph::Reshape(h, Shape{B * T, C}), wte_.weight());  // (B·T, V)
    return loss_(logits, graph::Reshape(labels, Shape{B * T}));
  }

 private:
  nn::VocabEmbedding wte_;
  nn::Embedding wpe_;
  nn::Dropout drop_;
  std::vector<std::unique_ptr<nn::TransformerLayer>> blocks_;
  nn::LayerNorm ln_f_;
  nn::LMLogits head_;
  nn::ParallelCrossEntropyLoss loss_;
};

// Philox streams of the synthetic data (the last counter word).
constexpr uint32_t kChainStream = 1;
constexpr uint32_t kSampleStream = 2;

double Uniform01(uint32_t bits) { return static_cast<double>(bits >> 8) * (1.0 / 16777216.0); }

template <typename T>
absl::Status ReadKey(const nlohmann::json& node, const char* key, T* out) {
  if (!node.contains(key) || node.at(key).is_null()) return absl::OkStatus();
  const nlohmann::json& v = node.at(key);
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return absl::InvalidArgumentError(StrCat("models.GPT2: ", key, " must be a bool"));
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer() && !(v.is_number() && std::floor(v.get<double>()) == v.get<double>())) {
      return absl::InvalidArgumentError(StrCat("models.GPT2: ", key, " must be an integer, got ", v.dump()));
    }
  } else {
    if (!v.is_number()) return absl::InvalidArgumentError(StrCat("models.GPT2: ", key, " must be a number, got ", v.dump()));
  }
  *out = v.get<T>();
  return absl::OkStatus();
}

}  // namespace

Gpt2::Gpt2(Gpt2Config config) : config_(std::move(config)) {
  const absl::Status valid = Validate(config_);
  TESSERA_CHECK(valid.ok(), std::string(valid.message()));
  const int64_t V = config_.vocab_size, K = config_.markov_successors;
  const PhiloxKey key = MakePhiloxKey(static_cast<uint64_t>(config_.data_seed));
  successors_.resize(static_cast<size_t>(V * K));
  for (int64_t v = 0; v < V; ++v) {
    std::set<int64_t> taken;
    uint32_t attempt = 0;
    for (int64_t k = 0; k < K; ++k) {
      int64_t next;
      do {
        const auto r = Philox4x32(key, static_cast<uint32_t>(v), static_cast<uint32_t>(k), attempt++, kChainStream);
        next = static_cast<int64_t>(r[0] % static_cast<uint32_t>(V));
      } while (taken.contains(next));
      taken.insert(next);
      successors_[static_cast<size_t>(v * K + k)] = next;
    }
  }
  double total = 0;
  for (int64_t k = 0; k < K; ++k) total += std::ldexp(1.0, -static_cast<int>(k));
  double acc = 0;
  for (int64_t k = 0; k < K; ++k) {
    acc += std::ldexp(1.0, -static_cast<int>(k)) / total;
    cumulative_.push_back(acc);
  }
  cumulative_.back() = 1.0;
}

absl::Status Gpt2::Validate(const Gpt2Config& c) {
  auto fail = [](auto... parts) { return absl::InvalidArgumentError(StrCat("models.GPT2: ", parts...)); };
  if (c.vocab_size < 2) return fail("vocab_size must be >= 2, got ", c.vocab_size);
  if (c.hidden_size < 1 || c.num_layers < 1 || c.num_attention_heads < 1 || c.ffn_hidden_size < 1) {
    return fail("hidden_size, num_layers, num_attention_heads and ffn_hidden_size must be >= 1");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return fail("hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ", c.num_attention_heads);
  }
  if (c.seq_length < 1 || c.seq_length > c.max_seq_length) {
    return fail("seq_length ", c.seq_length, " must be in [1, max_seq_length = ", c.max_seq_length, "]");
  }
  for (const auto& [name, p] : {std::pair{"embedding_dropout_prob", c.embedding_dropout_prob},
                                std::pair{"attention_dropout_prob", c.attention_dropout_prob},
                                std::pair{"output_dropout_prob", c.output_dropout_prob}}) {
    if (!(p >= 0 && p < 1)) return fail(name, " must be in [0, 1), got ", p);
  }
  if (!(c.layernorm_epsilon > 0) || !(c.initializer_range >= 0)) {
    return fail("layernorm_epsilon must be > 0 and initializer_range >= 0");
  }
  if (c.markov_successors < 1 || c.markov_successors > c.vocab_size || c.markov_successors > 30) {
    return fail("markov_successors must be in [1, min(vocab_size, 30)], got ", c.markov_successors);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Gpt2::FromJson(const nlohmann::json& node) {
  static const std::vector<std::string> kKeys = {
      "_target_",         "vocab_size",       "hidden_size",         "num_layers",
      "num_attention_heads", "ffn_hidden_size", "max_seq_length",     "seq_length",
      "embedding_dropout_prob", "attention_dropout_prob", "output_dropout_prob", "layernorm_epsilon",
      "initializer_range", "use_scaled_init_for_output_weights", "init_seed", "dropout_seed",
      "data_seed",        "markov_successors"};
  for (const auto& [key, value] : node.items()) {
    if (std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end()) continue;
    const std::optional<std::string> closest = ClosestMatch(key, kKeys);
    return absl::InvalidArgumentError(StrCat("models.GPT2: unknown key '", key, "'",
                                             closest ? StrCat("; did you mean '", *closest, "'?") : std::string()));
  }
  Gpt2Config c;
  c.ffn_hidden_size = 0;
  c.seq_length = 0;
  RETURN_IF_ERROR(ReadKey(node, "vocab_size", &c.vocab_size));
  RETURN_IF_ERROR(ReadKey(node, "hidden_size", &c.hidden_size));
  RETURN_IF_ERROR(ReadKey(node, "num_layers", &c.num_layers));
  RETURN_IF_ERROR(ReadKey(node, "num_attention_heads", &c.num_attention_heads));
  RETURN_IF_ERROR(ReadKey(node, "ffn_hidden_size", &c.ffn_hidden_size));
  RETURN_IF_ERROR(ReadKey(node, "max_seq_length", &c.max_seq_length));
  RETURN_IF_ERROR(ReadKey(node, "seq_length", &c.seq_length));
  RETURN_IF_ERROR(ReadKey(node, "embedding_dropout_prob", &c.embedding_dropout_prob));
  RETURN_IF_ERROR(ReadKey(node, "attention_dropout_prob", &c.attention_dropout_prob));
  RETURN_IF_ERROR(ReadKey(node, "output_dropout_prob", &c.output_dropout_prob));
  RETURN_IF_ERROR(ReadKey(node, "layernorm_epsilon", &c.layernorm_epsilon));
  RETURN_IF_ERROR(ReadKey(node, "initializer_range", &c.initializer_range));
  RETURN_IF_ERROR(ReadKey(node, "use_scaled_init_for_output_weights", &c.use_scaled_init_for_output_weights));
  RETURN_IF_ERROR(ReadKey(node, "init_seed", &c.init_seed));
  RETURN_IF_ERROR(ReadKey(node, "dropout_seed", &c.dropout_seed));
  RETURN_IF_ERROR(ReadKey(node, "data_seed", &c.data_seed));
  RETURN_IF_ERROR(ReadKey(node, "markov_successors", &c.markov_successors));
  if (c.ffn_hidden_size == 0) c.ffn_hidden_size = 4 * c.hidden_size;
  if (c.seq_length == 0) c.seq_length = c.max_seq_length;
  RETURN_IF_ERROR(Validate(c));
  return std::make_unique<Gpt2>(std::move(c));
}

absl::StatusOr<graph::Graph> Gpt2::BuildGraph(int64_t batch) const {
  if (batch < 1) return absl::InvalidArgumentError(StrCat("models.GPT2: batch size ", batch, " must be >= 1"));
  graph::GraphBuilder b;
  const TensorMeta tokens{DType::kI64, Shape{batch, config_.seq_length}};
  const graph::Sym input_ids = b.Input("input_ids", tokens);
  const graph::Sym labels = b.Input("labels", tokens);
  b.SetHints(input_ids, std::nullopt, nn::BatchSplit());
  b.SetHints(labels, std::nullopt, nn::BatchSplit());
  Gpt2Network network(config_);
  b.MarkLoss(network.Forward(input_ids, labels));
  return b.Finish();
}

std::vector<int64_t> Gpt2::SampleSequence(int64_t iteration, int64_t sample) const {
  const int64_t V = config_.vocab_size, K = config_.markov_successors, T = config_.seq_length;
  const PhiloxKey key = MakePhiloxKey(static_cast<uint64_t>(config_.data_seed));
  // Draw t of the sample: Philox counter (t, sample, iteration, stream).
  auto draw = [&](int64_t t) {
    return Philox4x32(key, static_cast<uint32_t>(t), static_cast<uint32_t>(sample), static_cast<uint32_t>(iteration),
                      kSampleStream)[0];
  };
  std::vector<int64_t> tokens(static_cast<size_t>(T + 1));
  tokens[0] = static_cast<int64_t>(draw(0) % static_cast<uint32_t>(V));
  for (int64_t t = 1; t <= T; ++t) {
    const double u = Uniform01(draw(t));
    int64_t k = 0;
    while (k + 1 < K && u >= cumulative_[static_cast<size_t>(k)]) ++k;
    tokens[static_cast<size_t>(t)] = successors_[static_cast<size_t>(tokens[static_cast<size_t>(t - 1)] * K + k)];
  }
  return tokens;
}

absl::Status Gpt2::FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const {
  const int64_t T = config_.seq_length;
  int64_t offset = 0;
  if (input == "labels") {
    offset = 1;
  } else if (input != "input_ids") {
    return absl::NotFoundError(StrCat("models.GPT2 has no input '", input, "'"));
  }
  if (out.dtype() != DType::kI64 || out.shape().rank() != 2 || out.shape()[1] != T) {
    return absl::InvalidArgumentError(StrCat("models.GPT2: input '", input, "' must be i64 (batch, ", T, "), got ",
                                             out.meta().ToString()));
  }
  int64_t* data = out.data<int64_t>();
  for (int64_t j = 0; j < out.shape()[0]; ++j) {
    const std::vector<int64_t> tokens = SampleSequence(iteration, j);
    for (int64_t t = 0; t < T; ++t) data[j * T + t] = tokens[static_cast<size_t>(t + offset)];
  }
  return absl::OkStatus();
}

}  // namespace tessera::models
