#pragma once
// How a verb of the `tessera` binary ends from inside a CLI11 callback:
// Fail throws the one-line reason (newlines flattened) that main() prints as
// "tessera: <reason>" with exit code 1; Succeed ends the callback with exit 0.

#include <string>

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

}  // namespace tessera
