#pragma once
// The 16-bit float types of the CUDA emulator (cuda_fp16.h, cuda_bf16.h):
// IEEE binary16 and bfloat16 as bits, converted with round-to-nearest-even.

#include <cstdint>
#include <cstring>

namespace cuda_emu {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to or past 65520: infinity
  if (a < 0x38800000u) {                                 // below 2^-14: a subnormal half (or zero), in units of 2^-24
    const float scaled = BitsFloat(a) * 16777216.0f;     // exact: a power-of-two scale
    const float rounded = __builtin_nearbyintf(scaled);  // nearest even under the default rounding mode
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  const uint32_t mant = a & 0x7fffffu;
  const uint32_t exp = (a >> 23) - 112u;  // rebias 127 -> 15
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) / 16777216.0f;  // mant · 2^-24, exact
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// An integer rounded once to `bits` significant bits (nearest even), as a
// float (exact: the result has at most 24 significant bits).
inline float RoundIntegerTo(long long v, int bits) {
  const bool negative = v < 0;
  uint64_t m = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  int width = 0;
  for (uint64_t t = m; t != 0; t >>= 1) ++width;
  if (width > bits) {
    const int drop = width - bits;
    const uint64_t rest = m & ((uint64_t{1} << drop) - 1);
    const uint64_t half = uint64_t{1} << (drop - 1);
    m >>= drop;
    if (rest > half || (rest == half && (m & 1u) != 0)) ++m;
    const float f = static_cast<float>(m) * BitsFloat(static_cast<uint32_t>(127 + drop) << 23);
    return negative ? -f : f;
  }
  const float f = static_cast<float>(m);
  return negative ? -f : f;
}

}  // namespace cuda_emu
