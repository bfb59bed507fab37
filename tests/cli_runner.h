#pragma once
// Runs the `tessera` binary as a user would, for end-to-end tests. Needs the
// TESSERA_BINARY and TESSERA_SOURCE_DIR compile definitions.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace tessera::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// Runs `tessera ARGS` under a 120 s deadline, so a hang fails the test
// instead of blocking it.
inline CliResult RunTessera(const std::string& args) {
  const std::string cmd = "timeout 120 " + std::string(TESSERA_BINARY) + " " + args + " 2>&1";
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

// A path inside the source tree.
inline std::string SourcePath(const std::string& relative) {
  return std::string(TESSERA_SOURCE_DIR) + "/" + relative;
}

}  // namespace tessera::testing
