#include "core/checksum.h"

// GCC 12 warns inside its own AVX-512 intrinsics (_mm512_undefined_*, which
// are uninitialised by design) when xxHash's AVX-512 path inlines them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_format.h"

namespace tessera {

std::string Checksum(std::string_view bytes) {
  return absl::StrFormat("%016x", XXH3_64bits(bytes.data(), bytes.size()));
}
#pragma GCC diagnostic pop

}  // namespace tessera
