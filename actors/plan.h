#pragma once
// The physical plan (comm/proto/plan.proto) on the runtime side: conversions
// between proto and core types, serialisation, validation, the per-device
// memory estimate, and PlanBuilder, a small helper for hand-written plans
// (tests, benchmarks).

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/proto/plan.pb.h"
#include "comm/proto/plan_codec.h"
#include "core/dtype.h"
#include "core/sbp.h"
#include "core/shape.h"
#include "ops/attr.h"
#include "ops/registry.h"

namespace tessera::actors {

// The plan codec lives in comm/proto (shared with the scheduler); the
// runtime uses it under these names.
using comm::AttrMapFromProto;
using comm::CheckPlanSize;
using comm::EstimateMemory;
using comm::FromProto;
using comm::ParseNodePlan;
using comm::ParsePlan;
using comm::PiecesPerIteration;
using comm::PlanBuilder;
using comm::SerializeNodePlan;
using comm::SerializePlan;
using comm::SplitPlan;
using comm::TensorMetaFromProto;
using comm::TensorSliceFromProto;
using comm::ToProto;

// Structural checks: ids unique and valid, every register desc's producer and
// consumers list it (and no task consumes what it produces), quotas in
// [1, kMaxRegisterNum], tensors within core/checked.h's limits and byte
// sizes matching them, tensor refs and slices in range (micro-batch strides
// included), ops known with valid attributes and (compute) outputs matching
// shape inference, kind-specific arities, boxing and transfer descriptions
// that the runtime can build, piece rates that agree along every desc (a
// repeat produces repeat_num pieces per consumed one, an acc one per
// repeat_num; every other consumer runs at its producer's rate; a parameter
// with an update runs once per iteration), and the counts of
// comm/proto/plan_codec.h's limits, so the act counts of the run fit in
// int64. Errors name the task or desc. Any plan that ParsePlan returns gets
// OK or an error: plans arrive from the network.
absl::Status ValidatePlan(const proto::Plan& plan, const ops::OpRegistry& registry);

}  // namespace tessera::actors
