#pragma once
// models.GPT2: a GPT-2 language model built from nn/ layers, trained on a
// synthetic token stream.
//
// Graph (B batch, T = seq_length, C = hidden_size, V = vocab_size):
//   input_ids (B, T) i64, labels (B, T) i64      graph inputs, hinted (S(0), B)
//   h = drop(wte(input_ids) + wpe(arange(T)))    layer 0; the sum hinted (S(0), B) like
//                                                the blocks' residual stream (nn/module.h)
//   h = h.{i}(h) for i < num_layers              pre-LN TransformerLayer, layer i
//   logits = ln_f(h) @ wteᵀ                      tied head, (B·T, V), layer -1
//   loss = mean over B·T of cross-entropy(logits, labels)   vocabulary parallel, layer -1
//
// Parameter names and shapes are Hugging Face's GPT2Model (no "transformer."
// prefix, no separate lm_head: it is tied to wte):
//   wte.weight (V, C)  wpe.weight (max_seq_length, C)
//   h.{i}.ln_1.{weight,bias} (C)  h.{i}.attn.c_attn.weight (C, 3, C)*  h.{i}.attn.c_attn.bias (3, C)*
//   h.{i}.attn.c_proj.weight (C, C)  h.{i}.attn.c_proj.bias (C)  h.{i}.ln_2.{weight,bias} (C)
//   h.{i}.mlp.c_fc.weight (C, F)  h.{i}.mlp.c_fc.bias (F)  h.{i}.mlp.c_proj.weight (F, C)
//   h.{i}.mlp.c_proj.bias (C)  ln_f.{weight,bias} (C)
//   * HF's (C, 3C) and (3C) viewed with the same bytes (nn/transformer.h).
// Init as HF: weights N(0, initializer_range²) (output projections
// c_proj: / sqrt(2 · num_layers) when use_scaled_init_for_output_weights),
// biases 0, LayerNorm weights 1.
//
// Data without text (no dataloader.data_prefix): the synthetic Markov chain
// of models/markov_chain.h over the vocabulary (data_seed,
// markov_successors); sample j of iteration i has T + 1 tokens, input_ids =
// tokens [0, T), labels = tokens [1, T].
//
// Config keys (model.*): declared once, in Gpt2::Keys() with the Gpt2Config
// members they fill (docs/config.md lists them). The seeds left null derive
// from train.seed.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/schema.h"
#include "models/markov_chain.h"
#include "models/model.h"
#include "nlohmann/json.hpp"

namespace tessera::models {

struct Gpt2Config {
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t num_layers = 2;
  int64_t num_attention_heads = 4;
  std::optional<int64_t> ffn_hidden_size;  // unset: 4 · hidden_size
  int64_t max_seq_length = 32;
  std::optional<int64_t> seq_length;  // unset: max_seq_length
  double embedding_dropout_prob = 0;
  double attention_dropout_prob = 0;
  double output_dropout_prob = 0;
  bool fused_attention = false;  // one flash_attention op per layer (ops/attention.cc)
  bool bias_gelu_fusion = false;  // the MLP's c_fc + bias + GELU as one matmul_bias_gelu op
  double layernorm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool use_scaled_init_for_output_weights = true;
  int64_t init_seed = 1234;
  int64_t dropout_seed = 4321;
  int64_t data_seed = 0;
  int64_t markov_successors = 4;

  int64_t ffn() const { return ffn_hidden_size.value_or(4 * hidden_size); }
  int64_t seq() const { return seq_length.value_or(max_seq_length); }
};

class Gpt2 final : public Model {
 public:
  // `config` must pass Validate (CHECKed); FromJson checks a config node.
  explicit Gpt2(Gpt2Config config);
  static absl::StatusOr<std::unique_ptr<Model>> FromJson(const nlohmann::json& node);
  static absl::Status Validate(const Gpt2Config& config);
  // The `model` keys of models.GPT2 and the members they fill.
  static const config::Binding<Gpt2Config>& Keys();

  absl::StatusOr<graph::Graph> BuildGraph(int64_t batch) const override;
  // Dropout off; input sample_weights (batch,), fetches loss_sum and
  // loss_weight (models/model.h).
  absl::StatusOr<graph::Graph> BuildEvalGraph(int64_t batch) const override;
  // Inputs "input_ids" and "labels", i64 (batch, seq_length).
  absl::Status FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const override;

  int64_t num_layers() const override { return config_.num_layers; }
  // GPT2Model's names; c_attn as Hugging Face's Conv1D: (C, 3C) and (3C).
  std::vector<HfTensor> HuggingFaceTensors() const override;
  // GPT2LMHeadModel's (GELU "gelu_new", the tanh approximation, as here).
  std::optional<nlohmann::json> HuggingFaceConfig() const override;
  std::optional<TextInputs> text_inputs() const override {
    return TextInputs{.seq_length = config_.seq(), .vocab_size = config_.vocab_size};
  }

  const Gpt2Config& config() const { return config_; }
  // The synthetic data of a run without text.
  const MarkovChain& chain() const { return chain_; }

 private:
  absl::StatusOr<graph::Graph> Build(int64_t batch, bool eval) const;
  Gpt2Config config_;
  MarkovChain chain_;
};

}  // namespace tessera::models
