#pragma once
// The synthetic token stream a language model trains on when the job has no
// text data (models.GPT2 without dataloader.data_prefix): a fixed random
// Markov chain over the vocabulary.
//
// Each token v has `successors` distinct successors; successor k (the k-th
// distinct draw of v's Philox stream under `seed`) follows with probability
// ∝ 2^-k, so a model's loss can fall from ln V to the chain's entropy (about
// 1.1 nats for 4 successors). Sample j of iteration i is a sequence of
// `length` tokens (the first uniform), every draw a Philox function of
// (seed, i, j, position): a batch is layout-invariant, row j being the same
// whatever batch size is filled. Successors are computed on demand (a table
// would take V × successors words). Immutable: thread-safe.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace tessera::models {

class MarkovChain {
 public:
  struct Options {
    int64_t vocab_size = 2;
    int64_t successors = 4;  // in [1, min(vocab_size, 30)]
    int64_t seed = 0;
  };
  // InvalidArgument naming the option out of range (`prefix` starts it).
  static absl::Status Validate(const Options& options, std::string_view prefix);
  // `options` must pass Validate (CHECKed).
  explicit MarkovChain(Options options);

  // The k-th successor of token v.
  int64_t Successor(int64_t v, int64_t k) const;
  // The `length` tokens of sample `sample` of `iteration`.
  std::vector<int64_t> Sample(int64_t iteration, int64_t sample, int64_t length) const;
  // Fills `out`, i64 (rows, T), with rows [0, rows) of `iteration`: tokens
  // [offset, offset + T) of each sample of T + 1 tokens (offset 0: inputs,
  // 1: the next-token labels).
  void Fill(int64_t iteration, int64_t offset, const Tensor& out) const;

 private:
  Options options_;
  std::vector<double> cumulative_;  // cumulative_[k] = P(successor index <= k)
};

}  // namespace tessera::models
