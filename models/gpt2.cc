#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <type_traits>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "graph/builder.h"
#include "models/markov_chain.h"
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
          c.hidden_size, c.num_attention_heads, c.ffn(),
          nn::TransformerLayerOptions{.causal = true,
                                      .attention_dropout_prob = c.attention_dropout_prob,
                                      .output_dropout_prob = c.output_dropout_prob,
                                      .layernorm_epsilon = c.layernorm_epsilon,
                                      .layer_idx = i,
                                      .init_std = c.initializer_range,
                                      .output_init_std = output_std,
                                      .fused_attention = c.fused_attention,
                                      .bias_gelu_fusion = c.bias_gelu_fusion}));
      RegisterModule(StrCat("h.", i), *blocks_.back());
    }
    RegisterModule("ln_f", ln_f_);
    RegisterModule("lm_head", head_);  // no parameters: tied to wte
    RegisterModule("loss", loss_);
  }

  // input_ids, labels (B, T) i64 -> the mean loss (scalar). With
  // sample_weights (B,) f32 (evaluation), also fetches loss_sum = Σ w·loss
  // and loss_weight = Σ w over the tokens (models/model.h).
  nn::Sym Forward(const nn::Sym& input_ids, const nn::Sym& labels, const nn::Sym& sample_weights = nn::Sym()) {
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
    if (!h.valid()) return nn::Sym();  // the builder holds the error (e.g. a parameter too large)
    const int64_t C = h.shape()[2];
    const nn::Sym logits = head_(graph::Reshape(h, Shape{B * T, C}), wte_.weight());  // (B·T, V)
    if (!sample_weights.valid()) return loss_(logits, graph::Reshape(labels, Shape{B * T}));
    const nn::ParallelCrossEntropyLoss::Weighted loss =
        loss_.Forward(logits, labels, graph::Reshape(sample_weights, Shape{B, 1}));
    if (!loss.mean.valid()) return nn::Sym();
    b->MarkFetch("loss_sum", loss.weighted_sum);
    b->MarkFetch("loss_weight", loss.weight);
    return loss.mean;
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

// Largest sizes the schema admits: far past any real GPT, small enough that
// sizes derived from them stay well inside 64 bits.
constexpr double kMaxVocab = 2147483647.0;  // token ids fit in int32
constexpr double kMaxWidth = 1 << 20;
constexpr double kMaxLayers = 1024;
constexpr double kMaxSequence = 1 << 24;

config::Binding<Gpt2Config> MakeKeys() {
  config::Binding<Gpt2Config> b("A GPT-2 language model (Hugging Face's parameter names) on a synthetic Markov chain.");
  b.Field("vocab_size", &Gpt2Config::vocab_size, {.min = 2, .max = kMaxVocab, .doc = "vocabulary size V"});
  b.Field("hidden_size", &Gpt2Config::hidden_size, {.min = 1, .max = kMaxWidth, .doc = "width C of the residual stream"});
  b.Field("num_layers", &Gpt2Config::num_layers, {.min = 1, .max = kMaxLayers, .doc = "transformer layers"});
  b.Field("num_attention_heads", &Gpt2Config::num_attention_heads,
          {.min = 1, .max = kMaxWidth, .doc = "attention heads; must divide hidden_size"});
  b.Field("ffn_hidden_size", &Gpt2Config::ffn_hidden_size,
          {.min = 1, .max = 4 * kMaxWidth, .doc = "MLP inner width; `null`: 4 × hidden_size"});
  b.Field("max_seq_length", &Gpt2Config::max_seq_length,
          {.min = 1, .max = kMaxSequence, .doc = "positions of the position embedding (wpe)"});
  b.Field("seq_length", &Gpt2Config::seq_length,
          {.min = 1, .max = kMaxSequence, .doc = "tokens per training sequence T; `null`: max_seq_length"});
  b.Field("embedding_dropout_prob", &Gpt2Config::embedding_dropout_prob,
          {.min = 0, .max = 1, .exclusive_max = true, .doc = "dropout after the embeddings"});
  b.Field("attention_dropout_prob", &Gpt2Config::attention_dropout_prob,
          {.min = 0, .max = 1, .exclusive_max = true, .doc = "dropout on the attention probabilities"});
  b.Field("output_dropout_prob", &Gpt2Config::output_dropout_prob,
          {.min = 0, .max = 1, .exclusive_max = true, .doc = "dropout on each block's attention and MLP outputs"});
  b.Field("fused_attention", &Gpt2Config::fused_attention,
          {.doc = "attention as one flash_attention op per layer (the (T, T) scores never stored; a CUDA kernel on "
                  "GPUs), with the unfused attention's dropout masks"});
  b.Field("bias_gelu_fusion", &Gpt2Config::bias_gelu_fusion,
          {.doc = "each MLP's c_fc, its bias and the GELU as one matmul_bias_gelu op (the GEMM's epilogue; "
                  "cuBLASLt's on GPUs); false: the GEMM, then bias_gelu (LiBai's bias_gelu_fusion)"});
  b.Field("layernorm_epsilon", &Gpt2Config::layernorm_epsilon,
          {.min = 0, .max = 1, .exclusive_min = true, .doc = "LayerNorm epsilon"});
  b.Field("initializer_range", &Gpt2Config::initializer_range,
          {.min = 0, .max = 10, .doc = "standard deviation of the weights' normal init"});
  b.Field("use_scaled_init_for_output_weights", &Gpt2Config::use_scaled_init_for_output_weights,
          {.doc = "output projections' std divided by sqrt(2 · num_layers), as GPT-2"});
  b.Field("init_seed", &Gpt2Config::init_seed,
          {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of parameter init; `null`: derived from train.seed"});
  b.Field("dropout_seed", &Gpt2Config::dropout_seed,
          {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of dropout masks; `null`: derived from train.seed"});
  b.Field("data_seed", &Gpt2Config::data_seed,
          {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of the Markov chain and its samples; `null`: derived from train.seed"});
  b.Field("markov_successors", &Gpt2Config::markov_successors,
          {.min = 1, .max = 30, .doc = "successors per token in the synthetic chain (probabilities ∝ 2^-k); at most vocab_size"});
  return b;
}

}  // namespace

Gpt2::Gpt2(Gpt2Config config)
    : config_(std::move(config)),
      chain_(MarkovChain::Options{
          .vocab_size = config_.vocab_size, .successors = config_.markov_successors, .seed = config_.data_seed}) {
  const absl::Status valid = Validate(config_);
  TESSERA_CHECK(valid.ok(), std::string(valid.message()));
}

absl::Status Gpt2::Validate(const Gpt2Config& c) {
  auto fail = [](auto... parts) { return absl::InvalidArgumentError(StrCat("models.GPT2: ", parts...)); };
  if (c.vocab_size < 2) return fail("vocab_size must be >= 2, got ", c.vocab_size);
  if (c.hidden_size < 1 || c.num_layers < 1 || c.num_attention_heads < 1 || c.ffn() < 1) {
    return fail("hidden_size, num_layers, num_attention_heads and ffn_hidden_size must be >= 1");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return fail("hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ", c.num_attention_heads);
  }
  if (c.max_seq_length < 1 || c.seq() < 1 || c.seq() > c.max_seq_length) {
    return fail("seq_length ", c.seq(), " must be in [1, max_seq_length = ", c.max_seq_length, "]");
  }
  for (const auto& [name, p] : {std::pair{"embedding_dropout_prob", c.embedding_dropout_prob},
                                std::pair{"attention_dropout_prob", c.attention_dropout_prob},
                                std::pair{"output_dropout_prob", c.output_dropout_prob}}) {
    if (!(p >= 0 && p < 1)) return fail(name, " must be in [0, 1), got ", p);
  }
  if (!(c.layernorm_epsilon > 0) || !(c.initializer_range >= 0)) {
    return fail("layernorm_epsilon must be > 0 and initializer_range >= 0");
  }
  return MarkovChain::Validate(
      {.vocab_size = c.vocab_size, .successors = c.markov_successors, .seed = c.data_seed}, "models.GPT2: ");
}

const config::Binding<Gpt2Config>& Gpt2::Keys() {
  static const auto* const keys = new config::Binding<Gpt2Config>(MakeKeys());
  return *keys;
}

absl::StatusOr<std::unique_ptr<Model>> Gpt2::FromJson(const nlohmann::json& node) {
  ASSIGN_OR_RETURN(const Gpt2Config c, ReadModelKeys(Keys(), node));
  RETURN_IF_ERROR(Validate(c));
  return std::make_unique<Gpt2>(c);
}

absl::StatusOr<graph::Graph> Gpt2::Build(int64_t batch, bool eval) const {
  if (batch < 1) return absl::InvalidArgumentError(StrCat("models.GPT2: batch size ", batch, " must be >= 1"));
  graph::GraphBuilder b;
  const TensorMeta tokens{DType::kI64, Shape{batch, config_.seq()}};
  const graph::Sym input_ids = b.Input("input_ids", tokens);
  const graph::Sym labels = b.Input("labels", tokens);
  b.SetHints(input_ids, std::nullopt, nn::BatchSplit());
  b.SetHints(labels, std::nullopt, nn::BatchSplit());
  graph::Sym sample_weights;
  if (eval) {
    sample_weights = b.Input(kSampleWeights, TensorMeta{DType::kF32, Shape{batch}});
    b.SetHints(sample_weights, std::nullopt, nn::BatchSplit());
  }
  Gpt2Config c = config_;
  if (eval) c.embedding_dropout_prob = c.attention_dropout_prob = c.output_dropout_prob = 0;
  Gpt2Network network(c);
  b.MarkLoss(network.Forward(input_ids, labels, sample_weights));
  return b.Finish();
}

absl::StatusOr<graph::Graph> Gpt2::BuildGraph(int64_t batch) const { return Build(batch, /*eval=*/false); }
absl::StatusOr<graph::Graph> Gpt2::BuildEvalGraph(int64_t batch) const { return Build(batch, /*eval=*/true); }

absl::Status Gpt2::FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const {
  const int64_t T = config_.seq();
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
  chain_.Fill(iteration, offset, out);
  return absl::OkStatus();
}

std::optional<nlohmann::json> Gpt2::HuggingFaceConfig() const {
  const Gpt2Config& c = config_;
  return nlohmann::json{{"architectures", {"GPT2LMHeadModel"}},
                        {"model_type", "gpt2"},
                        {"vocab_size", c.vocab_size},
                        {"n_positions", c.max_seq_length},
                        {"n_ctx", c.max_seq_length},
                        {"n_embd", c.hidden_size},
                        {"n_layer", c.num_layers},
                        {"n_head", c.num_attention_heads},
                        {"n_inner", c.ffn()},
                        {"activation_function", "gelu_new"},
                        {"embd_pdrop", c.embedding_dropout_prob},
                        {"attn_pdrop", c.attention_dropout_prob},
                        {"resid_pdrop", c.output_dropout_prob},
                        {"layer_norm_epsilon", c.layernorm_epsilon},
                        {"initializer_range", c.initializer_range},
                        {"tie_word_embeddings", true},
                        {"torch_dtype", "float32"}};
}

std::vector<Model::HfTensor> Gpt2::HuggingFaceTensors() const {
  const int64_t V = config_.vocab_size, C = config_.hidden_size, F = config_.ffn(), P = config_.max_seq_length;
  // GPT2LMHeadModel's files prefix these with "transformer." and hold the
  // head, lm_head.weight, tied to wte.
  std::vector<HfTensor> out = {HfTensor::Of("wte.weight", "wte.weight", Shape{V, C}),
                               HfTensor::Of("wpe.weight", "wpe.weight", Shape{P, C})};
  out[0].tied = {"lm_head.weight"};
  const auto same = [&](const std::string& name, Shape shape) { out.push_back(HfTensor::Of(name, name, shape)); };
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string h = StrCat("h.", i, ".");
    same(h + "ln_1.weight", Shape{C});
    same(h + "ln_1.bias", Shape{C});
    same(h + "attn.c_attn.weight", Shape{C, 3 * C});  // Tessera's (C, 3, C)
    same(h + "attn.c_attn.bias", Shape{3 * C});       // Tessera's (3, C)
    same(h + "attn.c_proj.weight", Shape{C, C});
    same(h + "attn.c_proj.bias", Shape{C});
    same(h + "ln_2.weight", Shape{C});
    same(h + "ln_2.bias", Shape{C});
    same(h + "mlp.c_fc.weight", Shape{C, F});
    same(h + "mlp.c_fc.bias", Shape{F});
    same(h + "mlp.c_proj.weight", Shape{F, C});
    same(h + "mlp.c_proj.bias", Shape{C});
  }
  same("ln_f.weight", Shape{C});
  same("ln_f.bias", Shape{C});
  return out;
}

}  // namespace tessera::models
