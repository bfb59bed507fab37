#pragma once
// Runs the `tessera` binary as a user would, for end-to-end tests, and
// reads what a run leaves behind. Needs the TESSERA_BINARY and
// TESSERA_SOURCE_DIR compile definitions.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include "nlohmann/json.hpp"

namespace tessera::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// Runs a shell command line; its stdout (add 2>&1 for stderr too).
inline CliResult RunCommand(const std::string& cmd) {
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Runs `tessera ARGS` under a 120 s deadline, so a hang fails the test
// instead of blocking it.
inline CliResult RunTessera(const std::string& args) {
  return RunCommand("timeout 120 " + std::string(TESSERA_BINARY) + " " + args + " 2>&1");
}

// Starts `tessera ARGS` in the background, its stdout and stderr into
// `log` (a process to signal: the caller waits for it); -1 if fork fails.
inline pid_t SpawnTessera(const std::string& args, const std::filesystem::path& log) {
  const pid_t child = ::fork();
  if (child == 0) {
    const std::string cmd = std::string(TESSERA_BINARY) + " " + args + " > " + log.string() + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return child;
}

// A failed command that said one line naming `needle`.
inline void ExpectOneLineError(const CliResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
}

// A run's metrics.jsonl by iteration: training rows and evaluation rows
// (those with eval_loss).
struct MetricsRows {
  std::map<int64_t, nlohmann::json> train, eval;
};
inline MetricsRows ReadMetricsRows(const std::filesystem::path& output_dir) {
  MetricsRows rows;
  std::ifstream in(output_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    (row.contains("eval_loss") ? rows.eval : rows.train)[row["iter"].get<int64_t>()] = row;
  }
  return rows;
}

// A path inside the source tree.
inline std::string SourcePath(const std::string& relative) {
  return std::string(TESSERA_SOURCE_DIR) + "/" + relative;
}

// A new, empty directory NAME_PID under the system's temporary directory
// (what an earlier run of that process id left there removed).
inline std::filesystem::path FreshProcessDirectory(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Removes a directory when the tests are done; register it at namespace
// scope: ::testing::AddGlobalTestEnvironment(new RemoveDirectoryWhenDone(D))
// (gtest owns registered environments).
class RemoveDirectoryWhenDone : public ::testing::Environment {
 public:
  explicit RemoveDirectoryWhenDone(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void TearDown() override { std::filesystem::remove_all(dir_); }

 private:
  std::filesystem::path dir_;
};

}  // namespace tessera::testing
