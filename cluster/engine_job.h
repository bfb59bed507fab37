#pragma once
// The engine behind the cluster's seams (cluster/job_interfaces.h): the
// master's JobCompiler resolves a submitted config with the job schema and
// compiles it into one NodePlan per worker (train/ CompileForNodes); the
// worker's PlanRunner runs its NodePlan in an actors::Runtime whose
// communicators across workers are gloo, meeting through the master's KV.
// `tessera train`, the daemons and the embedding API all go through these,
// so a single-box run and a cluster run cannot drift apart.

#include <memory>
#include <string>
#include <vector>

#include "cluster/job_interfaces.h"

namespace tessera::cluster {

// Thread-compatible (the master serialises its calls).
std::unique_ptr<JobCompiler> MakeEngineJobCompiler();

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
};

PlanRunnerFactory MakeEnginePlanRunnerFactory(EngineRunnerOptions options = {});

}  // namespace tessera::cluster
