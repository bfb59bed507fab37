#pragma once
// A trainable model as the trainer sees it: it builds its logical graph (one
// marked loss) for a batch size and fills the graph inputs it declares with
// its own (synthetic, seeded) data, or reads text (TextInputs).
//
// Fetches the trainer reads: "loss" (the marked loss) and "grad_norm"; any
// other scalar fetch of the training graph is logged under its name
// (metrics.jsonl). Of the evaluation graph, summed over all its batches:
// pairs "<m>_sum" / "<m>_weight", reported as eval_<m> = Σ sum / Σ weight,
// and pairs "<m>_correct" / "<m>_count", reported as eval_<m>_accuracy;
// other scalars are averaged over the batches (eval_<name>). eval_loss is
// the sum of the eval values of eval_loss_terms() (eval_ppl = exp of it for
// GPT-style models). The evaluation graph may declare the input
// kSampleWeights, f32 (batch,): 1 for each sample evaluated, 0 for the rows
// that only pad the last batch of a whole-split evaluation, which the
// weighted pairs then leave out. Models are built from the config node
// `model` by `_target_` (e.g. "models.MLP") through a Registry<Model> that the
// caller owns and fills with RegisterBuiltinModels. Model methods are const
// and may be called from any thread.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/registry.h"
#include "core/schema.h"
#include "core/tensor.h"
#include "graph/graph.h"
#include "nlohmann/json.hpp"

namespace tessera::models {

// The evaluation graph's per-sample weights (see above).
inline constexpr char kSampleWeights[] = "sample_weights";

class Model {
 public:
  virtual ~Model() = default;
  // The graph with its inputs, variables and one loss; metrics may be fetched.
  virtual absl::StatusOr<graph::Graph> BuildGraph(int64_t batch) const = 0;
  // The graph evaluation runs: the same inputs, variables (names, shapes,
  // layouts) and loss, without training-only randomness (dropout off).
  virtual absl::StatusOr<graph::Graph> BuildEvalGraph(int64_t batch) const { return BuildGraph(batch); }
  // The evaluation metrics whose sum is eval_loss (see above).
  virtual std::vector<std::string> eval_loss_terms() const { return {"loss"}; }
  // Writes the data of graph input `input` for `iteration` into `out`
  // (preallocated with the input's meta). Deterministic in (seed, iteration).
  virtual absl::Status FillBatch(int64_t iteration, std::string_view input, const Tensor& out) const = 0;
  // How many layers the model's layer_idx values range over (0 .. n-1): the
  // count LiBai's pipeline stage assignment divides.
  virtual int64_t num_layers() const = 0;

  // A language model that can read text data (train/text_data.h):
  //   kGpt: inputs "input_ids" and "labels", i64 (batch, seq_length) token
  //     ids below vocab_size, contiguous windows of the corpus; the model
  //     also has data of its own (FillBatch) for runs without text.
  //   kBert: BERT's pre-training inputs (models/bert.h), built by
  //     data/bert_dataset.h with the masking options below; text only.
  // nullopt: the model reads only its own data.
  struct TextInputs {
    enum class Kind { kGpt, kBert };
    Kind kind = Kind::kGpt;
    int64_t seq_length = 0;
    int64_t vocab_size = 0;
    // kBert:
    int64_t max_predictions_per_seq = 0;
    double masked_lm_prob = 0;
    double short_seq_prob = 0;
    bool next_sentence = false;  // the model reads next_sentence_labels
  };
  virtual std::optional<TextInputs> text_inputs() const { return std::nullopt; }

  // The model's variables in Hugging Face's layout (`train.load_weight` of a
  // model.safetensors, `tessera export`): each variable's graph name, its
  // name in Hugging Face's model.safetensors and its shape there. Plain: the
  // same element count and row-major bytes (trailing axes may be joined).
  // Converted: Hugging Face holds the transpose (a torch Linear's (out, in)
  // weight of Tessera's (in, out)), and/or several tensors stacked on one
  // of Tessera's axes (BERT's query, key and value as c_attn). Empty: the
  // model has no Hugging Face counterpart.
  struct HfTensor {
    std::string name;                     // the variable's graph name
    std::string hf_name;                  // its Hugging Face name (the first part's, with more_parts)
    Shape hf_shape;                       // its shape there (each part's)
    bool transposed = false;              // each part is the 2-D transpose of Tessera's
    std::vector<std::string> more_parts;  // stacked after hf_name on Tessera's axis stack_axis
    int64_t stack_axis = 0;
    // Hugging Face tensors with the same values where a file holds them (a
    // head tied to this embedding); a file where they differ is refused.
    std::vector<std::string> tied;

    // A plain entry; set the other members for a converted one.
    static HfTensor Of(std::string name, std::string hf_name, Shape hf_shape) {
      HfTensor t;
      t.name = std::move(name);
      t.hf_name = std::move(hf_name);
      t.hf_shape = std::move(hf_shape);
      return t;
    }
    bool converted() const { return transposed || !more_parts.empty(); }
    // Tessera's shape of a converted tensor.
    Shape ModelShape() const {
      std::vector<int64_t> dims = hf_shape.dims();
      if (transposed) std::reverse(dims.begin(), dims.end());
      if (!more_parts.empty()) dims.insert(dims.begin() + stack_axis, static_cast<int64_t>(1 + more_parts.size()));
      return Shape(dims);
    }
  };
  virtual std::vector<HfTensor> HuggingFaceTensors() const { return {}; }
  // transformers' config.json of the same model (`tessera export` to a
  // directory); nullopt without a Hugging Face counterpart.
  virtual std::optional<nlohmann::json> HuggingFaceConfig() const { return std::nullopt; }
};

// A model kind: its `_target_` name, its keys under `model` (declared once,
// with the struct they fill), and the factory that builds it from a
// `model` node (resolved or not: the factory checks it against `keys`).
struct ModelType {
  std::string name;
  config::Section keys;
  Registry<Model>::Factory factory;
};

// A model's config from its `model` node: checked against `keys` (unknown
// keys, types, ranges; messages say "model.<key>"), defaults filled in.
template <typename T>
absl::StatusOr<T> ReadModelKeys(const config::Binding<T>& keys, const nlohmann::json& node) {
  if (!node.is_object()) return absl::InvalidArgumentError("config key 'model' expects an object");
  nlohmann::json args = node;
  args.erase("_target_");
  absl::StatusOr<nlohmann::json> resolved = config::Resolve(keys.section(), args, {}, "model");
  if (!resolved.ok()) return resolved.status();
  return keys.Read(*resolved);
}

// Every model of models/ ("models.BERT", "models.GPT2", "models.MLP").
const std::vector<ModelType>& BuiltinModelTypes();

// Registers every model of BuiltinModelTypes() into `registry`.
[[nodiscard]] absl::Status RegisterBuiltinModels(Registry<Model>& registry);

}  // namespace tessera::models
