#include "core/json_text.h"

#include <cmath>

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

}  // namespace tessera::config
