// Shape ops: reshape, transpose, slice (+ slice_grad), concat, split,
// broadcast_to, cast, where, masked_fill, and the constant makers fill /
// zeros / ones / arange. Data movement is dtype-generic. Kernels:
// ops/cpu/shape_ops.cc.

#include "ops/cpu/shape_ops.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/checked.h"
#include "core/status.h"
#include "core/text.h"
#include "ops/data_movement.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/cast.h"
#include "ops/cuda/select.h"
#endif
#include "ops/op_util.h"
#include "ops/registry.h"

namespace tessera::ops {
namespace {

const TensorMeta kExample{DType::kF32, Shape{4, 6}};

using MetaList = std::vector<TensorMeta>;
using Signatures = std::vector<SbpSignature>;

std::vector<Sbp> Repeat(Sbp sbp, size_t n) { return std::vector<Sbp>(n, sbp); }

// B…→B…, plus P…→P… when every input and output is floating point (partial
// sums of integers or bools are not a thing we lay out).
void AddBroadcastAndPartial(Signatures& sigs, size_t num_inputs, size_t num_outputs, bool partial) {
  sigs.push_back({Repeat(Sbp::Broadcast(), num_inputs), Repeat(Sbp::Broadcast(), num_outputs)});
  if (partial) sigs.push_back({Repeat(Sbp::PartialSum(), num_inputs), Repeat(Sbp::PartialSum(), num_outputs)});
}

absl::Status CheckExtents(const std::vector<int64_t>& dims, std::string_view what) {
  for (int64_t d : dims) {
    if (d < 0) return absl::InvalidArgumentError(StrCat(what, " (", Join(dims, ", "), ") has a negative extent"));
  }
  return absl::OkStatus();
}

// Whether `value` is exactly an element of `dtype` (floats take anything).
absl::Status CheckRepresentable(double value, DType dtype, std::string_view attr) {
  if (IsFloatingPoint(dtype)) return absl::OkStatus();
  if (dtype == DType::kBool) {
    if (value == 0.0 || value == 1.0) return absl::OkStatus();
    return absl::InvalidArgumentError(StrCat(attr, " = ", value, " is not a bool (0 or 1)"));
  }
  const double lo = dtype == DType::kI32 ? -2147483648.0 : -9223372036854775808.0;
  const double hi = dtype == DType::kI32 ? 2147483647.0 : 9223372036854775807.0;
  if (!std::isfinite(value) || value != std::floor(value) || value < lo || value >= hi + 1.0) {
    return absl::InvalidArgumentError(StrCat(attr, " = ", value, " is not representable as ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

// ---- reshape

absl::StatusOr<Shape> ResolveReshape(const Shape& in, const std::vector<int64_t>& dims) {
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (inferred >= 0)
        return absl::InvalidArgumentError(StrCat("shape (", Join(dims, ", "), ") has more than one -1"));
      inferred = static_cast<int>(i);
    } else if (dims[i] < 0) {
      return absl::InvalidArgumentError(StrCat("shape (", Join(dims, ", "), ") has a negative extent"));
    } else {
      ASSIGN_OR_RETURN(known, CheckedMul(known, dims[i], StrCat("shape (", Join(dims, ", "), ")")));
    }
  }
  std::vector<int64_t> out = dims;
  const int64_t n = in.NumElements();
  if (inferred >= 0) {
    if (known == 0 || n % known != 0) {
      return absl::InvalidArgumentError(
          StrCat("cannot infer the -1 in shape (", Join(dims, ", "), ") for ", n, " elements"));
    }
    out[static_cast<size_t>(inferred)] = n / known;
  }
  Shape shape(std::move(out));
  if (known != n && inferred < 0) {
    return absl::InvalidArgumentError(StrCat("cannot reshape ", in.ToString(), " (", n, " elements) to ",
                                             shape.ToString(), " (", known, " elements)"));
  }
  return shape;
}

// Whether a split of input axis a over p devices is, shard for shard, the
// split of output axis b. Row-major, the axes before a (resp. b) index
// chunks of I[a]·inner_in (resp. O[b]·inner_out) contiguous elements; when
// the products of the axes before a and before b agree these chunks are the
// same, and each shard holds one piece of every chunk. The shard's piece is
// the same run of elements on both sides iff every shard boundary lands on
// the same element: off_a(r)·inner_in == off_b(r)·inner_out for all r, with
// off the balanced-split offsets. For (B, T, C) → (B·T, C), S(0) → S(0),
// this holds iff B % p == 0 or T == 1 (off_b = off_a·T); uneven splits
// generally break it, hence the exact per-shard check for this p.
bool SplitMapsThrough(const Shape& in, int a, const Shape& out, int b, int64_t p) {
  int64_t before_in = 1, before_out = 1, inner_in = 1, inner_out = 1;
  for (int i = 0; i < a; ++i) before_in *= in[i];
  for (int i = 0; i < b; ++i) before_out *= out[i];
  if (before_in != before_out) return false;
  for (int i = a + 1; i < in.rank(); ++i) inner_in *= in[i];
  for (int i = b + 1; i < out.rank(); ++i) inner_out *= out[i];
  if (in[a] * inner_in != out[b] * inner_out) return false;
  for (int64_t r = 1; r < p; ++r) {
    if (BalancedSplit(in[a], p, r).offset * inner_in != BalancedSplit(out[b], p, r).offset * inner_out) return false;
  }
  return true;
}

Signatures ReshapeSignatures(const TensorMeta& in, const Shape& out, int64_t p) {
  Signatures sigs;
  for (int a = 0; a < in.shape.rank(); ++a) {
    for (int b = 0; b < out.rank(); ++b) {
      if (SplitMapsThrough(in.shape, a, out, b, p)) sigs.push_back({{Sbp::Split(a)}, {Sbp::Split(b)}});
    }
  }
  AddBroadcastAndPartial(sigs, 1, 1, IsFloatingPoint(in.dtype));
  return sigs;
}

// Over several axes: every device's block of x and of y hold the same
// elements in the same order (SplitMapsThrough checks each axis alone, on
// the logical shape; an inner axis splits the outer axis's piece, which
// may split unevenly where the logical extent did not).
bool ReshapeNdValid(const MetaList& in, const MetaList& out, const std::vector<NdSbp>& in_layouts,
                    const std::vector<NdSbp>& out_layouts, const std::vector<int64_t>& hierarchy) {
  int64_t devices = 1;
  for (int64_t h : hierarchy) devices *= h;
  for (int64_t id = 0; id < devices; ++id) {
    const absl::StatusOr<TensorSlice> x = LocalSlice(in[0].shape, in_layouts[0], hierarchy, id);
    const absl::StatusOr<TensorSlice> y = LocalSlice(out[0].shape, out_layouts[0], hierarchy, id);
    if (!x.ok() || !y.ok() || !SameRowMajorElements(*x, *y)) return false;
  }
  return true;
}

absl::Status ReshapeKernel(KernelContext& ctx) {
  if (ctx.input(0).NumElements() != ctx.output(0).NumElements()) {
    return absl::InvalidArgumentError(StrCat("local input ", ctx.input(0).shape().ToString(), " and output ",
                                             ctx.output(0).shape().ToString(), " differ in element count"));
  }
  RETURN_IF_ERROR(movement::CopyElements(ctx, ctx.input(0), ctx.output(0)));
  return absl::OkStatus();
}

absl::Status BroadcastToKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(movement::BroadcastTo(ctx, ctx.input(0), ctx.output(0)));
  return absl::OkStatus();
}

void RegisterReshape(OpRegistry& r) {
  r.MustRegister(
      OpSchema("reshape")
          .Doc("y = x's elements in row-major order with another shape; one extent may be -1 (inferred)")
          .Input("x")
          .Output("y")
          .Attr("shape", AttrType::kInts)
          .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
            ASSIGN_OR_RETURN(Shape shape, ResolveReshape(in[0].shape, attrs.Ints("shape")));
            return MetaList{{in[0].dtype, shape}};
          })
          .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t p) {
            const absl::StatusOr<Shape> out = ResolveReshape(in[0].shape, attrs.Ints("shape"));
            return out.ok() ? ReshapeSignatures(in[0], *out, p) : Signatures{};
          })
          .NdSbpCheck(ReshapeNdValid)
          .Grad([](GradBuilder& b) {
            b.SetInputGrad(0, b.Op("reshape", {b.output_grad(0)}, {{"shape", b.meta(b.input(0)).shape.dims()}}));
          })
          .Kernel(DeviceType::kCpu, ReshapeKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, ReshapeKernel)
#endif
          .Example({kExample}, {{"shape", std::vector<int64_t>{2, -1}}}));

  r.MustRegister(
      OpSchema("broadcast_to")
          .Doc("y = x broadcast to `shape` (numpy rules, ranks aligned on the right)")
          .Input("x")
          .Output("y")
          .Attr("shape", AttrType::kInts)
          .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
            const Shape target(attrs.Ints("shape"));
            RETURN_IF_ERROR(CheckExtents(target.dims(), "shape"));
            auto broadcast = BroadcastShapes(in[0].shape, target);
            if (!broadcast.ok() || *broadcast != target) {
              return absl::InvalidArgumentError(
                  StrCat("x ", in[0].shape.ToString(), " does not broadcast to ", target.ToString()));
            }
            return MetaList{{in[0].dtype, target}};
          })
          .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
            const Shape& x = in[0].shape;
            const Shape target(attrs.Ints("shape"));
            Signatures sigs;
            for (int a = 0; a < target.rank(); ++a) {
              const int ia = a - (target.rank() - x.rank());
              // Along a broadcast axis every shard of the output is the
              // same repetition of the whole input.
              const Sbp in_sbp = ia < 0 || x[ia] == 1 ? Sbp::Broadcast() : Sbp::Split(ia);
              sigs.push_back({{in_sbp}, {Sbp::Split(a)}});
            }
            AddBroadcastAndPartial(sigs, 1, 1, IsFloatingPoint(in[0].dtype));
            return sigs;
          })
          .Grad([](GradBuilder& b) { b.SetInputGrad(0, b.SumToShape(b.output_grad(0), b.meta(b.input(0)).shape)); })
          .Kernel(DeviceType::kCpu, BroadcastToKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, BroadcastToKernel)
#endif
          .Example({{DType::kF32, Shape{4, 1}}}, {{"shape", std::vector<int64_t>{3, 4, 6}}}));
}

// ---- transpose

absl::StatusOr<std::vector<int>> NormalizePerm(const std::vector<int64_t>& perm, int rank) {
  if (static_cast<int>(perm.size()) != rank) {
    return absl::InvalidArgumentError(
        StrCat("perm (", Join(perm, ", "), ") must list each of the ", rank, " axes once"));
  }
  std::vector<int> out;
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t p : perm) {
    auto axis = NormalizeAxis(p, rank);
    if (!axis.ok() || seen[static_cast<size_t>(*axis)]) {
      return absl::InvalidArgumentError(
          StrCat("perm (", Join(perm, ", "), ") is not a permutation of ", rank, " axes"));
    }
    seen[static_cast<size_t>(*axis)] = true;
    out.push_back(*axis);
  }
  return out;
}

absl::Status TransposeKernel(KernelContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<int> perm, NormalizePerm(ctx.attr().Ints("perm"), ctx.input(0).shape().rank()));
  RETURN_IF_ERROR(movement::Transpose(ctx, ctx.input(0), perm, ctx.output(0)));
  return absl::OkStatus();
}

void RegisterTranspose(OpRegistry& r) {
  r.MustRegister(OpSchema("transpose")
                     .Doc("y = x with axes permuted: y's axis i is x's axis perm[i]")
                     .Input("x")
                     .Output("y")
                     .Attr("perm", AttrType::kInts)
                     .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
                       ASSIGN_OR_RETURN(std::vector<int> perm, NormalizePerm(attrs.Ints("perm"), in[0].shape.rank()));
                       std::vector<int64_t> dims;
                       for (int p : perm) dims.push_back(in[0].shape[p]);
                       return MetaList{{in[0].dtype, Shape(dims)}};
                     })
                     .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
                       const std::vector<int> perm = *NormalizePerm(attrs.Ints("perm"), in[0].shape.rank());
                       Signatures sigs;
                       for (size_t i = 0; i < perm.size(); ++i) {
                         sigs.push_back({{Sbp::Split(perm[i])}, {Sbp::Split(static_cast<int>(i))}});
                       }
                       AddBroadcastAndPartial(sigs, 1, 1, IsFloatingPoint(in[0].dtype));
                       return sigs;
                     })
                     .Grad([](GradBuilder& b) {
                       const std::vector<int> perm =
                           *NormalizePerm(b.attrs().Ints("perm"), b.meta(b.input(0)).shape.rank());
                       std::vector<int64_t> inverse(perm.size());
                       for (size_t i = 0; i < perm.size(); ++i)
                         inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
                       b.SetInputGrad(0, b.Op("transpose", {b.output_grad(0)}, {{"perm", inverse}}));
                     })
                     .Kernel(DeviceType::kCpu, TransposeKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, TransposeKernel)
#endif
                     .Example({kExample}, {{"perm", std::vector<int64_t>{1, 0}}}));
}

// ---- slice, slice_grad

// numpy basic slicing with step 1, per axis: a negative start or end counts
// from the end (+ extent), both are then clamped to [0, extent], and
// end <= start gives an empty axis.
struct SliceRange {
  std::vector<int64_t> start, size;
  // Whether the slice keeps axis a whole (such an axis may be split).
  bool Whole(const Shape& shape, int a) const {
    return start[static_cast<size_t>(a)] == 0 && size[static_cast<size_t>(a)] == shape[a];
  }
};

absl::StatusOr<SliceRange> NormalizeSlice(const Shape& shape, const std::vector<int64_t>& starts,
                                          const std::vector<int64_t>& ends) {
  const size_t rank = static_cast<size_t>(shape.rank());
  if (starts.size() != rank || ends.size() != rank) {
    return absl::InvalidArgumentError(StrCat("starts (", Join(starts, ", "), ") and ends (", Join(ends, ", "),
                                             ") must have one entry per axis of ", shape.ToString()));
  }
  SliceRange range;
  for (size_t a = 0; a < rank; ++a) {
    const int64_t d = shape[static_cast<int>(a)];
    auto clamp = [d](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + d : i, 0, d); };
    const int64_t s = clamp(starts[a]), e = clamp(ends[a]);
    range.start.push_back(s);
    range.size.push_back(std::max<int64_t>(0, e - s));
  }
  return range;
}

// Local start of the slice within a local tensor whose logical shape is
// `logical`: whole axes (possibly split) start at 0 locally; others are not
// split, so the logical start applies.
std::vector<int64_t> LocalStart(const SliceRange& range, const Shape& logical) {
  std::vector<int64_t> start = range.start;
  for (int a = 0; a < logical.rank(); ++a) {
    if (range.Whole(logical, a)) start[static_cast<size_t>(a)] = 0;
  }
  return start;
}

Signatures SliceSignatures(const Shape& full, const SliceRange& range, DType dtype) {
  Signatures sigs;
  for (int a = 0; a < full.rank(); ++a) {
    if (range.Whole(full, a)) sigs.push_back({{Sbp::Split(a)}, {Sbp::Split(a)}});
  }
  AddBroadcastAndPartial(sigs, 1, 1, IsFloatingPoint(dtype));
  return sigs;
}

absl::Status SliceKernel(KernelContext& ctx) {
  const Shape logical = ctx.input_slice(0).logical;
  ASSIGN_OR_RETURN(SliceRange range, NormalizeSlice(logical, ctx.attr().Ints("starts"), ctx.attr().Ints("ends")));
  const Tensor& y = ctx.output(0);
  RETURN_IF_ERROR(movement::CopyBlock(ctx, ctx.input(0), LocalStart(range, logical), y,
                                  std::vector<int64_t>(static_cast<size_t>(y.shape().rank()), 0), y.shape()));
  return absl::OkStatus();
}

absl::Status SliceGradKernel(KernelContext& ctx) {
  const Shape logical = ctx.output_slice(0).logical;
  ASSIGN_OR_RETURN(SliceRange range, NormalizeSlice(logical, ctx.attr().Ints("starts"), ctx.attr().Ints("ends")));
  const Tensor& dy = ctx.input(0);
  RETURN_IF_ERROR(movement::ZeroFill(ctx, ctx.output(0)));
  RETURN_IF_ERROR(movement::CopyBlock(ctx, dy, std::vector<int64_t>(static_cast<size_t>(dy.shape().rank()), 0),
                                  ctx.output(0), LocalStart(range, logical), dy.shape()));
  return absl::OkStatus();
}

void RegisterSlice(OpRegistry& r) {
  r.MustRegister(
      OpSchema("slice")
          .Doc("y = x[starts[0]:ends[0], ...] per axis (numpy semantics, step 1: negative indices count from "
               "the end, out-of-range ones clamp, end <= start is empty)")
          .Input("x")
          .Output("y")
          .Attr("starts", AttrType::kInts)
          .Attr("ends", AttrType::kInts)
          .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
            ASSIGN_OR_RETURN(SliceRange range, NormalizeSlice(in[0].shape, attrs.Ints("starts"), attrs.Ints("ends")));
            return MetaList{{in[0].dtype, Shape(range.size)}};
          })
          .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
            const SliceRange range = *NormalizeSlice(in[0].shape, attrs.Ints("starts"), attrs.Ints("ends"));
            return SliceSignatures(in[0].shape, range, in[0].dtype);
          })
          .Grad([](GradBuilder& b) {
            b.SetInputGrad(0, b.Op("slice_grad", {b.output_grad(0)},
                                   {{"shape", b.meta(b.input(0)).shape.dims()},
                                    {"starts", b.attrs().Ints("starts")},
                                    {"ends", b.attrs().Ints("ends")}}));
          })
          .Kernel(DeviceType::kCpu, SliceKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, SliceKernel)
#endif
          .Example({kExample}, {{"starts", std::vector<int64_t>{0, 1}}, {"ends", std::vector<int64_t>{4, -1}}}));

  r.MustRegister(
      OpSchema("slice_grad")
          .Doc("dx = zeros of `shape` with dy placed where slice(starts, ends) took it from")
          .Input("dy")
          .Output("dx")
          .Attr("shape", AttrType::kInts)
          .Attr("starts", AttrType::kInts)
          .Attr("ends", AttrType::kInts)
          .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
            const Shape shape(attrs.Ints("shape"));
            RETURN_IF_ERROR(CheckExtents(shape.dims(), "shape"));
            ASSIGN_OR_RETURN(SliceRange range, NormalizeSlice(shape, attrs.Ints("starts"), attrs.Ints("ends")));
            if (in[0].shape != Shape(range.size)) {
              return absl::InvalidArgumentError(StrCat("dy must have the slice's shape ", Shape(range.size).ToString(),
                                                       ", got ", in[0].shape.ToString()));
            }
            return MetaList{{in[0].dtype, shape}};
          })
          .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
            const Shape shape(attrs.Ints("shape"));
            const SliceRange range = *NormalizeSlice(shape, attrs.Ints("starts"), attrs.Ints("ends"));
            return SliceSignatures(shape, range, in[0].dtype);
          })
          .Kernel(DeviceType::kCpu, SliceGradKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, SliceGradKernel)
#endif
          .Example({{DType::kF32, Shape{4, 4}}}, {{"shape", std::vector<int64_t>{4, 6}},
                                                  {"starts", std::vector<int64_t>{0, 1}},
                                                  {"ends", std::vector<int64_t>{4, -1}}}));
}

// ---- concat, split

// Signatures of concat / split along `axis` of rank-`rank` tensors: a split of
// any other axis carries through every piece.
Signatures ConcatSplitSignatures(int rank, int axis, size_t num_inputs, size_t num_outputs, bool partial) {
  Signatures sigs;
  for (int a = 0; a < rank; ++a) {
    if (a != axis) sigs.push_back({Repeat(Sbp::Split(a), num_inputs), Repeat(Sbp::Split(a), num_outputs)});
  }
  AddBroadcastAndPartial(sigs, num_inputs, num_outputs, partial);
  return sigs;
}

absl::Status ConcatKernel(KernelContext& ctx) {
  const Tensor& y = ctx.output(0);
  const int axis = *NormalizeAxis(ctx.attr().Int("axis"), y.shape().rank());
  std::vector<int64_t> at(static_cast<size_t>(y.shape().rank()), 0);
  for (const Tensor& x : ctx.inputs) {
    RETURN_IF_ERROR(movement::CopyBlock(ctx, x, std::vector<int64_t>(at.size(), 0), y, at, x.shape()));
    at[static_cast<size_t>(axis)] += x.shape()[axis];
  }
  return absl::OkStatus();
}

absl::Status SplitKernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int axis = *NormalizeAxis(ctx.attr().Int("axis"), x.shape().rank());
  std::vector<int64_t> at(static_cast<size_t>(x.shape().rank()), 0);
  for (const Tensor& y : ctx.outputs) {
    RETURN_IF_ERROR(movement::CopyBlock(ctx, x, at, y, std::vector<int64_t>(at.size(), 0), y.shape()));
    at[static_cast<size_t>(axis)] += y.shape()[axis];
  }
  return absl::OkStatus();
}

void RegisterConcatSplit(OpRegistry& r) {
  r.MustRegister(
      OpSchema("concat")
          .Doc("y = the inputs joined along `axis` (all other extents equal)")
          .VariadicInput("xs")
          .Output("y")
          .Attr("axis", AttrType::kInt)
          .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
            RETURN_IF_ERROR(ExpectRank(in[0], 1, "xs[0]", /*at_least=*/true));
            ASSIGN_OR_RETURN(int axis, NormalizeAxis(attrs.Int("axis"), in[0].shape.rank()));
            std::vector<int64_t> dims = in[0].shape.dims();
            dims[static_cast<size_t>(axis)] = 0;
            for (size_t i = 0; i < in.size(); ++i) {
              bool match = in[i].dtype == in[0].dtype && in[i].shape.rank() == in[0].shape.rank();
              for (int a = 0; match && a < in[0].shape.rank(); ++a) {
                match = a == axis || in[i].shape[a] == in[0].shape[a];
              }
              if (!match) {
                return absl::InvalidArgumentError(StrCat("xs[", i, "] ", in[i].ToString(), " does not match xs[0] ",
                                                         in[0].ToString(), " outside axis ", axis));
              }
              ASSIGN_OR_RETURN(
                  dims[static_cast<size_t>(axis)],
                  CheckedAdd(dims[static_cast<size_t>(axis)], in[i].shape[axis], StrCat("extent of axis ", axis)));
            }
            return MetaList{{in[0].dtype, Shape(dims)}};
          })
          .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
            const int rank = in[0].shape.rank();
            return ConcatSplitSignatures(rank, *NormalizeAxis(attrs.Int("axis"), rank), in.size(), 1,
                                         IsFloatingPoint(in[0].dtype));
          })
          .Grad([](GradBuilder& b) {
            const int rank = b.meta(b.input(0)).shape.rank();
            const int axis = *NormalizeAxis(b.attrs().Int("axis"), rank);
            std::vector<int64_t> sizes;
            for (int i = 0; i < b.num_inputs(); ++i) sizes.push_back(b.meta(b.input(i)).shape[axis]);
            const std::vector<ValueId> grads =
                b.Ops("split", {b.output_grad(0)}, {{"axis", int64_t{axis}}, {"sizes", sizes}});
            if (static_cast<int>(grads.size()) != b.num_inputs()) return;  // emission failed; status says why
            for (int i = 0; i < b.num_inputs(); ++i) b.SetInputGrad(i, grads[static_cast<size_t>(i)]);
          })
          .Kernel(DeviceType::kCpu, ConcatKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, ConcatKernel)
#endif
          .Example({kExample, {DType::kF32, Shape{4, 2}}}, {{"axis", int64_t{1}}}));

  r.MustRegister(OpSchema("split")
                     .Doc("ys = x cut along `axis` into pieces of extents `sizes` (which sum to x's extent)")
                     .Input("x")
                     .VariadicOutput("ys")
                     .Attr("axis", AttrType::kInt)
                     .Attr("sizes", AttrType::kInts)
                     .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
                       RETURN_IF_ERROR(ExpectRank(in[0], 1, "x", /*at_least=*/true));
                       ASSIGN_OR_RETURN(int axis, NormalizeAxis(attrs.Int("axis"), in[0].shape.rank()));
                       const std::vector<int64_t>& sizes = attrs.Ints("sizes");
                       RETURN_IF_ERROR(CheckExtents(sizes, "sizes"));
                       int64_t total = 0;
                       for (int64_t size : sizes) {
                         ASSIGN_OR_RETURN(total, CheckedAdd(total, size, StrCat("sizes (", Join(sizes, ", "), ")")));
                       }
                       if (sizes.empty() || total != in[0].shape[axis]) {
                         return absl::InvalidArgumentError(StrCat("sizes (", Join(sizes, ", "), ") must sum to axis ",
                                                                  axis, "'s extent ", in[0].shape[axis]));
                       }
                       MetaList out;
                       for (int64_t size : sizes) {
                         Shape shape = in[0].shape;
                         shape[axis] = size;
                         out.push_back({in[0].dtype, shape});
                       }
                       return out;
                     })
                     .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
                       const int rank = in[0].shape.rank();
                       return ConcatSplitSignatures(rank, *NormalizeAxis(attrs.Int("axis"), rank), 1,
                                                    attrs.Ints("sizes").size(), IsFloatingPoint(in[0].dtype));
                     })
                     .Grad([](GradBuilder& b) {
                       std::vector<ValueId> grads;
                       for (int i = 0; i < b.num_outputs(); ++i) grads.push_back(b.OutputGradOrZeros(i));
                       b.SetInputGrad(0, b.Op("concat", grads, {{"axis", b.attrs().Int("axis")}}));
                     })
                     .Kernel(DeviceType::kCpu, SplitKernel)
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, SplitKernel)
#endif
                     .Example({kExample}, {{"axis", int64_t{1}}, {"sizes", std::vector<int64_t>{2, 4}}}));
}

// ---- cast

void RegisterCast(OpRegistry& r) {
  r.MustRegister(OpSchema("cast")
                     .Doc("y = x converted to `dtype`. Floats to integers truncate toward zero and saturate (NaN → 0); "
                          "to bool: x != 0; integers to narrower integers wrap")
                     .Input("x")
                     .Output("y")
                     .Attr("dtype", AttrType::kDType)
                     .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
                       return MetaList{{attrs.GetDType("dtype"), in[0].shape}};
                     })
                     .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
                       const bool float_to_float =
                           IsFloatingPoint(in[0].dtype) && IsFloatingPoint(attrs.GetDType("dtype"));
                       return ElementwiseSignatures(1, 1, in[0].shape.rank(), float_to_float);
                     })
                     .Grad([](GradBuilder& b) {
                       const TensorMeta x = b.meta(b.input(0));
                       if (!IsFloatingPoint(x.dtype)) return;
                       if (IsFloatingPoint(b.attrs().GetDType("dtype"))) {
                         b.SetInputGrad(0, b.Op("cast", {b.output_grad(0)}, {{"dtype", x.dtype}}));
                       } else {
                         // A step function: zero gradient almost everywhere.
                         b.SetInputGrad(0, b.Op("zeros", {}, {{"shape", x.shape.dims()}, {"dtype", x.dtype}}));
                       }
                     })
                     .Kernel(DeviceType::kCpu,
                             [](KernelContext& ctx) {
                               cpu::Cast(ctx, ctx.input(0), ctx.output(0));
                               return absl::OkStatus();
                             })
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::CastKernel)
#endif
                     .Example({kExample}, {{"dtype", DType::kBF16}}));
}

// ---- where, masked_fill

// Broadcasting signatures for any number of inputs: for each output axis, S
// on it in every input that has a non-1 extent there (B in those that
// broadcast along it), skipped when all broadcast; and B…→B.
Signatures BroadcastSignatures(const std::vector<Shape>& inputs, const Shape& out) {
  Signatures sigs;
  for (int a = 0; a < out.rank(); ++a) {
    std::vector<Sbp> in_sbp;
    bool any_split = false;
    for (const Shape& s : inputs) {
      const int ia = a - (out.rank() - s.rank());
      if (ia < 0 || s[ia] == 1) {
        in_sbp.push_back(Sbp::Broadcast());
      } else {
        in_sbp.push_back(Sbp::Split(ia));
        any_split = true;
      }
    }
    if (any_split) sigs.push_back({in_sbp, {Sbp::Split(a)}});
  }
  sigs.push_back({Repeat(Sbp::Broadcast(), inputs.size()), {Sbp::Broadcast()}});
  return sigs;
}

absl::StatusOr<Shape> WhereShape(const MetaList& in) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kBool, "cond"));
  if (in[1].dtype != in[2].dtype) {
    return absl::InvalidArgumentError(
        StrCat("x and y must have one dtype, got ", DTypeName(in[1].dtype), " and ", DTypeName(in[2].dtype)));
  }
  ASSIGN_OR_RETURN(Shape xy, BroadcastShapes(in[1].shape, in[2].shape));
  return BroadcastShapes(in[0].shape, xy);
}

void RegisterSelect(OpRegistry& r) {
  r.MustRegister(
      OpSchema("where")
          .Doc("out = cond ? x : y element by element, all three broadcast (numpy rules)")
          .NonDifferentiableInput("cond")
          .Input("x")
          .Input("y")
          .Output("out")
          .Infer([](const MetaList& in, const AttrMap&) -> absl::StatusOr<MetaList> {
            ASSIGN_OR_RETURN(Shape shape, WhereShape(in));
            return MetaList{{in[1].dtype, shape}};
          })
          .Sbp([](const MetaList& in, const AttrMap&, int64_t) {
            const Shape out = *WhereShape(in);
            Signatures sigs = BroadcastSignatures({in[0].shape, in[1].shape, in[2].shape}, out);
            // Linear in (x, y) jointly for a fixed cond.
            if (IsFloatingPoint(in[1].dtype)) {
              sigs.push_back({{Sbp::Broadcast(), Sbp::PartialSum(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
            }
            return sigs;
          })
          .Grad([](GradBuilder& b) {
            const ValueId dy = b.output_grad(0);
            const TensorMeta m = b.meta(dy);
            const ValueId zeros = b.Op("zeros", {}, {{"shape", m.shape.dims()}, {"dtype", m.dtype}});
            const ValueId cond = b.input(0);
            b.SetInputGrad(1, b.SumToShape(b.Op("where", {cond, dy, zeros}), b.meta(b.input(1)).shape));
            b.SetInputGrad(2, b.SumToShape(b.Op("where", {cond, zeros, dy}), b.meta(b.input(2)).shape));
          })
          .Kernel(DeviceType::kCpu,
                  [](KernelContext& ctx) {
                    cpu::Where(ctx, ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0));
                    return absl::OkStatus();
                  })
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, cuda::WhereKernel)
#endif
          .Example({{DType::kBool, Shape{4, 1}}, kExample, {DType::kF32, Shape{6}}}));

  r.MustRegister(OpSchema("masked_fill")
                     .Doc("y = mask ? value : x, mask (bool) broadcast to x's shape")
                     .Input("x")
                     .NonDifferentiableInput("mask")
                     .Output("y")
                     .Attr("value", AttrType::kFloat)
                     .Infer([](const MetaList& in, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
                       RETURN_IF_ERROR(ExpectDType(in[1], DType::kBool, "mask"));
                       auto shape = BroadcastShapes(in[0].shape, in[1].shape);
                       if (!shape.ok() || *shape != in[0].shape) {
                         return absl::InvalidArgumentError(StrCat("mask ", in[1].shape.ToString(),
                                                                  " does not broadcast to x ", in[0].shape.ToString()));
                       }
                       const double value = attrs.Float("value");
                       RETURN_IF_ERROR(CheckRepresentable(value, in[0].dtype, "value"));
                       return MetaList{in[0]};
                     })
                     .Sbp([](const MetaList& in, const AttrMap& attrs, int64_t) {
                       Signatures sigs = BroadcastSignatures({in[0].shape, in[1].shape}, in[0].shape);
                       // Filling with 0 is linear in x; any other value is not.
                       if (IsFloatingPoint(in[0].dtype) && attrs.Float("value") == 0.0) {
                         sigs.push_back({{Sbp::PartialSum(), Sbp::Broadcast()}, {Sbp::PartialSum()}});
                       }
                       return sigs;
                     })
                     .Grad([](GradBuilder& b) {
                       b.SetInputGrad(0, b.Op("masked_fill", {b.output_grad(0), b.input(1)}, {{"value", 0.0}}));
                     })
                     .Kernel(DeviceType::kCpu,
                             [](KernelContext& ctx) {
                               cpu::MaskedFill(ctx, ctx.input(0), ctx.input(1), ctx.attr().Float("value"),
                                               ctx.output(0));
                               return absl::OkStatus();
                             })
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::MaskedFillKernel)
#endif
                     .Example({kExample, {DType::kBool, Shape{1, 6}}}, {{"value", -1e9}}));
}

// ---- fill, zeros, ones, arange

// Ops without inputs make their local block directly: () → S(a) for every
// axis, () → B.
Signatures MakerSignatures(size_t rank) {
  Signatures sigs;
  for (size_t a = 0; a < rank; ++a) sigs.push_back({{}, {Sbp::Split(static_cast<int>(a))}});
  sigs.push_back({{}, {Sbp::Broadcast()}});
  return sigs;
}

absl::StatusOr<MetaList> InferConstant(const AttrMap& attrs, double value) {
  const std::vector<int64_t>& dims = attrs.Ints("shape");
  RETURN_IF_ERROR(CheckExtents(dims, "shape"));
  const DType dtype = attrs.GetDType("dtype");
  RETURN_IF_ERROR(CheckRepresentable(value, dtype, "value"));
  return MetaList{{dtype, Shape(dims)}};
}

OpSchema ConstantSchema(const std::string& name, std::optional<double> fixed_value, const std::string& doc) {
  OpSchema schema(name);
  schema.Doc(doc).Output("y").Attr("shape", AttrType::kInts).Attr("dtype", AttrType::kDType, DType::kF32);
  if (!fixed_value) schema.Attr("value", AttrType::kFloat);
  schema
      .Infer([fixed_value](const MetaList&, const AttrMap& attrs) {
        return InferConstant(attrs, fixed_value ? *fixed_value : attrs.Float("value"));
      })
      .Sbp([](const MetaList&, const AttrMap& attrs, int64_t) { return MakerSignatures(attrs.Ints("shape").size()); })
      .Kernel(DeviceType::kCpu, [fixed_value](KernelContext& ctx) {
        const double value = fixed_value ? *fixed_value : ctx.attr().Float("value");
        if (value == 0.0 && !std::signbit(value)) {  // all-zero bytes in every dtype
          cpu::ZeroFill(ctx, ctx.output(0));
        } else {
          cpu::FillConstant(ctx, ctx.output(0), value);
        }
        return absl::OkStatus();
      });
#ifdef TESSERA_WITH_CUDA
  schema.Kernel(DeviceType::kCuda, [fixed_value](KernelContext& ctx) {
    return cuda::FillKernel(ctx, fixed_value ? *fixed_value : ctx.attr().Float("value"));
  });
#endif
  AttrMap example{{"shape", std::vector<int64_t>{4, 6}}};
  if (!fixed_value) example.Set("value", 0.5);
  schema.Example({}, std::move(example));
  return schema;
}

void RegisterMakers(OpRegistry& r) {
  r.MustRegister(ConstantSchema("fill", std::nullopt, "y = `value` everywhere, of `shape` and `dtype`"));
  r.MustRegister(ConstantSchema("zeros", 0.0, "y = 0 everywhere, of `shape` and `dtype`"));
  r.MustRegister(ConstantSchema("ones", 1.0, "y = 1 everywhere, of `shape` and `dtype`"));
  r.MustRegister(OpSchema("arange")
                     .Doc("y[i] = start + i · step for i in [0, n) (1-D). Integer dtypes need integral start and step")
                     .Output("y")
                     .Attr("start", AttrType::kFloat, 0.0)
                     .Attr("step", AttrType::kFloat, 1.0)
                     .Attr("n", AttrType::kInt)
                     .Attr("dtype", AttrType::kDType, DType::kF32)
                     .Infer([](const MetaList&, const AttrMap& attrs) -> absl::StatusOr<MetaList> {
                       const int64_t n = attrs.Int("n");
                       if (n < 0) return absl::InvalidArgumentError(StrCat("n = ", n, " must be >= 0"));
                       const DType dtype = attrs.GetDType("dtype");
                       if (dtype == DType::kBool) return absl::InvalidArgumentError("arange has no bool dtype");
                       RETURN_IF_ERROR(CheckRepresentable(attrs.Float("start"), dtype, "start"));
                       RETURN_IF_ERROR(CheckRepresentable(attrs.Float("step"), dtype, "step"));
                       return MetaList{{dtype, Shape{n}}};
                     })
                     .Sbp([](const MetaList&, const AttrMap&, int64_t) { return MakerSignatures(1); })
                     .Kernel(DeviceType::kCpu,
                             [](KernelContext& ctx) {
                               // Under S(0) this shard holds the values from its offset on.
                               cpu::Arange(ctx, ctx.output(0), ctx.attr().Float("start"), ctx.attr().Float("step"),
                                           ctx.output_slice(0).offset[0]);
                               return absl::OkStatus();
                             })
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, cuda::ArangeKernel)
#endif
                     .Example({}, {{"n", int64_t{8}}}));
}

// depend(x, after) = x, computed only once `after` exists: the activation-
// checkpointing pass starts a layer's recomputation from its input made to
// wait for the layer's output gradient (graph/passes.h). `after` is never
// read, so any layout of it goes with any layout of x.
absl::Status DependKernel(KernelContext& ctx) {
  RETURN_IF_ERROR(movement::CopyElements(ctx, ctx.input(0), ctx.output(0)));
  return absl::OkStatus();
}

void RegisterDepend(OpRegistry& r) {
  r.MustRegister(
      OpSchema("depend")
          .Doc("y = x, once `after` exists (its values are not read): orders a recomputation after a gradient")
          .Input("x")
          .NonDifferentiableInput("after")
          .Output("y")
          .Infer([](const MetaList& in, const AttrMap&) -> absl::StatusOr<MetaList> { return MetaList{in[0]}; })
          .Sbp([](const MetaList& in, const AttrMap&, int64_t) {
            const auto layouts = [](const TensorMeta& meta) {
              std::vector<tessera::Sbp> out = {tessera::Sbp::Broadcast()};
              for (int a = 0; a < meta.shape.rank(); ++a) out.push_back(tessera::Sbp::Split(a));
              if (IsFloatingPoint(meta.dtype)) {  // y = x keeps either kind of partial
                out.push_back(tessera::Sbp::PartialSum());
                out.push_back(tessera::Sbp::PartialMax());
              }
              return out;
            };
            Signatures sigs;
            for (const tessera::Sbp& x : layouts(in[0])) {
              for (const tessera::Sbp& after : layouts(in[1])) sigs.push_back({{x, after}, {x}});
            }
            return sigs;
          })
          .Grad([](GradBuilder& b) { b.SetInputGrad(0, b.output_grad(0)); })
          .Kernel(DeviceType::kCpu, DependKernel)
#ifdef TESSERA_WITH_CUDA
          .Kernel(DeviceType::kCuda, DependKernel)
#endif
          .Example({{DType::kF32, Shape{4, 8}}, {DType::kF32, Shape{2, 3}}}));
}

}  // namespace

void RegisterShapeOps(OpRegistry& registry) {
  RegisterDepend(registry);
  RegisterReshape(registry);
  RegisterTranspose(registry);
  RegisterSlice(registry);
  RegisterConcatSplit(registry);
  RegisterCast(registry);
  RegisterSelect(registry);
  RegisterMakers(registry);
}

}  // namespace tessera::ops
