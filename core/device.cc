#include "core/device.h"

#include "core/text.h"

namespace tessera {

std::string_view DeviceTypeName(DeviceType type) {
  return type == DeviceType::kCpu ? "cpu" : "cuda";
}

absl::StatusOr<DeviceType> ParseDeviceType(std::string_view name) {
  if (name == "cpu") return DeviceType::kCpu;
  if (name == "cuda" || name == "gpu") return DeviceType::kCuda;
  return absl::InvalidArgumentError(
      StrCat("unknown device type '", name, "' (expected cpu or cuda)"));
}

std::string Device::ToString() const { return StrCat(DeviceTypeName(type), ":", index); }

absl::StatusOr<Device> ParseDevice(std::string_view text) {
  const size_t colon = text.find(':');
  Device device;
  auto type = ParseDeviceType(text.substr(0, colon));
  if (!type.ok()) {
    return absl::InvalidArgumentError(StrCat("bad device '", text, "': ", type.status().message()));
  }
  device.type = *type;
  if (colon != std::string_view::npos) {
    int index = -1;
    if (!ParseInteger(text.substr(colon + 1), &index) || index < 0) {
      return absl::InvalidArgumentError(
          StrCat("bad device '", text, "': index must be a non-negative integer"));
    }
    device.index = index;
  }
  return device;
}

}  // namespace tessera
