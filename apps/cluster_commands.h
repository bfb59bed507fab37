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
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "cluster/job_interfaces.h"

namespace tessera {

struct ClusterCommandDeps {
  // The master's compiler (one per master).
  std::function<std::unique_ptr<cluster::JobCompiler>()> make_compiler;
  // The worker's runners (one per job).
  cluster::PlanRunnerFactory make_runner;
  // `submit --fast-dev-run`: the overrides that make the config's job a
  // fast dev run (train/job_config.h's FastDevRunOverrides); unset: the
  // flag is refused.
  std::function<absl::StatusOr<std::vector<std::string>>(const std::string& config,
                                                         const std::vector<std::string>& overrides)>
      fast_dev_run_overrides = {};
};

void AddClusterCommands(CLI::App& app, ClusterCommandDeps deps);

}  // namespace tessera
