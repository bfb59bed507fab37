#include "core/status.h"

namespace tessera::internal {

void CheckFailed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "TESSERA_CHECK failed at %s:%d: %s%s%s\n", file, line, condition,
               message.empty() ? "" : " — ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tessera::internal
