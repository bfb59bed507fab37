#pragma once
// For tests with GPU cases (ctest label cuda): why this process cannot run
// a case that needs `wanted` GPUs, "" when it can; the reason goes to
// GTEST_SKIP.

#include <string>

#include "core/storage.h"
#include "core/text.h"

namespace tessera::testing {

inline std::string MissingGpus(int wanted) {
  const absl::StatusOr<int> gpus = CudaDeviceCount();
  if (!gpus.ok()) return std::string(gpus.status().message());
  if (*gpus < wanted) return StrCat("needs ", wanted, " GPUs, ", *gpus, " present");
  return "";
}

}  // namespace tessera::testing
