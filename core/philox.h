#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
// Counter-based: the output is a pure function of (key, counter), so any
// element of any tensor can be drawn independently, in any order, on any
// device. This is what makes Tessera's randomness layout-invariant
// (DESIGN §4): an element's numbers depend on
//   key     = seed (64 bits)
//   counter = (element index low 32, element index high 32, tensor id, step)
// where the element index is its position in the logical tensor of the whole
// iteration, never its position in a local shard.

#include <array>
#include <cmath>
#include <cstdint>

namespace tessera {

struct PhiloxKey {
  uint32_t k0, k1;
};

inline PhiloxKey MakePhiloxKey(uint64_t seed) {
  return PhiloxKey{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}

// Four 32-bit outputs for one counter. Inline and branch-free so loops over
// elements vectorise; constexpr, so CUDA kernels call it too (nvcc's
// --expt-relaxed-constexpr, ops/cuda/random.cu).
constexpr std::array<uint32_t, 4> Philox4x32(PhiloxKey key, uint32_t c0, uint32_t c1, uint32_t c2,
                                          uint32_t c3) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

// The four numbers of element `index` of tensor `tensor_id` at `step`.
inline std::array<uint32_t, 4> PhiloxForElement(PhiloxKey key, uint64_t index, uint32_t tensor_id,
                                                uint32_t step) {
  return Philox4x32(key, static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), tensor_id,
                    step);
}

// Uniform in [0, 1) with 24 random bits (exactly representable in f32).
inline float UnitFloat(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// Standard normal from two 32-bit draws (Box–Muller); u1 is kept away from 0.
inline float BoxMuller(uint32_t a, uint32_t b) {
  const float u1 = (static_cast<float>(a >> 8) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  const float u2 = UnitFloat(b);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
}

}  // namespace tessera
