#pragma once
// The CUDA emulator's __nv_bfloat16 (cuda_emu/float16.h).

#include "cuda_emu/float16.h"

struct __nv_bfloat16 {
  uint16_t __x = 0;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(cuda_emu::FloatToBf16(f)) {}      // NOLINT: implicit, as CUDA's
  operator float() const { return cuda_emu::Bf16ToFloat(__x); }  // NOLINT
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return cuda_emu::Bf16ToFloat(h.__x); }
inline __nv_bfloat16 __ll2bfloat16_rn(long long v) { return __nv_bfloat16(cuda_emu::RoundIntegerTo(v, 8)); }
inline __nv_bfloat16 __int2bfloat16_rn(int v) { return __ll2bfloat16_rn(v); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
