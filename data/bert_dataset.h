#pragma once
// BERT pre-training samples (masked LM + next-sentence prediction) over an
// indexed dataset whose sequences are sentences and whose documents are
// documents (`tessera preprocess` with sentence splitting and without an
// end-of-document id).
//
// Construction follows Google's create_pretraining_data.py, reshaped so that
// every sample is a pure function of (seed, sample index), hence resumable
// and the same under any parallel layout (DESIGN §4):
//   1. Make cuts each document of the split into chunks once: sentences are
//      gathered until they reach a target length (max_seq_length - 3, or with
//      probability short_seq_prob a uniform length in [2, max_seq_length - 3],
//      drawn per chunk from Philox keyed by the seed and (document, chunk)),
//      or the document ends. Sample i is chunk i, in document order.
//   2. Sample(i) draws from Philox keyed by the seed, counter (i, stream,
//      draw): A = the chunk's first a sentences (a uniform in [1, n-1]; all of
//      it when n = 1); B = the rest of the chunk (NSP label 0), or, with
//      probability 1/2 and always when n = 1, sentences from a uniformly
//      chosen other document of the split starting at a uniform sentence,
//      until B reaches the length A left over (NSP label 1). Unlike Google's
//      sequential generator, the unused rest of the chunk is not put back for
//      the next sample: chunks are fixed so samples can be read in any order.
//   3. While |A| + |B| > max_seq_length - 3, one token goes from the longer
//      side (B on a tie), from its front or back with probability 1/2 each.
//   Without next_sentence, A is the whole chunk and there is no B: one
//   segment, cut to max_seq_length - 2 as in step 3, [CLS] A [SEP].
//   4. [CLS] A [SEP] B [SEP], padded to max_seq_length. Of the |A| + |B|
//      non-special tokens, round(masked_lm_prob · count) (at least 1, at most
//      max_predictions_per_seq when set) are chosen uniformly; each becomes
//      [MASK] with probability 0.8, a uniform id in [0, vocab_size) with 0.1,
//      or stays itself with 0.1. Labels hold the original id at the chosen
//      positions and ignore_label everywhere else.
//
// Thread-safe (immutable). Borrows the IndexedDataset, which must outlive it.
// Memory: O(samples + documents) for the chunk table.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace tessera::data {

// PyTorch's CrossEntropyLoss ignore_index default, which Hugging Face's BERT
// labels use as well.
inline constexpr int64_t kBertIgnoreLabel = -100;

struct BertSpecialIds {
  int64_t cls = -1;
  int64_t sep = -1;
  int64_t mask = -1;
  int64_t pad = -1;

  // SpecialId("[CLS]"), ("[SEP]"), ("[MASK]"), ("[PAD]"); NotFound naming the
  // first one the tokenizer lacks.
  [[nodiscard]] static absl::StatusOr<BertSpecialIds> FromTokenizer(const Tokenizer& tokenizer);
};

struct BertDatasetOptions {
  int64_t max_seq_length = 512;         // S >= 5 (3 special tokens, A and B)
  double short_seq_prob = 0.1;          // in [0, 1]
  double masked_lm_prob = 0.15;         // in [0, 1]
  int64_t max_predictions_per_seq = 0;  // cap on masked positions; 0: none
  int64_t ignore_label = kBertIgnoreLabel;
  uint64_t seed = 1234;
  std::string splits = "969,30,1";
  DatasetSplit split = DatasetSplit::kTrain;
  BertSpecialIds special_ids = {};  // all in [0, vocab_size)
  int64_t vocab_size = 0;           // range of the random replacement ids
  // Sentence pairs for next-sentence prediction (the model's binary head);
  // false: masked LM only, each sample one segment, [CLS] A [SEP], A the
  // whole chunk (Megatron's BERT without its binary head), nsp_label 0.
  bool next_sentence = true;
};

// One sample; every vector has max_seq_length entries.
struct BertSample {
  std::vector<int64_t> tokens;        // (S) [CLS] A [SEP] B [SEP] [PAD]...
  std::vector<int64_t> token_types;   // (S) 0 on [CLS] A [SEP] and padding, 1 on B [SEP]
  std::vector<int64_t> padding_mask;  // (S) 1 on real tokens, 0 on padding
  std::vector<int64_t> labels;        // (S) original id where chosen for MLM, else ignore_label
  int64_t nsp_label = 0;              // 0: B follows A in the document; 1: B is from another document
};

class BertDataset {
 public:
  // InvalidArgument for out-of-range options; FailedPrecondition when the
  // split has no document with sentences, or with next_sentence fewer than
  // two (a random B needs another document), naming the split.
  [[nodiscard]] static absl::StatusOr<BertDataset> Make(const IndexedDataset& dataset,
                                                        const BertDatasetOptions& options);

  int64_t size() const { return static_cast<int64_t>(chunks_.size()); }
  int64_t max_seq_length() const { return options_.max_seq_length; }

  // Fills `out` (vectors resized to max_seq_length). OutOfRange for an index
  // outside [0, size()).
  [[nodiscard]] absl::Status Sample(int64_t index, BertSample* out) const;

 private:
  // Sentences [begin, end) of one document, and that document's position in
  // documents_ (to draw a different one for a random B).
  struct Chunk {
    int64_t begin;
    int64_t end;
    int64_t document_rank;
    int64_t target_length;
  };

  BertDataset(const IndexedDataset* dataset, BertDatasetOptions options)
      : dataset_(dataset), options_(std::move(options)) {}

  const IndexedDataset* dataset_;  // borrowed
  BertDatasetOptions options_;
  std::vector<Chunk> chunks_;
  std::vector<int64_t> documents_;  // the split's documents that hold a sentence
};

}  // namespace tessera::data
