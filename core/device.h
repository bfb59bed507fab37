#pragma once
// A device on a node: `cpu:i` (a virtual CPU device with its own threads) or
// `cuda:i`. Parsed from and printed to that text form.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera {

enum class DeviceType : uint8_t { kCpu = 0, kCuda = 1 };

std::string_view DeviceTypeName(DeviceType type);  // "cpu" / "cuda"
absl::StatusOr<DeviceType> ParseDeviceType(std::string_view name);

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  std::string ToString() const;
  bool operator==(const Device&) const = default;
};

// Parses "cpu:0", "cuda:3" (and "cpu" as cpu:0).
absl::StatusOr<Device> ParseDevice(std::string_view text);

}  // namespace tessera
