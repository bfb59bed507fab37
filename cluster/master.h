#pragma once
// The master daemon: a registry of workers, a job queue, the job state
// machine, the rendezvous KV and the outputs of jobs (DESIGN §9).
//
// Job states:
//
//   SubmitJob (Resolve ok)
//        |
//        v
//     PENDING <-------------------------------+
//        |  enough free devices: workers      |  a worker is unreachable at
//        |  assigned                          |  LoadPlan, or lost: the job
//        v                                    |  goes back to the queue's head
//    COMPILING -------------------------------+
//        |   \---- compile error, LoadPlan or Start refused ----> FAILED
//        |  every node loaded, then started
//        v
//     RUNNING ----- a node fails, a worker is lost -------------> FAILED
//        |          or re-registers
//        |  every node reported OK
//        v
//    SUCCEEDED
//
//   CancelJob in PENDING, COMPILING or RUNNING -----------------> CANCELLED
//
// SUCCEEDED, FAILED and CANCELLED are final. Leaving COMPILING or RUNNING
// for FAILED or CANCELLED stops the job on every worker it had (Stop RPCs);
// a worker's devices are free again once it no longer holds the job (its
// heartbeat no longer lists it, it reported its end, or it is lost).
//
// Scheduling policy: a job takes whole workers. Free live workers are taken
// in registration order until their devices add up to devices_needed; slot i
// (node i) gets min(worker's devices, devices still needed) of them. Jobs are
// started first-in first-out; a job that needs more devices than all live
// workers have together stays PENDING (with a reason saying so) and does not
// block the jobs behind it; it starts once enough workers join. Each
// placement (a launch: compile, LoadPlan and Start on every node) runs on a
// thread of its own, so a worker slow to answer holds no other job; a
// launch whose job was queued again meanwhile (a worker lost or shutting
// down) stops, and its stops name it (Stop.launch).
//
// Liveness: workers heartbeat every heartbeat_interval; the master also
// probes each worker's Status RPC every heartbeat_interval. A worker that
// has not heartbeated within worker_timeout, or has failed probe_failures
// probes in a row, is lost: removed from the registry, its job FAILED naming
// it (one still loading, COMPILING, queued again). A hung (SIGSTOPped)
// worker answers neither, so both catch it.
//
// Persistence: with a state_dir, each job is a file <state_dir>/<job id>.json,
// rewritten through a temporary name and a rename on every state change.
// Start() reloads them; jobs not final then become FAILED ("master
// restarted").
//
// Outputs: for a job whose spec has an output_dir the master writes
// config.json (the resolved config) when it starts, metrics.jsonl (the
// metrics reported, the trainer's format) and log.txt (every node's log lines, as
// "[node i] line").
//
// Thread-safety: all public methods are thread-safe. The master owns its
// compiler (called by one thread at a time), its gRPC server, its threads
// (the scheduler, one per launch under way, the monitor, one prober per
// worker) and the metrics server.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/job_interfaces.h"
#include "cluster/transport.h"

namespace tessera::cluster {

class Master {
 public:
  struct Options {
    std::string listen = "127.0.0.1:0";
    std::string state_dir;  // empty: nothing persisted
    Security security;      // token, TLS (as a server and towards workers)
    int metrics_port = -1;  // -1: no /metrics; 0: the OS picks (see metrics_port())
    std::string metrics_host = "127.0.0.1";
    absl::Duration heartbeat_interval = absl::Seconds(1);
    absl::Duration worker_timeout = absl::Seconds(5);
    absl::Duration probe_timeout = absl::Seconds(2);
    int probe_failures = 3;
    absl::Duration rpc_timeout = absl::Seconds(10);  // LoadPlan, Start, Stop
    absl::Duration max_kv_wait = absl::Minutes(10);
    // KvWait and WatchJob calls held at once (each holds one of the
    // server's threads while it waits: a client opening thousands took as
    // many threads). More are RESOURCE_EXHAUSTED; the KV's clients try again.
    int max_waiting_calls = 2048;
    // The KV's keys and values together (what jobs keep there is small; a
    // client filling it would take the master's memory).
    size_t max_kv_bytes = size_t{256} << 20;
    // A graceful cancel (CancelJobRequest.checkpoint) that has not ended the
    // job after this long stops it at once.
    absl::Duration stop_grace = absl::Minutes(5);
    size_t max_events_per_job = 100000;  // WatchJob history; the oldest go first
    // Log a job that ends FAILED or CANCELLED at warning level (else info):
    // off where the submitter prints the reason itself (`tessera train`).
    bool warn_on_job_failure = true;
  };

  Master(Options options, std::unique_ptr<JobCompiler> compiler);
  ~Master();  // Shutdown()
  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;

  // Reloads the state dir, binds, starts serving; returns the bound address
  // ("127.0.0.1:41234"). Errors: the address cannot be bound, the state dir
  // is unusable.
  [[nodiscard]] absl::StatusOr<std::string> Start();
  // The bound port of /metrics (after Start), or -1.
  int metrics_port() const;
  // Ends watches and waits, stops the server and the threads. Jobs still
  // running are left to the workers (they drop them when the master goes).
  void Shutdown();
  // The first step of a graceful shutdown (`tessera master`'s SIGINT or
  // SIGTERM): takes no new job (SubmitJob: UNAVAILABLE) and places none;
  // each running job stops as a graceful cancel stops it (at an iteration
  // boundary its nodes agree on, with a checkpoint there, ending CANCELLED
  // "the master is shutting down; interrupted at iteration N; checkpoint
  // ..."), one still compiling goes back to the queue; queued jobs stay queued (their
  // records keep them PENDING, and the next master on the state directory
  // queues them again). Returns once no job runs (or Shutdown was called);
  // then call Shutdown. A stop that hangs ends at the grace period.
  void Drain();
  // Jobs compiling or running now.
  int jobs_running() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::cluster
