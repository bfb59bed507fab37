#pragma once
// What GPT-2's byte-level BPE tokenizer (data/gpt2_tokenizer.h) and the BPE
// trainer (data/bpe_trainer.h) share: GPT-2's byte <-> character table, its
// pre-tokenizer, and reading a vocabulary file whole.

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::data::internal {

// GPT-2's bytes_to_unicode(): every byte stands for one printable code point
// in encoder.json and vocab.bpe, so that a token is a JSON string without
// escapes and a merge line splits on its one space (a space byte is 'Ġ').
// Printable Latin-1 bytes stand for themselves; the 68 others, in increasing
// order, for U+0100.. U+0143.
char32_t ByteToCodePoint(uint8_t byte);
// The bytes in the order of GPT-2's table (the printable ones first): byte
// GptByteOrder()[i] has id i in GPT-2's encoder.json and in trained ones.
const std::array<uint8_t, 256>& GptByteOrder();
// Raw bytes -> their characters, as UTF-8 (what encoder.json keys hold).
std::string BytesToTokenText(std::string_view bytes);
// The inverse; nullopt when `text` is not valid UTF-8 or holds a character
// that stands for no byte.
std::optional<std::string> TokenTextToBytes(std::string_view text);

// GPT-2's pre-tokenizer: the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// compiled with PCRE2 (UTF, UCP, JIT where available). \s is spelled out as
// Unicode's White_Space set, which is what OpenAI's references match (PCRE2
// 10.42's own \s also takes U+180E, which Unicode 6.3 took out of it).
//
// Thread-safe: the compiled pattern is read-only after Create; each Split
// call has its own match state.
class Gpt2PreTokenizer {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gpt2PreTokenizer>> Create();
  ~Gpt2PreTokenizer();
  Gpt2PreTokenizer(const Gpt2PreTokenizer&) = delete;
  Gpt2PreTokenizer& operator=(const Gpt2PreTokenizer&) = delete;

  // Calls `piece` with each piece of `text`, in order; the pieces tile the
  // text. `text` must be valid UTF-8 (the caller checks: PCRE2 is told not to
  // re-check it at every match, which would make a split quadratic).
  [[nodiscard]] absl::Status Split(std::string_view text, absl::FunctionRef<void(std::string_view)> piece) const;

 private:
  struct Compiled;
  explicit Gpt2PreTokenizer(std::unique_ptr<Compiled> compiled);
  std::unique_ptr<Compiled> compiled_;
};

// "<path> line <n>" for error messages about line `line` (1-based).
std::string FileLine(const std::filesystem::path& path, int64_t line);

}  // namespace tessera::data::internal
