#pragma once
// The CUDA emulator's __half (cuda_emu/float16.h).

#include "cuda_emu/float16.h"

struct __half {
  uint16_t __x = 0;
  __half() = default;
  __half(float f) : __x(cuda_emu::FloatToHalf(f)) {}             // NOLINT: implicit, as CUDA's
  operator float() const { return cuda_emu::HalfToFloat(__x); }  // NOLINT
};

inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __half(f); }
inline float __half2float(__half h) { return cuda_emu::HalfToFloat(h.__x); }
inline __half __ll2half_rn(long long v) { return __half(cuda_emu::RoundIntegerTo(v, 11)); }
inline __half __int2half_rn(int v) { return __ll2half_rn(v); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
