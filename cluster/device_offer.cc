#include "cluster/device_offer.h"

#include <algorithm>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/text.h"

namespace tessera::cluster {
namespace {

constexpr int kMaxDevices = 256;  // a node's devices (actor ids' 8 bits)
constexpr size_t kMaxOfferBytes = 1024;

// Plain decimal digits only (no sign, no spaces), as an index or count is written.
bool ParseInt(std::string_view text, int* out) {
  if (text.empty() || text.size() > 9 || !absl::c_all_of(text, absl::ascii_isdigit)) return false;
  return absl::SimpleAtoi(std::string(text), out);
}

}  // namespace

absl::StatusOr<DeviceOffer> ParseDeviceOffer(std::string_view devices) {
  const std::string shown(devices.substr(0, 64));
  const auto bad = [&shown](std::string_view why) {
    return absl::InvalidArgumentError(
        StrCat("--devices '", shown, "': ", why, " (expected cpu:N, cuda:I, cuda:A-B or a list such as cuda:0,2-3)"));
  };
  // Bounded before anything is split (the master parses what a registration sends).
  if (devices.size() > kMaxOfferBytes) return bad(StrCat("longer than ", kMaxOfferBytes, " characters"));
  const size_t colon = devices.find(':');
  if (colon == std::string_view::npos) return bad("no device type");
  DeviceOffer offer;
  const std::string_view type = devices.substr(0, colon), rest = devices.substr(colon + 1);
  if (type == "cpu") {
    int n = 0;
    if (!ParseInt(rest, &n) || n < 1 || n > kMaxDevices) {
      return bad(StrCat("cpu:N is a count of virtual devices in [1, ", kMaxDevices, "]"));
    }
    offer.type = DeviceType::kCpu;
    offer.cpus = n;
    return offer;
  }
  if (type != "cuda") return bad(StrCat("unknown device type '", type.substr(0, 16), "'"));
  offer.type = DeviceType::kCuda;
  if (rest.empty()) return bad("no GPU named");
  const std::vector<std::string> items = absl::StrSplit(std::string(rest), ',');
  for (const std::string_view item : items) {
    int first = 0, last = 0;
    if (const size_t dash = item.find('-'); dash != std::string_view::npos) {
      if (!ParseInt(item.substr(0, dash), &first) || !ParseInt(item.substr(dash + 1), &last) || first < 0 ||
          last < first || last >= kMaxDevices) {
        return bad(StrCat("'", item.substr(0, 16), "': a range A-B of GPUs needs 0 <= A <= B < ", kMaxDevices));
      }
    } else if (!ParseInt(item, &first) || first < 0 || first >= kMaxDevices) {
      return bad(StrCat("'", item.substr(0, 16), "': a GPU index in [0, ", kMaxDevices, ")"));
    } else {
      last = first;
    }
    if (!offer.gpus.empty() && first <= offer.gpus.back()) {
      return bad(StrCat("GPU ", first, " comes after GPU ", offer.gpus.back(), ": list each GPU once, ascending"));
    }
    for (int g = first; g <= last; ++g) offer.gpus.push_back(g);
  }
  return offer;
}

absl::StatusOr<std::optional<std::string>> CudaVisibleDevices(const DeviceOffer& offer,
                                                              std::optional<std::string_view> visible) {
  if (offer.type != DeviceType::kCuda) return std::optional<std::string>();
  if (!visible.has_value()) return std::optional<std::string>(absl::StrJoin(offer.gpus, ","));
  // As CUDA reads it: entries are indices or UUIDs (GPU-..., MIG-...),
  // spaces around them ignored, and the first entry that is neither (-1, a
  // name) hides it and every one after it.
  std::vector<std::string> entries;
  for (absl::string_view entry : absl::StrSplit(std::string(*visible), ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const bool index = !entry.empty() && std::all_of(entry.begin(), entry.end(), absl::ascii_isdigit);
    if (!index && !absl::StartsWith(entry, "GPU-") && !absl::StartsWith(entry, "MIG-")) break;
    entries.emplace_back(entry);
  }
  std::vector<std::string> picked;
  for (const int gpu : offer.gpus) {
    if (gpu >= static_cast<int>(entries.size())) {
      return absl::InvalidArgumentError(StrCat("GPU ", gpu, " is not among the ", entries.size(),
                                               " GPU(s) that CUDA_VISIBLE_DEVICES='", visible->substr(0, 64),
                                               "' shows"));
    }
    picked.push_back(entries[static_cast<size_t>(gpu)]);
  }
  return std::optional<std::string>(absl::StrJoin(picked, ","));
}

}  // namespace tessera::cluster
