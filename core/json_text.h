#pragma once
// Words for JSON values in one-line error messages (the config loader and
// the schema share them): type names, quoting that stays short and valid
// UTF-8 whatever the input held, and integral-number checks.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::config {

// Quoted values are cut to this many bytes (a long array would swamp the line).
inline constexpr std::size_t kMaxQuotedChars = 80;

// "null", "boolean", "integer", "number", "string", "array", "object".
std::string JsonTypeName(const nlohmann::json& value);
// "an integer", "a list of numbers"; "null" stays "null".
std::string WithArticle(std::string_view noun);
// `value` as compact JSON, invalid UTF-8 replaced, cut to kMaxQuotedChars.
std::string QuoteJson(const nlohmann::json& value);
// "string \"abc\"", "integer 3", or "null".
std::string DescribeJson(const nlohmann::json& value);
// `text` with its control characters escaped (\n, \t, \xNN), cut to
// kMaxQuotedChars at a character boundary, "..." appended.
std::string ShortText(std::string_view text);
// `number` as an int64 if it is finite, integral and in range (2.0, 1e5).
std::optional<int64_t> AsIntegral(double number);

// A number of JSON text that reads as zero though it is not (1e-400: past the
// smallest a double holds; the parser takes it silently as 0): its byte
// offset and text, the first one in `text` outside strings and comments.
// `text` must be JSON the parser accepted (comments allowed).
struct NumberAt {
  std::size_t offset = 0;
  std::string text;
};
std::optional<NumberAt> FirstUnderflowingNumber(std::string_view text);

}  // namespace tessera::config
