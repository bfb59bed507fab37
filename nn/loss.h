#pragma once
// The language-model head and loss in global view: LMLogits (tied to the word
// embedding) and ParallelCrossEntropyLoss (vocabulary parallel). Both have no
// parameters; GPT-2 puts them on the last stage (layer_idx -1). Not
// thread-safe.
//
// With the word embedding hinted (B, S(0)) (VocabEmbedding), the logits
// x @ wteᵀ come out split on the vocabulary axis (matmul B × S(0)ᵀ -> S(1)),
// and the loss is composed of ops with vocabulary-split signatures
// (docs/ops.md): reduce_max S(1) -> P(max), cross_entropy_partials
// S(1), B, B -> P, P, so no rank ever holds the full (N, V) logits.

#include <cstdint>

#include "nn/module.h"

namespace tessera::nn {

// logits = x @ word_embeddingsᵀ: x (..., C) of rank >= 2 and the (V, C) word
// embedding (VocabEmbedding::weight(), so the head is tied) -> (..., V).
// Pass 2-D x to avoid reshape copies of the (large) logits.
class LMLogits : public Module {
 public:
  explicit LMLogits(int64_t layer_idx = -1) : Module(layer_idx) {}
  Sym Forward(const Sym& x, const Sym& word_embeddings);
  Sym operator()(const Sym& x, const Sym& word_embeddings) { return Forward(x, word_embeddings); }
};

// The mean over all tokens of -log softmax(logits)[label]: logits (..., V),
// labels (...) i32/i64 -> a scalar. Composed as
//   row_max = reduce_max(logits, axes [1], keepdim)               (N, 1)
//   sumexp, label_logit = cross_entropy_partials(logits, row_max, labels)
//   loss = mean(log(sumexp) - label_logit)
// The mean divides by the LOGICAL token count (reduce_mean under a batch
// split divides each shard's sum by it), i.e. it is the mean over the global
// batch × sequence, whatever the data-parallel layout (DESIGN §4).
class ParallelCrossEntropyLoss : public Module {
 public:
  explicit ParallelCrossEntropyLoss(int64_t layer_idx = -1) : Module(layer_idx) {}
  Sym Forward(const Sym& logits, const Sym& labels);
  Sym operator()(const Sym& logits, const Sym& labels) { return Forward(logits, labels); }
  // Forward's mean, with Σ w·loss and Σ w over the tokens, the weights
  // broadcast (numpy rules) to the labels' shape, e.g. (B, 1) per-sample
  // weights of (B, T) labels: a weighted mean that adds up across batches.
  // Labels may also be of any shape with N elements for 2-D logits (N, V).
  struct Weighted {
    Sym mean, weighted_sum, weight;
  };
  Weighted Forward(const Sym& logits, const Sym& labels, const Sym& weights);

 private:
  Sym Losses(GraphBuilder& b, const Sym& logits, const Sym& labels);
};

}  // namespace tessera::nn
