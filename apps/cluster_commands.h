#pragma once
// The cluster verbs of the `tessera` binary (DESIGN §1): `master`, `worker`,
// `submit`, `status`, `logs`, `cancel`. Each verb parses, calls cluster/ and
// prints; the daemons run until SIGINT or SIGTERM and then stop cleanly.
//
// Wiring (apps/main.cc): AddClusterCommands(app, deps) before app.parse().
// A verb runs in its subcommand's callback, inside app.parse(), and ends by
// throwing: CLI::Success when it succeeded (main's `app.exit(e)` returns 0),
// CLI::RuntimeError(one-line reason, 1) when it failed (main's ParseError
// handler prints the line and returns 1).

#include <functional>
#include <memory>

#include "CLI/CLI.hpp"
#include "cluster/job_interfaces.h"

namespace tessera {

struct ClusterCommandDeps {
  // The master's compiler (one per master).
  std::function<std::unique_ptr<cluster::JobCompiler>()> make_compiler;
  // The worker's runners (one per job).
  cluster::PlanRunnerFactory make_runner;
};

void AddClusterCommands(CLI::App& app, ClusterCommandDeps deps);

}  // namespace tessera
