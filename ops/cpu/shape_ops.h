#pragma once
// CPU kernels of the shape family (schemas in ops/shape_ops.cc). Data
// movement is dtype-generic (elements are moved as 1/2/4/8-byte words); the
// schema side validates shapes and attributes and passes plain parameters,
// always in terms of the LOCAL tensors a kernel sees.

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

// y = x's elements in row-major order (same dtype and element count).
void CopyElements(const KernelContext& ctx, const Tensor& x, const Tensor& y);

// Every element of y = value in y's dtype (the caller checked it fits).
void FillConstant(const KernelContext& ctx, const Tensor& y, double value);
// `value` as the bit pattern of one element of `dtype` (its low DTypeSize
// bytes), as FillConstant and MaskedFill store it.
uint64_t ElementBits(double value, DType dtype);

// y[i] = start + (offset + i) · step, computed in double, then rounded to
// y's dtype (integers: to nearest).
void Arange(const KernelContext& ctx, const Tensor& y, double start, double step, int64_t offset);

// y = x broadcast (numpy rules, ranks aligned on the right) to y's shape.
void BroadcastTo(const KernelContext& ctx, const Tensor& x, const Tensor& y);

// y = x with axes permuted: y's axis i is x's axis perm[i].
void Transpose(const KernelContext& ctx, const Tensor& x, const std::vector<int>& perm, const Tensor& y);

// Copies the block of `extent` at `src_start` in src to `dst_start` in dst
// (same dtype and rank). What slice, slice_grad, concat and split are made of.
void CopyBlockParallel(const KernelContext& ctx, const Tensor& src, const std::vector<int64_t>& src_start,
                       const Tensor& dst, const std::vector<int64_t>& dst_start, const Shape& extent);

// All bytes of y = 0 (0 in every dtype).
void ZeroFill(const KernelContext& ctx, const Tensor& y);

// y = x converted to y's dtype. Floats to integers truncate toward zero and
// saturate, NaN gives 0; to bool: x != 0; integers to narrower integers wrap.
void Cast(const KernelContext& ctx, const Tensor& x, const Tensor& y);

// The values of a bf16 or f16 tensor `t` as f32 (exact) into `out`
// (t.NumElements() floats); f32 results `x` rounded (to nearest even) into
// the bf16 or f16 tensor `out`. What the 16-bit paths of kernels computing
// in f32 are made of (matmul without native 16-bit products, attention).
void WidenTo(const KernelContext& ctx, const Tensor& t, float* out);
void NarrowFrom(const KernelContext& ctx, const float* x, const Tensor& out);

// out = cond ? x : y, all three broadcast to out's shape; cond is bool.
void Where(const KernelContext& ctx, const Tensor& cond, const Tensor& x, const Tensor& y, const Tensor& out);

// y = mask ? value : x, mask (bool) broadcast to x's shape.
void MaskedFill(const KernelContext& ctx, const Tensor& x, const Tensor& mask, double value, const Tensor& y);

}  // namespace tessera::ops::cpu
