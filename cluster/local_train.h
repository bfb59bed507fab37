#pragma once
// `tessera train CONFIG` on one box: a master and a worker in this process,
// the same code a cluster runs (the master's compiler and queue, the
// worker's NodePlan runner, the client's watch), so single-box and cluster
// runs cannot drift apart. Both listen on 127.0.0.1 only, on ports the OS
// picks, and require a token made for this run.
//
// Thread-safety: call from one thread; it blocks until the job ends.

#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "cluster/engine_job.h"
#include "nlohmann/json.hpp"

namespace tessera::cluster {

// Runs the resolved job config to completion. `progress` (may be null) gets
// the progress line of every logged iteration (train/trainer.h
// FormatProgressLine); the master writes train.output_dir. Errors: the
// config's (as the master's compiler reports them, before anything starts),
// else the job's failure reason as its worker reported it.
// `stop` (may be null): Request() ends the run at the end of the iteration
// it is in, with a checkpoint there (cluster/engine_job.h GracefulStop); the
// result is then Cancelled saying where.
absl::Status TrainOnThisMachine(const nlohmann::json& config, std::FILE* progress,
                                std::shared_ptr<GracefulStop> stop = nullptr);

}  // namespace tessera::cluster
