#pragma once
// GlooStore: gloo's rendezvous Store (set / get / wait) over a KvStore, so a
// gloo context finds its peers through the master's KV in a cluster and
// through InProcessKvStore or a file-backed store in tests (DESIGN.md §9).
// gloo ships no TCP store; this is the adapter.
//
// Contract:
// - Every key is stored as "<prefix>/<key>" in the KvStore, so communicators
//   of different groups (and the two contexts of one communicator) never see
//   each other's keys.
// - get waits for the key (up to the timeout), like gloo's own stores; wait
//   without a timeout uses the one given at construction.
// - gloo's Store interface knows only exceptions: every failure (a KvStore
//   error, a timeout) throws gloo::IoException with the KvStore's message, and
//   is also kept as a Status (last_error()) so the caller that catches the
//   exception can return a typed error (DeadlineExceeded stays
//   DeadlineExceeded).
//
// Thread-safety: thread-safe if the KvStore is. The KvStore is borrowed and
// must outlive the GlooStore.

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/collective/kv_store.h"
#include "gloo/rendezvous/store.h"

namespace tessera::comm {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(KvStore& store, std::string prefix, absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  GlooStore(const GlooStore&) = delete;
  GlooStore& operator=(const GlooStore&) = delete;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // The error behind the last exception thrown; OK if none was.
  [[nodiscard]] absl::Status last_error() const;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  // Records `status` and throws it as a gloo::IoException.
  [[noreturn]] void Fail(absl::Status status);

  KvStore& store_;
  const std::string prefix_;
  const absl::Duration timeout_;
  mutable std::mutex mu_;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::comm
