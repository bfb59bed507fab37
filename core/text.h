#pragma once
// Small text helpers that work with std::string_view. Debian's Abseil is
// built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW=0), so
// absl::StrCat / SimpleAtoi do not accept std::string_view; these do.

#include <charconv>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace tessera {

// Concatenates the fmt "{}" renderings of its arguments.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (fmt::format_to(std::back_inserter(out), "{}", args), ...);
  return out;
}

// Whole-string integer parse; false on anything else (sign allowed).
template <typename Int>
bool ParseInteger(std::string_view text, Int* out) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

inline bool ConsumePrefix(std::string_view* text, std::string_view prefix) {
  if (text->substr(0, prefix.size()) != prefix) return false;
  text->remove_prefix(prefix.size());
  return true;
}
inline bool ConsumeSuffix(std::string_view* text, std::string_view suffix) {
  if (text->size() < suffix.size() || text->substr(text->size() - suffix.size()) != suffix) return false;
  text->remove_suffix(suffix.size());
  return true;
}
inline std::string_view StripWhitespace(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t' || text.front() == '\n' || text.front() == '\r')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  return text;
}
// Splits on every `separator` (empty pieces kept).
inline std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == separator) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}
// "a, b, c" from anything fmt can format element by element.
template <typename Range>
std::string Join(const Range& range, std::string_view separator) {
  return fmt::format("{}", fmt::join(range, separator));
}

}  // namespace tessera

// fmt support for Abseil's own string_view (Status::message() returns one) and
// for Status itself.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(absl::string_view s, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.data(), s.size()), ctx);
  }
};
template <>
struct fmt::formatter<absl::Status> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(const absl::Status& s, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(s.ToString(), ctx);
  }
};
