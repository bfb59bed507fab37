// Random ops: normal, uniform, dropout, and bias_dropout_add (a row-parallel
// projection's bias, its dropout and the residual add in one pass).
//
// Layout-invariant randomness (DESIGN §4): every number is a pure function of
// (seed, tensor_id, step, the element's index in the logical tensor), drawn
// from Philox4x32-10 (core/philox.h). Element i takes lane i % 4 of the Philox
// block with counter (i / 4, tensor_id, step) and key seed, so one Philox call
// serves four consecutive elements. The kernels read the global index from the
// slices, so a shard computes exactly the numbers the unsplit op would give its
// elements, under any split.

#include <cmath>
#include <limits>
#include <vector>

#include "core/text.h"
#include "ops/op_util.h"
#include "ops/registry.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/random.h"
#endif

namespace tessera::ops {

namespace cpu {
absl::Status NormalKernel(KernelContext& ctx);
absl::Status UniformKernel(KernelContext& ctx);
absl::Status DropoutKernel(KernelContext& ctx);
absl::Status BiasDropoutAddKernel(KernelContext& ctx);
}  // namespace cpu

namespace {

// tensor_id is one 32-bit word of the Philox counter.
absl::Status CheckStreamAttrs(const AttrMap& attrs) {
  const int64_t tensor_id = attrs.Int("tensor_id");
  if (tensor_id < 0 || tensor_id > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(StrCat("tensor_id must be in [0, 2^32), got ", tensor_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<Shape> ShapeAttr(const AttrMap& attrs) {
  const std::vector<int64_t>& dims = attrs.Ints("shape");
  for (int64_t d : dims) {
    if (d < 0) {
      return absl::InvalidArgumentError(StrCat("shape must not have negative extents, got (", Join(dims, ", "), ")"));
    }
  }
  return Shape(dims);
}

absl::StatusOr<std::vector<TensorMeta>> InferNormal(const std::vector<TensorMeta>&, const AttrMap& attrs) {
  RETURN_IF_ERROR(CheckStreamAttrs(attrs));
  const double mean = attrs.Float("mean"), std = attrs.Float("std");
  if (!std::isfinite(mean) || !std::isfinite(std) || std < 0) {
    return absl::InvalidArgumentError(
        StrCat("mean must be finite and std finite and >= 0, got mean ", mean, ", std ", std));
  }
  if (!std::isfinite(static_cast<float>(mean)) || !std::isfinite(static_cast<float>(std))) {
    return absl::InvalidArgumentError(StrCat("need mean and std within f32's range (",
                                             std::numeric_limits<float>::max(), "), got mean ", mean, ", std ", std));
  }
  ASSIGN_OR_RETURN(Shape shape, ShapeAttr(attrs));
  return std::vector<TensorMeta>{{DType::kF32, std::move(shape)}};
}

absl::StatusOr<std::vector<TensorMeta>> InferUniform(const std::vector<TensorMeta>&, const AttrMap& attrs) {
  RETURN_IF_ERROR(CheckStreamAttrs(attrs));
  const double low = attrs.Float("low"), high = attrs.Float("high");
  if (!std::isfinite(low) || !std::isfinite(high) || high < low) {
    return absl::InvalidArgumentError(StrCat("need finite low <= high, got low ", low, ", high ", high));
  }
  // (The kernels draw in f32: bounds past its range, or a span that
  // overflows it, gave inf or NaN samples, NaN bounds differently on CPU
  // and CUDA.)
  if (!std::isfinite(static_cast<float>(high) - static_cast<float>(low))) {
    return absl::InvalidArgumentError(StrCat("need low, high and high - low within f32's range (",
                                             std::numeric_limits<float>::max(), "), got low ", low, ", high ", high));
  }
  ASSIGN_OR_RETURN(Shape shape, ShapeAttr(attrs));
  return std::vector<TensorMeta>{{DType::kF32, std::move(shape)}};
}

// A generated tensor can be split along any axis: each shard draws its own
// elements by their global index.
std::vector<SbpSignature> GeneratorSignatures(const std::vector<TensorMeta>&, const AttrMap& attrs, int64_t) {
  std::vector<SbpSignature> sigs;
  const int rank = static_cast<int>(attrs.Ints("shape").size());
  for (int axis = 0; axis < rank; ++axis) sigs.push_back({{}, {Sbp::Split(axis)}});
  sigs.push_back({{}, {Sbp::Broadcast()}});
  return sigs;
}

absl::StatusOr<std::vector<TensorMeta>> InferDropout(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
  RETURN_IF_ERROR(CheckStreamAttrs(attrs));
  const double rate = attrs.Float("rate");
  if (!(rate >= 0 && rate < 1)) return absl::InvalidArgumentError(StrCat("rate must be in [0, 1), got ", rate));
  return std::vector<TensorMeta>{in[0]};
}

// x (..., C) f32, bias (C,) f32, residual as x.
absl::StatusOr<std::vector<TensorMeta>> InferBiasDropoutAdd(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kF32, "bias"));
  RETURN_IF_ERROR(ExpectRank(in[0], 1, "x", /*at_least=*/true));
  const int64_t C = in[0].shape[in[0].shape.rank() - 1];
  if (in[1].shape != Shape{C}) {
    return absl::InvalidArgumentError(
        StrCat("bias must have shape (", C, ",) to match the last axis of x, got ", in[1].shape.ToString()));
  }
  if (in[2] != in[0]) {
    return absl::InvalidArgumentError(StrCat("residual must match x ", in[0].ToString(), ", got ", in[2].ToString()));
  }
  return InferDropout({in[0]}, attrs);
}

}  // namespace

void RegisterRandomOps(OpRegistry& registry) {
  registry.MustRegister(
      OpSchema("normal")
          .Doc("Samples N(mean, std^2) of `shape` (f32). Element i draws from Philox(key seed, counter (i / 4, "
               "tensor_id, step)), i its index in the logical tensor, so any split gives the same numbers.")
          .Output("y")
          .Attr("shape", AttrType::kInts)
          .Attr("mean", AttrType::kFloat, 0.0)
          .Attr("std", AttrType::kFloat, 1.0)
          .Attr("seed", AttrType::kInt)
          .Attr("tensor_id", AttrType::kInt)
          .Infer(InferNormal)
          .Sbp(GeneratorSignatures)
          .Kernel(DeviceType::kCpu, cpu::NormalKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::NormalKernel)
#endif
          .Example({}, {{"shape", std::vector<int64_t>{4, 6}}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}}));

  registry.MustRegister(
      OpSchema("uniform")
          .Doc("Samples U[low, high) of `shape` (f32), from the same layout-invariant stream as normal.")
          .Output("y")
          .Attr("shape", AttrType::kInts)
          .Attr("low", AttrType::kFloat, 0.0)
          .Attr("high", AttrType::kFloat, 1.0)
          .Attr("seed", AttrType::kInt)
          .Attr("tensor_id", AttrType::kInt)
          .Infer(InferUniform)
          .Sbp(GeneratorSignatures)
          .Kernel(DeviceType::kCpu, cpu::UniformKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::UniformKernel)
#endif
          .Example({}, {{"shape", std::vector<int64_t>{4, 6}}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}}));

  registry.MustRegister(
      OpSchema("dropout")
          .Doc("y = x * keep / (1 - rate), keep = U >= rate with U uniform in [0, 1) drawn per element of x from "
               "(seed, tensor_id, step, global index), so the mask is the same under any split.")
          .Input("x")
          .Output("y")
          .Attr("rate", AttrType::kFloat)
          .Attr("seed", AttrType::kInt)
          .Attr("tensor_id", AttrType::kInt)
          .DrawsByGlobalIndex("rate")
          .Infer(InferDropout)
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
            // For a fixed mask the op is linear in x, so partial sums pass through.
            return ElementwiseSignatures(1, 1, in[0].shape.rank(), /*linear_in_all=*/true);
          })
          .Grad([](GradBuilder& b) {
            // dx = dy * keep / (1 - rate): dropout of dy with the same attributes.
            // The mask is not stored: dy has x's shape and slices, and the
            // backward op runs in the same step, so it regenerates the very
            // same mask from the same counters. That saves a mask tensor per
            // dropout for the price of recomputing Philox, which is cheap
            // next to the memory traffic it replaces.
            b.SetInputGrad(0, b.Op("dropout", {b.OutputGradOrZeros(0)}, b.attrs()));
          })
          .Kernel(DeviceType::kCpu, cpu::DropoutKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::DropoutKernel)
#endif
          .Example({{DType::kF32, Shape{4, 6}}}, {{"rate", 0.1}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}}));

  registry.MustRegister(
      OpSchema("bias_dropout_add")
          .Doc("y = residual + dropout(x + bias): bias over the last axis of x, the dropout op's mask for (rate, "
               "seed, tensor_id) on x's shape, the same operations in the same order as bias_add, dropout and add "
               "(so the same bits). What the graph's fusion pass makes of a row-parallel projection's bias, its "
               "dropout and the residual add.")
          .Input("x")
          .Input("bias")
          .Input("residual")
          .Output("y")
          .Attr("rate", AttrType::kFloat)
          .Attr("seed", AttrType::kInt)
          .Attr("tensor_id", AttrType::kInt)
          .DrawsByGlobalIndex("rate")
          .Infer(InferBiasDropoutAdd)
          .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
            // bias_add's, with the residual laid out as x; no partial sums:
            // the bias would be added once per part.
            return BiasSignatures(in, /*linear=*/false);
          })
          .Grad([](GradBuilder& b) {
            // dresidual = dy; dx = dropout(dy) with the forward's mask (the
            // dropout op's own gradient); dbias = dx summed over the rows.
            const ValueId dy = b.OutputGradOrZeros(0);
            const ValueId dx = b.attrs().Float("rate") == 0.0 ? dy
                                                              : b.Op("dropout", {dy},
                                                                     {{"rate", b.attrs().Float("rate")},
                                                                      {"seed", b.attrs().Int("seed")},
                                                                      {"tensor_id", b.attrs().Int("tensor_id")}});
            b.SetInputGrad(0, dx);
            b.SetInputGrad(1, b.SumToShape(dx, b.meta(b.input(1)).shape));
            b.SetInputGrad(2, dy);
          })
          .Kernel(DeviceType::kCpu, cpu::BiasDropoutAddKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::BiasDropoutAddKernel)
#endif
          .Example({{DType::kF32, Shape{4, 6}}, {DType::kF32, Shape{6}}, {DType::kF32, Shape{4, 6}}},
                   {{"rate", 0.1}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}}));
}

}  // namespace tessera::ops
