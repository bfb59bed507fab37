#pragma once
// Per-op kernel time of a run, for finding where a step's time goes
// (RuntimeOptions::profile_path; `TESSERA_PROFILE_OPS=FILE` in the
// environment). Each kernel of a Compute or Parameter act (the optimizer's
// update) is timed where it runs, by its OpRunner: an asynchronous act's
// on its stream (a CUDA stream's device time between
// events recorded around its kernels, a CPU stream's worker time), a
// synchronous act's on its actor thread. The first iteration of a run of
// several is left out (caches, cuBLASLt's heuristics and allocators warm
// up in it). Collectives, transfers and the host's callbacks are not
// timed: the sums say what the kernels cost, not what a step waits for.
// Thread-safe.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace tessera::actors {

class OpProfile {
 public:
  struct Entry {
    std::string op, device;
    int64_t acts = 0;
    int64_t ns = 0;
  };
  void Add(const std::string& op, const std::string& device, int64_t ns);
  // By total time, largest first.
  std::vector<Entry> Entries() const;
  // Appends a table to `path`: a "# " line naming the run (`title`), then
  // a tab-separated header and one row per (op, device): acts, total ms,
  // mean µs, share of the device's timed total.
  absl::Status AppendTo(const std::string& path, const std::string& title) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// TESSERA_PROFILE_OPS from the environment ("" when unset).
std::string ProfilePathFromEnvironment();

}  // namespace tessera::actors
