#include "data/internal/byte_level.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>
#include <unicode/utypes.h>

#include <array>
#include <fstream>
#include <sstream>
#include <system_error>

#include "core/status.h"
#include "core/text.h"

namespace tessera::data::internal {
namespace {

// Unicode's White_Space property (PropList.txt), which Python's `regex` and
// Rust's `regex` use for \s.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// The letters and numbers of Unicode versions after PCRE2's tables, as the
// body of a PCRE2 class ("\x{11F04}-\x{11F10}..."), from ICU: PCRE2's own
// \p{L} and \p{N} are its tables' version (Unicode 14 for PCRE2 10.42), so
// letters Unicode 15 added (CJK Extension H, Kawi, ...) split "'s" off as
// punctuation where tiktoken, and Tessera's WordPiece (ICU), take them as
// letters. Only the newer code points are spelled out: a class of every
// letter's ranges made non-ASCII text 1.5x slower to split.
absl::StatusOr<std::string> NewerThanPcre2(std::string_view property) {
  std::array<char, 32> version{};
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version.data()) < 0) {
    return absl::InternalError("PCRE2 does not say its Unicode version");
  }
  const std::string_view full(version.data());
  const size_t second_dot = full.find('.', full.find('.') + 1);
  const std::string age(full.substr(0, second_dot));  // "14.0"
  const std::string pattern = StrCat("[[:", property, ":]-[:age=", age, ":]]");
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeSet set(icu::UnicodeString(pattern.c_str(), -1, US_INV), status);
  // An ICU that does not know PCRE2's version is older than PCRE2's tables:
  // nothing to add.
  if (U_FAILURE(status)) return std::string();
  std::string body;
  for (int32_t i = 0; i < set.getRangeCount(); ++i) {
    const UChar32 first = set.getRangeStart(i), last = set.getRangeEnd(i);
    body += first == last ? fmt::format("\\x{{{:X}}}", first) : fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", first, last);
  }
  return body;
}

absl::StatusOr<std::string> Gpt2Pattern() {
  const std::string ws(kWhiteSpace);
  ASSIGN_OR_RETURN(const std::string newer_letters, NewerThanPcre2("L"));
  ASSIGN_OR_RETURN(const std::string newer_numbers, NewerThanPcre2("N"));
  const std::string letters = StrCat(R"(\p{L})", newer_letters), numbers = StrCat(R"(\p{N})", newer_numbers);
  // The letter, number and symbol runs are possessive: nothing after them in
  // their branch could take back a character, so this only saves backtracking.
  return StrCat(R"('s|'t|'re|'ve|'m|'ll|'d| ?[)", letters, "]++| ?[", numbers, "]++| ?[^", ws, letters, numbers,
                "]++|[", ws, "]+(?![^", ws, "])|[", ws, "]+");
}

struct ByteTables {
  std::array<char32_t, 256> code_point_of_byte{};
  std::array<uint8_t, 256> order{};
  // Code points U+0000..U+0143 -> byte + 1 (0: stands for no byte).
  std::array<uint16_t, 0x144> byte_of_code_point{};
};

const ByteTables& Tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      if (printable(b)) {
        t.code_point_of_byte[b] = static_cast<char32_t>(b);
        t.order[next++] = static_cast<uint8_t>(b);
      }
    }
    char32_t extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      if (!printable(b)) {
        t.code_point_of_byte[b] = extra++;
        t.order[next++] = static_cast<uint8_t>(b);
      }
    }
    for (int b = 0; b < 256; ++b) t.byte_of_code_point[t.code_point_of_byte[b]] = static_cast<uint16_t>(b + 1);
    return t;
  }();
  return tables;
}

void AppendUtf8(char32_t c, std::string* out) {
  // Only code points below U+0144 occur here.
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace

char32_t ByteToCodePoint(uint8_t byte) { return Tables().code_point_of_byte[byte]; }

const std::array<uint8_t, 256>& GptByteOrder() { return Tables().order; }

std::string BytesToTokenText(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char b : bytes) AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(b)), &text);
  return text;
}

std::optional<std::string> TokenTextToBytes(std::string_view text) {
  const ByteTables& tables = Tables();
  std::string bytes;
  bytes.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<uint8_t>(text[i]);
    char32_t c;
    if (lead < 0x80) {
      c = lead;
      i += 1;
    } else if ((lead & 0xE0) == 0xC0 && i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
      c = (static_cast<char32_t>(lead & 0x1F) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3F);
      i += 2;
    } else {
      // Every character of the table is below U+0800: a longer sequence
      // (or a malformed one) stands for no byte.
      return std::nullopt;
    }
    if (c >= tables.byte_of_code_point.size() || tables.byte_of_code_point[c] == 0) return std::nullopt;
    bytes.push_back(static_cast<char>(tables.byte_of_code_point[c] - 1));
  }
  return bytes;
}

struct Gpt2PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

Gpt2PreTokenizer::Gpt2PreTokenizer(std::unique_ptr<Compiled> compiled) : compiled_(std::move(compiled)) {}
Gpt2PreTokenizer::~Gpt2PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2PreTokenizer>> Gpt2PreTokenizer::Create() {
  ASSIGN_OR_RETURN(const std::string pattern, Gpt2Pattern());
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  auto compiled = std::make_unique<Compiled>();
  compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                 &error, &error_offset, nullptr);
  if (compiled->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InternalError(StrCat("cannot compile GPT-2's pre-tokenizer pattern at offset ", error_offset, ": ",
                                      reinterpret_cast<const char*>(message)));
  }
  // Without JIT (a PCRE2 built without it) the interpreter gives the same
  // pieces, only slower.
  compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Gpt2PreTokenizer>(new Gpt2PreTokenizer(std::move(compiled)));
}

absl::Status Gpt2PreTokenizer::Split(std::string_view text, absl::FunctionRef<void(std::string_view)> piece) const {
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  if (match == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  // A long whitespace run makes `\s+(?!\S)` backtrack through it; the JIT's
  // default 32 KiB stack can run out there, so a larger one is made only
  // when that happens.
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  auto release = [&] {
    pcre2_match_data_free(match);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
  size_t start = 0;
  while (start < text.size()) {
    int rc = compiled_->jit
                 ? pcre2_jit_match(compiled_->code, subject, text.size(), start, 0, match, context)
                 : pcre2_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, match, context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack == nullptr) {
      context = pcre2_match_context_create(nullptr);
      jit_stack = pcre2_jit_stack_create(32 * 1024, 512 * 1024 * 1024, nullptr);
      if (context == nullptr || jit_stack == nullptr) {
        release();
        return absl::ResourceExhaustedError("cannot allocate a PCRE2 JIT stack");
      }
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      release();
      return absl::InternalError(
          StrCat("GPT-2 pre-tokenizer failed at byte ", start, ": ", reinterpret_cast<const char*>(message)));
    }
    // Every character matches some branch, so pieces are contiguous and
    // never empty.
    TESSERA_CHECK(ovector[0] == start && ovector[1] > start, "start=", start, " match=", ovector[0], "..", ovector[1]);
    piece(text.substr(start, ovector[1] - start));
    start = ovector[1];
  }
  release();
  return absl::OkStatus();
}

std::string FileLine(const std::filesystem::path& path, int64_t line) { return StrCat(path.string(), " line ", line); }

}  // namespace tessera::data::internal
