#pragma once
// Logging through spdlog. Library code logs with TLOG_INFO(...) etc. (fmt
// syntax); the binary chooses the level once at start-up.

#include <string_view>

#include "absl/status/status.h"
#include "spdlog/spdlog.h"

namespace tessera {

// Sets the global level from "trace", "debug", "info", "warn", "error", "off",
// and (on the first call) sends log lines to stderr.
absl::Status SetLogLevel(std::string_view level);

}  // namespace tessera

#define TLOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define TLOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define TLOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define TLOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
