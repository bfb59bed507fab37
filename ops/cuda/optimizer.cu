// CUDA optimizer steps: the element loops of ops/cpu/optimizer.cc.

#include <cuda_runtime.h>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

__global__ void SgdKernel(const float* param, const float* grad, const float* buf, float* new_param, float* new_buf,
                          int64_t n, const float* lr, const float* skip, float momentum, float weight_decay,
                          bool nesterov) {
  const bool skipping = skip != nullptr && *skip != 0.0f;
  const float rate = *lr;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // (No buf, new_buf: momentum 0 keeps no buffer.)
    if (skipping) {  // the state as it was (a no-op where outputs alias inputs)
      const float p = param[i];
      new_param[i] = p;
      if (buf != nullptr) {
        const float b = buf[i];
        new_buf[i] = b;
      }
    } else if (buf == nullptr) {
      float unused;
      SgdElement(param[i], grad[i], 0.0f, rate, 0.0f, weight_decay, false, &new_param[i], &unused);
    } else {
      SgdElement(param[i], grad[i], buf[i], rate, momentum, weight_decay, nesterov, &new_param[i], &new_buf[i]);
    }
  }
}

__global__ void AdamwKernel(const float* param, const float* grad, const float* m, const float* v, float* new_param,
                            float* new_m, float* new_v, int64_t n, const float* lr, const float* skip,
                            const float* skipped, int64_t step, AdamwHyper hyper) {
  __shared__ AdamwScalars s;
  const bool skipping = skip != nullptr && *skip != 0.0f;
  if (threadIdx.x == 0 && !skipping) {
    const double t = static_cast<double>(step + 1) - (skipped != nullptr ? static_cast<double>(*skipped) : 0.0);
    s = AdamwStepScalars(static_cast<double>(*lr), hyper.beta1, hyper.beta2, hyper.weight_decay, hyper.eps,
                         hyper.bias_correction, t);
  }
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (skipping) {  // the state as it was (a no-op where outputs alias inputs)
      const float p = param[i], mi = m[i], vi = v[i];
      new_param[i] = p;
      new_m[i] = mi;
      new_v[i] = vi;
    } else {
      AdamwElement(param[i], grad[i], m[i], v[i], s, &new_param[i], &new_m[i], &new_v[i]);
    }
  }
}

__global__ void NonfiniteKernel(const void* x, int code, int64_t n, float* flag) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bool bad;
    if (code == 0) {
      bad = !isfinite(static_cast<const float*>(x)[i]);
    } else {  // f16 / bf16: every exponent bit set
      const uint16_t exponent = code == 2 ? 0x7f80 : 0x7c00;
      bad = (static_cast<const uint16_t*>(x)[i] & exponent) == exponent;
    }
    if (bad) *flag = 1.0f;  // every writer writes the same value
  }
}

__global__ void LossScaleUpdateKernel(const float* scale, const float* found_inf, const float* good, float* new_scale,
                                      float* new_good, double backoff, double growth, int64_t growth_interval) {
  const float s = *scale, g = *good;
  float next = s, next_good = 0.0f;
  if (*found_inf != 0.0f) {
    next = static_cast<float>(s * backoff);
  } else if (g + 1.0f >= static_cast<float>(growth_interval)) {
    const float grown = static_cast<float>(s * growth);
    if (isfinite(grown)) next = grown;  // (as the CPU kernel: an overflowing scale stays)
  } else {
    next_good = g + 1.0f;
  }
  *new_scale = next;
  *new_good = next_good;
}

}  // namespace

int LaunchNonfinite(const void* x, int code, int64_t n, float* flag) {
  cudaError_t err = cudaMemsetAsync(flag, 0, sizeof(float), CurrentStream());
  if (err != cudaSuccess) return static_cast<int>(err);
  if (n > 0) NonfiniteKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(x, code, n, flag);
  return Finish();
}

int LaunchLossScaleUpdate(const float* scale, const float* found_inf, const float* good, float* new_scale,
                          float* new_good, double backoff, double growth, int64_t growth_interval) {
  LossScaleUpdateKernel<<<1, 1, 0, CurrentStream()>>>(scale, found_inf, good, new_scale, new_good, backoff, growth,
                                                          growth_interval);
  return Finish();
}

int LaunchSgd(const float* param, const float* grad, const float* buf, float* new_param, float* new_buf, int64_t n,
              const float* lr, const float* skip, float momentum, float weight_decay, bool nesterov) {
  if (n == 0) return 0;
  SgdKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(param, grad, buf, new_param, new_buf, n, lr, skip, momentum,
                                                             weight_decay, nesterov);
  return Finish();
}

int LaunchAdamw(const float* param, const float* grad, const float* m, const float* v, float* new_param, float* new_m,
                float* new_v, int64_t n, const float* lr, const float* skip, const float* skipped, int64_t step,
                const AdamwHyper& hyper) {
  if (n == 0) return 0;
  AdamwKernel<<<Blocks(n), kThreads, 0, CurrentStream()>>>(param, grad, m, v, new_param, new_m, new_v, n, lr, skip,
                                                               skipped, step, hyper);
  return Finish();
}

}  // namespace tessera::ops::cuda
