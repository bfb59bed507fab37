#pragma once
// Tokenizers (DESIGN §11): text <-> token ids.
//
// Kinds:
//   - "gpt2": GPT-2's byte-level BPE, from `encoder.json` (token -> id) and
//     `vocab.bpe` (the merges, ranked by line). The same ids as OpenAI's
//     reference tokenizer on any valid UTF-8 text; a BPE vocabulary trained by
//     data/bpe_trainer.h is read the same way.
//   - "bert": BERT's WordPiece, from `vocab.txt` (one token per line, id =
//     line number): cleaning, optional lower-casing with accent stripping,
//     basic (whitespace, punctuation, CJK) then word-piece split.
//
// A Tokenizer is immutable after loading: its const methods may be called
// from any number of threads at once.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // UTF-8 text -> ids. Invalid UTF-8 is InvalidArgument naming the byte
  // offset of the first bad sequence. Special tokens written in the text
  // ("<|endoftext|>", "[SEP]") are NOT recognised: they are encoded as
  // plain text (as GPT-2's and BERT's reference encoders do by default).
  [[nodiscard]] virtual absl::StatusOr<std::vector<int64_t>> Encode(std::string_view text) const = 0;
  // Ids -> text. An id outside [0, vocab_size()) is InvalidArgument naming
  // it. For "gpt2" the result is the exact bytes (decode(encode(x)) == x);
  // it may end inside a UTF-8 sequence when `ids` is a prefix of a longer
  // encoding. For "bert", word pieces are joined as BERT's reference does
  // ("##" continuations glued, other tokens separated by one space).
  [[nodiscard]] virtual absl::StatusOr<std::string> Decode(std::span<const int64_t> ids) const = 0;

  virtual int64_t vocab_size() const = 0;
  // "gpt2" or "bert".
  virtual std::string_view kind() const = 0;
  // The id of a special token by its text ("<|endoftext|>", "[CLS]",
  // "[SEP]", "[MASK]", "[PAD]", "[UNK]"); nullopt if the vocabulary has none.
  virtual std::optional<int64_t> SpecialId(std::string_view token) const = 0;
  // The id appended after each document when a corpus is preprocessed:
  // "<|endoftext|>" for gpt2, "[SEP]" for bert; nullopt when absent.
  virtual std::optional<int64_t> EndOfDocumentId() const = 0;
};

// Where a tokenizer's vocabulary lives.
struct TokenizerFiles {
  std::string kind;                  // "gpt2" or "bert"
  std::filesystem::path vocab_file;  // gpt2: encoder.json; bert: vocab.txt
  std::filesystem::path merges_file; // gpt2: vocab.bpe; unused for bert
  bool lower_case = true;            // bert: lower-case and strip accents
};

// Loads and checks the files; a missing, unreadable or malformed file is an
// error naming the file and (where it applies) the line or key at fault.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenizerFiles& files);

}  // namespace tessera::data
