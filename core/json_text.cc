#include "core/json_text.h"

#include <cmath>
#include <cstdlib>

#include "core/strings.h"
#include "core/text.h"

namespace tessera::config {

std::string JsonTypeName(const nlohmann::json& value) {
  using Type = nlohmann::json::value_t;
  switch (value.type()) {
    case Type::null: return "null";
    case Type::boolean: return "boolean";
    case Type::number_integer:
    case Type::number_unsigned: return "integer";
    case Type::number_float: return "number";
    case Type::string: return "string";
    case Type::array: return "array";
    case Type::object: return "object";
    default: return value.type_name();
  }
}

std::string WithArticle(std::string_view noun) {
  if (noun.empty() || noun == "null") return std::string(noun);
  const char c = noun[0];
  return StrCat(c == 'a' || c == 'e' || c == 'i' || c == 'o' ? "an " : "a ", noun);
}

std::string ShortText(std::string_view raw) {
  // (A newline in an override's key was shown as a space: a key the user
  // did not type.)
  const std::string text = EscapeControlChars(raw);
  if (text.size() <= kMaxQuotedChars) return text;
  std::size_t cut = kMaxQuotedChars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return StrCat(text.substr(0, cut), "...");
}

std::string QuoteJson(const nlohmann::json& value) {
  // The replace handler keeps a stray invalid UTF-8 byte from turning an
  // error message into an exception.
  return ShortText(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::string DescribeJson(const nlohmann::json& value) {
  return value.is_null() ? "null" : StrCat(JsonTypeName(value), " ", QuoteJson(value));
}

std::optional<int64_t> AsIntegral(double number) {
  // 2^63 is exactly representable; anything at or beyond it would overflow.
  constexpr double kTwoToThe63 = 9223372036854775808.0;
  if (!std::isfinite(number) || std::trunc(number) != number || number < -kTwoToThe63 || number >= kTwoToThe63) {
    return std::nullopt;
  }
  return static_cast<int64_t>(number);
}

std::optional<NumberAt> FirstUnderflowingNumber(std::string_view text) {
  const auto part_of_number = [](char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {  // a string, its escapes skipped
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
      ++i;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      const std::size_t end = text.find('\n', i);
      i = end == std::string_view::npos ? text.size() : end + 1;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const std::size_t end = text.find("*/", i + 2);
      i = end == std::string_view::npos ? text.size() : end + 2;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      std::size_t end = i;
      while (end < text.size() && part_of_number(text[end])) ++end;
      const std::string number(text.substr(i, end - i));
      // A nonzero digit before the exponent makes it a nonzero number.
      const std::string mantissa = number.substr(0, number.find_first_of("eE"));
      if (mantissa.find_first_of("123456789") != std::string::npos && std::strtod(number.c_str(), nullptr) == 0.0) {
        return NumberAt{i, number};
      }
      i = end;
    } else {
      ++i;
    }
  }
  return std::nullopt;
}

}  // namespace tessera::config
