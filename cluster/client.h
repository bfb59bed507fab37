#pragma once
// A client of the master: submit, inspect, cancel and watch jobs (what the
// CLI verbs and embedding C++ services use). Every method is one RPC (Watch:
// one stream) with the token and TLS of `security`; errors are the master's
// status (INVALID_ARGUMENT with the config error, NOT_FOUND for an unknown
// job, UNAVAILABLE when no master answers, UNAUTHENTICATED without the right
// token). Options that cannot work (an address that is not HOST:PORT, a
// token that cannot travel as a header, a timeout <= 0) make every method
// return the INVALID_ARGUMENT that names them, before any connection; so
// does a job id that is not 1-128 characters of [A-Za-z0-9._-] (no job has
// one), and a cancel reason that is not UTF-8.
// gRPC prints its own errors on stderr, several lines each; call
// RouteGrpcLogs() (cluster/transport.h) once to send them to Tessera's log
// at debug level, as the CLI does.
//
// Thread-safety: thread-safe.

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/transport.h"
#include "comm/proto/control.grpc.pb.h"

namespace tessera::cluster {

class Client {
 public:
  struct Options {
    std::string master = "127.0.0.1:7070";
    Security security;
    absl::Duration timeout = absl::Seconds(30);  // per unary call
    // A master that stops answering (stopped, partitioned) ends a Watch
    // UNAVAILABLE within about twice this (transport.h MakeChannel); a
    // unary call made meanwhile ends at `timeout` (DEADLINE_EXCEEDED) or
    // UNAVAILABLE, whichever comes first. At least 1 s.
    absl::Duration keepalive = absl::Seconds(20);
  };

  explicit Client(Options options);

  // The job's id.
  [[nodiscard]] absl::StatusOr<std::string> Submit(const std::string& config_json,
                                                   const std::vector<std::string>& overrides);
  [[nodiscard]] absl::StatusOr<control::JobInfo> Get(const std::string& job_id);
  [[nodiscard]] absl::StatusOr<std::vector<control::JobInfo>> List();
  [[nodiscard]] absl::StatusOr<std::vector<control::WorkerInfo>> ListWorkers();
  // Stops the job at once; with `checkpoint`, gracefully (control.proto's
  // CancelJobRequest.checkpoint: the answer shows it still RUNNING).
  [[nodiscard]] absl::StatusOr<control::JobInfo> Cancel(const std::string& job_id, const std::string& reason = "",
                                                        bool checkpoint = false);
  // Calls `on_event` for every event of the job, from its first, until the
  // job ends (OK), `on_event` returns false or StopWatches is called
  // (CANCELLED), or the master stops answering (UNAVAILABLE, see
  // Options.keepalive). No deadline. `follow` false: only the events so
  // far, then OK.
  [[nodiscard]] absl::Status Watch(const std::string& job_id,
                                   const std::function<bool(const control::JobEvent&)>& on_event,
                                   bool follow = true);
  // Ends every Watch of this client in progress (from any thread; each
  // returns CANCELLED); later Watches are not affected.
  void StopWatches();

 private:
  // A call's status, with the master's address and gRPC's transport errors
  // (connection refused, TLS handshakes) in words.
  absl::Status Reached(const grpc::Status& status) const;
  const Options options_;
  const absl::Status invalid_;  // OK, or why options_ cannot work
  std::unique_ptr<control::Master::Stub> stub_;
  absl::Mutex mu_;
  std::set<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera::cluster
