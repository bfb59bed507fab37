#pragma once
// GPT training samples over an indexed dataset (DESIGN §11).
//
// The documents of one split (SplitDocuments) are read as one token stream:
// each document's sequences back to back, documents back to back, as stored
// (preprocessing appended the end-of-document id to each document, so the
// model sees the boundaries). With T = seq_length, sample s is the window
// [s·T, s·T + T + 1) of that stream: T inputs and, shifted by one, T labels;
// consecutive samples share one token, so every token but the first is a
// label exactly once. size() = floor((tokens - 1) / T); a trailing partial
// window is dropped.
//
// Nothing is materialised: the stream of a document range is one contiguous
// slice of PREFIX.bin (IndexedDataset guarantees back-to-back sequences), so
// a sample is one bounds-checked copy. The order in which samples are read is
// the sampler's business (data/sampler.h), not this class's; unlike Megatron,
// documents are not shuffled here and windows do not change across epochs.
//
// Thread-safe (immutable). Borrows the IndexedDataset, which must outlive it.

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/indexed_dataset.h"

namespace tessera::data {

struct GptDatasetOptions {
  int64_t seq_length = 0;           // T >= 1; a sample holds T + 1 tokens
  std::string splits = "969,30,1";  // Megatron's train,valid,test weights
  DatasetSplit split = DatasetSplit::kTrain;
  int64_t vocab_size = 0;  // > 0: Sample refuses ids outside [0, vocab_size)
};

class GptDataset {
 public:
  // InvalidArgument for a bad seq_length or splits string; FailedPrecondition
  // when the chosen split holds fewer than T + 1 tokens (no whole sample),
  // naming the split, its documents and token count. Other splits being empty
  // is no error.
  [[nodiscard]] static absl::StatusOr<GptDataset> Make(const IndexedDataset& dataset, const GptDatasetOptions& options);

  // Number of samples.
  int64_t size() const { return num_samples_; }
  int64_t seq_length() const { return seq_length_; }
  // Tokens per sample: seq_length() + 1.
  int64_t sample_length() const { return seq_length_ + 1; }
  DocumentRange documents() const { return documents_; }
  // Tokens in the split's stream.
  int64_t num_tokens() const { return num_tokens_; }

  // Writes sample `index` (T + 1 token ids) into `out`. OutOfRange for an
  // index outside [0, size()), InvalidArgument when out.size() != T + 1 or
  // an id lies outside the options' vocabulary (IndexedDataset::CheckIds).
  [[nodiscard]] absl::Status Sample(int64_t index, std::span<int64_t> out) const;

 private:
  GptDataset(const IndexedDataset* dataset, int64_t seq_length, int64_t vocab_size, DocumentRange documents,
             int64_t first_token, int64_t num_tokens);

  const IndexedDataset* dataset_;  // borrowed
  int64_t seq_length_;
  int64_t vocab_size_;
  DocumentRange documents_;
  int64_t first_token_;  // where the split's stream starts in PREFIX.bin, in tokens
  int64_t num_tokens_;
  int64_t num_samples_;
};

}  // namespace tessera::data
