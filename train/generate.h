#pragma once
// Text generation from a trained GPT-2 (models/gpt2.h) checkpoint, on CPU,
// batch 1, with a key/value cache, on one rank or split over several as
// training's tensor parallelism (GeneratorOptions::tensor_parallel_size).
//
// The forward is the training graph's, op for op, through the same
// registered CPU kernels (layer_norm, matmul, bias_add, bias_gelu with the
// tanh GELU, fused_scale_causal_softmax, add), with every dropout off; the
// attention's per-head GEMMs and a decoding step's matrix-vector products,
// which it cuts over the pool itself, go through ops/cpu/matmul.h's GEMM
// driver. Only the bookkeeping the graph has no op for is plain C++: the
// embedding rows' sum, copying the new positions' k and v into the cache
// and moving heads between layouts.
//
// Shapes: V vocabulary, C hidden, H heads, D = C / H, F MLP width,
// P = max_positions (model.max_seq_length), M tokens fed in one forward.
// Each layer keeps K and V caches of (H, P, D): a forward of M new tokens at
// positions [n, n + M) computes q, k, v of the new tokens only, appends k
// and v at rows [n, n + M), and attends over rows [0, n + M) with the causal
// mask aligned to the last key (a query at position t sees keys <= t). One
// decoding step therefore costs O(n · C) in attention plus the weights'
// O(C² + C·F + V·C), never a pass over the prefix. Prompts are fed in chunks
// of up to GeneratorOptions::prefill_chunk tokens (GEMMs instead of
// matrix-vector products), then one token per step.
//
// Context limit: a sequence (prompt + generated) never exceeds P tokens. A
// prompt longer than P is an error; generation that reaches P tokens stops
// with StopReason::kContextFull.
//
// Sampling, per new token (Hugging Face's order): logits / temperature,
// top-k, then top-p (nucleus), then one draw. temperature 0 is greedy: the
// argmax, the lowest id among ties. top_k keeps exactly k tokens, ranked by
// logit then by lower id (so top_k = 1 is greedy even on ties); top_p keeps
// the smallest prefix of that ranking whose probability reaches top_p (at
// least one token). The draw is a Philox function of (seed, index of the new
// token): the same seed gives the same tokens for the same logits. (Another
// thread count may cut the GEMMs differently, and logits that differ in
// their last bits can, rarely, pick another token.)

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/thread_pool.h"
#include "data/tokenizer.h"
#include "models/gpt2.h"
#include "nlohmann/json.hpp"

namespace tessera {

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // >= 0
  double temperature = 1.0;     // >= 0; 0 = greedy (top_k, top_p and seed unused)
  int64_t top_k = 0;            // >= 0; 0 = off
  double top_p = 1.0;           // in (0, 1]; 1 = off
  uint64_t seed = 0;
  // Generation ends when this token is drawn (it is not returned), e.g. the
  // tokenizer's <|endoftext|>. Must lie in the vocabulary.
  std::optional<int64_t> stop_token = std::nullopt;
  // Only ids below this are ever chosen: for a tokenizer smaller than the
  // model's (padded) vocabulary. In [1, V]; unset = V.
  std::optional<int64_t> vocab_limit = std::nullopt;
};

enum class StopReason {
  kMaxNewTokens,  // max_new_tokens generated
  kStopToken,     // GenerateOptions::stop_token drawn
  kContextFull,   // prompt + generated reached max_positions
};
std::string_view StopReasonName(StopReason reason);  // "max_new_tokens", "stop_token", "context_full"

struct Generation {
  std::vector<int64_t> ids;  // the new tokens, without the stop token
  StopReason stop = StopReason::kMaxNewTokens;
};

struct GeneratorOptions {
  ThreadPool* pool = nullptr;  // borrowed, for the kernels; null = the calling thread only
  // Ranks the model is split over, as training's tensor parallelism
  // (Megatron's layout: heads and MLP columns per rank, row-parallel
  // projections all-reduced, the vocabulary split for the embedding and
  // the head). Each rank holds only its slices of the weights and its heads'
  // KV cache, and runs on a thread of its own (with T > 1 the pool is not
  // used); the ranks meet in a shared-memory group. At most the number of
  // heads, which it need not divide (ranks hold whole heads, some one more).
  int64_t tensor_parallel_size = 1;
  int64_t prefill_chunk = 64;  // >= 1: prompt tokens per forward
  // The run's resolved config (its model and tokenization sections) in
  // place of the checkpoint's: required for Hugging Face weights, which
  // carry none.
  std::optional<nlohmann::json> run_config = std::nullopt;
};

// A GPT-2 loaded from a checkpoint, with its KV cache and work buffers, all
// allocated once by Open. Generate and Logits each start a new sequence
// (the cache is reset, not reallocated).
//
// Not thread-safe: one sequence at a time, from one thread at a time (the
// pool's threads run inside the calls). The weights are owned; the pool is
// borrowed and must outlive the Generator.
class Generator {
 public:
  // `path`: a checkpoint directory (one holding index.json), a training
  // output directory, whose latest checkpoint is taken, or Hugging Face
  // GPT-2 weights (train/checkpoint.h; options.run_config required). Errors name the
  // path and what is wrong: no checkpoint, a run that is not models.GPT2, a
  // tensor missing or of another shape or dtype than the run's model config
  // gives.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Generator>> Open(const std::filesystem::path& path,
                                                                       GeneratorOptions options = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Feeds `prompt` and generates up to options.max_new_tokens tokens.
  // InvalidArgument for an empty prompt, an id outside [0, V) (naming its
  // index), bad options; OutOfRange for a prompt longer than max_positions.
  [[nodiscard]] absl::StatusOr<Generation> Generate(std::span<const int64_t> prompt, const GenerateOptions& options);

  // The logits (V) of the last position after feeding `ids` from an empty
  // cache, `tokens_per_step` tokens per forward (1: pure decoding steps).
  // Errors as Generate's for the ids.
  [[nodiscard]] absl::StatusOr<std::vector<float>> Logits(std::span<const int64_t> ids, int64_t tokens_per_step = 1);

  const models::Gpt2Config& model_config() const;
  int64_t vocab_size() const { return model_config().vocab_size; }
  int64_t max_positions() const { return model_config().max_seq_length; }
  // The checkpoint read, its iteration, and the run's resolved config.
  const std::filesystem::path& checkpoint_dir() const;
  int64_t iteration() const;
  const nlohmann::json& run_config() const;

 private:
  struct State;
  explicit Generator(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The tokenizer of a run (its config's `tokenization` section, paths
// expanded as core/file_util.h's ExpandPath). FailedPrecondition when the
// run names none.
[[nodiscard]] absl::StatusOr<std::unique_ptr<data::Tokenizer>> LoadRunTokenizer(const nlohmann::json& run_config);

struct TextGenerateOptions {
  // vocab_limit is capped at the tokenizer's size (a model's vocabulary may
  // be padded past it); an unset stop_token becomes the tokenizer's
  // end-of-document token (<|endoftext|>) when stop_at_end_of_text.
  GenerateOptions generate = {};
  bool stop_at_end_of_text = true;
  GeneratorOptions generator = {};
};

struct TextGeneration {
  std::string text;  // the generated continuation only (bytes: may end inside a UTF-8 sequence)
  int64_t prompt_tokens = 0;
  Generation generation;
};

// The whole `tessera generate` path: opens `path` (as Generator::Open),
// encodes `prompt` with the run's tokenizer, generates, decodes. An empty
// prompt starts from the end-of-document token, as GPT-2's unconditional
// samples do. FailedPrecondition when the run has no tokenizer or one larger
// than the model's vocabulary; otherwise Open's and Generate's errors.
[[nodiscard]] absl::StatusOr<TextGeneration> GenerateText(const std::filesystem::path& path, std::string_view prompt,
                                                          const TextGenerateOptions& options);

}  // namespace tessera
