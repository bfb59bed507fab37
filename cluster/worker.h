#pragma once
// The worker daemon: registers with the master (retrying until it answers),
// heartbeats, serves the Worker service (LoadPlan, Start, Stop, Status) and
// runs each job's PlanRunner on a thread of its own (DESIGN §9).
//
// A job on a worker:
//
//   LoadPlan --> LOADING --(runner Load ok)--> LOADED --Start--> RUNNING --Run returns--> DONE (reaped)
//                   |                            |                  |
//                   +---(Load fails: the RPC's error, forgotten)    +-- Stop: runner Cancel; Run returns
//                                  Stop: forgotten <--------------------+
//
// A job's metrics rows and log lines are queued and sent to the master in
// order by one reporter thread (each retried while its failure passes), so
// training never waits on the master. When Run returns the worker reports
// the result to the master after them (Report, finished), then the job's thread is joined and everything it held
// (runner, KV client) released within a heartbeat interval, so a worker runs any number of jobs in a row without
// growing.
//
// The master's heartbeat answers list jobs to drop: those are cancelled. If
// the master is unreachable for master_timeout (or the master's worker
// timeout, where longer), or no longer knows this
// worker (it restarted), every job is cancelled and the worker registers
// again, retrying every heartbeat interval.
//
// Thread-safety: all public methods are thread-safe. The worker owns its
// server, its heartbeat thread and the jobs' threads and runners.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/job_interfaces.h"
#include "cluster/transport.h"

namespace tessera::cluster {

class Worker {
 public:
  struct Options {
    std::string master;                  // the master's address
    std::string listen = "127.0.0.1:0";  // the Worker service
    std::string devices = "cpu:1";       // "cpu:N", "cuda:0-7"
    std::string data_address;            // the data plane's address, passed to peers
    std::string worker_id;               // empty: the master assigns one
    Security security;                   // token; TLS as a server (cert/key) and to the master (ca)
    absl::Duration heartbeat_interval = absl::Seconds(1);  // until the master says otherwise
    // How long a silent master is waited for before the jobs are cancelled
    // (at least: the master's own worker timeout where longer, given at
    // registration).
    absl::Duration master_timeout = absl::Seconds(5);
    absl::Duration rpc_timeout = absl::Seconds(10);
    // Dials the master (empty: MakeChannel(master, security)): an
    // embedder's own channel (a proxy, interceptors); the tests inject
    // failed calls here.
    std::function<std::shared_ptr<grpc::Channel>()> master_channel;
  };

  Worker(Options options, PlanRunnerFactory factory);
  ~Worker();  // Shutdown()
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Binds the Worker service and starts registering; returns the bound
  // address. Does not wait for the master.
  [[nodiscard]] absl::StatusOr<std::string> Start();
  // Cancels every job, joins their threads, stops serving.
  void Shutdown();
  // The first step of a graceful shutdown (`tessera worker`'s SIGINT or
  // SIGTERM): takes no new job (LoadPlan: UNAVAILABLE; the master, told at
  // once by a heartbeat marked draining, places none here) and has each job
  // it holds stopped as a graceful cancel stops it: at an iteration boundary
  // its nodes agree on, with a checkpoint there, the job ending CANCELLED
  // ("worker ID is shutting down; interrupted at iteration N; checkpoint
  // ..."; the master stops the job's other nodes, this worker its own; a
  // master that does not answer is not waited on). Returns once every job
  // has ended and been reported (or Shutdown was called); then call
  // Shutdown, which tells the master the worker is gone. A job whose stop
  // hangs is the master's to end (Master::Options::stop_grace), or
  // Shutdown's.
  void Drain();

  // The id the master gave (empty until registered) and whether it is
  // registered now.
  std::string worker_id() const;
  bool registered() const;
  // Jobs held (loading, loaded or running; finished ones not yet reaped too).
  int jobs_held() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::cluster
