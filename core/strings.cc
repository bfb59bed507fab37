#include "core/strings.h"

#include <algorithm>
#include <cctype>

namespace tessera {

std::size_t EditDistance(std::string_view a, std::string_view b) {
  // Three rolling rows: the swap rule looks two rows back.
  const std::size_t n = b.size();
  std::vector<std::size_t> two_back(n + 1), previous(n + 1), current(n + 1);
  for (std::size_t j = 0; j <= n; ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= n; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], two_back[j - 2] + 1);
      }
    }
    std::swap(two_back, previous);
    std::swap(previous, current);
  }
  return previous[n];
}

std::optional<std::string> ClosestMatch(std::string_view query,
                                        const std::vector<std::string>& candidates) {
  // The same name in another case, or without its dotted prefix ("sgd" for
  // SGD, "GPT2" for models.GPT2): no edit distance finds those.
  const auto same_letters = [](std::string_view a, std::string_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
      return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
    });
  };
  for (const std::string& candidate : candidates) {
    const std::string_view last = std::string_view(candidate).substr(candidate.rfind('.') + 1);
    if (same_letters(candidate, query) || (!query.empty() && same_letters(last, query))) {
      return candidate;
    }
  }
  const std::size_t max_distance = std::max<std::size_t>(2, query.size() / 3);
  const std::string* best = nullptr;
  std::size_t best_distance = max_distance + 1;
  for (const std::string& candidate : candidates) {
    // (Not the query's own section: "model" for an unknown "model.x".)
    if (query.size() > candidate.size() && query.starts_with(candidate) && query[candidate.size()] == '.') continue;
    // The distance is at least the length difference: skipping those keeps
    // a megabyte-long typo from costing |query| x |candidate| per candidate.
    const std::size_t length_gap = query.size() > candidate.size() ? query.size() - candidate.size()
                                                                   : candidate.size() - query.size();
    if (length_gap >= best_distance) continue;
    const std::size_t distance = EditDistance(query, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = &candidate;
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

std::optional<std::size_t> FirstInvalidUtf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    std::size_t length;
    uint32_t min_code, code;
    if ((lead & 0xE0) == 0xC0) {
      length = 2, min_code = 0x80, code = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, min_code = 0x800, code = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, min_code = 0x10000, code = lead & 0x07;
    } else {
      return i;
    }
    if (n - i < length) return i;
    for (std::size_t k = 1; k < length; ++k) {
      if ((bytes[i + k] & 0xC0) != 0x80) return i;
      code = (code << 6) | (bytes[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF.
    if (code < min_code || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return i;
    i += length;
  }
  return std::nullopt;
}

std::string EscapeControlChars(std::string_view text, bool non_ascii) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7F && (byte < 0x80 || !non_ascii)) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

std::string OneLine(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  constexpr char kHex[] = "0123456789abcdef";
  const auto escape = [&](unsigned char byte) {
    out += "\\x";
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  };
  while (!message.empty()) {
    const size_t valid = FirstInvalidUtf8(message).value_or(message.size());
    for (const char c : message.substr(0, valid)) {
      const auto byte = static_cast<unsigned char>(c);
      if (c == '\n' || c == '\r') {
        out += ' ';
      } else if ((byte < 0x20 && c != '\t') || byte == 0x7F) {
        escape(byte);
      } else {
        out += c;
      }
    }
    if (valid == message.size()) break;
    escape(static_cast<unsigned char>(message[valid]));
    message.remove_prefix(valid + 1);
  }
  return out;
}

}  // namespace tessera
