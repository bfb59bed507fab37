// The cluster verbs (apps/cluster_commands.h) wired to the test doubles: the
// worker and master processes of the multiprocess tests, and the CLI under
// test. main() catches as apps/main.cc does.

#include <cstdio>
#include <memory>

#include "CLI/CLI.hpp"
#include "apps/cluster_commands.h"
#include "tests/cluster/test_doubles.h"

int main(int argc, char** argv) {
  CLI::App app{"tessera cluster verbs with test doubles (tests only)"};
  app.require_subcommand(1);
  auto counters = std::make_shared<tessera::cluster::testing::RunnerCounters>();
  tessera::AddClusterCommands(
      app, {[] { return std::make_unique<tessera::cluster::testing::FakeJobCompiler>(); },
            tessera::cluster::testing::SleepyRunnerFactory(counters)});
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return 1;
  }
  return 1;
}
