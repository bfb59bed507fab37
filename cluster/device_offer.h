#pragma once
// What a worker offers (`tessera worker --devices`): "cpu:N" (N virtual CPU
// devices), "cuda:N" (GPUs 0 .. N-1) or "cuda:A-B" (GPUs A .. B). Plans
// number a node's devices from 0; a worker offering cuda:A-B runs them on
// GPUs A .. B by narrowing CUDA_VISIBLE_DEVICES to those before the CUDA
// runtime starts (CudaVisibleDevices), so cuda:0 of its plans is GPU A.

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace tessera::cluster {

struct DeviceOffer {
  DeviceType type = DeviceType::kCpu;
  int first = 0;  // the first device's index (cuda:A-B: A)
  int count = 1;
};

// Errors name the text and what is expected (one line).
absl::StatusOr<DeviceOffer> ParseDeviceOffer(std::string_view devices);

// The CUDA_VISIBLE_DEVICES that shows a CUDA offer's GPUs as 0 .. count-1:
// their indices ("2,3"), or, when the process already sees a narrowed set
// (`visible`, the current value), those entries of it ("GPU-a,GPU-b" with
// cuda:1-1 gives "GPU-b"). nullopt for a CPU offer. An offer past the
// visible set is an error.
absl::StatusOr<std::optional<std::string>> CudaVisibleDevices(const DeviceOffer& offer,
                                                              std::optional<std::string_view> visible);

}  // namespace tessera::cluster
