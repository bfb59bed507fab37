#include "data/wordpiece_tokenizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <nlohmann/json.hpp>

#include "core/file_util.h"
#include "core/json_text.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "data/internal/byte_level.h"

namespace tessera::data {
namespace {

std::string Quote(std::string_view text) { return config::QuoteJson(nlohmann::json(std::string(text))); }

// Python's str.isspace(), which BERT's whitespace split (str.split()) and
// vocabulary loading (str.strip()) use.
bool IsPythonSpace(UChar32 c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// BERT's _is_whitespace.
bool IsBertWhitespace(UChar32 c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || u_charType(c) == U_SPACE_SEPARATOR;
}

// BERT's _is_control as Hugging Face has it (transformers, tokenizers and
// tokenizers.js alike): every "other" category, C* (Google's tokenization.py
// dropped only Cc and Cf, keeping private-use and unassigned characters,
// which then made words [UNK]).
bool IsBertControl(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  return (U_GET_GC_MASK(c) & U_GC_C_MASK) != 0;
}

// BERT's _is_punctuation: the ASCII non-alphanumeric symbols count even
// where Unicode calls them symbols (S*: $, +, <, =, >, ^, `, |, ~).
bool IsBertPunctuation(UChar32 c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  return (U_GET_GC_MASK(c) & U_GC_P_MASK) != 0;
}

// BERT's _is_chinese_char: the CJK Unified Ideographs blocks (not Hangul,
// Hiragana or Katakana, which are written with spaces).
bool IsCjkIdeograph(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// The code point at `*i` of valid UTF-8 `text`, advancing `*i`.
UChar32 NextCodePoint(std::string_view text, size_t* i) {
  UChar32 c;
  U8_NEXT_UNSAFE(reinterpret_cast<const uint8_t*>(text.data()), *i, c);
  return c;
}

void AppendCodePoint(UChar32 c, std::string* out) {
  char buffer[U8_MAX_LENGTH];
  size_t length = 0;
  U8_APPEND_UNSAFE(reinterpret_cast<uint8_t*>(buffer), length, c);
  out->append(buffer, length);
}

bool IsAscii(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// BERT's token.lower() then _run_strip_accents (NFD, drop Mn).
absl::StatusOr<std::string> LowerAndStripAccents(std::string_view word) {
  if (IsAscii(word)) {
    std::string lower(word);
    for (char& c : lower) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return lower;
  }
  icu::UnicodeString text =
      icu::UnicodeString::fromUTF8(icu::StringPiece(word.data(), static_cast<int32_t>(word.size())));
  // The root locale: Python's str.lower() has no language rules either.
  text.toLower(icu::Locale::getRoot());
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(error);
  if (U_FAILURE(error)) return absl::InternalError(StrCat("ICU has no NFD normalizer: ", u_errorName(error)));
  const icu::UnicodeString decomposed = nfd->normalize(text, error);
  if (U_FAILURE(error)) return absl::InternalError(StrCat("ICU NFD failed: ", u_errorName(error)));
  std::string utf8;
  decomposed.toUTF8String(utf8);
  std::string stripped;
  stripped.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    const UChar32 c = NextCodePoint(utf8, &i);
    if (u_charType(c) != U_NON_SPACING_MARK) AppendCodePoint(c, &stripped);
  }
  return stripped;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::Load(const std::filesystem::path& vocab_file,
                                                                             bool lower_case) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(vocab_file));
  std::unique_ptr<WordPieceTokenizer> tokenizer(new WordPieceTokenizer(lower_case));
  std::vector<std::string_view> lines = Split(text, '\n');
  // A final newline leaves an empty last piece, which is not a line.
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return absl::InvalidArgumentError(StrCat(vocab_file.string(), ": no tokens"));
  tokenizer->tokens_.reserve(lines.size());
  tokenizer->id_of_token_.reserve(lines.size());
  for (size_t index = 0; index < lines.size(); ++index) {
    const int64_t line_number = static_cast<int64_t>(index) + 1;
    std::string_view line = lines[index];
    if (const std::optional<size_t> bad = FirstInvalidUtf8(line)) {
      return absl::InvalidArgumentError(
          StrCat(internal::FileLine(vocab_file, line_number), ": invalid UTF-8 at byte ", *bad + 1, " of the line"));
    }
    // Python's str.strip(), as BERT's load_vocab.
    size_t begin = 0, end = line.size();
    while (begin < end) {
      size_t next = begin;
      if (!IsPythonSpace(NextCodePoint(line, &next))) break;
      begin = next;
    }
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(line[start]) & 0xC0) == 0x80) --start;
      size_t at = start;
      if (!IsPythonSpace(NextCodePoint(line, &at))) break;
      end = start;
    }
    const std::string_view token = line.substr(begin, end - begin);
    if (token.empty()) {
      return absl::InvalidArgumentError(StrCat(internal::FileLine(vocab_file, line_number), ": empty token"));
    }
    const auto [it, inserted] = tokenizer->id_of_token_.emplace(token, static_cast<int64_t>(index));
    if (!inserted) {
      return absl::InvalidArgumentError(StrCat(internal::FileLine(vocab_file, line_number), ": token ", Quote(token),
                                               " repeats line ", it->second + 1));
    }
    tokenizer->tokens_.emplace_back(token);
    tokenizer->max_token_bytes_ = std::max(tokenizer->max_token_bytes_, token.size());
  }
  const std::optional<int64_t> unknown = tokenizer->Find("[UNK]");
  if (!unknown.has_value()) {
    return absl::InvalidArgumentError(
        StrCat(vocab_file.string(), ": no [UNK] token (the id of words that cannot be split into pieces)"));
  }
  tokenizer->unknown_id_ = *unknown;
  return tokenizer;
}

std::optional<int64_t> WordPieceTokenizer::Find(std::string_view token) const {
  const auto it = id_of_token_.find(absl::string_view(token.data(), token.size()));
  if (it == id_of_token_.end()) return std::nullopt;
  return it->second;
}

void WordPieceTokenizer::EncodeWord(std::string_view word, size_t chars, std::vector<int64_t>* out) const {
  if (chars > kMaxCharsPerWord) {
    out->push_back(unknown_id_);
    return;
  }
  // boundary[k]: the byte offset of character k (boundary[chars] = size).
  std::vector<size_t> boundary;
  boundary.reserve(chars + 1);
  for (size_t i = 0; i < word.size();) {
    boundary.push_back(i);
    NextCodePoint(word, &i);
  }
  boundary.push_back(word.size());
  const size_t first = out->size();
  std::string candidate;
  for (size_t start = 0; start < chars;) {
    size_t end = chars;
    std::optional<int64_t> piece;
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      const size_t bytes = boundary[end] - boundary[start];
      if (candidate.size() + bytes > max_token_bytes_) continue;
      candidate.append(word.substr(boundary[start], bytes));
      piece = Find(candidate);
      if (piece.has_value()) break;
    }
    if (!piece.has_value()) {
      // Part of the word has no piece: the whole word is unknown.
      out->resize(first);
      out->push_back(unknown_id_);
      return;
    }
    out->push_back(*piece);
    start = end;
  }
}

absl::StatusOr<std::vector<int64_t>> WordPieceTokenizer::Encode(std::string_view text) const {
  if (const std::optional<size_t> bad = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(StrCat("invalid UTF-8 at byte offset ", *bad));
  }
  // Steps 1 and 2: clean, space out CJK ideographs.
  std::string cleaned;
  cleaned.reserve(text.size() + 16);
  for (size_t i = 0; i < text.size();) {
    const UChar32 c = NextCodePoint(text, &i);
    if (c == 0 || c == 0xFFFD || IsBertControl(c)) continue;
    if (IsBertWhitespace(c)) {
      cleaned.push_back(' ');
    } else if (IsCjkIdeograph(c)) {
      cleaned.push_back(' ');
      AppendCodePoint(c, &cleaned);
      cleaned.push_back(' ');
    } else {
      AppendCodePoint(c, &cleaned);
    }
  }
  std::vector<int64_t> ids;
  std::string lowered;
  // Step 4 for one word, then step 5 for each piece.
  auto split_word = [&](std::string_view word) {
    size_t piece_start = 0, piece_chars = 0;
    for (size_t i = 0; i < word.size();) {
      const size_t at = i;
      const UChar32 c = NextCodePoint(word, &i);
      if (IsBertPunctuation(c)) {
        if (piece_chars > 0) EncodeWord(word.substr(piece_start, at - piece_start), piece_chars, &ids);
        EncodeWord(word.substr(at, i - at), 1, &ids);
        piece_start = i;
        piece_chars = 0;
      } else {
        ++piece_chars;
      }
    }
    if (piece_chars > 0) EncodeWord(word.substr(piece_start), piece_chars, &ids);
  };
  // Step 3: after cleaning, the only characters str.split() still splits on
  // are the space and U+2028 / U+2029 (Zl, Zp: neither Zs nor control).
  size_t word_start = 0;
  for (size_t i = 0; i <= cleaned.size();) {
    const size_t at = i;
    const bool at_end = i == cleaned.size();
    const UChar32 c = at_end ? ' ' : NextCodePoint(cleaned, &i);
    if (at_end) ++i;
    if (c != ' ' && c != 0x2028 && c != 0x2029) continue;
    if (at > word_start) {
      const std::string_view word = std::string_view(cleaned).substr(word_start, at - word_start);
      if (lower_case_) {
        ASSIGN_OR_RETURN(lowered, LowerAndStripAccents(word));
        split_word(lowered);
      } else {
        split_word(word);
      }
    }
    word_start = i;
  }
  return ids;
}

absl::StatusOr<std::string> WordPieceTokenizer::Decode(std::span<const int64_t> ids) const {
  // BERT's " ".join(tokens).replace(" ##", ""): a "##" piece is glued to the
  // token before it. (The final .strip() has nothing to do: vocabulary
  // tokens carry no surrounding whitespace.)
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(
          StrCat("token id ", ids[i], " (at position ", i, ") is out of range [0, ", vocab_size(), ")"));
    }
    if (i > 0) text.push_back(' ');
    text += tokens_[ids[i]];
  }
  std::string glued;
  glued.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, " ##") == 0) {
      i += 3;
    } else {
      glued.push_back(text[i++]);
    }
  }
  return glued;
}

std::optional<int64_t> WordPieceTokenizer::SpecialId(std::string_view token) const {
  if (token.size() < 3 || token.front() != '[' || token.back() != ']') return std::nullopt;
  return Find(token);
}

std::optional<int64_t> WordPieceTokenizer::EndOfDocumentId() const { return Find("[SEP]"); }

}  // namespace tessera::data
