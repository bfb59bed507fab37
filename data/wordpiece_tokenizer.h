#pragma once
// BERT's WordPiece tokenizer ("bert" in data/tokenizer.h), as google-research
// BERT's tokenization.py (BasicTokenizer, then WordpieceTokenizer) as
// Hugging Face's transformers has it:
//   1. clean: drop U+0000, U+FFFD and every "other" character (C*: control,
//      format, private use, unassigned; not tab, newline, carriage return;
//      Google's dropped only Cc and Cf); whitespace (those three, space, Zs)
//      becomes a space;
//   2. put spaces around each CJK ideograph, so that it is a word of its own;
//   3. split on whitespace; with lower_case, lower-case each word (full
//      Unicode mapping) and strip accents (NFD, then drop Mn);
//   4. split each word before and after every punctuation character (ASCII
//      symbols !../:..@[..`{..~ and Unicode P*);
//   5. word pieces: greedy longest match first, "##" before non-initial
//      pieces; a word that cannot be covered, or of more than 100 characters,
//      is [UNK].
//
// Thread-safe: immutable after Load.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "data/tokenizer.h"

namespace tessera::data {

class WordPieceTokenizer final : public Tokenizer {
 public:
  // Words longer than this many characters are [UNK] (as Hugging Face's BERT
  // tokenizers; google-research's uses 200).
  static constexpr size_t kMaxCharsPerWord = 100;

  // Reads `vocab_file` (vocab.txt: one token per line, id = line number - 1,
  // surrounding whitespace stripped). An empty line, a token given twice,
  // invalid UTF-8 or a vocabulary without "[UNK]" is an error naming the line
  // or token.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> Load(const std::filesystem::path& vocab_file,
                                                                                bool lower_case);

  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> Encode(std::string_view text) const override;
  [[nodiscard]] absl::StatusOr<std::string> Decode(std::span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::string_view kind() const override { return "bert"; }
  // Tokens written "[...]": [CLS], [SEP], [MASK], [PAD], [UNK], [unused0]...
  std::optional<int64_t> SpecialId(std::string_view token) const override;
  std::optional<int64_t> EndOfDocumentId() const override;

 private:
  explicit WordPieceTokenizer(bool lower_case) : lower_case_(lower_case) {}
  // Step 5 for one word of step 4 (UTF-8, `chars` characters long).
  void EncodeWord(std::string_view word, size_t chars, std::vector<int64_t>* out) const;
  std::optional<int64_t> Find(std::string_view token) const;

  bool lower_case_;
  std::vector<std::string> tokens_;                        // id -> token
  absl::flat_hash_map<std::string, int64_t> id_of_token_;  // the inverse
  int64_t unknown_id_ = 0;
  // The longest token in bytes, "##" included: no longer candidate can match.
  size_t max_token_bytes_ = 0;
};

}  // namespace tessera::data
