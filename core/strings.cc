#include "core/strings.h"

#include <algorithm>

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
  const std::size_t max_distance = std::max<std::size_t>(2, query.size() / 3);
  const std::string* best = nullptr;
  std::size_t best_distance = max_distance + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t distance = EditDistance(query, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = &candidate;
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

}  // namespace tessera
