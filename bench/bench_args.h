#pragma once
// The benchmarks' command lines: --help (or -h) prints the usage and exits
// 0; an argument a benchmark does not take is named with the usage, exit 2
// (a benchmark ran for minutes on a flag it ignored).

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace tessera::bench {

// The exit code for argument `arg` a benchmark does not take: 0 after the
// usage on stdout for --help / -h, else 2 after naming it on stderr.
inline int Usage(const char* name, const char* usage, const char* arg) {
  if (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0) {
    std::printf("usage: %s %s\n", name, usage);
    return 0;
  }
  std::fprintf(stderr, "%s: unknown argument '%s' (usage: %s %s)\n", name, arg, name, usage);
  return 2;
}

// The exit code (2) for flag `flag` given without its value, or a bad one.
inline int BadValue(const char* name, const char* usage, const char* flag, const char* wanted) {
  std::fprintf(stderr, "%s: %s takes %s (usage: %s %s)\n", name, flag, wanted, name, usage);
  return 2;
}

// A positive integer argument, or nothing.
inline std::optional<long long> PositiveInteger(const char* text) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 1) return std::nullopt;
  return value;
}

}  // namespace tessera::bench
