#include "models/bert.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "graph/builder.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/transformer.h"

namespace tessera::models {
namespace {

// embeddings.*: word (vocabulary parallel), position and token-type
// embeddings summed, LayerNorm, dropout. Layer 0.
class BertEmbeddings : public nn::Module {
 public:
  explicit BertEmbeddings(const BertConfig& c)
      : Module(0),
        word_(c.vocab_size, c.hidden_size, {.layer_idx = 0, .init_std = c.initializer_range}),
        position_(c.max_seq_length, c.hidden_size, {.layer_idx = 0, .init_std = c.initializer_range}),
        token_type_(c.num_tokentypes, c.hidden_size, {.layer_idx = 0, .init_std = c.initializer_range}),
        norm_(c.hidden_size, {.eps = c.layernorm_epsilon, .layer_idx = 0}),
        drop_(c.hidden_dropout_prob, 0) {
    RegisterModule("word_embeddings", word_);
    RegisterModule("position_embeddings", position_);
    RegisterModule("token_type_embeddings", token_type_);
    RegisterModule("LayerNorm", norm_);
    RegisterModule("dropout", drop_);
  }

  // ids, types (B, T) i64 -> (B, T, C).
  nn::Sym Forward(const nn::Sym& ids, const nn::Sym& types) {
    nn::GraphBuilder* b = Prepare(ids);
    if (b == nullptr) return nn::Sym();
    auto scope = EnterScope(*b);
    const int64_t T = ids.shape()[1];
    const nn::Sym positions = b->Apply("arange", {}, {{"n", T}, {"dtype", DType::kI64}});  // (T,)
    nn::Sym h = word_(ids) + position_(positions) + token_type_(types);                    // word's lookup is P over tp
    b->SetHints(h, std::nullopt, nn::BatchSplit());
    h = norm_(h);
    b->SetHints(h, std::nullopt, nn::BatchSplit());
    return drop_(h);
  }

  nn::Sym word_weight() const { return word_.weight(); }

 private:
  nn::VocabEmbedding word_;
  nn::Embedding position_, token_type_;
  nn::LayerNorm norm_;
  nn::Dropout drop_;
};

// cls.predictions: transform (dense, exact GELU, LayerNorm), the decoder
// tied to the word embedding, and its own bias (V) split like the
// vocabulary. Layer -1.
class MlmHead : public nn::Module {
 public:
  explicit MlmHead(const BertConfig& c)
      : Module(-1),
        dense_(c.hidden_size, c.hidden_size, {.layer_idx = -1, .init_std = c.initializer_range}),
        norm_(c.hidden_size, {.eps = c.layernorm_epsilon, .layer_idx = -1}),
        bias_gelu_fusion_(c.bias_gelu_fusion) {
    DeclareParameter({"bias", Shape{c.vocab_size}, nn::ParameterInit::Zeros(), nn::TensorParallelSplit(0)});
    RegisterModule("transform.dense", dense_);
    RegisterModule("transform.LayerNorm", norm_);
    RegisterModule("decoder", decoder_);
  }

  // x (N, C), the word embedding (V, C) -> logits (N, V), split on V over tp.
  nn::Sym Forward(const nn::Sym& x, const nn::Sym& word_embeddings) {
    nn::GraphBuilder* b = Prepare(x);
    if (b == nullptr) return nn::Sym();
    auto scope = EnterScope(*b);
    const nn::Sym t = norm_(dense_.ForwardGelu(x, "none", bias_gelu_fusion_));
    return graph::BiasAdd(decoder_(t, word_embeddings), parameter("bias"));
  }

 private:
  nn::Linear dense_;
  nn::LayerNorm norm_;
  nn::LMLogits decoder_;
  bool bias_gelu_fusion_;
};

// Per-row cross-entropy pieces of vocabulary-parallel logits (N, V) and
// labels (N): ce (N, 1) = log Σ exp - label logit, and label_logit (N, 1)
// = the label's logit minus the row maximum (0 exactly when the label holds
// the maximum).
struct RowLoss {
  nn::Sym ce, label_logit;
};
RowLoss CrossEntropyRows(nn::GraphBuilder& b, const nn::Sym& logits, const nn::Sym& labels) {
  const nn::Sym row_max = b.Apply("reduce_max", {logits}, {{"axes", std::vector<int64_t>{1}}, {"keepdim", true}});
  const std::vector<nn::Sym> parts = b.Op("cross_entropy_partials", {logits, row_max, labels});
  if (parts.size() != 2) return {};
  return {graph::Log(parts[0]) - parts[1], parts[1]};
}

// 1 where the label's logit is the row's maximum, else 0: (N, 1) f32.
nn::Sym Correct(const nn::Sym& label_logit) {
  return 1.0 - graph::Cast(graph::Cast(label_logit, DType::kBool), DType::kF32);
}

class BertNetwork : public nn::Module {
 public:
  explicit BertNetwork(const BertConfig& c)
      : Module(graph::kUnassignedLayer),
        config_(c),
        embeddings_(c),
        pooler_(c.hidden_size, c.hidden_size, {.layer_idx = -1, .init_std = c.initializer_range}),
        mlm_(c),
        nsp_(c.hidden_size, 2, {.layer_idx = -1, .init_std = c.initializer_range}) {
    set_seeds({.init = c.init_seed, .dropout = c.dropout_seed});
    RegisterModule("embeddings", embeddings_);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      layers_.push_back(std::make_unique<nn::TransformerLayer>(
          c.hidden_size, c.num_attention_heads, c.ffn(),
          nn::TransformerLayerOptions{.causal = false,
                                      .post_layernorm = true,
                                      .gelu_approximate = "none",
                                      .attention_dropout_prob = c.attention_dropout_prob,
                                      .output_dropout_prob = c.hidden_dropout_prob,
                                      .layernorm_epsilon = c.layernorm_epsilon,
                                      .layer_idx = i,
                                      .init_std = c.initializer_range,
                                      .output_init_std = c.initializer_range,
                                      .fused_attention = c.fused_attention,
                                      .bias_gelu_fusion = c.bias_gelu_fusion}));
      RegisterModule(StrCat("encoder.layer.", i), *layers_.back());
    }
    if (c.add_binary_head) RegisterModule("pooler.dense", pooler_);
    RegisterModule("cls.predictions", mlm_);
    if (c.add_binary_head) RegisterModule("cls.seq_relationship", nsp_);
  }

  struct Inputs {
    nn::Sym input_ids, token_type_ids, attention_mask, positions, labels, weights, mean_count, next_sentence;
    nn::Sym sample_weights;  // evaluation only (models/model.h)
  };

  // The loss; fetches mlm_loss / nsp_loss, and in evaluation (with
  // sample_weights) the weighted loss pairs and the accuracy counts.
  nn::Sym Forward(nn::GraphBuilder& b, const Inputs& in) {
    const bool eval = in.sample_weights.valid();
    const int64_t B = in.input_ids.shape()[0], C = config_.hidden_size, P = config_.max_predictions_per_seq;
    nn::Sym h = embeddings_.Forward(in.input_ids, in.token_type_ids);
    nn::Sym mask;
    {
      auto scope = b.Scope("embeddings", /*layer_idx=*/0);
      mask = graph::Cast(in.attention_mask, DType::kBool);
    }
    for (auto& layer : layers_) h = (*layer)(h, mask);
    if (!h.valid()) return nn::Sym();  // the builder holds the error
    auto scope = b.Scope("heads", /*layer_idx=*/-1);
    // Masked LM on the P selected rows of each sample.
    const nn::Sym gathered = graph::BatchMatmul(in.positions, h);  // (B, P, C)
    const nn::Sym logits = mlm_.Forward(graph::Reshape(gathered, Shape{B * P, C}), embeddings_.word_weight());
    const RowLoss mlm = CrossEntropyRows(b, logits, graph::Reshape(in.labels, Shape{B * P}));
    if (!mlm.ce.valid()) return nn::Sym();
    const nn::Sym weights = graph::Reshape(in.weights, Shape{B * P, 1});
    // Divided by the micro-batch's rows' share of the iteration's count, not
    // by its own count: the mean over the micro-batches is then the whole
    // batch's Σ w·ce / Σ w, whatever the micro-batching.
    const nn::Sym mlm_loss = graph::ReduceSum(mlm.ce * weights) / graph::ReduceSum(in.mean_count);
    b.MarkFetch("mlm_loss", mlm_loss);
    // Evaluation: sums over the samples evaluated (sample weight 1).
    const nn::Sym sample_weights = eval ? graph::Reshape(in.sample_weights, Shape{B, 1}) : nn::Sym();
    if (eval) {
      const nn::Sym used = graph::Reshape(in.weights * sample_weights, Shape{B * P, 1});
      const nn::Sym slots = graph::ReduceSum(used);  // both pairs' denominator, one value
      b.MarkFetch("mlm_loss_sum", graph::ReduceSum(mlm.ce * used));
      b.MarkFetch("mlm_loss_weight", slots);
      b.MarkFetch("mlm_correct", graph::ReduceSum(Correct(mlm.label_logit) * used));
      b.MarkFetch("mlm_count", slots);
    }
    if (!config_.add_binary_head) return mlm_loss;
    // Next-sentence prediction from [CLS].
    const nn::Sym first =
        b.Apply("slice", {h},
                {{"starts", std::vector<int64_t>{0, 0, 0}}, {"ends", std::vector<int64_t>{B, 1, C}}});  // (B, 1, C)
    const nn::Sym pooled = graph::Tanh(pooler_(graph::Reshape(first, Shape{B, C})));
    const RowLoss nsp = CrossEntropyRows(b, nsp_(pooled), in.next_sentence);  // (B, 1)
    if (!nsp.ce.valid()) return nn::Sym();
    const nn::Sym nsp_loss = graph::ReduceMean(nsp.ce);
    b.MarkFetch("nsp_loss", nsp_loss);
    if (eval) {
      const nn::Sym samples = graph::ReduceSum(sample_weights);
      b.MarkFetch("nsp_loss_sum", graph::ReduceSum(nsp.ce * sample_weights));
      b.MarkFetch("nsp_loss_weight", samples);
      b.MarkFetch("nsp_correct", graph::ReduceSum(Correct(nsp.label_logit) * sample_weights));
      b.MarkFetch("nsp_count", samples);
    }
    return mlm_loss + nsp_loss;
  }

 private:
  BertConfig config_;
  BertEmbeddings embeddings_;
  std::vector<std::unique_ptr<nn::TransformerLayer>> layers_;
  nn::Linear pooler_;
  MlmHead mlm_;
  nn::Linear nsp_;
};

constexpr double kMaxVocab = 2147483647.0;
constexpr double kMaxWidth = 1 << 20;
constexpr double kMaxLayers = 1024;
constexpr double kMaxSequence = 1 << 24;

config::Binding<BertConfig> MakeKeys() {
  config::Binding<BertConfig> b(
      "BERT pre-training (masked LM + next-sentence prediction, post-LN layers) on text read with the WordPiece "
      "tokenizer.");
  b.Field("vocab_size", &BertConfig::vocab_size, {.min = 5, .max = kMaxVocab, .doc = "vocabulary size V"});
  b.Field("hidden_size", &BertConfig::hidden_size, {.min = 1, .max = kMaxWidth, .doc = "width C of the hidden states"});
  b.Field("num_layers", &BertConfig::num_layers, {.min = 1, .max = kMaxLayers, .doc = "transformer layers"});
  b.Field("num_attention_heads", &BertConfig::num_attention_heads,
          {.min = 1, .max = kMaxWidth, .doc = "attention heads; must divide hidden_size"});
  b.Field("ffn_hidden_size", &BertConfig::ffn_hidden_size,
          {.min = 1, .max = 4 * kMaxWidth, .doc = "MLP inner width; `null`: 4 × hidden_size"});
  b.Field("max_seq_length", &BertConfig::max_seq_length,
          {.min = 5, .max = kMaxSequence, .doc = "positions of the position embedding"});
  b.Field("seq_length", &BertConfig::seq_length,
          {.min = 5,
           .max = kMaxSequence,
           .doc = "tokens per sample T ([CLS] A [SEP] B [SEP], padded); `null`: max_seq_length"});
  b.Field("num_tokentypes", &BertConfig::num_tokentypes,
          {.min = 2, .max = kMaxWidth, .doc = "rows of the token-type (segment) embedding"});
  b.Field(
      "hidden_dropout_prob", &BertConfig::hidden_dropout_prob,
      {.min = 0, .max = 1, .exclusive_max = true, .doc = "dropout after the embeddings, attention and MLP outputs"});
  b.Field("attention_dropout_prob", &BertConfig::attention_dropout_prob,
          {.min = 0, .max = 1, .exclusive_max = true, .doc = "dropout on the attention probabilities"});
  b.Field("fused_attention", &BertConfig::fused_attention,
          {.doc = "attention as one flash_attention_masked op per layer (the (T, T) scores never stored; a CUDA "
                  "kernel on GPUs), with the unfused attention's dropout masks"});
  b.Field("bias_gelu_fusion", &BertConfig::bias_gelu_fusion,
          {.doc = "each MLP's first Linear (and the MLM head's transform.dense), its bias and the GELU as one "
                  "matmul_bias_gelu op (the GEMM's epilogue; cuBLASLt's on GPUs); false: the GEMM, then bias_gelu "
                  "(LiBai's bias_gelu_fusion)"});
  b.Field("layernorm_epsilon", &BertConfig::layernorm_epsilon,
          {.min = 0, .max = 1, .exclusive_min = true, .doc = "LayerNorm epsilon"});
  b.Field("initializer_range", &BertConfig::initializer_range,
          {.min = 0, .max = 10, .doc = "standard deviation of the weights' normal init"});
  b.Field("add_binary_head", &BertConfig::add_binary_head,
          {.doc = "next-sentence prediction (pooler and seq_relationship); false: masked LM only, each sample one "
                  "segment (`[CLS] A [SEP]`, A a chunk of whole sentences; a split needs one document, not two)"});
  b.Field(
      "max_predictions_per_seq", &BertConfig::max_predictions_per_seq,
      {.min = 1, .max = kMaxSequence, .doc = "masked-LM slots P per sample (masked tokens beyond it are not chosen)"});
  b.Field("masked_lm_prob", &BertConfig::masked_lm_prob,
          {.min = 0, .max = 1, .exclusive_min = true, .doc = "fraction of a sample's tokens chosen for the masked LM"});
  b.Field("short_seq_prob", &BertConfig::short_seq_prob,
          {.min = 0, .max = 1, .doc = "probability of a shorter target length for a sample"});
  b.Field(
      "init_seed", &BertConfig::init_seed,
      {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of parameter init; `null`: derived from train.seed"});
  b.Field(
      "dropout_seed", &BertConfig::dropout_seed,
      {.min = 0, .derive_seed_from = "train.seed", .doc = "seed of dropout masks; `null`: derived from train.seed"});
  return b;
}

}  // namespace

Bert::Bert(BertConfig config) : config_(std::move(config)) {
  const absl::Status valid = Validate(config_);
  TESSERA_CHECK(valid.ok(), std::string(valid.message()));
}

absl::Status Bert::Validate(const BertConfig& c) {
  auto fail = [](auto... parts) { return absl::InvalidArgumentError(StrCat("models.BERT: ", parts...)); };
  if (c.vocab_size < 5) return fail("vocab_size must be >= 5 ([PAD], [UNK], [CLS], [SEP], [MASK]), got ", c.vocab_size);
  if (c.hidden_size < 1 || c.num_layers < 1 || c.num_attention_heads < 1 || c.ffn() < 1) {
    return fail("hidden_size, num_layers, num_attention_heads and ffn_hidden_size must be >= 1");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return fail("hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ", c.num_attention_heads);
  }
  if (c.seq() < 5 || c.seq() > c.max_seq_length) {
    return fail("seq_length ", c.seq(), " must be in [5, max_seq_length = ", c.max_seq_length, "]");
  }
  if (c.num_tokentypes < 2) return fail("num_tokentypes must be >= 2 (segments A and B), got ", c.num_tokentypes);
  if (c.max_predictions_per_seq < 1 || c.max_predictions_per_seq > c.seq() - 3) {
    return fail("max_predictions_per_seq ", c.max_predictions_per_seq, " must be in [1, seq_length - 3 = ", c.seq() - 3,
                "]");
  }
  for (const auto& [name, p] : {std::pair{"hidden_dropout_prob", c.hidden_dropout_prob},
                                std::pair{"attention_dropout_prob", c.attention_dropout_prob}}) {
    if (!(p >= 0 && p < 1)) return fail(name, " must be in [0, 1), got ", p);
  }
  if (!(c.masked_lm_prob > 0 && c.masked_lm_prob <= 1))
    return fail("masked_lm_prob must be in (0, 1], got ", c.masked_lm_prob);
  if (!(c.short_seq_prob >= 0 && c.short_seq_prob <= 1))
    return fail("short_seq_prob must be in [0, 1], got ", c.short_seq_prob);
  if (!(c.layernorm_epsilon > 0) || !(c.initializer_range >= 0)) {
    return fail("layernorm_epsilon must be > 0 and initializer_range >= 0");
  }
  return absl::OkStatus();
}

const config::Binding<BertConfig>& Bert::Keys() {
  static const auto* const keys = new config::Binding<BertConfig>(MakeKeys());
  return *keys;
}

absl::StatusOr<std::unique_ptr<Model>> Bert::FromJson(const nlohmann::json& node) {
  ASSIGN_OR_RETURN(const BertConfig c, ReadModelKeys(Keys(), node));
  RETURN_IF_ERROR(Validate(c));
  return std::make_unique<Bert>(c);
}

absl::StatusOr<graph::Graph> Bert::Build(int64_t batch, bool eval) const {
  if (batch < 1) return absl::InvalidArgumentError(StrCat("models.BERT: batch size ", batch, " must be >= 1"));
  const int64_t T = config_.seq(), P = config_.max_predictions_per_seq;
  graph::GraphBuilder b;
  const auto input = [&](const char* name, DType dtype, Shape shape) {
    const graph::Sym s = b.Input(name, TensorMeta{dtype, std::move(shape)});
    b.SetHints(s, std::nullopt, nn::BatchSplit());
    return s;
  };
  BertNetwork::Inputs in;
  in.input_ids = input("input_ids", DType::kI64, Shape{batch, T});
  in.token_type_ids = input("token_type_ids", DType::kI64, Shape{batch, T});
  in.attention_mask = input("attention_mask", DType::kI64, Shape{batch, T});
  in.positions = input("masked_lm_positions", DType::kF32, Shape{batch, P, T});
  in.labels = input("masked_lm_labels", DType::kI64, Shape{batch, P});
  in.weights = input("masked_lm_weights", DType::kF32, Shape{batch, P});
  in.mean_count = input("masked_lm_mean_count", DType::kF32, Shape{batch});
  if (config_.add_binary_head) in.next_sentence = input("next_sentence_labels", DType::kI64, Shape{batch});
  if (eval) in.sample_weights = input(kSampleWeights, DType::kF32, Shape{batch});
  BertConfig c = config_;
  if (eval) c.hidden_dropout_prob = c.attention_dropout_prob = 0;
  BertNetwork network(c);
  b.MarkLoss(network.Forward(b, in));
  return b.Finish();
}

absl::StatusOr<graph::Graph> Bert::BuildGraph(int64_t batch) const { return Build(batch, /*eval=*/false); }
absl::StatusOr<graph::Graph> Bert::BuildEvalGraph(int64_t batch) const { return Build(batch, /*eval=*/true); }

std::optional<nlohmann::json> Bert::HuggingFaceConfig() const {
  const BertConfig& c = config_;
  // Without the binary head the file holds no pooler and no
  // seq_relationship: BertForMaskedLM's tensors (its BertModel has no
  // pooler), which transformers would otherwise fill at random.
  return nlohmann::json{{"architectures", {c.add_binary_head ? "BertForPreTraining" : "BertForMaskedLM"}},
                        {"model_type", "bert"},
                        {"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"intermediate_size", c.ffn()},
                        {"hidden_act", "gelu"},
                        {"hidden_dropout_prob", c.hidden_dropout_prob},
                        {"attention_probs_dropout_prob", c.attention_dropout_prob},
                        {"max_position_embeddings", c.max_seq_length},
                        {"type_vocab_size", c.num_tokentypes},
                        {"initializer_range", c.initializer_range},
                        {"layer_norm_eps", c.layernorm_epsilon},
                        {"pad_token_id", 0},
                        {"position_embedding_type", "absolute"},
                        {"tie_word_embeddings", true},
                        {"torch_dtype", "float32"}};
}

std::vector<Model::HfTensor> Bert::HuggingFaceTensors() const {
  const int64_t V = config_.vocab_size, C = config_.hidden_size, F = config_.ffn();
  std::vector<HfTensor> out;
  // "bert." + name, the same shape
  const auto same = [&](const std::string& name, Shape shape) {
    out.push_back(HfTensor::Of(name, "bert." + name, std::move(shape)));
  };
  // A Linear: Hugging Face's (out, in) weight, Tessera's (in, out).
  const auto linear = [&](const std::string& name, const std::string& hf, int64_t in, int64_t out_features) {
    out.push_back(HfTensor::Of(name + ".weight", hf + ".weight", Shape{out_features, in}));
    out.back().transposed = true;
    out.push_back(HfTensor::Of(name + ".bias", hf + ".bias", Shape{out_features}));
  };
  const auto layer_norm = [&](const std::string& name, const std::string& hf) {
    out.push_back(HfTensor::Of(name + ".weight", hf + ".weight", Shape{C}));
    out.push_back(HfTensor::Of(name + ".bias", hf + ".bias", Shape{C}));
  };
  out.push_back(
      HfTensor::Of("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight", Shape{V, C}));
  out.back().tied = {"cls.predictions.decoder.weight"};
  same("embeddings.position_embeddings.weight", Shape{config_.max_seq_length, C});
  same("embeddings.token_type_embeddings.weight", Shape{config_.num_tokentypes, C});
  layer_norm("embeddings.LayerNorm", "bert.embeddings.LayerNorm");
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string t = StrCat("encoder.layer.", i, "."), hf = StrCat("bert.encoder.layer.", i, ".");
    const std::string self = hf + "attention.self.";
    // c_attn (C, 3, C) and (3, C): query, key, value stacked on axis 1 / 0.
    out.push_back(HfTensor::Of(t + "attn.c_attn.weight", self + "query.weight", Shape{C, C}));
    out.back().transposed = true;
    out.back().more_parts = {self + "key.weight", self + "value.weight"};
    out.back().stack_axis = 1;
    out.push_back(HfTensor::Of(t + "attn.c_attn.bias", self + "query.bias", Shape{C}));
    out.back().more_parts = {self + "key.bias", self + "value.bias"};
    linear(t + "attn.c_proj", hf + "attention.output.dense", C, C);
    layer_norm(t + "ln_1", hf + "attention.output.LayerNorm");
    linear(t + "mlp.c_fc", hf + "intermediate.dense", C, F);
    linear(t + "mlp.c_proj", hf + "output.dense", F, C);
    layer_norm(t + "ln_2", hf + "output.LayerNorm");
  }
  if (config_.add_binary_head) linear("pooler.dense", "bert.pooler.dense", C, C);
  linear("cls.predictions.transform.dense", "cls.predictions.transform.dense", C, C);
  layer_norm("cls.predictions.transform.LayerNorm", "cls.predictions.transform.LayerNorm");
  out.push_back(HfTensor::Of("cls.predictions.bias", "cls.predictions.bias", Shape{V}));
  out.back().tied = {"cls.predictions.decoder.bias"};
  if (config_.add_binary_head) linear("cls.seq_relationship", "cls.seq_relationship", C, 2);
  return out;
}

std::vector<std::string> Bert::eval_loss_terms() const {
  if (config_.add_binary_head) return {"mlm_loss", "nsp_loss"};
  return {"mlm_loss"};
}

absl::Status Bert::FillBatch(int64_t, std::string_view, const Tensor&) const {
  return absl::FailedPreconditionError(
      "models.BERT trains on text only: set dataloader.data_prefix and tokenization.tokenizer=bert");
}

std::optional<Model::TextInputs> Bert::text_inputs() const {
  return TextInputs{.kind = TextInputs::Kind::kBert,
                    .seq_length = config_.seq(),
                    .vocab_size = config_.vocab_size,
                    .max_predictions_per_seq = config_.max_predictions_per_seq,
                    .masked_lm_prob = config_.masked_lm_prob,
                    .short_seq_prob = config_.short_seq_prob,
                    .next_sentence = config_.add_binary_head};
}

}  // namespace tessera::models
