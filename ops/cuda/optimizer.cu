// CUDA optimizer steps: the element loops of ops/cpu/optimizer.cc.

#include <cuda_runtime.h>

#include "ops/cuda/launch.h"
#include "ops/cuda/launch_util.cuh"

namespace tessera::ops::cuda {
namespace {

__global__ void SgdKernel(const float* param, const float* grad, const float* buf, float* new_param, float* new_buf,
                          int64_t n, float lr, float momentum, float weight_decay, bool nesterov) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    SgdElement(param[i], grad[i], buf[i], lr, momentum, weight_decay, nesterov, &new_param[i], &new_buf[i]);
  }
}

__global__ void AdamwKernel(const float* param, const float* grad, const float* m, const float* v, float* new_param,
                            float* new_m, float* new_v, int64_t n, AdamwScalars s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    AdamwElement(param[i], grad[i], m[i], v[i], s, &new_param[i], &new_m[i], &new_v[i]);
  }
}

}  // namespace

int LaunchSgd(const float* param, const float* grad, const float* buf, float* new_param, float* new_buf, int64_t n,
              float lr, float momentum, float weight_decay, bool nesterov) {
  if (n == 0) return 0;
  SgdKernel<<<Blocks(n), kThreads, 0, cudaStreamPerThread>>>(param, grad, buf, new_param, new_buf, n, lr, momentum,
                                                             weight_decay, nesterov);
  return Finish();
}

int LaunchAdamw(const float* param, const float* grad, const float* m, const float* v, float* new_param, float* new_m,
                float* new_v, int64_t n, const AdamwScalars& step) {
  if (n == 0) return 0;
  AdamwKernel<<<Blocks(n), kThreads, 0, cudaStreamPerThread>>>(param, grad, m, v, new_param, new_m, new_v, n, step);
  return Finish();
}

}  // namespace tessera::ops::cuda
