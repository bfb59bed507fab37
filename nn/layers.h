#pragma once
// Basic layers in global view (see nn/module.h for the hint convention, how
// modules reach the builder, names and randomness): Linear, Embedding,
// VocabEmbedding, LayerNorm, Dropout. Shapes in comments: B batch, T
// sequence, C features. Not thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nn/module.h"

namespace tessera::nn {

// LiBai's Linear parallel modes (`parallel="col" | "row" | "data"`).
enum class Parallel : uint8_t {
  kColumn,  // weight (B, S(1)), bias (B, S(0)): output features split over tp; y is S(last) over tp
  kRow,     // weight (B, S(0)), bias (B, B): input features split; x @ W is P over tp, made B for the bias
  kData,    // everything (B, B)
};
absl::StatusOr<Parallel> ParseParallel(std::string_view text);  // "col", "row", "data"
std::string_view ParallelName(Parallel parallel);

struct LinearOptions {
  Parallel parallel = Parallel::kData;
  bool bias = true;
  int64_t layer_idx = 0;
  double init_std = 0.02;  // weight ~ N(0, init_std^2); bias zeros
};

// y = x @ W + b with W stored (in, out), as Hugging Face's Conv1D (GPT-2's
// layout). x (..., in) of rank >= 2 -> y (..., out); inputs of rank > 2 are
// flattened to (rows, in) around the matmul (a copy each way: callers on a
// hot path pass 2-D inputs). Parameters "weight" (in, out), "bias" (out).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Sym Forward(const Sym& x);
  Sym operator()(const Sym& x) { return Forward(x); }
  // x @ W only, for callers that fuse the bias into the next op (bias_gelu).
  Sym ForwardWithoutBias(const Sym& x);
  // GELU(x @ W + b), `approximate` "none" (erf) or "tanh"; needs the bias.
  // fused: one matmul_bias_gelu op (the bias and GELU as the GEMM's
  // epilogue); else x @ W, then bias_gelu in the caller's scope.
  Sym ForwardGelu(const Sym& x, const std::string& approximate, bool fused);

  Sym weight() const { return parameter("weight"); }
  Sym bias() const { return options_.bias ? parameter("bias") : Sym(); }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  const LinearOptions& options() const { return options_; }

 private:
  enum class Epilogue { kNone, kBias, kBiasGelu };
  Sym Apply(const Sym& x, Epilogue epilogue, const std::string& approximate = "");
  int64_t in_, out_;
  LinearOptions options_;
};

struct EmbeddingOptions {
  int64_t layer_idx = 0;
  double init_std = 0.02;  // weight ~ N(0, init_std^2)
};

// y = weight[ids]: ids (...) i32/i64 -> (..., dim). Parameter "weight"
// (num_embeddings, dim), data parallel (B, B) (LiBai's Embedding; GPT-2's wpe).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, EmbeddingOptions options = {});
  Sym Forward(const Sym& ids);
  Sym operator()(const Sym& ids) { return Forward(ids); }
  Sym weight() const { return parameter("weight"); }

 protected:
  Embedding(int64_t num_embeddings, int64_t dim, EmbeddingOptions options, NdSbp weight_sbp);
};

// Embedding with the vocabulary split over tensor parallel: weight
// (vocab, dim) hinted (B, S(0)); the embedding op's S(0), B -> P signature
// makes each rank look up its own rows (zeros elsewhere) and the output a
// partial sum over tp. GPT-2's wte, also read by LMLogits (tied head).
class VocabEmbedding : public Embedding {
 public:
  VocabEmbedding(int64_t vocab_size, int64_t dim, EmbeddingOptions options = {});
};

struct LayerNormOptions {
  double eps = 1e-5;
  int64_t layer_idx = 0;
};

// Layer normalisation over the last axis; parameters "weight" (ones) and
// "bias" (zeros), both (C,), (B, B).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t hidden, LayerNormOptions options = {});
  Sym Forward(const Sym& x);
  Sym operator()(const Sym& x) { return Forward(x); }

 private:
  LayerNormOptions options_;
};

// y = x * keep / (1 - rate) through the dropout op, whose mask is a pure
// function of (seed, tensor_id, step, global element index): the same under
// any layout, different every iteration, regenerated (not stored) for the
// backward. Every call of a Dropout module is its own site with its own
// stream: tensor_id = StreamKey("<full name>#<call index>"), seed =
// seeds().dropout. rate 0 is the identity (no op emitted).
class Dropout : public Module {
 public:
  explicit Dropout(double rate, int64_t layer_idx = 0);
  Sym Forward(const Sym& x);
  Sym operator()(const Sym& x) { return Forward(x); }
  double rate() const { return rate_; }
  // For an op that drops internally what Forward would drop (the fused
  // attention): the dropout op's attributes for the next call (rate, seed,
  // tensor_id; the call counts as one of Forward's), under the op's names
  // "dropout_rate", "seed" and "tensor_id"; rate 0 when the rate is 0.
  ops::AttrMap NextDrawAttrs();

 private:
  double rate_;
  int64_t calls_ = 0;
};

}  // namespace tessera::nn
