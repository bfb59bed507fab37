#pragma once
// Descriptions of registered ops for users (`tessera ops`): inputs, outputs,
// attributes, kernels per device, gradient, and SBP signatures shown for the
// op's example inputs over 2 devices.

#include <string>

#include "nlohmann/json.hpp"
#include "ops/registry.h"

namespace tessera::ops {

nlohmann::json DescribeOpsJson(const OpRegistry& registry);
std::string DescribeOpsText(const OpRegistry& registry);

}  // namespace tessera::ops
