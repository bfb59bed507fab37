#pragma once
// CPU kernels of the reduction family (schemas in ops/reduce.cc). All work on
// contiguous f32 tensors (Reduce also reads bf16 and f16, widened exactly); the schema side validates shapes and
// attributes and passes each kernel what it needs in plain form (a per-axis "reduced" mask, a scale), so these
// functions never read attributes.

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/kernel_context.h"

namespace tessera::ops::cpu {

enum class ReduceKind : uint8_t { kSum, kMax };

// y (f32) = scale · Σ x (kSum) or max x (kMax) over the axes of x where
// reduced[axis]; y holds the kept axes in order (with or without the size-1
// reduced axes: only its element count and order matter). An empty reduction
// gives 0 (sum) or -inf (max). NaNs are not propagated by kMax.
void Reduce(const KernelContext& ctx, ReduceKind kind, const Tensor& x, const std::vector<bool>& reduced, float scale,
            const Tensor& y);

// dx = dy routed to the positions where x equals its max y, split evenly
// among ties. x, dx: x's shape; y, dy: the reduced shape.
void ReduceMaxGrad(const KernelContext& ctx, const Tensor& x, const std::vector<bool>& reduced, const Tensor& y,
                   const Tensor& dy, const Tensor& dx);

// y (i64) = index of the max of x along `axis`, the lowest index among ties.
// NaNs are skipped (a row of only NaN and -inf gives 0).
void Argmax(const KernelContext& ctx, const Tensor& x, int axis, const Tensor& y);

// The k largest values of each last-axis row of x, descending, ties by lower
// index, with their indices (i64).
void TopK(const KernelContext& ctx, const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices);

// y () = Σ x².
void SquareSum(const KernelContext& ctx, const Tensor& x, const Tensor& y);

}  // namespace tessera::ops::cpu
