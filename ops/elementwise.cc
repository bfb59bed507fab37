// Element-wise ops: broadcasting binary arithmetic, scalar arithmetic, unary
// math and activations with their gradient ops, and the bias family
// (bias_add, fused bias + GELU). Kernels: ops/cpu/elementwise.cc.

#include <string>

#include "core/text.h"
#include "ops/cpu/elementwise.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/elementwise.h"
#endif
#include "ops/op_util.h"
#include "ops/registry.h"

namespace tessera::ops {
namespace {

using cpu::ActivationGradKind;
using cpu::BinaryKind;
using cpu::ScalarKind;
using cpu::UnaryKind;

const TensorMeta kExample{DType::kF32, Shape{4, 6}};

// Registers `kernel` (a callable of (KernelContext&, Args...)) for the CPU
// and, in a build with CUDA, its CUDA twin of the same name in ops::cuda.
#ifdef TESSERA_WITH_CUDA
#define TESSERA_ELEMENTWISE_KERNELS(schema, call)                                         \
  (schema)                                                                                \
      .Kernel(DeviceType::kCpu, [=](KernelContext& ctx) { return cpu::call; })            \
      .Kernel(DeviceType::kCuda, [=](KernelContext& ctx) { return cuda::call; })
#else
#define TESSERA_ELEMENTWISE_KERNELS(schema, call) \
  (schema).Kernel(DeviceType::kCpu, [=](KernelContext& ctx) { return cpu::call; })
#endif

absl::StatusOr<std::vector<TensorMeta>> InferSameF32(const std::vector<TensorMeta>& in, const AttrMap&) {
  for (size_t i = 0; i < in.size(); ++i) {
    RETURN_IF_ERROR(ExpectDType(in[i], DType::kF32, StrCat("input ", i)));
    if (in[i].shape != in[0].shape) {
      return absl::InvalidArgumentError(
          StrCat("inputs must have the same shape, got ", in[0].shape.ToString(), " and ", in[i].shape.ToString()));
    }
  }
  return std::vector<TensorMeta>{in[0]};
}

absl::StatusOr<std::vector<TensorMeta>> InferBroadcast(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "a"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kF32, "b"));
  ASSIGN_OR_RETURN(Shape shape, BroadcastShapes(in[0].shape, in[1].shape));
  return std::vector<TensorMeta>{{DType::kF32, shape}};
}

// x (..., C) with bias (C,) [and dy like x].
absl::StatusOr<std::vector<TensorMeta>> InferBias(const std::vector<TensorMeta>& in, const AttrMap&) {
  RETURN_IF_ERROR(ExpectDType(in[0], DType::kF32, "x"));
  RETURN_IF_ERROR(ExpectDType(in[1], DType::kF32, "bias"));
  RETURN_IF_ERROR(ExpectRank(in[0], 1, "x", /*at_least=*/true));
  const int64_t C = in[0].shape[in[0].shape.rank() - 1];
  if (in[1].shape != Shape{C}) {
    return absl::InvalidArgumentError(StrCat("bias must have shape (", C, ",) to match the last axis of x, got ",
                                             in[1].shape.ToString()));
  }
  if (in.size() == 3 && in[2] != in[0]) {
    return absl::InvalidArgumentError(StrCat("dy must match x, got ", in[2].ToString()));
  }
  return std::vector<TensorMeta>{in[0]};
}

// Activation-gradient ops (z, dy): element-wise, and linear in dy, so a
// broadcast z with a partial dy gives a partial dx.
std::vector<SbpSignature> ActivationGradSignatures(const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
  auto sigs = ElementwiseSignatures(2, 1, in[0].shape.rank(), false);
  sigs.push_back({{Sbp::Broadcast(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
  return sigs;
}

void RegisterBinary(OpRegistry& r, const std::string& name, BinaryKind kind, PartialRules partial, GradFn grad,
                    const std::string& doc) {
  OpSchema schema(name);
  schema.Doc(doc)
                     .Input("a")
                     .Input("b")
                     .Output("y")
                     .Infer(InferBroadcast)
                     .Sbp([partial](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
                       return BroadcastBinarySignatures(in[0].shape, in[1].shape, partial);
                     })
                     .Grad(std::move(grad))
                     .Example({kExample, {DType::kF32, Shape{6}}});
  TESSERA_ELEMENTWISE_KERNELS(schema, BinaryKernel(ctx, kind));
  r.MustRegister(std::move(schema));
}

absl::Status CheckApproximate(const AttrMap& attrs) {
  const std::string& a = attrs.String("approximate");
  if (a == "none" || a == "tanh") return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat("attribute 'approximate' must be \"none\" or \"tanh\", got \"", a, "\""));
}

absl::StatusOr<std::vector<TensorMeta>> InferGelu(const std::vector<TensorMeta>& in, const AttrMap& attrs) {
  RETURN_IF_ERROR(CheckApproximate(attrs));
  return InferSameF32(in, attrs);
}

void RegisterUnary(OpRegistry& r, const std::string& name, UnaryKind kind, bool linear, GradFn grad,
                   const std::string& doc, AttrMap example_attrs = {}) {
  OpSchema schema(name);
  schema.Doc(doc)
      .Input("x")
      .Output("y")
      .Infer(InferSameF32)
      .Sbp([linear](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
        return ElementwiseSignatures(1, 1, in[0].shape.rank(), linear);
      })
      .Grad(std::move(grad))
      .Example({kExample}, std::move(example_attrs));
  if (kind == UnaryKind::kGelu) {
    // One schema, two kernels chosen by the attribute.
    schema.Attr("approximate", AttrType::kString, std::string("none"))
        .Infer(InferGelu);
    TESSERA_ELEMENTWISE_KERNELS(
        schema, UnaryKernel(ctx, ctx.attr().String("approximate") == "tanh" ? UnaryKind::kGeluTanh : UnaryKind::kGelu));
  } else {
    TESSERA_ELEMENTWISE_KERNELS(schema, UnaryKernel(ctx, kind));
  }
  r.MustRegister(std::move(schema));
}

void RegisterActivationGrad(OpRegistry& r, const std::string& name, const std::string& first_input,
                            ActivationGradKind kind, const std::string& doc) {
  OpSchema schema(name);
  schema.Doc(doc)
      .Input(first_input)
      .Input("dy")
      .Output("dx")
      .Infer(InferSameF32)
      .Sbp(ActivationGradSignatures)
      .Example({kExample, kExample});
  if (kind == ActivationGradKind::kGeluFromX) {
    schema.Attr("approximate", AttrType::kString, std::string("none"))
        .Infer(InferGelu);
    TESSERA_ELEMENTWISE_KERNELS(schema, ActivationGradKernel(ctx, ctx.attr().String("approximate") == "tanh"
                                                                   ? ActivationGradKind::kGeluTanhFromX
                                                                   : ActivationGradKind::kGeluFromX));
  } else {
    TESSERA_ELEMENTWISE_KERNELS(schema, ActivationGradKernel(ctx, kind));
  }
  r.MustRegister(std::move(schema));
}


void RegisterScalar(OpRegistry& r, const std::string& name, ScalarKind kind, bool linear, GradFn grad,
                    const std::string& doc) {
  const char* attr = kind == ScalarKind::kPow ? "exponent" : "value";
  OpSchema schema(name);
  schema.Doc(doc)
                     .Input("x")
                     .Output("y")
                     .Attr(attr, AttrType::kFloat)
                     .Infer(InferSameF32)
                     .Sbp([linear](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
                       return ElementwiseSignatures(1, 1, in[0].shape.rank(), linear);
                     })
                     .Grad(std::move(grad))
                     .Example({kExample}, {{attr, 2.0}});
  TESSERA_ELEMENTWISE_KERNELS(schema, ScalarKernel(ctx, kind, static_cast<float>(ctx.attr().Float(attr))));
  r.MustRegister(std::move(schema));
}

}  // namespace

void RegisterElementwiseOps(OpRegistry& r) {
  // ---- Broadcasting binary ops. Gradients sum back over broadcast axes.
  RegisterBinary(r, "add", BinaryKind::kAdd, {.both_partial = true}, [](GradBuilder& b) {
    const ValueId dy = b.output_grad(0);
    b.SetInputGrad(0, b.SumToShape(dy, b.meta(b.input(0)).shape));
    b.SetInputGrad(1, b.SumToShape(dy, b.meta(b.input(1)).shape));
  }, "y = a + b (numpy broadcasting)");
  RegisterBinary(r, "sub", BinaryKind::kSub, {.both_partial = true}, [](GradBuilder& b) {
    const ValueId dy = b.output_grad(0);
    b.SetInputGrad(0, b.SumToShape(dy, b.meta(b.input(0)).shape));
    b.SetInputGrad(1, b.SumToShape(b.Op("neg", {dy}), b.meta(b.input(1)).shape));
  }, "y = a - b (numpy broadcasting)");
  RegisterBinary(r, "mul", BinaryKind::kMul, {.first_partial = true, .second_partial = true}, [](GradBuilder& b) {
    const ValueId dy = b.output_grad(0);
    b.SetInputGrad(0, b.SumToShape(b.Op("mul", {dy, b.input(1)}), b.meta(b.input(0)).shape));
    b.SetInputGrad(1, b.SumToShape(b.Op("mul", {dy, b.input(0)}), b.meta(b.input(1)).shape));
  }, "y = a * b (numpy broadcasting)");
  RegisterBinary(r, "div", BinaryKind::kDiv, {.first_partial = true}, [](GradBuilder& b) {
    const ValueId dy = b.output_grad(0);
    // d/da = dy / b; d/db = -dy * a / b^2 = -dy * y / b.
    b.SetInputGrad(0, b.SumToShape(b.Op("div", {dy, b.input(1)}), b.meta(b.input(0)).shape));
    const ValueId y_over_b = b.Op("div", {b.output(0), b.input(1)});
    b.SetInputGrad(1, b.SumToShape(b.Op("neg", {b.Op("mul", {dy, y_over_b})}), b.meta(b.input(1)).shape));
  }, "y = a / b (numpy broadcasting)");

  // ---- Scalar arithmetic.
  RegisterScalar(r, "scalar_add", ScalarKind::kAdd, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.output_grad(0));
  }, "y = x + value");
  RegisterScalar(r, "scalar_mul", ScalarKind::kMul, true, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("scalar_mul", {b.output_grad(0)}, {{"value", b.attrs().Float("value")}}));
  }, "y = x * value");
  RegisterScalar(r, "scalar_pow", ScalarKind::kPow, false, [](GradBuilder& b) {
    const double p = b.attrs().Float("exponent");
    if (p == 0) {  // x^0 is 1: no gradient (0 * x^-1 made it NaN at x = 0)
      b.SetInputGrad(0, b.Op("scalar_mul", {b.output_grad(0)}, {{"value", 0.0}}));
      return;
    }
    const ValueId d = b.Op("scalar_mul", {b.Op("scalar_pow", {b.input(0)}, {{"exponent", p - 1}})}, {{"value", p}});
    b.SetInputGrad(0, b.Op("mul", {b.output_grad(0), d}));
  }, "y = x ^ exponent");

  // ---- Unary math.
  RegisterUnary(r, "neg", UnaryKind::kNeg, true, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("neg", {b.output_grad(0)}));
  }, "y = -x");
  RegisterUnary(r, "exp", UnaryKind::kExp, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("mul", {b.output_grad(0), b.output(0)}));
  }, "y = e^x");
  RegisterUnary(r, "log", UnaryKind::kLog, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("div", {b.output_grad(0), b.input(0)}));
  }, "y = ln x");
  RegisterUnary(r, "sqrt", UnaryKind::kSqrt, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("div", {b.output_grad(0), b.Op("scalar_mul", {b.output(0)}, {{"value", 2.0}})}));
  }, "y = sqrt(x)");
  RegisterUnary(r, "rsqrt", UnaryKind::kRsqrt, false, [](GradBuilder& b) {
    // dy/dx = -x^(-3/2) / 2 = -y^3 / 2.
    const ValueId d = b.Op("scalar_mul", {b.Op("scalar_pow", {b.output(0)}, {{"exponent", 3.0}})}, {{"value", -0.5}});
    b.SetInputGrad(0, b.Op("mul", {b.output_grad(0), d}));
  }, "y = 1 / sqrt(x)");
  RegisterUnary(
      r, "abs", UnaryKind::kAbs, false,
      [](GradBuilder& b) {
        b.SetInputGrad(0, b.Op("abs_grad", {b.input(0), b.output_grad(0)}));
      },
      "y = |x| (the p-norms of gradient clipping)");

  // ---- Activations and their gradient ops.
  RegisterUnary(r, "tanh", UnaryKind::kTanh, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("tanh_grad", {b.output(0), b.output_grad(0)}));
  }, "y = tanh(x)");
  RegisterUnary(r, "relu", UnaryKind::kRelu, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("relu_grad", {b.output(0), b.output_grad(0)}));
  }, "y = max(x, 0)");
  RegisterUnary(r, "silu", UnaryKind::kSilu, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("silu_grad", {b.input(0), b.output_grad(0)}));
  }, "y = x * sigmoid(x)");
  RegisterUnary(r, "gelu", UnaryKind::kGelu, false, [](GradBuilder& b) {
    b.SetInputGrad(0, b.Op("gelu_grad", {b.input(0), b.output_grad(0)},
                           {{"approximate", b.attrs().String("approximate")}}));
  }, "y = GELU(x); approximate = \"none\" (erf, exact) or \"tanh\"");
  RegisterActivationGrad(r, "tanh_grad", "y", ActivationGradKind::kTanhFromY, "dx = dy * (1 - y^2)");
  RegisterActivationGrad(r, "relu_grad", "y", ActivationGradKind::kReluFromY, "dx = dy * (y > 0)");
  RegisterActivationGrad(r, "silu_grad", "x", ActivationGradKind::kSiluFromX, "dx = dy * silu'(x)");
  RegisterActivationGrad(r, "gelu_grad", "x", ActivationGradKind::kGeluFromX, "dx = dy * gelu'(x)");
  RegisterActivationGrad(r, "abs_grad", "x", ActivationGradKind::kAbsFromX, "dx = dy * sign(x) (0 at x = 0, as torch)");

  // ---- Bias family.
  r.MustRegister(OpSchema("bias_add")
                     .Doc("y = x + bias, bias over the last axis of x")
                     .Input("x")
                     .Input("bias")
                     .Output("y")
                     .Infer(InferBias)
                     .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
                       return BiasSignatures(in, /*linear=*/true);
                     })
                     .Grad([](GradBuilder& b) {
                       b.SetInputGrad(0, b.output_grad(0));
                       b.SetInputGrad(1, b.SumToShape(b.output_grad(0), b.meta(b.input(1)).shape));
                     })
                     .Kernel(DeviceType::kCpu, [](KernelContext& ctx) { return cpu::BiasAddKernel(ctx, false, false); })
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda, [](KernelContext& ctx) { return cuda::BiasAddKernel(ctx, false, false); })
#endif
                     .Example({kExample, {DType::kF32, Shape{6}}}));
  r.MustRegister(OpSchema("bias_gelu")
                     .Doc("y = GELU(x + bias), fused; approximate = \"none\" or \"tanh\"")
                     .Input("x")
                     .Input("bias")
                     .Output("y")
                     .Attr("approximate", AttrType::kString, std::string("none"))
                     .Infer([](const std::vector<TensorMeta>& in, const AttrMap& attrs)
                                -> absl::StatusOr<std::vector<TensorMeta>> {
                       RETURN_IF_ERROR(CheckApproximate(attrs));
                       return InferBias(in, attrs);
                     })
                     .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
                       return BiasSignatures(in, /*linear=*/false);
                     })
                     .Grad([](GradBuilder& b) {
                       const ValueId dh = b.Op("bias_gelu_grad", {b.input(0), b.input(1), b.output_grad(0)},
                                               {{"approximate", b.attrs().String("approximate")}});
                       b.SetInputGrad(0, dh);
                       b.SetInputGrad(1, b.SumToShape(dh, b.meta(b.input(1)).shape));
                     })
                     .Kernel(DeviceType::kCpu,
                             [](KernelContext& ctx) {
                               return cpu::BiasAddKernel(ctx, true, ctx.attr().String("approximate") == "tanh");
                             })
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda,
                             [](KernelContext& ctx) {
                               return cuda::BiasAddKernel(ctx, true, ctx.attr().String("approximate") == "tanh");
                             })
#endif
                     .Example({kExample, {DType::kF32, Shape{6}}}));
  r.MustRegister(OpSchema("bias_gelu_grad")
                     .Doc("dx = dy * gelu'(x + bias); the bias gradient is its sum over rows")
                     .Input("x")
                     .Input("bias")
                     .Input("dy")
                     .Output("dx")
                     .Attr("approximate", AttrType::kString, std::string("none"))
                     .Infer([](const std::vector<TensorMeta>& in, const AttrMap& attrs)
                                -> absl::StatusOr<std::vector<TensorMeta>> {
                       RETURN_IF_ERROR(CheckApproximate(attrs));
                       return InferBias(in, attrs);
                     })
                     .Sbp([](const std::vector<TensorMeta>& in, const AttrMap&, int64_t) {
                       auto sigs = BiasSignatures(in, /*linear=*/false);
                       sigs.push_back({{Sbp::Broadcast(), Sbp::Broadcast(), Sbp::PartialSum()}, {Sbp::PartialSum()}});
                       return sigs;
                     })
                     .Kernel(DeviceType::kCpu,
                             [](KernelContext& ctx) {
                               return cpu::BiasGeluGradKernel(ctx, ctx.attr().String("approximate") == "tanh");
                             })
#ifdef TESSERA_WITH_CUDA
                     .Kernel(DeviceType::kCuda,
                             [](KernelContext& ctx) {
                               return cuda::BiasGeluGradKernel(ctx, ctx.attr().String("approximate") == "tanh");
                             })
#endif
                     .Example({kExample, {DType::kF32, Shape{6}}, kExample}));
}

}  // namespace tessera::ops
