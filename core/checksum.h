#pragma once
// Checksums of stored bytes: what lets a reader tell a damaged checkpoint
// shard from a good one (train/checkpoint.h). XXH3, 64 bits (libxxhash,
// inlined: no run-time library), tens of GB/s on one core, so a load pays
// well under a second for a GPT-2 small checkpoint with its optimizer state.

#include <string>
#include <string_view>

namespace tessera {

// The name stored beside each checksum (index.json "checksums").
inline constexpr std::string_view kChecksumAlgorithm = "xxh3_64";

// XXH3-64 of `bytes` as 16 lowercase hex digits.
std::string Checksum(std::string_view bytes);

}  // namespace tessera
