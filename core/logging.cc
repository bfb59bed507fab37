#include "core/logging.h"

#include <string>

#include "core/text.h"

namespace tessera {

absl::Status SetLogLevel(std::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for anything it does not know.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(StrCat(
        "unknown log level '", level, "' (expected trace, debug, info, warn, error or off)"));
  }
  spdlog::set_level(parsed);
  return absl::OkStatus();
}

}  // namespace tessera
