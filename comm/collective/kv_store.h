#pragma once
// KvStore: the key-value rendezvous that communicators use to find each other
// (DESIGN §9). In a cluster it is the master's KV (Put/Get/Wait RPCs, see
// cluster/); in one process InProcessKvStore. gloo's rendezvous and NCCL's
// unique ids go through it.
//
// Contract:
// - Keys are written once per job: Set of a key that already holds a value
//   replaces it (callers namespace keys by job and group, so this only
//   happens when a job reuses a name on purpose).
// - Wait blocks until every key is set, then returns their values in the
//   order asked; after `timeout` it fails with DeadlineExceeded naming the
//   keys still missing. Nothing waits forever.
// - Errors of the store itself (a lost master) come back as a Status, never
//   an exception or an abort.
//
// Thread-safety: implementations are thread-safe.

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera::comm {

class KvStore {
 public:
  virtual ~KvStore() = default;
  [[nodiscard]] virtual absl::Status Set(const std::string& key, std::string value) = 0;
  // NotFound when the key is not set (does not wait).
  [[nodiscard]] virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                                      absl::Duration timeout) = 0;
};

// A KvStore for threads of one process.
class InProcessKvStore final : public KvStore {
 public:
  absl::Status Set(const std::string& key, std::string value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// A view of `inner` whose Wait gives up with Cancelled once `cancel` is set
// (looked at every 100 ms): a rendezvous that can no longer succeed (a
// member of the same load failed) stops waiting for peers. Set and Get go
// straight through. Both are borrowed.
class CancellableKvStore final : public KvStore {
 public:
  CancellableKvStore(KvStore& inner, const std::atomic<bool>& cancel) : inner_(inner), cancel_(cancel) {}
  absl::Status Set(const std::string& key, std::string value) override { return inner_.Set(key, std::move(value)); }
  absl::StatusOr<std::string> Get(const std::string& key) override { return inner_.Get(key); }
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  KvStore& inner_;
  const std::atomic<bool>& cancel_;
};

}  // namespace tessera::comm
