#pragma once
// How a verb of the `tessera` binary ends from inside a CLI11 callback:
// Fail throws the one-line reason (core/strings.h's OneLine) that main() prints as
// "tessera: <reason>" with exit code 1; Succeed ends the callback with exit 0.

#include <signal.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/strings.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace tessera {

[[noreturn]] inline void Fail(const std::string& message) { throw CLI::RuntimeError(OneLine(message), 1); }

[[noreturn]] inline void Succeed() { throw CLI::Success(); }

// Appended by main() to every argument "[...]" after the verb so that CLI11
// does not read it as a list; a transform of every option takes it off
// again before any other check.
inline constexpr char kBracketMarker = '\x1f';

// A stop signal arriving within this many milliseconds of the first is the
// same one delivered twice (GNU timeout signals the child, then its process
// group; so may a batch system) and counts once: for `tessera train` and
// the daemons alike.
inline constexpr int kRepeatedSignalWindowMs = 100;

// Whether `signal` is ignored (SIG_IGN inherited: `nohup` does so for SIGHUP).
inline bool SignalIgnored(int signal) {
  struct sigaction current {};
  return ::sigaction(signal, nullptr, &current) == 0 && current.sa_handler == SIG_IGN;
}

// How a stop signal is told: "interrupted" (SIGINT), "hung up" (SIGHUP),
// "terminated".
inline const char* StopSignalVerb(int signal) {
  return signal == SIGINT ? "interrupted" : signal == SIGHUP ? "hung up" : "terminated";
}

// CLI::Range in the words of the other flag checks: "'1e7' is not a number
// in [0, 1000000]" (CLI11 said "Value 1e7 not in range 0.000000 to
// 1000000.000000").
template <typename T>
CLI::Validator InRange(T lo, T hi) {
  constexpr bool kInteger = std::is_integral_v<T>;
  return CLI::Validator(
      [lo, hi](const std::string& text) -> std::string {
        T value{};
        if (!CLI::detail::lexical_cast(text, value) || !(value >= lo && value <= hi)) {
          return fmt::format("'{}' is not {} in [{}, {}]", text, kInteger ? "an integer" : "a number", lo, hi);
        }
        return "";
      },
      fmt::format("{} in [{}, {}]", kInteger ? "INT" : "FLOAT", lo, hi));
}

// Appends the overrides --resume and --eval-only stand for (train, plan and
// submit). An override already setting the key would contradict the flag,
// or say it twice: the error naming both, and nothing appended.
inline std::optional<std::string> AddFlagOverrides(std::vector<std::string>& overrides, bool resume, bool eval_only) {
  for (const std::string& text : overrides) {
    const size_t equals = text.find('=');
    const std::string key = text.substr(0, equals);
    bool sets_resume = key == "train.resume", sets_eval_only = key == "train.eval_only";
    // (Or the section as an object: train={"resume": false}.)
    if (key == "train" && equals != std::string::npos) {
      const nlohmann::json section = nlohmann::json::parse(text.substr(equals + 1), nullptr, false);
      if (section.is_object()) {
        sets_resume |= section.contains("resume");
        sets_eval_only |= section.contains("eval_only");
      }
    }
    if ((resume && sets_resume) || (eval_only && sets_eval_only)) {
      return std::string(resume && sets_resume ? "--resume" : "--eval-only") + " and " + text + " both given: keep one";
    }
  }
  if (resume) overrides.push_back("train.resume=true");
  if (eval_only) overrides.push_back("train.eval_only=true");
  return std::nullopt;
}

}  // namespace tessera
