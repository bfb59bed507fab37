// Reductions: reduce_sum / reduce_mean / reduce_max over a set of axes (and
// reduce_max's gradient op), argmax, topk over the last axis, and square_sum
// (Σ x², for global-norm clipping). All f32, except that reduce_sum also
// sums bf16 and f16 (widened exactly, summed and given in f32: a 16-bit
// gradient's bias gradient, with no f32 copy of it). Kernels:
// ops/cpu/reduce.cc.

#include "ops/cpu/reduce.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/text.h"
#include "ops/op_util.h"
#include "ops/reduce_chunks.h"
#include "ops/registry.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/reduce.h"
#endif

namespace tessera::ops {
namespace {

using cpu::ReduceKind;

const TensorMeta kExample{DType::kF32, Shape{4, 6}};

// Which axes of a rank-`rank` tensor `axes` reduces (empty = all). Errors
// for axes out of range or listed twice.
absl::StatusOr<std::vector<bool>> ReducedMask(int rank, const std::vector<int64_t>& axes) {
  if (rank == 0 && !axes.empty()) {
    return absl::InvalidArgumentError(StrCat("axes must be empty for a scalar input, got [", Join(axes, ", "), "]"));
  }
  if (axes.empty()) return std::vector<bool>(static_cast<size_t>(rank), true);
  std::vector<bool> mask(static_cast<size_t>(rank), false);
  for (int64_t axis : axes) {
    ASSIGN_OR_RETURN(int a, NormalizeAxis(axis, rank));
    if (mask[static_cast<size_t>(a)]) {
      return absl::InvalidArgumentError(StrCat("axis ", axis, " is listed twice in axes [", Join(axes, ", "), "]"));
    }
    mask[static_cast<size_t>(a)] = true;
  }
  return mask;
}

// The mask for an op's canonical attributes on an input already validated
// by inference.
std::vector<bool> MaskOf(const Shape& shape, const AttrMap& attrs) {
  auto mask = ReducedMask(shape.rank(), attrs.Ints("axes"));
  TESSERA_CHECK(mask.ok(), mask.status().ToString());
  return *std::move(mask);
}

Shape ReducedShape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  std::vector<int64_t> dims;
  for (int a = 0; a < shape.rank(); ++a) {
    if (!mask[static_cast<size_t>(a)]) {
      dims.push_back(shape[a]);
    } else if (keepdim) {
      dims.push_back(1);
    }
  }
  return Shape(std::move(dims));
}

// y f32: x with the axes reduced (or kept as size 1).
absl::StatusOr<std::vector<TensorMeta>> InferReduceOf(const TensorMeta& x, const AttrMap& attrs) {
  ASSIGN_OR_RETURN(std::vector<bool> mask, ReducedMask(x.shape.rank(), attrs.Ints("axes")));
  return std::vector<TensorMeta>{{DType::kF32, ReducedShape(x.shape, mask, attrs.Bool("keepdim"))}};
}

absl::StatusOr<std::vector<TensorMeta>> InferReduce(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
  return InferReduceOf(in[0], attrs);
}

// reduce_sum's: x f32, bf16 or f16; y f32.
absl::StatusOr<std::vector<TensorMeta>> InferReduceSum(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  const DType t = in[0].dtype;
  if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16) {
    return absl::InvalidArgumentError(StrCat("input 'x' must be f32, bf16 or f16, got ", DTypeName(t)));
  }
  return InferReduceOf(in[0], attrs);
}

// S on a kept axis → S on its output axis; S on a reduced axis → `reduced`
// (P for sums, P(max) for max); B → B; plus the partial pass-through rule.
// Extra inputs (reduce_max_grad's y, dy) are handled by the caller.
std::vector<SbpSignature> ReduceSignatures(const Shape& shape, const std::vector<bool>& mask, bool keepdim,
                                           std::optional<Sbp> reduced, std::optional<Sbp> partial) {
  std::vector<SbpSignature> sigs;
  int out_axis = 0;
  for (int a = 0; a < shape.rank(); ++a) {
    const bool r = mask[static_cast<size_t>(a)];
    if (!r) {
      sigs.push_back({{Sbp::Split(a)}, {Sbp::Split(out_axis)}});
    } else if (reduced) {
      sigs.push_back({{Sbp::Split(a)}, {*reduced}});
    }
    if (!r || keepdim) ++out_axis;
  }
  sigs.push_back({{Sbp::Broadcast()}, {Sbp::Broadcast()}});
  if (partial) sigs.push_back({{*partial}, {*partial}});
  return sigs;
}

// dy (the reduced shape) broadcast back over x's shape.
ValueId BroadcastBack(GradBuilder& b, ValueId dy, const Shape& x_shape, const std::vector<bool>& mask) {
  const Shape kept = ReducedShape(x_shape, mask, /*keepdim=*/true);
  ValueId g = dy;
  if (b.meta(dy).shape != kept) g = b.Op("reshape", {g}, {{"shape", kept.dims()}});
  if (kept != x_shape) g = b.Op("broadcast_to", {g}, {{"shape", x_shape.dims()}});
  return g;
}

int64_t ReducedCount(const Shape& shape, const std::vector<bool>& mask) {
  int64_t count = 1;
  for (int a = 0; a < shape.rank(); ++a) {
    if (mask[static_cast<size_t>(a)]) count *= shape[a];
  }
  return count;
}

// y = scale · Σ or max over the masked axes, on the context's device.
absl::Status ReduceOn(const KernelContext& ctx, ReduceKind kind, const std::vector<bool>& mask, float scale) {
#ifdef TESSERA_WITH_CUDA
  if (ctx.device.type == DeviceType::kCuda) return cuda::Reduce(ctx, kind, ctx.input(0), mask, scale, ctx.output(0));
#endif
  cpu::Reduce(ctx, kind, ctx.input(0), mask, scale, ctx.output(0));
  return absl::OkStatus();
}

absl::Status ReduceSumKernel(KernelContext& ctx) {
  return ReduceOn(ctx, ReduceKind::kSum, MaskOf(ctx.input(0).shape(), ctx.attr()), 1.0f);
}

absl::Status ReduceMeanKernel(KernelContext& ctx) {
  // The logical count, not the local one: a shard of a split reduced axis
  // contributes its share of the global mean.
  const std::vector<bool> mask = MaskOf(ctx.input(0).shape(), ctx.attr());
  const int64_t count = ReducedCount(ctx.input_slice(0).logical, mask);
  return ReduceOn(ctx, ReduceKind::kSum, mask,
                  count == 0 ? std::numeric_limits<float>::quiet_NaN() : 1.0f / static_cast<float>(count));
}

absl::Status ReduceMaxKernel(KernelContext& ctx) {
  return ReduceOn(ctx, ReduceKind::kMax, MaskOf(ctx.input(0).shape(), ctx.attr()), 1.0f);
}

absl::Status SquareSumKernel(KernelContext& ctx) {
#ifdef TESSERA_WITH_CUDA
  if (ctx.device.type == DeviceType::kCuda) return cuda::SquareSum(ctx, ctx.input(0), ctx.output(0));
#endif
  cpu::SquareSum(ctx, ctx.input(0), ctx.output(0));
  return absl::OkStatus();
}

absl::Status ReduceMaxGradKernel(KernelContext& ctx) {
  const std::vector<bool> mask = MaskOf(ctx.input(0).shape(), ctx.attr());
#ifdef TESSERA_WITH_CUDA
  if (ctx.device.type == DeviceType::kCuda) {
    return cuda::ReduceMaxGrad(ctx, ctx.input(0), mask, ctx.input(1), ctx.input(2), ctx.output(0));
  }
#endif
  cpu::ReduceMaxGrad(ctx, ctx.input(0), mask, ctx.input(1), ctx.input(2), ctx.output(0));
  return absl::OkStatus();
}

absl::Status ArgmaxKernel(KernelContext& ctx) {
  const int axis = *NormalizeAxis(ctx.attr().Int("axis"), ctx.input(0).shape().rank());
#ifdef TESSERA_WITH_CUDA
  if (ctx.device.type == DeviceType::kCuda) return cuda::Argmax(ctx, ctx.input(0), axis, ctx.output(0));
#endif
  cpu::Argmax(ctx, ctx.input(0), axis, ctx.output(0));
  return absl::OkStatus();
}

// The CUDA kernel's partials (ops/reduce_chunks.h) for x reduced over
// `mask`: a long reduction is cut into ranges summed apart.
int64_t CudaReduceWorkspace(const Shape& x, const std::vector<bool>& mask, DeviceType device) {
  if (device != DeviceType::kCuda) return 0;
  const int64_t reduced = ReducedCount(x, mask);
  return ReducePartialBytes(reduced == 0 ? 0 : x.NumElements() / reduced, reduced);
}

OpSchema ReduceSchema(const std::string& name, const std::string& doc) {
  return OpSchema(name)
      .Doc(doc)
      .Input("x")
      .Output("y")
      .Attr("axes", AttrType::kInts, std::vector<int64_t>{})
      .Attr("keepdim", AttrType::kBool, false)
      .Infer(InferReduce)
      .Workspace([](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const AttrMap& attrs,
                    DeviceType device) -> int64_t {
        if (in.empty()) return 0;
        auto mask = ReducedMask(in[0].shape.rank(), attrs.Has("axes") ? attrs.Ints("axes") : std::vector<int64_t>{});
        return mask.ok() ? CudaReduceWorkspace(in[0].shape, *mask, device) : 0;
      })
      .Example({kExample}, {{"axes", std::vector<int64_t>{1}}});
}

void RegisterReductions(OpRegistry& r) {
  r.MustRegister(ReduceSchema("reduce_sum",
                              "y = Σ x over `axes` (empty = all); keepdim keeps them as size 1. x may be bf16 or "
                              "f16: each element is widened exactly and y is the f32 sum")
                     .Infer(InferReduceSum)
                     .Sbp([](const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t) {
                       return ReduceSignatures(in[0].shape, MaskOf(in[0].shape, attrs), attrs.Bool("keepdim"),
                                               Sbp::PartialSum(), Sbp::PartialSum());
                     })
                     .Grad([](GradBuilder& b) {
                       const TensorMeta& x = b.meta(b.input(0));
                       ValueId dx = BroadcastBack(b, b.output_grad(0), x.shape, MaskOf(x.shape, b.attrs()));
                       // A gradient has its value's dtype.
                       if (x.dtype != DType::kF32) dx = b.Op("cast", {dx}, {{"dtype", x.dtype}});
                       b.SetInputGrad(0, dx);
                     })
                     .Kernel(DeviceType::kCpu, ReduceSumKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, ReduceSumKernel)
#endif
  );

  r.MustRegister(
      ReduceSchema("reduce_mean",
                   "y = mean of x over `axes` (empty = all); keepdim keeps them as size 1. Under a split of a "
                   "reduced axis each shard divides its partial sum by the logical count")
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t) {
            return ReduceSignatures(in[0].shape, MaskOf(in[0].shape, attrs), attrs.Bool("keepdim"), Sbp::PartialSum(),
                                    Sbp::PartialSum());
          })
          .Grad([](GradBuilder& b) {
            const Shape x_shape = b.meta(b.input(0)).shape;
            const std::vector<bool> mask = MaskOf(x_shape, b.attrs());
            const ValueId g = BroadcastBack(b, b.output_grad(0), x_shape, mask);
            const int64_t count = ReducedCount(x_shape, mask);
            b.SetInputGrad(0,
                           b.Op("scalar_mul", {g}, {{"value", count == 0 ? 0.0 : 1.0 / static_cast<double>(count)}}));
          })
          .Kernel(DeviceType::kCpu, ReduceMeanKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, ReduceMeanKernel)
#endif
          );

  r.MustRegister(
      ReduceSchema("reduce_max",
                   "y = max of x over `axes` (empty = all); keepdim keeps them as size 1. The gradient goes to "
                   "the maximal positions, split evenly among ties")
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t) {
            return ReduceSignatures(in[0].shape, MaskOf(in[0].shape, attrs), attrs.Bool("keepdim"), Sbp::PartialMax(),
                                    Sbp::PartialMax());
          })
          .Grad([](GradBuilder& b) {
            b.SetInputGrad(0, b.Op("reduce_max_grad", {b.input(0), b.output(0), b.output_grad(0)},
                                   {{"axes", b.attrs().Ints("axes")}, {"keepdim", b.attrs().Bool("keepdim")}}));
          })
          .Kernel(DeviceType::kCpu, ReduceMaxKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, ReduceMaxKernel)
#endif
          );

  r.MustRegister(
      OpSchema("reduce_max_grad")
          .Doc("dx = dy at the positions where x equals y = reduce_max(x), divided by the number of such ties; "
               "0 elsewhere; NaN over a slice whose maximum is NaN (as PyTorch's amax)")
          .Input("x")
          .Input("y")
          .Input("dy")
          .Output("dx")
          .Attr("axes", AttrType::kInts, std::vector<int64_t>{})
          .Attr("keepdim", AttrType::kBool, false)
          .Infer(
              [](const std::vector<TensorMeta>& in, const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
                ASSIGN_OR_RETURN(std::vector<TensorMeta> reduced, InferReduce({in[0]}, attrs));
                RETURN_IF_ERROR(ExpectDType(in[1], DType::kF32, "y"));
                RETURN_IF_ERROR(ExpectDType(in[2], DType::kF32, "dy"));
                if (in[1].shape != reduced[0].shape || in[2].shape != reduced[0].shape) {
                  return absl::InvalidArgumentError(StrCat("y and dy must have the reduced shape ",
                                                           reduced[0].shape.ToString(), ", got ",
                                                           in[1].shape.ToString(), " and ", in[2].shape.ToString()));
                }
                return std::vector<TensorMeta>{in[0]};
              })
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t) {
            // Splits of kept axes only: ties are counted over the whole
            // reduced extent, which a split of a reduced axis would cut.
            const std::vector<bool> mask = MaskOf(in[0].shape, attrs);
            const bool keepdim = attrs.Bool("keepdim");
            std::vector<SbpSignature> sigs;
            int out_axis = 0;
            for (int a = 0; a < in[0].shape.rank(); ++a) {
              const bool r = mask[static_cast<size_t>(a)];
              if (!r) {
                const Sbp s = Sbp::Split(out_axis);
                sigs.push_back({{Sbp::Split(a), s, s}, {Sbp::Split(a)}});
              }
              if (!r || keepdim) ++out_axis;
            }
            sigs.push_back({{Sbp::Broadcast(), Sbp::Broadcast(), Sbp::Broadcast()}, {Sbp::Broadcast()}});
            // Linear in dy.
            sigs.push_back({{Sbp::Broadcast(), Sbp::Broadcast(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
            return sigs;
          })
          .Kernel(DeviceType::kCpu, ReduceMaxGradKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, ReduceMaxGradKernel)
#endif
          .Example({kExample, {DType::kF32, Shape{4}}, {DType::kF32, Shape{4}}}, {{"axes", std::vector<int64_t>{1}}}));
}

void RegisterIndexReductions(OpRegistry& r) {
  r.MustRegister(
      OpSchema("argmax")
          .Doc("y (i64) = index of the max of x along `axis`, the lowest index among ties; NaN is skipped (0 where "
               "all are NaN)")
          .NonDifferentiableInput("x")
          .Output("y")
          .Attr("axis", AttrType::kInt, int64_t{-1})
          .Attr("keepdim", AttrType::kBool, false)
          .Infer(
              [](const std::vector<TensorMeta>& in, const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
                RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
                RETURN_IF_ERROR(ExpectRank(in[0], 1, "x", /*at_least=*/true));
                ASSIGN_OR_RETURN(int axis, NormalizeAxis(attrs.Int("axis"), in[0].shape.rank()));
                if (in[0].shape[axis] == 0) {
                  return absl::InvalidArgumentError(StrCat("argmax over axis ", axis, " of extent 0"));
                }
                std::vector<bool> mask(static_cast<size_t>(in[0].shape.rank()), false);
                mask[static_cast<size_t>(axis)] = true;
                return std::vector<TensorMeta>{{DType::kI64, ReducedShape(in[0].shape, mask, attrs.Bool("keepdim"))}};
              })
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap& attrs, int64_t) {
            const int rank = in[0].shape.rank();
            const int axis = static_cast<int>(*NormalizeAxis(attrs.Int("axis"), rank));
            std::vector<bool> mask(static_cast<size_t>(rank), false);
            mask[static_cast<size_t>(axis)] = true;
            return ReduceSignatures(in[0].shape, mask, attrs.Bool("keepdim"), std::nullopt, std::nullopt);
          })
          .Kernel(DeviceType::kCpu, ArgmaxKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, ArgmaxKernel)
#endif
          .Example({kExample}));

  r.MustRegister(
      OpSchema("topk")
          .Doc("values, indices (i64) of the k largest elements of each last-axis row of x, descending, ties by "
               "lower index")
          .NonDifferentiableInput("x")
          .Output("values")
          .Output("indices")
          .Attr("k", AttrType::kInt)
          .Infer(
              [](const std::vector<TensorMeta>& in, const AttrMap& attrs) -> absl::StatusOr<std::vector<TensorMeta>> {
                RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
                RETURN_IF_ERROR(ExpectRank(in[0], 1, "x", /*at_least=*/true));
                const int64_t k = attrs.Int("k");
                const Shape& shape = in[0].shape;
                const int64_t n = shape[shape.rank() - 1];
                if (k < 0 || k > n) {
                  return absl::InvalidArgumentError(StrCat("k = ", k, " must be in [0, ", n, "] (the last axis of x)"));
                }
                std::vector<int64_t> dims = shape.dims();
                dims.back() = k;
                return std::vector<TensorMeta>{{DType::kF32, Shape(dims)}, {DType::kI64, Shape(dims)}};
              })
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
            std::vector<SbpSignature> sigs;
            for (int a = 0; a + 1 < in[0].shape.rank(); ++a) {
              sigs.push_back({{Sbp::Split(a)}, {Sbp::Split(a), Sbp::Split(a)}});
            }
            sigs.push_back({{Sbp::Broadcast()}, {Sbp::Broadcast(), Sbp::Broadcast()}});
            return sigs;
          })
          .Kernel(DeviceType::kCpu,
                  [](KernelContext& ctx) {
                    cpu::TopK(ctx, ctx.input(0), ctx.attr().Int("k"), ctx.output(0), ctx.output(1));
                    return absl::OkStatus();
                  })
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda,
                  [](KernelContext& ctx) {
                    return cuda::TopK(ctx, ctx.input(0), ctx.attr().Int("k"), ctx.output(0), ctx.output(1));
                  })
#endif
          .Example({kExample}, {{"k", int64_t{2}}}));

  r.MustRegister(
      OpSchema("square_sum")
          .Doc("y () = Σ x² over all elements (global-norm clipping)")
          .Input("x")
          .Output("y")
          .Infer([](const std::vector<TensorMeta>& in, const AttrMap&) -> absl::StatusOr<std::vector<TensorMeta>> {
            RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
            return std::vector<TensorMeta>{{DType::kF32, Shape{}}};
          })
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
            // No P input: the square of a sum is not the sum of squares.
            std::vector<SbpSignature> sigs;
            for (int a = 0; a < in[0].shape.rank(); ++a) sigs.push_back({{Sbp::Split(a)}, {Sbp::PartialSum()}});
            sigs.push_back({{Sbp::Broadcast()}, {Sbp::Broadcast()}});
            return sigs;
          })
          .Workspace([](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const AttrMap&,
                        DeviceType device) -> int64_t {
            if (in.empty()) return 0;
            return CudaReduceWorkspace(in[0].shape, std::vector<bool>(static_cast<size_t>(in[0].shape.rank()), true),
                                       device);
          })
          .Grad([](GradBuilder& b) {
            // dx = 2 · x · dy, dy a scalar broadcast over x.
            b.SetInputGrad(0, b.Op("scalar_mul", {b.Op("mul", {b.input(0), b.output_grad(0)})}, {{"value", 2.0}}));
          })
          .Kernel(DeviceType::kCpu, SquareSumKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, SquareSumKernel)
#endif
          .Example({kExample}));
}

}  // namespace

void RegisterReduceOps(OpRegistry& registry) {
  RegisterReductions(registry);
  RegisterIndexReductions(registry);
}

}  // namespace tessera::ops
