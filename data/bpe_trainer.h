#pragma once
// Learns a byte-level BPE vocabulary from a corpus, the GPT-2 way, for a
// corpus that comes without one: the text is cut by GPT-2's pre-tokenizer,
// the pieces ("words") are counted, and the most frequent adjacent pair of
// symbols over all words is merged into a new token, again and again. The
// result is written as GPT-2's encoder.json and vocab.bpe, which
// Gpt2Tokenizer (data/gpt2_tokenizer.h) reads.
//
// Ids: the 256 bytes first (in GPT-2's order, so a trained vocabulary shares
// GPT-2's first 256 ids), then one token per merge in merge order, then
// "<|endoftext|>" as the last id. Ties between pairs of equal count go to the
// pair whose left token's bytes sort first, then its right token's: the same
// corpus always gives the same files.
//
// Memory grows with the number of distinct words, not with the text: files
// are read in blocks, cut where the pre-tokenizer cuts anyway.
//
// Not thread-safe: one caller adds text, then trains.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::data {
namespace internal {
class Gpt2PreTokenizer;
}  // namespace internal

class BpeTrainer {
 public:
  // The smallest vocabulary: the 256 bytes and "<|endoftext|>".
  static constexpr int64_t kMinVocabSize = 257;

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BpeTrainer>> Create();
  ~BpeTrainer();
  BpeTrainer(const BpeTrainer&) = delete;
  BpeTrainer& operator=(const BpeTrainer&) = delete;

  // Counts the words of one chunk of text. Each chunk is pre-tokenised on its
  // own, so a chunk boundary is always a word boundary: cut a corpus between
  // documents (or use AddFile). Invalid UTF-8 is InvalidArgument naming the
  // byte offset; nothing of a rejected chunk is counted.
  [[nodiscard]] absl::Status AddText(std::string_view text);
  // Counts the words of a file, read in blocks. Errors name the file (and
  // the byte offset of invalid UTF-8).
  [[nodiscard]] absl::Status AddFile(const std::filesystem::path& path);

  // Learns merges until the vocabulary has `vocab_size` tokens (the last
  // being "<|endoftext|>") and writes `output_dir`/encoder.json and
  // `output_dir`/vocab.bpe (creating the directory), each through a
  // temporary file and a rename: a file there is either the old one or the
  // complete new one. InvalidArgument, with nothing written, when
  // `vocab_size` < kMinVocabSize or the corpus runs out of pairs to merge
  // before reaching it.
  [[nodiscard]] absl::Status Train(int64_t vocab_size, const std::filesystem::path& output_dir) const;

  // How many distinct words have been counted.
  int64_t distinct_words() const { return static_cast<int64_t>(word_counts_.size()); }

 private:
  explicit BpeTrainer(std::unique_ptr<internal::Gpt2PreTokenizer> pre_tokenizer);
  // Pre-tokenises `text` into `counts`; errors name `where` (a file) and the
  // offset of bad UTF-8 counted from `base_offset`.
  absl::Status Count(std::string_view text, std::string_view where, int64_t base_offset,
                     absl::flat_hash_map<std::string, int64_t>* counts) const;

  std::unique_ptr<internal::Gpt2PreTokenizer> pre_tokenizer_;
  absl::flat_hash_map<std::string, int64_t> word_counts_;  // word bytes -> occurrences
};

// Trains one vocabulary on all `files` (BpeTrainer::AddFile on each, then
// Train).
[[nodiscard]] absl::Status TrainBpe(std::span<const std::filesystem::path> files, int64_t vocab_size,
                                    const std::filesystem::path& output_dir);

}  // namespace tessera::data
