#pragma once
// Actor ids (DESIGN §7 layout) live in comm/proto/actor_id.h, shared with the
// scheduler that assigns them; the runtime uses them under these names.

#include "comm/proto/actor_id.h"

namespace tessera::actors {

using comm::ActorId;
using comm::ActorIdToString;
using comm::DecodeActorId;
using comm::EncodeActorId;
using comm::FieldMax;
using comm::StreamOf;
using comm::ValidateActorId;
using comm::kDeviceIndexBits;
using comm::kDeviceIndexShift;
using comm::kDeviceTypeBits;
using comm::kDeviceTypeShift;
using comm::kNodeBits;
using comm::kNodeShift;
using comm::kStreamBits;
using comm::kStreamShift;
using comm::kTaskBits;
using comm::kTaskShift;

}  // namespace tessera::actors
