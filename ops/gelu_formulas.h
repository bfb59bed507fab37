#pragma once
// GELU and its derivative, exact (erf) and tanh-approximated, written once
// for the CPU kernels (ops/cpu/vec_math.h, with their libm-free exp, erf and
// tanh) and the CUDA ones (ops/cuda/elementwise.cu, with CUDA's): `M`
// supplies static Exp, Erf and Tanh. Plain C++ (no absl), so nvcc reads it.

#ifdef __CUDACC__
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif

namespace tessera::ops {

inline constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluTanhCoeff = 0.044715f;
inline constexpr float kInvSqrt2 = 0.7071067811865476f;
inline constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)

template <typename M>
TESSERA_HOST_DEVICE inline float GeluOf(float x, bool tanh_approx) {
  if (tanh_approx) {
    // 0.5 x (1 + tanh u) = x * sigmoid(2u): one exp and one division, and no
    // cancellation for small u (unlike 1 - 2 / (e^2u + 1)).
    const float u = kSqrt2OverPi * (x + kGeluTanhCoeff * x * x * x);
    return x / (1.0f + M::Exp(-2.0f * u));
  }
  return 0.5f * x * (1.0f + M::Erf(x * kInvSqrt2));
}

// d gelu / dx.
template <typename M>
TESSERA_HOST_DEVICE inline float GeluGradOf(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float u = kSqrt2OverPi * (x + kGeluTanhCoeff * x * x * x);
    const float t = M::Tanh(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCoeff * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
  }
  const float cdf = 0.5f * (1.0f + M::Erf(x * kInvSqrt2));
  return cdf + x * kInvSqrt2Pi * M::Exp(-0.5f * x * x);
}

}  // namespace tessera::ops
