#pragma once
// How a verb of the `tessera` binary ends from inside a CLI11 callback:
// Fail throws the one-line reason (newlines flattened) that main() prints as
// "tessera: <reason>" with exit code 1; Succeed ends the callback with exit 0.

#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace tessera {

[[noreturn]] inline void Fail(const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  throw CLI::RuntimeError(line, 1);
}

[[noreturn]] inline void Succeed() { throw CLI::Success(); }

// A stop signal arriving within this many milliseconds of the first is the
// same one delivered twice (GNU timeout signals the child, then its process
// group; so may a batch system) and counts once: for `tessera train` and
// the daemons alike.
inline constexpr int kRepeatedSignalWindowMs = 100;

// Appends the overrides --resume and --eval-only stand for (train, plan and
// submit). An override already setting the key would contradict the flag,
// or say it twice: the error naming both, and nothing appended.
inline std::optional<std::string> AddFlagOverrides(std::vector<std::string>& overrides, bool resume, bool eval_only) {
  for (const std::string& text : overrides) {
    const std::string key = text.substr(0, text.find('='));
    if ((resume && key == "train.resume") || (eval_only && key == "train.eval_only")) {
      return std::string(key == "train.resume" ? "--resume" : "--eval-only") + " and " + text + " both given: keep one";
    }
  }
  if (resume) overrides.push_back("train.resume=true");
  if (eval_only) overrides.push_back("train.eval_only=true");
  return std::nullopt;
}

}  // namespace tessera
