#pragma once
// models.BERT: BERT pre-training (masked LM + next-sentence prediction), as
// Devlin et al. and Hugging Face's BertForPreTraining, built from nn/ layers
// and trained on text (train/text_data.h reads data/bert_dataset.h).
//
// Graph (B batch, T = seq_length, C = hidden_size, V = vocab_size,
// P = max_predictions_per_seq):
//   inputs (all hinted (S(0), B), batch split over data parallel):
//     input_ids, token_type_ids, attention_mask   (B, T) i64 (mask: 1 = real token)
//     masked_lm_positions  (B, P, T) f32   row p one-hot at the p-th masked position,
//                                          all zero for an unused slot
//     masked_lm_labels     (B, P) i64      the original token of slot p (0 when unused)
//     masked_lm_weights    (B, P) f32      1 for a used slot, 0 otherwise
//     masked_lm_mean_count (B) f32         in every row, the used slots of the
//                                          iteration's whole batch (all its
//                                          micro-batches) over its rows
//     next_sentence_labels (B) i64         0: B follows A; 1: B is random (add_binary_head)
//   h = drop(LN(word(ids) + position(arange(T)) + token_type(types)))      layer 0
//   h = encoder.layer.{i}(h, mask) for i < num_layers   post-LN TransformerLayer,
//                                           bidirectional, exact (erf) GELU
//   MLM (layer -1): g = masked_lm_positions @ h (B, P, C), the masked rows only
//     (as BERT's gather_indexes: the head and its V-wide logits run on P rows per
//     sample, not T); t = LN(gelu(dense(g))); logits = t @ wordᵀ + bias (tied
//     decoder, vocabulary parallel); mlm_loss = Σ w·ce / Σ mean_count over the
//     batch: Σ w·ce / Σ w of one batch, and under gradient accumulation the
//     mean over the micro-batches is still the whole batch's Σ w·ce / Σ w
//     (Megatron-LM and LiBai divide each micro-batch by its own Σ w).
//   NSP (layer -1): pooled = tanh(pooler.dense(h[:, 0])); logits = seq_relationship
//     (pooled) (B, 2); nsp_loss = mean cross-entropy.
//   loss = mlm_loss + nsp_loss (mlm_loss alone without add_binary_head); both
//   parts are fetched. The evaluation graph also takes sample_weights (B)
//   f32 (models/model.h) and fetches, weighted by them, mlm_loss_sum /
//   mlm_loss_weight (per masked slot), nsp_loss_sum / nsp_loss_weight (per
//   sample), mlm_correct / mlm_count and nsp_correct / nsp_count: a
//   prediction is correct when the label's logit is the row's maximum (a
//   tie counts as correct).
//
// Parameter names: Hugging Face's outside the layers (embeddings.word_embeddings,
// embeddings.position_embeddings, embeddings.token_type_embeddings,
// embeddings.LayerNorm, pooler.dense, cls.predictions.transform.dense,
// cls.predictions.transform.LayerNorm, cls.predictions.bias,
// cls.seq_relationship); inside encoder.layer.{i} Tessera's TransformerLayer
// names (attn.c_attn (C, 3, C), attn.c_proj, ln_1, mlp.c_fc, mlp.c_proj,
// ln_2), whose weights are stored (in, out). Hugging Face's
// BertForPreTraining weights load (train.load_weight) and export (`tessera
// export`) through HuggingFaceTensors(). Init as Hugging Face: weights N(0,
// initializer_range²), biases 0, LayerNorm weights 1; but the [PAD] row of
// word_embeddings is drawn as the others (as LiBai's), where Hugging Face
// zeroes it (a padded position is masked as a key: the row only moves the
// tied [PAD] logit).
//
// Data: text only (dataloader.data_prefix with tokenization.tokenizer
// "bert"); the masking and sentence-pair keys (masked_lm_prob,
// short_seq_prob, max_predictions_per_seq) live here because they shape the
// model's inputs. Config keys: Bert::Keys() (docs/config.md lists them).

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/schema.h"
#include "models/model.h"
#include "nlohmann/json.hpp"

namespace tessera::models {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_layers = 12;
  int64_t num_attention_heads = 12;
  std::optional<int64_t> ffn_hidden_size;  // unset: 4 · hidden_size
  int64_t max_seq_length = 512;            // positions of the position embedding
  std::optional<int64_t> seq_length;       // unset: max_seq_length
  int64_t num_tokentypes = 2;
  double hidden_dropout_prob = 0.1;     // embeddings, attention output, MLP output
  double attention_dropout_prob = 0.1;  // attention probabilities
  bool fused_attention = false;         // one flash_attention_masked op per layer (ops/attention.cc)
  bool bias_gelu_fusion = false;        // dense + bias + GELU as one matmul_bias_gelu op (MLPs, MLM head)
  double layernorm_epsilon = 1e-12;
  double initializer_range = 0.02;
  bool add_binary_head = true;  // next-sentence prediction
  int64_t max_predictions_per_seq = 20;
  double masked_lm_prob = 0.15;
  double short_seq_prob = 0.1;
  int64_t init_seed = 1234;
  int64_t dropout_seed = 4321;

  int64_t ffn() const { return ffn_hidden_size.value_or(4 * hidden_size); }
  int64_t seq() const { return seq_length.value_or(max_seq_length); }
};

class Bert final : public Model {
 public:
  // `config` must pass Validate (CHECKed); FromJson checks a config node.
  explicit Bert(BertConfig config);
  static absl::StatusOr<std::unique_ptr<Model>> FromJson(const nlohmann::json& node);
  static absl::Status Validate(const BertConfig& config);
  static const config::Binding<BertConfig>& Keys();

  absl::StatusOr<graph::Graph> BuildGraph(int64_t batch) const override;
  // Dropout off; input sample_weights (batch,); fetches the weighted pairs
  // mlm_loss_sum / _weight and nsp_loss_sum / _weight, and the accuracy
  // counts (models/model.h).
  absl::StatusOr<graph::Graph> BuildEvalGraph(int64_t batch) const override;
  // eval_loss = eval_mlm_loss + eval_nsp_loss (without the binary head, the
  // former alone), as the training loss.
  std::vector<std::string> eval_loss_terms() const override;
  // BERT reads text only: FailedPrecondition.
  absl::Status FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const override;
  int64_t num_layers() const override { return config_.num_layers; }
  std::optional<TextInputs> text_inputs() const override;
  // BertForPreTraining's names ("bert." inside the encoder): torch Linear
  // weights transposed, query, key and value stacked as c_attn (C, 3, C);
  // the MLM decoder (weight and bias) tied to the word embedding and
  // cls.predictions.bias.
  std::vector<HfTensor> HuggingFaceTensors() const override;
  // BertForPreTraining's (exact GELU, absolute positions, [PAD] = 0).
  std::optional<nlohmann::json> HuggingFaceConfig() const override;

  const BertConfig& config() const { return config_; }

 private:
  absl::StatusOr<graph::Graph> Build(int64_t batch, bool eval) const;
  BertConfig config_;
};

}  // namespace tessera::models
