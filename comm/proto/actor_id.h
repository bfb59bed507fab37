#pragma once
// Actor ids (DESIGN §7): one 64-bit integer that routes a message, laid out
// from the most significant bit down as
//   node 16 | device type 4 | device index 8 | stream 12 | task 24.
// The upper 40 bits (everything above the task) name the stream, and one
// stream is one thread: routing a message needs only `StreamOf(id)`.
// The field widths are the constants below; the shifts are derived from them.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace tessera::comm {

inline constexpr int kTaskBits = 24;
inline constexpr int kStreamBits = 12;
inline constexpr int kDeviceIndexBits = 8;
inline constexpr int kDeviceTypeBits = 4;
inline constexpr int kNodeBits = 16;
static_assert(kTaskBits + kStreamBits + kDeviceIndexBits + kDeviceTypeBits + kNodeBits == 64);

inline constexpr int kTaskShift = 0;
inline constexpr int kStreamShift = kTaskShift + kTaskBits;
inline constexpr int kDeviceIndexShift = kStreamShift + kStreamBits;
inline constexpr int kDeviceTypeShift = kDeviceIndexShift + kDeviceIndexBits;
inline constexpr int kNodeShift = kDeviceTypeShift + kDeviceTypeBits;

// No actor: all bits set, which no valid id has (its device type is not one).
inline constexpr uint64_t kNoActorId = ~uint64_t{0};

// Largest value each field may hold.
inline constexpr uint64_t FieldMax(int bits) { return (uint64_t{1} << bits) - 1; }

struct ActorId {
  uint32_t node = 0;          // kNodeBits
  DeviceType device_type = DeviceType::kCpu;  // kDeviceTypeBits
  uint32_t device_index = 0;  // kDeviceIndexBits
  uint32_t stream = 0;        // kStreamBits: the thread within the device
  uint32_t task = 0;          // kTaskBits: the actor within the stream

  Device device() const { return Device{device_type, static_cast<int>(device_index)}; }
  // "node 0 cpu:1 stream 2 task 7"
  std::string ToString() const;
  bool operator==(const ActorId&) const = default;
};

// Packs the fields; an out-of-range field is an error naming it.
absl::StatusOr<uint64_t> EncodeActorId(const ActorId& id);
// Unpacks; never fails (every 64-bit value decodes), but a device type
// outside DeviceType is reported by ValidateActorId.
ActorId DecodeActorId(uint64_t encoded);
absl::Status ValidateActorId(uint64_t encoded);

// The stream (= thread) part of an encoded actor id: all bits above the task.
inline constexpr uint64_t StreamOf(uint64_t encoded) { return encoded >> kStreamShift; }
// "node 0 cpu:1 stream 2 task 7" straight from the encoded form.
std::string ActorIdToString(uint64_t encoded);

}  // namespace tessera::comm
