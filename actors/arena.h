#pragma once
// A job's arenas (comm/proto/memory_plan.h) at run time: one block of memory
// per device, allocated once when the plan loads, the planned registers
// tensors inside it; and the monitor that follows which of those registers
// are in use.
//
// A register is in use from the act that takes it (its producer starts
// writing) until every reader handed it back (each reader reports its own
// hand-back, before its ack leaves). The monitor counts the bytes in
// use per device and their peak (Runtime::Stats). With checking on it also
// fails the run when a register is taken while another one sharing its bytes
// is in use (the planner's model of the protocol being wrong), and fills each
// register it gets back with 0xFF bytes (NaN for floats), so a kernel that
// reads what it did not write shows in the losses.
//
// Claim and Release are thread-safe (a device's registers are taken and
// handed back on several threads).

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "comm/proto/plan.pb.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace tessera::actors {

// Whether TESSERA_CHECK_ARENA is "1" (the default of RuntimeOptions::check_arena).
bool ArenaCheckFromEnvironment();

class ArenaMonitor {
 public:
  struct Use {
    uint32_t device_index = 0;
    int64_t arena_bytes = 0;
    int64_t peak_bytes = 0;  // the most bytes of its registers in use at once
    // Held outside the arena by the device's Parameter actors, as allocated:
    // the variables' shards and their optimizer state's (listed for devices
    // with an arena, as every device of a plan that computes has).
    int64_t parameter_bytes = 0;
    int64_t optimizer_state_bytes = 0;
  };

  explicit ArenaMonitor(bool check) : check_(check) {}
  ArenaMonitor(const ArenaMonitor&) = delete;
  ArenaMonitor& operator=(const ArenaMonitor&) = delete;

  // Allocates the arenas of `node` (zero-filled) and returns, per planned
  // register desc, its registers' tensors (desc id -> [register][tensor]).
  // Call once, before any Claim.
  absl::StatusOr<std::map<int64_t, std::vector<std::vector<Tensor>>>> Allocate(const proto::Plan& plan, uint32_t node);

  // Register `index` of desc `desc_id` taken by its producer / handed back
  // by one reader (by the producer itself when the desc has no readers);
  // nothing for a desc outside the arena.
  void Claim(int64_t desc_id, int32_t index);
  void Release(int64_t desc_id, int32_t index);
  // A collective's scratch or a compute's kernel workspace in the arena
  // (Task.scratch_offset; undefined when
  // it has none there), and its use by one act: claimed when the act starts,
  // released when it ends.
  Tensor Scratch(uint64_t actor_id) const;
  void ClaimScratch(uint64_t actor_id);
  void ReleaseScratch(uint64_t actor_id);

  // The first overlap seen (checking on), else OK.
  absl::Status status() const;
  // Called once, with that status, when the first overlap is seen (on the
  // thread that saw it): the runtime stops the job there. Set before any
  // Claim.
  void OnViolation(std::function<void(const absl::Status&)> fn) { on_violation_ = std::move(fn); }
  std::vector<Use> Uses() const;
  // A Parameter actor on `device_index` allocated these bytes (any thread).
  void CountHeld(uint32_t device_index, int64_t parameter_bytes, int64_t optimizer_state_bytes);

 private:
  struct Register {
    size_t device = 0;  // index into devices_
    int64_t begin = 0, bytes = 0;
    void* data = nullptr;
    int64_t desc_id = 0;
    int32_t index = 0;
    std::string name;  // "register 0 of desc 3 ('add')", "the scratch of 'boxing:...'"
    int readers = 1;   // hand-backs that end a use
    std::unique_ptr<std::atomic<int>> pending = std::make_unique<std::atomic<int>>(0);
  };
  struct Device {
    uint32_t index = 0;
    std::shared_ptr<Storage> storage;
    int64_t bytes = 0;
    bool host = false;  // CPU memory (zeroed and poisoned with memset)
    std::mutex mu;
    std::atomic<int64_t> live{0};
    std::atomic<int64_t> peak{0};
    std::map<int64_t, const Register*> in_use ABSL_GUARDED_BY(mu);  // begin -> register (checking on)
  };
  const Register* Find(int64_t desc_id, int32_t index) const;
  void ClaimRegister(const Register* reg);
  void ReleaseRegister(const Register* reg);

  const bool check_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::unordered_map<int64_t, std::vector<Register>> registers_;  // desc id -> per register; fixed after Allocate
  struct ScratchUse {
    Register reg;
    Tensor tensor;
  };
  std::unordered_map<uint64_t, ScratchUse> scratch_;  // actor id -> its scratch; fixed after Allocate
  std::function<void(const absl::Status&)> on_violation_;
  mutable std::mutex held_mu_;
  std::map<uint32_t, std::pair<int64_t, int64_t>> held_ ABSL_GUARDED_BY(held_mu_);  // device -> (parameters, state)
  mutable std::mutex status_mu_;
  absl::Status status_ ABSL_GUARDED_BY(status_mu_);
};

}  // namespace tessera::actors
