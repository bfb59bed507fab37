#pragma once
// Small string helpers shared by the config loader and the registries, used to
// turn a user's typo into a "did you mean" hint.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Edit distance counting insertions, deletions, substitutions and swaps of two
// adjacent characters (optimal string alignment): a swapped pair is the most
// common typo, and plain Levenshtein would charge it twice.
[[nodiscard]] std::size_t EditDistance(std::string_view a, std::string_view b);

// The candidate with the smallest EditDistance to `query` (the first one on a
// tie), or nullopt when `candidates` is empty or even the best one is too far
// away to be a plausible typo (more than max(2, |query| / 3) edits), so hints
// never point at something unrelated.
[[nodiscard]] std::optional<std::string> ClosestMatch(std::string_view query,
                                                      const std::vector<std::string>& candidates);

// The byte offset of the first byte that does not start a valid UTF-8
// sequence (RFC 3629: no overlong forms, surrogates or code points past
// U+10FFFF), or nullopt when all of `text` is valid.
[[nodiscard]] std::optional<std::size_t> FirstInvalidUtf8(std::string_view text);

// `text` with each ASCII control character (and DEL) written as a C escape
// (\n, \t, \r, \xNN), the rest (UTF-8 included) as is: for quoting a name
// the user gave (a path, a key) inside a one-line error message. With
// `non_ascii`, every byte past ASCII is written \xNN too (for input that
// is not valid UTF-8).
[[nodiscard]] std::string EscapeControlChars(std::string_view text, bool non_ascii = false);

// A message as one line a terminal shows as it is: newlines (\n, \r) as
// spaces, other ASCII control characters (a tab kept) and each byte that is
// not part of valid UTF-8 as \xNN (a path's raw bytes reached the
// terminal in some messages, escaped in others); valid UTF-8 as it is.
[[nodiscard]] std::string OneLine(std::string_view message);

}  // namespace tessera
