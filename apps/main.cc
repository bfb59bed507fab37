// The `tessera` binary: parses the command line and calls into the
// libraries. Every verb has --help and exits non-zero with a one-line reason
// on bad input.

#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/config.h"
#include "core/logging.h"
#include "ops/describe.h"
#include "ops/registry.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tessera: %s\n", message.c_str());
  return 1;
}

int RunOps(const std::string& format) {
  const auto& registry = tessera::ops::BuiltinOps();
  if (format == "json") {
    std::printf("%s\n", tessera::ops::DescribeOpsJson(registry).dump(2).c_str());
  } else {
    std::printf("%s", tessera::ops::DescribeOpsText(registry).c_str());
  }
  return 0;
}

int RunConfig(const std::string& path, const std::vector<std::string>& overrides) {
  auto config = tessera::config::LoadConfig(path, overrides);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  std::printf("%s\n", config->dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tessera: train large neural networks on many devices from a program written for one."};
  app.set_version_flag("--version", "tessera 0.1.0");
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();

  std::string ops_format = "text";
  CLI::App* ops = app.add_subcommand("ops", "List registered ops: kernels per device, gradient, SBP signatures");
  ops->add_option("--format", ops_format, "Output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  std::string config_path;
  std::vector<std::string> overrides;
  CLI::App* config = app.add_subcommand("config", "Print the resolved config (after _base_ merges and overrides)");
  config->add_option("CONFIG", config_path, "Config file (JSON, comments allowed)")->required();
  config->add_option("overrides", overrides, "key.path=value overrides");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (auto status = tessera::SetLogLevel(log_level); !status.ok()) return Fail(std::string(status.message()));

  if (*ops) return RunOps(ops_format);
  if (*config) return RunConfig(config_path, overrides);
  return Fail("no command given (see --help)");
}
