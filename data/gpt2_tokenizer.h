#pragma once
// GPT-2's byte-level BPE tokenizer ("gpt2" in data/tokenizer.h).
//
// Encoding: the text is cut into pieces by GPT-2's pre-tokenizer pattern,
// each piece's bytes start as one symbol per byte and the adjacent pair with
// the lowest merge rank (line order of vocab.bpe) is merged, every
// non-overlapping occurrence left to right, until no pair has a rank: OpenAI's
// encoder.py, so the ids are OpenAI's.
//
// Thread-safe: the vocabulary is immutable after Load; the cache of encoded
// pieces is sharded behind mutexes and bounded (a full shard is emptied), and
// only ever holds what BPE would compute again, so it never changes a result.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "data/tokenizer.h"

namespace tessera::data {
namespace internal {
class Gpt2PreTokenizer;
}  // namespace internal

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads `encoder_file` (encoder.json: a JSON object from token text, in
  // GPT-2's byte-to-character alphabet, to id; the ids must be exactly
  // 0..n-1 and every byte must have a token) and `merges_file` (vocab.bpe: an
  // optional "#version" line, then one "left right" merge per line whose
  // parts and result are tokens). Errors name the file and the key or line.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Load(const std::filesystem::path& encoder_file,
                                                                           const std::filesystem::path& merges_file);
  ~Gpt2Tokenizer() override;

  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> Encode(std::string_view text) const override;
  [[nodiscard]] absl::StatusOr<std::string> Decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(token_bytes_.size()); }
  std::string_view kind() const override { return "gpt2"; }
  // Tokens written "<|...|>" (GPT-2 has only "<|endoftext|>").
  std::optional<int64_t> SpecialId(std::string_view token) const override;
  std::optional<int64_t> EndOfDocumentId() const override { return end_of_document_id_; }

 private:
  // The merge of an adjacent pair of tokens: its rank (lower merges first)
  // and the token it makes.
  struct Merge {
    int32_t rank;
    int32_t token;
  };
  struct CacheShard {
    absl::Mutex mutex;
    absl::flat_hash_map<std::string, std::vector<int32_t>> ids ABSL_GUARDED_BY(mutex);
  };
  // The cache holds at most 64 x 2048 pieces of at most 64 bytes (a few MB
  // for typical words, tens of MB at worst); longer pieces are rare and
  // their BPE costs little next to their size.
  static constexpr int kCacheShards = 64;
  static constexpr size_t kCacheEntriesPerShard = 2048;
  static constexpr size_t kMaxCachedPieceBytes = 64;

  Gpt2Tokenizer() = default;
  absl::Status LoadEncoder(const std::filesystem::path& file);
  absl::Status LoadMerges(const std::filesystem::path& file);
  const Merge* FindMerge(int32_t left, int32_t right) const;
  // BPE of one piece (at least two bytes), appended to `out`.
  void EncodePiece(std::string_view piece, std::vector<int64_t>* out) const;
  void MergeShortPiece(std::vector<int32_t>* symbols) const;
  void MergeLongPiece(std::vector<int32_t>* symbols) const;

  std::unique_ptr<internal::Gpt2PreTokenizer> pre_tokenizer_;
  std::vector<std::string> token_bytes_;                   // id -> the raw bytes it stands for
  absl::flat_hash_map<std::string, int32_t> id_of_bytes_;  // the inverse
  std::array<int32_t, 256> byte_token_{};                  // byte -> its one-byte token
  absl::flat_hash_map<uint64_t, Merge> merges_;            // (left << 32 | right) -> merge
  std::optional<int64_t> end_of_document_id_;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace tessera::data
