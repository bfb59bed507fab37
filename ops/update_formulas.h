#pragma once
// One element of an optimizer step, written once for the CPU kernels
// (ops/cpu/optimizer.cc) and the CUDA ones (ops/cuda/optimizer.cu). Every
// input is read before an output is written, so outputs may alias inputs.

#ifdef __CUDACC__
#define TESSERA_UPDATE_HD __host__ __device__
#else
#define TESSERA_UPDATE_HD
#endif

#include <cmath>

namespace tessera::ops {

// torch.optim.SGD without dampening.
TESSERA_UPDATE_HD inline void SgdElement(float param, float grad, float buf, float lr, float momentum,
                                         float weight_decay, bool nesterov, float* new_param, float* new_buf) {
  const float g = grad + weight_decay * param;
  const float b = momentum * buf + g;
  const float step = nesterov ? g + momentum * b : b;
  *new_param = param - lr * step;
  *new_buf = b;
}

// AdamW's per-step scalars, in f32 for the element loop.
struct AdamwScalars {
  float decay, step_size, inv_sqrt_correction2, eps, b1, one_minus_b1, b2, one_minus_b2;
};

// AdamW's attributes, for kernels that form the scalars themselves (the
// CUDA one, from lr, skip and skipped in device memory).
struct AdamwHyper {
  double beta1, beta2, weight_decay, eps;
  bool bias_correction;
};

// double pow and sqrt on either side.
TESSERA_UPDATE_HD inline double UpdatePow(double a, double b) {
#ifdef __CUDA_ARCH__
  return ::pow(a, b);
#else
  return std::pow(a, b);
#endif
}
TESSERA_UPDATE_HD inline double UpdateSqrt(double a) {
#ifdef __CUDA_ARCH__
  return ::sqrt(a);
#else
  return std::sqrt(a);
#endif
}

// The scalars of AdamW's step t (counted from 1, skipped steps left out),
// in double as PyTorch computes them, then f32.
TESSERA_UPDATE_HD inline AdamwScalars AdamwStepScalars(double lr, double beta1, double beta2, double weight_decay,
                                                       double eps, bool bias_correction, double t) {
  const double correction1 = bias_correction ? 1.0 - UpdatePow(beta1, t) : 1.0;
  const double correction2 = bias_correction ? 1.0 - UpdatePow(beta2, t) : 1.0;
  AdamwScalars s;  // (plain assignments: nvcc compiles this header as C++17)
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.step_size = static_cast<float>(lr / correction1);
  s.inv_sqrt_correction2 = static_cast<float>(1.0 / UpdateSqrt(correction2));
  s.eps = static_cast<float>(eps);
  s.b1 = static_cast<float>(beta1);
  s.one_minus_b1 = static_cast<float>(1.0 - beta1);
  s.b2 = static_cast<float>(beta2);
  s.one_minus_b2 = static_cast<float>(1.0 - beta2);
  return s;
}

// torch.optim.AdamW: decoupled decay, then the bias-corrected step
// (denominator sqrt(v) / sqrt(correction2) + eps, as PyTorch's).
TESSERA_UPDATE_HD inline void AdamwElement(float param, float grad, float m, float v, const AdamwScalars& s,
                                           float* new_param, float* new_m, float* new_v) {
  const float mi = s.b1 * m + s.one_minus_b1 * grad;
  const float vi = s.b2 * v + s.one_minus_b2 * grad * grad;
  *new_param = param * s.decay - s.step_size * mi / (sqrtf(vi) * s.inv_sqrt_correction2 + s.eps);
  *new_m = mi;
  *new_v = vi;
}

}  // namespace tessera::ops
