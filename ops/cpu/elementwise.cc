// Element-wise CPU kernels. Every hot loop is a plain indexed loop over
// contiguous floats with no calls into libm (vec_math.h), so GCC vectorises
// it; ParallelFor cuts the index range into chunks for the intra-op threads.

#include "ops/cpu/elementwise.h"

#include <cmath>
#include <vector>

#include "core/text.h"
#include "ops/cpu/cpu_util.h"
#include "ops/cpu/vec_math.h"

namespace tessera::ops::cpu {
namespace {

template <BinaryKind kKind>
inline float Apply(float a, float b) {
  if constexpr (kKind == BinaryKind::kAdd) return a + b;
  if constexpr (kKind == BinaryKind::kSub) return a - b;
  if constexpr (kKind == BinaryKind::kMul) return a * b;
  return a / b;
}

// Inner loop over `n` elements; a_step / b_step are 1 (walk) or 0 (broadcast).
template <BinaryKind kKind>
inline void BinaryRow(const float* __restrict a, int64_t a_step, const float* __restrict b, int64_t b_step,
                      float* __restrict y, int64_t n) {
  if (a_step == 1 && b_step == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<kKind>(a[i], b[i]);
  } else if (a_step == 1) {
    const float bv = b[0];
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<kKind>(a[i], bv);
  } else if (b_step == 1) {
    const float av = a[0];
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<kKind>(av, b[i]);
  } else {
    const float v = Apply<kKind>(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

// Strides of `in` aligned to the output's axes, 0 where `in` broadcasts.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(static_cast<size_t>(out.rank()), 0);
  const std::vector<int64_t> own = in.Strides();
  const int lead = out.rank() - in.rank();
  for (int i = 0; i < in.rank(); ++i) {
    if (in[i] != 1) strides[static_cast<size_t>(i + lead)] = own[static_cast<size_t>(i)];
  }
  return strides;
}

template <BinaryKind kKind>
void BinaryImpl(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor& y = ctx.output(0);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  const Shape& out = y.shape();
  if (out.rank() == 0) {
    py[0] = Apply<kKind>(pa[0], pb[0]);
    return;
  }
  if (a.shape() == out && b.shape() == out) {
    ParallelFor(ctx, out.NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
      BinaryRow<kKind>(pa + begin, 1, pb + begin, 1, py + begin, end - begin);
    });
    return;
  }
  // General broadcast: rows along the last output axis, each row one inner loop.
  const std::vector<int64_t> sa = BroadcastStrides(a.shape(), out);
  const std::vector<int64_t> sb = BroadcastStrides(b.shape(), out);
  const int last = out.rank() - 1;
  const int64_t inner = out[last];
  const int64_t rows = inner == 0 ? 0 : out.NumElements() / inner;
  ParallelFor(ctx, rows, RowGrain(inner), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      // Decompose the row index over the outer axes.
      int64_t rem = row, off_a = 0, off_b = 0;
      for (int axis = last - 1; axis >= 0; --axis) {
        const int64_t idx = rem % out[axis];
        rem /= out[axis];
        off_a += idx * sa[static_cast<size_t>(axis)];
        off_b += idx * sb[static_cast<size_t>(axis)];
      }
      BinaryRow<kKind>(pa + off_a, sa[static_cast<size_t>(last)], pb + off_b, sb[static_cast<size_t>(last)],
                       py + row * inner, inner);
    }
  });
}

template <UnaryKind kKind>
inline float ApplyUnary(float x) {
  if constexpr (kKind == UnaryKind::kNeg) return -x;
  if constexpr (kKind == UnaryKind::kExp) return ExpF(x);
  if constexpr (kKind == UnaryKind::kLog) return LogF(x);
  if constexpr (kKind == UnaryKind::kSqrt) return std::sqrt(x);  // a single instruction (vsqrtps)
  if constexpr (kKind == UnaryKind::kRsqrt) return 1.0f / std::sqrt(x);
  if constexpr (kKind == UnaryKind::kTanh) return TanhF(x);
  if constexpr (kKind == UnaryKind::kRelu) return x > 0.0f || x != x ? x : 0.0f;  // NaN stays NaN, as PyTorch's
  if constexpr (kKind == UnaryKind::kSilu) return x * SigmoidF(x);
  if constexpr (kKind == UnaryKind::kGelu) return GeluF(x, false);
  if constexpr (kKind == UnaryKind::kAbs) return std::fabs(x);
  return GeluF(x, true);
}

template <UnaryKind kKind>
void UnaryImpl(KernelContext& ctx) {
  const float* x = ctx.input(0).data<float>();
  float* y = ctx.output(0).data<float>();
  ParallelFor(ctx, ctx.input(0).NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = ApplyUnary<kKind>(x[i]);
  });
}

template <ActivationGradKind kKind>
inline float ApplyActivationGrad(float z, float dy) {
  if constexpr (kKind == ActivationGradKind::kReluFromY) return z > 0.0f ? dy : 0.0f;
  if constexpr (kKind == ActivationGradKind::kTanhFromY) return dy * (1.0f - z * z);
  if constexpr (kKind == ActivationGradKind::kSiluFromX) {
    const float s = SigmoidF(z);
    return dy * s * (1.0f + z * (1.0f - s));
  }
  if constexpr (kKind == ActivationGradKind::kGeluFromX) return dy * GeluGradF(z, false);
  if constexpr (kKind == ActivationGradKind::kAbsFromX) return z > 0.0f ? dy : z < 0.0f ? -dy : 0.0f;
  return dy * GeluGradF(z, true);
}

template <ActivationGradKind kKind>
void ActivationGradImpl(KernelContext& ctx) {
  const float* z = ctx.input(0).data<float>();
  const float* dy = ctx.input(1).data<float>();
  float* dx = ctx.output(0).data<float>();
  ParallelFor(ctx, ctx.input(0).NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dx[i] = ApplyActivationGrad<kKind>(z[i], dy[i]);
  });
}

template <ScalarKind kKind>
void ScalarImpl(KernelContext& ctx, float value) {
  const float* x = ctx.input(0).data<float>();
  float* y = ctx.output(0).data<float>();
  ParallelFor(ctx, ctx.input(0).NumElements(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    if constexpr (kKind == ScalarKind::kAdd) {
      for (int64_t i = begin; i < end; ++i) y[i] = x[i] + value;
    } else if constexpr (kKind == ScalarKind::kMul) {
      for (int64_t i = begin; i < end; ++i) y[i] = x[i] * value;
    } else if (value == 2.0f) {  // the common squares stay exact and fast
      for (int64_t i = begin; i < end; ++i) y[i] = x[i] * x[i];
    } else {
      for (int64_t i = begin; i < end; ++i) y[i] = std::pow(x[i], value);
    }
  });
}

}  // namespace

absl::Status BinaryKernel(KernelContext& ctx, BinaryKind kind) {
  switch (kind) {
    case BinaryKind::kAdd:
      BinaryImpl<BinaryKind::kAdd>(ctx);
      break;
    case BinaryKind::kSub:
      BinaryImpl<BinaryKind::kSub>(ctx);
      break;
    case BinaryKind::kMul:
      BinaryImpl<BinaryKind::kMul>(ctx);
      break;
    case BinaryKind::kDiv:
      BinaryImpl<BinaryKind::kDiv>(ctx);
      break;
  }
  return absl::OkStatus();
}

absl::Status UnaryKernel(KernelContext& ctx, UnaryKind kind) {
  switch (kind) {
    case UnaryKind::kNeg:
      UnaryImpl<UnaryKind::kNeg>(ctx);
      break;
    case UnaryKind::kExp:
      UnaryImpl<UnaryKind::kExp>(ctx);
      break;
    case UnaryKind::kLog:
      UnaryImpl<UnaryKind::kLog>(ctx);
      break;
    case UnaryKind::kSqrt:
      UnaryImpl<UnaryKind::kSqrt>(ctx);
      break;
    case UnaryKind::kRsqrt:
      UnaryImpl<UnaryKind::kRsqrt>(ctx);
      break;
    case UnaryKind::kTanh:
      UnaryImpl<UnaryKind::kTanh>(ctx);
      break;
    case UnaryKind::kRelu:
      UnaryImpl<UnaryKind::kRelu>(ctx);
      break;
    case UnaryKind::kSilu:
      UnaryImpl<UnaryKind::kSilu>(ctx);
      break;
    case UnaryKind::kGelu:
      UnaryImpl<UnaryKind::kGelu>(ctx);
      break;
    case UnaryKind::kGeluTanh:
      UnaryImpl<UnaryKind::kGeluTanh>(ctx);
      break;
    case UnaryKind::kAbs:
      UnaryImpl<UnaryKind::kAbs>(ctx);
      break;
  }
  return absl::OkStatus();
}

absl::Status ScalarKernel(KernelContext& ctx, ScalarKind kind, float value) {
  switch (kind) {
    case ScalarKind::kAdd:
      ScalarImpl<ScalarKind::kAdd>(ctx, value);
      break;
    case ScalarKind::kMul:
      ScalarImpl<ScalarKind::kMul>(ctx, value);
      break;
    case ScalarKind::kPow:
      ScalarImpl<ScalarKind::kPow>(ctx, value);
      break;
  }
  return absl::OkStatus();
}

absl::Status ActivationGradKernel(KernelContext& ctx, ActivationGradKind kind) {
  switch (kind) {
    case ActivationGradKind::kReluFromY:
      ActivationGradImpl<ActivationGradKind::kReluFromY>(ctx);
      break;
    case ActivationGradKind::kTanhFromY:
      ActivationGradImpl<ActivationGradKind::kTanhFromY>(ctx);
      break;
    case ActivationGradKind::kSiluFromX:
      ActivationGradImpl<ActivationGradKind::kSiluFromX>(ctx);
      break;
    case ActivationGradKind::kGeluFromX:
      ActivationGradImpl<ActivationGradKind::kGeluFromX>(ctx);
      break;
    case ActivationGradKind::kGeluTanhFromX:
      ActivationGradImpl<ActivationGradKind::kGeluTanhFromX>(ctx);
      break;
    case ActivationGradKind::kAbsFromX:
      ActivationGradImpl<ActivationGradKind::kAbsFromX>(ctx);
      break;
  }
  return absl::OkStatus();
}

absl::Status BiasAddKernel(KernelContext& ctx, bool gelu, bool tanh_approx) {
  const Tensor& x = ctx.input(0);  // (..., C)
  const float* px = x.data<float>();
  const float* bias = ctx.input(1).data<float>();  // (C,)
  float* y = ctx.output(0).data<float>();
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t rows = C == 0 ? 0 : x.NumElements() / C;
  ParallelFor(ctx, rows, RowGrain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = px + r * C;
      float* yr = y + r * C;
      if (!gelu) {
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] + bias[c];
      } else if (tanh_approx) {
        for (int64_t c = 0; c < C; ++c) yr[c] = GeluF(xr[c] + bias[c], true);
      } else {
        for (int64_t c = 0; c < C; ++c) yr[c] = GeluF(xr[c] + bias[c], false);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status BiasGeluGradKernel(KernelContext& ctx, bool tanh_approx) {
  const Tensor& x = ctx.input(0);  // (..., C)
  const float* px = x.data<float>();
  const float* bias = ctx.input(1).data<float>();  // (C,)
  const float* dy = ctx.input(2).data<float>();    // (..., C)
  float* dx = ctx.output(0).data<float>();
  const int64_t C = x.shape()[x.shape().rank() - 1];
  const int64_t rows = C == 0 ? 0 : x.NumElements() / C;
  ParallelFor(ctx, rows, RowGrain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t o = r * C;
      if (tanh_approx) {
        for (int64_t c = 0; c < C; ++c) dx[o + c] = dy[o + c] * GeluGradF(px[o + c] + bias[c], true);
      } else {
        for (int64_t c = 0; c < C; ++c) dx[o + c] = dy[o + c] * GeluGradF(px[o + c] + bias[c], false);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace tessera::ops::cpu
