#pragma once
// What a worker offers (`tessera worker --devices`): "cpu:N" (N virtual CPU
// devices) or GPUs by their indices on the machine, as devices are named
// (DESIGN §4): "cuda:I" (GPU I), "cuda:A-B" (GPUs A .. B) or a list of those
// ("cuda:0,2-3"), ascending. Plans number a node's devices from 0; a worker
// runs them on the GPUs it offers by narrowing CUDA_VISIBLE_DEVICES to those
// before the CUDA runtime starts (CudaVisibleDevices), so cuda:0 of its
// plans is the first GPU offered.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace tessera::cluster {

struct DeviceOffer {
  DeviceType type = DeviceType::kCpu;
  int cpus = 1;           // cpu: the virtual devices offered
  std::vector<int> gpus;  // cuda: the machine's GPU indices offered, ascending

  // The devices offered.
  int count() const { return type == DeviceType::kCuda ? static_cast<int>(gpus.size()) : cpus; }
};

// Errors name the text and what is expected (one line).
absl::StatusOr<DeviceOffer> ParseDeviceOffer(std::string_view devices);

// The CUDA_VISIBLE_DEVICES that shows a CUDA offer's GPUs as 0 .. count-1:
// their indices ("2,3"), or, when the process already sees a narrowed set
// (`visible`, the current value), those entries of it ("GPU-a,GPU-b" with
// cuda:1 gives "GPU-b"; read as CUDA reads it: spaces around entries
// ignored, the first entry that is no index or UUID ending the list).
// nullopt for a CPU offer. An offer past the visible set is an error
// naming the GPU.
absl::StatusOr<std::optional<std::string>> CudaVisibleDevices(const DeviceOffer& offer,
                                                              std::optional<std::string_view> visible);

}  // namespace tessera::cluster
