#include "core/placement.h"

#include <algorithm>
#include <set>

#include "core/status.h"
#include "core/text.h"

namespace tessera {

absl::StatusOr<Placement> Placement::Create(DeviceType type, std::vector<int64_t> ranks,
                                            std::vector<int64_t> hierarchy) {
  if (ranks.empty()) return absl::InvalidArgumentError("placement has no ranks");
  if (hierarchy.empty()) hierarchy = {static_cast<int64_t>(ranks.size())};
  if (static_cast<int64_t>(ranks.size()) > kMaxDevices) {
    return absl::InvalidArgumentError(StrCat("placement has ", ranks.size(), " ranks, more than ", kMaxDevices));
  }
  int64_t product = 1;
  for (int64_t h : hierarchy) {
    if (h <= 0) return absl::InvalidArgumentError(StrCat("placement hierarchy [", Join(hierarchy, ","), "] has a non-positive axis"));
    // (Stopped past the most devices: the product overflowed, and could
    // wrap to the rank count.)
    product = h > kMaxDevices ? kMaxDevices + 1 : std::min(product * h, kMaxDevices + 1);
  }
  if (product != static_cast<int64_t>(ranks.size())) {
    return absl::InvalidArgumentError(StrCat("placement hierarchy [", Join(hierarchy, ","),
                                                   "] holds ", product, " devices but ", ranks.size(),
                                                   " ranks were given"));
  }
  std::set<int64_t> seen;
  for (int64_t r : ranks) {
    if (r < 0 || !seen.insert(r).second) {
      return absl::InvalidArgumentError(StrCat("placement ranks {", Join(ranks, ","),
                                                     "} must be distinct and non-negative"));
    }
  }
  return Placement(type, std::move(ranks), std::move(hierarchy));
}

Placement Placement::Range(DeviceType type, int64_t n) {
  std::vector<int64_t> ranks(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ranks[static_cast<size_t>(i)] = i;
  return Placement(type, std::move(ranks), {n});
}

std::vector<int64_t> Placement::Coordinates(int64_t parallel_id) const {
  std::vector<int64_t> coords(hierarchy_.size());
  for (int i = static_cast<int>(hierarchy_.size()) - 1; i >= 0; --i) {
    coords[static_cast<size_t>(i)] = parallel_id % hierarchy_[static_cast<size_t>(i)];
    parallel_id /= hierarchy_[static_cast<size_t>(i)];
  }
  return coords;
}

int64_t Placement::ParallelIdOf(int64_t rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == rank) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string Placement::ToString() const {
  return StrCat(DeviceTypeName(type_), ":{", Join(ranks_, ","), "}@[",
                      Join(hierarchy_, ","), "]");
}

absl::StatusOr<Placement> ParsePlacement(std::string_view text) {
  std::string_view rest = StripWhitespace(text);
  const size_t colon = rest.find(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError(StrCat("bad placement '", text, "': expected TYPE:RANKS[@[H,...]]"));
  }
  ASSIGN_OR_RETURN(DeviceType type, ParseDeviceType(rest.substr(0, colon)));
  rest.remove_prefix(colon + 1);
  std::string_view hierarchy_text;
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    hierarchy_text = rest.substr(at + 1);
    rest = rest.substr(0, at);
  }
  ConsumePrefix(&rest, "{");
  ConsumeSuffix(&rest, "}");
  std::vector<int64_t> ranks;
  for (std::string_view part : Split(rest, ',')) {
    std::vector<std::string_view> bounds = Split(part, '-');
    int64_t lo = 0, hi = 0;
    if (bounds.size() > 2 || !ParseInteger(bounds[0], &lo) ||
        !ParseInteger(bounds.back(), &hi) || hi < lo) {
      return absl::InvalidArgumentError(StrCat("bad placement '", text, "': bad rank list '", rest, "'"));
    }
    // (Bounded: "cpu:0-9999999999" filled memory before any check.)
    if (hi - lo >= Placement::kMaxDevices - static_cast<int64_t>(ranks.size())) {
      return absl::InvalidArgumentError(
          StrCat("bad placement '", text, "': more than ", Placement::kMaxDevices, " ranks"));
    }
    for (int64_t r = lo; r <= hi; ++r) ranks.push_back(r);
  }
  std::vector<int64_t> hierarchy;
  if (!hierarchy_text.empty()) {
    ConsumePrefix(&hierarchy_text, "[");
    ConsumeSuffix(&hierarchy_text, "]");
    for (std::string_view part : Split(hierarchy_text, ',')) {
      int64_t h = 0;
      if (!ParseInteger(part, &h)) {
        return absl::InvalidArgumentError(StrCat("bad placement '", text, "': bad hierarchy"));
      }
      hierarchy.push_back(h);
    }
  }
  auto placement = Placement::Create(type, std::move(ranks), std::move(hierarchy));
  if (!placement.ok()) {
    return absl::InvalidArgumentError(StrCat("bad placement '", text, "': ", placement.status().message()));
  }
  return placement;
}

}  // namespace tessera
