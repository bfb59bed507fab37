#include "cluster/device_offer.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/text.h"

namespace tessera::cluster {
namespace {

constexpr int kMaxDevices = 256;  // a node's devices (actor ids' 8 bits)

bool ParseInt(std::string_view text, int* out) { return absl::SimpleAtoi(std::string(text), out); }

}  // namespace

absl::StatusOr<DeviceOffer> ParseDeviceOffer(std::string_view devices) {
  const std::string shown(devices.substr(0, 64));
  const auto bad = [&shown](std::string_view why) {
    return absl::InvalidArgumentError(
        StrCat("--devices '", shown, "': ", why, " (expected cpu:N, cuda:N or cuda:A-B)"));
  };
  const size_t colon = devices.find(':');
  if (colon == std::string_view::npos) return bad("no device type");
  DeviceOffer offer;
  const std::string_view type = devices.substr(0, colon), count = devices.substr(colon + 1);
  if (type == "cpu") {
    offer.type = DeviceType::kCpu;
  } else if (type == "cuda") {
    offer.type = DeviceType::kCuda;
  } else {
    return bad(StrCat("unknown device type '", type.substr(0, 16), "'"));
  }
  if (const size_t dash = count.find('-'); dash != std::string_view::npos) {
    int first = 0, last = 0;
    if (offer.type != DeviceType::kCuda) return bad("a range names GPUs only");
    if (!ParseInt(count.substr(0, dash), &first) || !ParseInt(count.substr(dash + 1), &last) || first < 0 ||
        last < first || last >= kMaxDevices) {
      return bad(StrCat("a range A-B needs 0 <= A <= B < ", kMaxDevices));
    }
    offer.first = first;
    offer.count = last - first + 1;
    return offer;
  }
  int n = 0;
  if (!ParseInt(count, &n) || n < 1 || n > kMaxDevices) return bad(StrCat("a count in [1, ", kMaxDevices, "]"));
  offer.count = n;
  return offer;
}

absl::StatusOr<std::optional<std::string>> CudaVisibleDevices(const DeviceOffer& offer,
                                                              std::optional<std::string_view> visible) {
  if (offer.type != DeviceType::kCuda) return std::optional<std::string>();
  std::vector<std::string> picked;
  if (!visible.has_value()) {
    for (int i = 0; i < offer.count; ++i) picked.push_back(std::to_string(offer.first + i));
    return std::optional<std::string>(absl::StrJoin(picked, ","));
  }
  const std::vector<std::string> entries = absl::StrSplit(std::string(*visible), ',', absl::SkipWhitespace());
  if (offer.first + offer.count > static_cast<int>(entries.size())) {
    return absl::InvalidArgumentError(StrCat("--devices cuda:", offer.first, "-", offer.first + offer.count - 1,
                                             ": CUDA_VISIBLE_DEVICES='", visible->substr(0, 64), "' shows ",
                                             entries.size(), " GPU(s)"));
  }
  for (int i = 0; i < offer.count; ++i) picked.push_back(entries[static_cast<size_t>(offer.first + i)]);
  return std::optional<std::string>(absl::StrJoin(picked, ","));
}

}  // namespace tessera::cluster
