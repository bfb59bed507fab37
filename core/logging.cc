#include "core/logging.h"

#include <mutex>
#include <string>

#include "core/text.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace tessera {

absl::Status SetLogLevel(std::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for anything it does not know.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(StrCat(
        "unknown log level '", level, "' (expected trace, debug, info, warn, error or off)"));
  }
  // Log lines go to stderr, so stdout stays the command's output.
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("tessera");
    logger->set_pattern("[%H:%M:%S.%e] [%l] %v");
    spdlog::set_default_logger(std::move(logger));
  });
  spdlog::set_level(parsed);
  return absl::OkStatus();
}

}  // namespace tessera
