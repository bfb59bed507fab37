#pragma once
// The engine behind the cluster's seams (cluster/job_interfaces.h): the
// master's JobCompiler resolves a submitted config with the job schema and
// compiles it into one NodePlan per worker (train/ CompileForNodes); the
// worker's PlanRunner runs its NodePlan in an actors::Runtime whose
// communicators across workers are gloo, meeting through the master's KV.
// `tessera train`, the daemons and the embedding API all go through these,
// so a single-box run and a cluster run cannot drift apart.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cluster/job_interfaces.h"

namespace tessera::cluster {

// Thread-compatible (the master serialises its calls).
std::unique_ptr<JobCompiler> MakeEngineJobCompiler();

// A graceful stop (`tessera train`'s Ctrl-C) for the runners of this
// process: Request() asks each running job to stop as PlanRunner::
// RequestStop does (the runner's graceful stop: the job's nodes agree on an
// iteration boundary, finish the iterations before it, write a checkpoint
// there and end with Cancelled "interrupted at iteration N; checkpoint
// ..."). Thread-safe; Request may be called from any thread (not from a
// signal handler).
class GracefulStop {
 public:
  void Request();
  bool requested() const;
  // Calls `fn` on Request (at once if already requested), until Unwatch.
  int Watch(std::function<void()> fn);
  void Unwatch(int id);

 private:
  mutable std::mutex mu_;
  bool requested_ = false;
  int next_id_ = 0;
  std::map<int, std::function<void()>> watchers_;
};

struct EngineRunnerOptions {
  // Where this worker's gloo transport listens when the worker gives no
  // data-plane address (`tessera worker --data-address HOST[:PORT]`: its host).
  std::string hostname = "127.0.0.1";
  // gloo rendezvous and per-op timeout.
  double connect_timeout_s = 30;
  // The runtime's stall watchdog (0 = none).
  double stall_timeout_s = 120;
  // Kernel threads per device when the job sets no train.dist.intra_op_threads
  // (0 = the machine's share).
  int intra_op_threads = 0;
  // How long a graceful stop waits for the job's other nodes to say where
  // they are before it stops the job at once.
  double stop_agreement_timeout_s = 60;
  // Shared by the runners made by one factory; null: none (RequestStop
  // still stops gracefully).
  std::shared_ptr<GracefulStop> graceful_stop;
};

PlanRunnerFactory MakeEnginePlanRunnerFactory(EngineRunnerOptions options = {});

}  // namespace tessera::cluster
