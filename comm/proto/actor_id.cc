#include "comm/proto/actor_id.h"

#include "core/status.h"
#include "core/text.h"

namespace tessera::comm {
namespace {

uint64_t Field(uint64_t encoded, int shift, int bits) { return (encoded >> shift) & FieldMax(bits); }

absl::Status CheckField(std::string_view name, uint64_t value, int bits) {
  if (value > FieldMax(bits)) {
    return absl::InvalidArgumentError(
        StrCat("actor id field ", name, " = ", value, " does not fit in ", bits, " bits (max ", FieldMax(bits), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ActorId::ToString() const {
  return StrCat("node ", node, " ", device().ToString(), " stream ", stream, " task ", task);
}

absl::StatusOr<uint64_t> EncodeActorId(const ActorId& id) {
  const auto device_type = static_cast<uint64_t>(id.device_type);
  RETURN_IF_ERROR(CheckField("node", id.node, kNodeBits));
  RETURN_IF_ERROR(CheckField("device_type", device_type, kDeviceTypeBits));
  RETURN_IF_ERROR(CheckField("device_index", id.device_index, kDeviceIndexBits));
  RETURN_IF_ERROR(CheckField("stream", id.stream, kStreamBits));
  RETURN_IF_ERROR(CheckField("task", id.task, kTaskBits));
  return (uint64_t{id.node} << kNodeShift) | (device_type << kDeviceTypeShift) |
         (uint64_t{id.device_index} << kDeviceIndexShift) | (uint64_t{id.stream} << kStreamShift) |
         (uint64_t{id.task} << kTaskShift);
}

ActorId DecodeActorId(uint64_t encoded) {
  ActorId id;
  id.node = static_cast<uint32_t>(Field(encoded, kNodeShift, kNodeBits));
  id.device_type = static_cast<DeviceType>(Field(encoded, kDeviceTypeShift, kDeviceTypeBits));
  id.device_index = static_cast<uint32_t>(Field(encoded, kDeviceIndexShift, kDeviceIndexBits));
  id.stream = static_cast<uint32_t>(Field(encoded, kStreamShift, kStreamBits));
  id.task = static_cast<uint32_t>(Field(encoded, kTaskShift, kTaskBits));
  return id;
}

absl::Status ValidateActorId(uint64_t encoded) {
  const uint64_t type = Field(encoded, kDeviceTypeShift, kDeviceTypeBits);
  if (type != static_cast<uint64_t>(DeviceType::kCpu) && type != static_cast<uint64_t>(DeviceType::kCuda)) {
    return absl::InvalidArgumentError(StrCat("actor id ", encoded, " has unknown device type ", type));
  }
  return absl::OkStatus();
}

std::string ActorIdToString(uint64_t encoded) {
  if (!ValidateActorId(encoded).ok()) return StrCat("actor id ", encoded, " (invalid device type)");
  return DecodeActorId(encoded).ToString();
}

}  // namespace tessera::comm
