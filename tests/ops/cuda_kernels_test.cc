// CUDA kernels against the CPU kernels: every op registered with a kernel
// for DeviceType::kCuda runs its example inputs (random values) on cuda:0
// and on the CPU, for each value of its "approximate" attribute where it has
// one, and the results agree to float rounding (the two use the same
// formulas; libm and CUDA's expf / erff / tanhf differ in the last bits).
// Label `cuda`: without a GPU (or without CUDA in the build) the GPU cases
// skip with the reason; the checks that need no GPU run everywhere.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/stream.h"
#include "core/text.h"
#include "ops/cpu/norm_softmax.h"
#include "ops/eager.h"
#include "ops/registry.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/launch.h"
#endif

namespace tessera::ops {
namespace {

// Ops whose inputs must be positive for a finite result (log, roots,
// powers, divisors).
const std::set<std::string> kPositiveInputs = {"log", "sqrt", "rsqrt", "scalar_pow", "div"};

// Floats in a range; integers (ids, labels) in [0, 4), valid for every
// example's vocabulary or classes; bools (masks) true three times in four.
Tensor RandomInput(const TensorMeta& meta, bool positive, std::mt19937& rng) {
  auto t = Tensor::Empty(meta.shape, meta.dtype, Device{});
  EXPECT_TRUE(t.ok()) << t.status();
  std::uniform_real_distribution<float> dist(positive ? 0.25f : -3.0f, positive ? 2.0f : 3.0f);
  for (int64_t i = 0; i < t->NumElements(); ++i) {
    if (meta.dtype == DType::kI64) {
      t->data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
    } else if (meta.dtype == DType::kI32) {
      t->data<int32_t>()[i] = static_cast<int32_t>(rng() % 4);
    } else if (meta.dtype == DType::kBool) {
      t->data<bool>()[i] = rng() % 4 != 0;  // masks: mostly kept
    } else if (meta.dtype == DType::kBF16 || meta.dtype == DType::kF16) {
      SetElementFromDouble(*t, i, dist(rng));
    } else {
      t->data<float>()[i] = dist(rng);
    }
  }
  return *std::move(t);
}

std::vector<std::string> CudaOps() {
  std::vector<std::string> names;
  for (const std::string& name : BuiltinOps().Names()) {
    if (BuiltinOps().Find(name)->FindKernel(DeviceType::kCuda) != nullptr) names.push_back(name);
  }
  return names;
}

// What the build registers (a build without CUDA registers none, and
// `tessera ops` says so).
TEST(CudaKernels, RegisteredWhereTheBuildHasCuda) {
  const std::vector<std::string> names = CudaOps();
#ifdef TESSERA_WITH_CUDA
  std::vector<std::string> expected = {
      // element-wise
      "add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "relu", "silu", "gelu", "abs",
      "relu_grad", "tanh_grad", "silu_grad", "gelu_grad", "abs_grad", "scalar_add", "scalar_mul", "scalar_pow",
      "bias_add", "bias_gelu",
      // softmax and normalisation
      "softmax", "softmax_grad", "log_softmax", "log_softmax_grad", "fused_scale_causal_softmax",
      "fused_scale_mask_softmax", "layer_norm", "layer_norm_grad", "layer_norm_grad_add", "rms_norm", "rms_norm_grad",
      // optimizers and products
      "sgd_update", "adamw_update", "nonfinite", "loss_scale_update", "matmul", "batch_matmul", "matmul_add",
      "matmul_bias", "matmul_bias_gelu",
      // embeddings, loss
      "embedding", "embedding_grad", "bias_gelu_grad", "cross_entropy_partials", "cross_entropy_partials_grad",
      "sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad", "dropout", "bias_dropout_add",
      // reductions
      "reduce_sum", "reduce_mean", "reduce_max", "reduce_max_grad", "argmax", "square_sum",
      // data movement
      "cast", "reshape", "broadcast_to", "transpose", "slice", "slice_grad", "concat", "split", "depend",
      // makers and selections
      "fill", "zeros", "ones", "arange", "where", "masked_fill", "topk",
      // random
      "uniform", "normal",
      // fused attention
      "flash_attention", "flash_attention_grad", "flash_attention_masked", "flash_attention_masked_grad"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);  // Names() is sorted
#else
  EXPECT_TRUE(names.empty()) << Join(names, ", ");
#endif
}

// A CUDA kernel handed CPU tensors refuses them (no GPU needed: it checks
// before touching the device).
TEST(CudaKernels, RefuseTensorsOffTheirDevice) {
  for (const std::string& name : CudaOps()) {
    SCOPED_TRACE(name);
    const OpSchema& schema = *BuiltinOps().Find(name);
    std::mt19937 rng(1);
    KernelContext ctx;
    for (const TensorMeta& meta : schema.example().inputs) ctx.inputs.push_back(RandomInput(meta, true, rng));
    auto canonical = schema.CanonicalizeAttrs(schema.example().attrs);
    ASSERT_TRUE(canonical.ok()) << canonical.status();
    std::vector<TensorMeta> metas;
    for (const Tensor& t : ctx.inputs) metas.push_back(t.meta());
    auto out = schema.InferMeta(metas, *canonical);
    ASSERT_TRUE(out.ok()) << out.status();
    for (const TensorMeta& meta : *out) ctx.outputs.push_back(*Tensor::Empty(meta.shape, meta.dtype, Device{}));
    ctx.attrs = &*canonical;
    ctx.device = Device{DeviceType::kCuda, 0};
    ctx.schema = &schema;
    const absl::Status status = (*schema.FindKernel(DeviceType::kCuda))(ctx);
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.message().find("given to a kernel on cuda:0"), std::string::npos) << status;
  }
}

#ifdef TESSERA_WITH_CUDA
// Why the GPU cases cannot run here ("" when they can).
std::string NoGpu() {
  int count = 0;
  const int err = cuda::DeviceCount(&count);
  if (err != 0) return StrCat("no CUDA device: ", cuda::ErrorString(err));
  if (count == 0) return "no CUDA device";
  return "";
}

Tensor ToDevice(const Tensor& host, const Device& device) {
  auto t = Tensor::Empty(host.shape(), host.dtype(), device);
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(cuda::Copy(t->raw_data(), host.raw_data(), host.NumBytes()), 0);
  return *std::move(t);
}

Tensor ToHost(const Tensor& on_device) {
  auto t = Tensor::Empty(on_device.shape(), on_device.dtype(), Device{});
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(cuda::Copy(t->raw_data(), on_device.raw_data(), on_device.NumBytes()), 0);
  return *std::move(t);
}

// Runs op `name` on cuda:0 with `inputs` copied there; the outputs copied
// back, none when *status is an error. `with_workspace`: the workspace its
// schema asks for, as the actor runtime gives it (filled with ones first,
// so a kernel reading bytes it did not write shows).
std::vector<Tensor> RunOnGpu(const std::string& name, const std::vector<Tensor>& inputs, const AttrMap& attrs,
                             absl::Status* status, bool with_workspace = false, int64_t step = 0) {
  const Device gpu{DeviceType::kCuda, 0};
  const OpSchema& schema = *BuiltinOps().Find(name);
  auto canonical = schema.CanonicalizeAttrs(attrs);
  std::vector<TensorMeta> metas;
  for (const Tensor& t : inputs) metas.push_back(t.meta());
  auto out = schema.InferMeta(metas, *canonical);
  KernelContext ctx;
  for (const Tensor& t : inputs) ctx.inputs.push_back(ToDevice(t, gpu));
  for (const TensorMeta& m : *out) ctx.outputs.push_back(*Tensor::Empty(m.shape, m.dtype, gpu));
  ctx.attrs = &*canonical;
  ctx.device = gpu;
  ctx.step = step;
  if (const int64_t bytes = schema.WorkspaceBytes(metas, *out, *canonical, DeviceType::kCuda);
      with_workspace && bytes > 0) {
    auto ones = Tensor::Empty(Shape{(bytes + 7) / 8}, DType::kI64, Device{});
    EXPECT_TRUE(ones.ok()) << ones.status();
    for (int64_t i = 0; i < ones->NumElements(); ++i) ones->data<int64_t>()[i] = -1;
    ctx.workspace = ToDevice(*ones, gpu);
  }
  *status = RunKernel(schema, ctx);
  std::vector<Tensor> host;
  if (status->ok()) {
    for (const Tensor& t : ctx.outputs) host.push_back(ToHost(t));
  }
  return host;
}

// got equals want exactly, NaN where want has NaN, and want has some.
void ExpectEqualWithNans(const Tensor& got, const Tensor& want) {
  const std::vector<float> w = want.ToVector<float>(), g = got.ToVector<float>();
  ASSERT_EQ(g.size(), w.size());
  int nans = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    nans += std::isnan(w[i]);
    if (std::isnan(w[i]) || std::isnan(g[i])) {
      EXPECT_TRUE(std::isnan(w[i]) && std::isnan(g[i])) << i << ": " << g[i] << " vs " << w[i];
    } else {
      EXPECT_EQ(g[i], w[i]) << i;
    }
  }
  EXPECT_GT(nans, 0);
}

// Op `name` on the CPU (`want`) and on cuda:0 (`got`, RunOnGpu); both must
// succeed (call it in ASSERT_NO_FATAL_FAILURE).
void RunOnBoth(const std::string& name, const std::vector<Tensor>& inputs, const AttrMap& attrs,
               std::vector<Tensor>& want, std::vector<Tensor>& got, bool with_workspace = false) {
  auto cpu = RunOp(name, inputs, attrs);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  want = *std::move(cpu);
  absl::Status status;
  got = RunOnGpu(name, inputs, attrs, &status, with_workspace);
  ASSERT_TRUE(status.ok()) << name << " on cuda:0: " << status;
}

TEST(CudaKernels, MatchTheCpuKernels) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  const Device gpu{DeviceType::kCuda, 0};
  int checked = 0;
  for (const std::string& name : CudaOps()) {
    const OpSchema& schema = *BuiltinOps().Find(name);
    std::vector<AttrMap> variants = {schema.example().attrs};
    const auto& defs = schema.attrs();
    if (std::any_of(defs.begin(), defs.end(), [](const AttrDef& d) { return d.name == "approximate"; })) {
      variants = {schema.example().attrs, schema.example().attrs};
      variants[0].Set("approximate", std::string("none"));
      variants[1].Set("approximate", std::string("tanh"));
    }
    for (const AttrMap& attrs : variants) {
      SCOPED_TRACE(StrCat(name, " ", attrs.ToString()));
      std::mt19937 rng(7);
      std::vector<Tensor> inputs;
      for (const TensorMeta& meta : schema.example().inputs) {
        inputs.push_back(RandomInput(meta, kPositiveInputs.contains(name), rng));
      }
      auto want = RunOp(name, inputs, attrs);
      ASSERT_TRUE(want.ok()) << want.status();
      auto canonical = schema.CanonicalizeAttrs(attrs);
      ASSERT_TRUE(canonical.ok()) << canonical.status();
      KernelContext ctx;
      for (const Tensor& t : inputs) ctx.inputs.push_back(ToDevice(t, gpu));
      for (const Tensor& t : *want) ctx.outputs.push_back(*Tensor::Empty(t.shape(), t.dtype(), gpu));
      ctx.attrs = &*canonical;
      ctx.device = gpu;
      ASSERT_TRUE(RunKernel(schema, ctx).ok());
      for (size_t k = 0; k < want->size(); ++k) {
        const Tensor got = ToHost(ctx.outputs[k]);
        const Tensor& ref = (*want)[k];
        // Sums of large terms round at the terms' scale: the flash
        // attention gradients of random (inconsistent) lse and y reach 1e5,
        // and an element near 0 made from them differs by float rounding.
        double scale = 0;
        for (int64_t i = 0; i < ref.NumElements(); ++i) {
          const double r = std::fabs(ElementAsDouble(ref, i));
          if (std::isfinite(r)) scale = std::max(scale, r);
        }
        for (int64_t i = 0; i < ref.NumElements(); ++i) {
          // Any dtype (cast's outputs): compared as doubles; 16-bit results
          // are rounded once on both sides, so they agree exactly.
          const double r = ElementAsDouble(ref, i), g = ElementAsDouble(got, i);
          if (g == r) continue;  // infinities too (lse of a query without keys)
          // NaN on both sides: the same formula's (adamw_update's random
          // second moments may be negative, and their square roots NaN).
          if (std::isnan(g) && std::isnan(r)) continue;
          // normal: CUDA's logf and sincospif times a radius (see below).
          const double floor = (name == "normal" ? 1e-5 : 1e-6) + 1e-7 * scale;
          ASSERT_NEAR(g, r, 1e-5 * std::fabs(r) + floor) << "output " << k << " element " << i;
        }
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 60);
}
// cross_entropy_partials_grad with a 16-bit dlogits (mixed precision's):
// the GPU's rounding of its f32 values against the CPU's, within one unit
// in the last place of the 16-bit type (expf and the CPU's exp may differ
// in the last f32 bit, which can move a rounding).
TEST(CudaKernels, CrossEntropyPartialsGradIn16BitsMatchesTheCpu) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  const OpSchema& schema = *BuiltinOps().Find("cross_entropy_partials_grad");
  std::mt19937 rng(13);
  std::vector<Tensor> inputs;
  for (const TensorMeta& meta : schema.example().inputs) inputs.push_back(RandomInput(meta, false, rng));
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<Tensor> want, got;
    ASSERT_NO_FATAL_FAILURE(RunOnBoth("cross_entropy_partials_grad", inputs, {{"dtype", dtype}}, want, got, true));
    ASSERT_EQ(got[0].dtype(), dtype);
    const double ulp = dtype == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
    for (int64_t i = 0; i < got[0].NumElements(); ++i) {
      const double r = ElementAsDouble(want[0], i), g = ElementAsDouble(got[0], i);
      ASSERT_NEAR(g, r, ulp * std::fabs(r) + 1e-7) << "element " << i;
    }
  }
}

// bias_dropout_add on the GPU: the CPU's mask (Philox by global index) and
// each operation rounded on its own (no FMA), so the CPU's bits, with and
// without dropout, over a tensor whose rows do not fill whole blocks.
TEST(CudaKernels, BiasDropoutAddGivesTheCpuBits) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(17);
  const Shape shape{7, 45, 67};
  const std::vector<Tensor> inputs = {RandomInput({DType::kF32, shape}, false, rng),
                                      RandomInput({DType::kF32, Shape{67}}, false, rng),
                                      RandomInput({DType::kF32, shape}, false, rng)};
  for (const double rate : {0.0, 0.2}) {
    SCOPED_TRACE(StrCat("rate ", rate));
    std::vector<Tensor> want, got;
    ASSERT_NO_FATAL_FAILURE(RunOnBoth("bias_dropout_add", inputs,
                                      {{"rate", rate}, {"seed", int64_t{9}}, {"tensor_id", int64_t{4}}}, want, got));
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(std::memcmp(got[0].raw_data(), want[0].raw_data(), want[0].NumBytes()), 0);
  }
}

// layer_norm_grad_add on the GPU: the GPU's layer_norm_grad then add, bit
// for bit (dx + addend rounded on its own, no FMA), dgamma and dbeta
// unchanged.
TEST(CudaKernels, LayerNormGradAddIsTheGradientThenAdd) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(19);
  const Shape shape{37, 300};
  auto forward = RunOp(
      "layer_norm", {RandomInput({DType::kF32, shape}, false, rng), RandomInput({DType::kF32, Shape{300}}, false, rng),
                     RandomInput({DType::kF32, Shape{300}}, false, rng)});
  ASSERT_TRUE(forward.ok()) << forward.status();
  std::vector<Tensor> in = {RandomInput({DType::kF32, shape}, false, rng),
                            RandomInput({DType::kF32, shape}, false, rng), (*forward)[1], (*forward)[2],
                            RandomInput({DType::kF32, Shape{300}}, false, rng)};
  const Tensor addend = RandomInput({DType::kF32, shape}, false, rng);
  absl::Status status;
  const std::vector<Tensor> grads = RunOnGpu("layer_norm_grad", in, {}, &status);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<Tensor> want = RunOnGpu("add", {grads[0], addend}, {}, &status);
  ASSERT_TRUE(status.ok()) << status;
  in.push_back(addend);
  const std::vector<Tensor> got = RunOnGpu("layer_norm_grad_add", in, {}, &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(std::memcmp(got[0].raw_data(), want[0].raw_data(), want[0].NumBytes()), 0);
  for (size_t k = 1; k < 3; ++k) {
    EXPECT_EQ(std::memcmp(got[k].raw_data(), grads[k].raw_data(), grads[k].NumBytes()), 0) << k;
  }
}

// i32 labels: the cross-entropy kernels widen them on the device into the
// workspace the plan gives them (a cast kernel on the stream, no wait), or,
// called eagerly without one, into memory of their own; both ways give the
// CPU's results.
TEST(CudaKernels, CrossEntropyTakesI32LabelsWithAndWithoutItsWorkspace) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  for (const std::string name : {"sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad",
                                 "cross_entropy_partials", "cross_entropy_partials_grad"}) {
    SCOPED_TRACE(name);
    const OpSchema& schema = *BuiltinOps().Find(name);
    std::mt19937 rng(11);
    std::vector<Tensor> inputs;
    std::vector<TensorMeta> metas;
    for (TensorMeta meta : schema.example().inputs) {
      if (meta.dtype == DType::kI64) meta.dtype = DType::kI32;  // the labels
      inputs.push_back(RandomInput(meta, false, rng));
      metas.push_back(meta);
    }
    for (const bool workspace : {true, false}) {
      SCOPED_TRACE(workspace ? "planned workspace" : "eager");
      std::vector<Tensor> want, got;
      ASSERT_NO_FATAL_FAILURE(RunOnBoth(name, inputs, schema.example().attrs, want, got, workspace));
      std::vector<TensorMeta> out_metas;
      for (const Tensor& t : want) out_metas.push_back(t.meta());
      ASSERT_GT(schema.WorkspaceBytes(metas, out_metas, schema.example().attrs, DeviceType::kCuda), 0);
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        for (int64_t i = 0; i < got[k].NumElements(); ++i) {
          const double r = ElementAsDouble(want[k], i), g = ElementAsDouble(got[k], i);
          ASSERT_NEAR(g, r, 1e-5 * std::fabs(r) + 1e-6) << "output " << k << " element " << i;
        }
      }
    }
  }
}

// sgd_update at momentum 0 (no buffer: param, grad, lr[, skip] -> param')
// against the CPU kernel, stepped and skipped.
TEST(CudaKernels, SgdWithoutMomentumMatchesTheCpu) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(13);
  const TensorMeta meta{DType::kF32, Shape{37, 5}};
  const Tensor param = RandomInput(meta, false, rng), grad = RandomInput(meta, false, rng);
  const Tensor lr = Tensor::FromVector<float>(Shape{}, {0.1f});
  for (const float skip : {-1.0f, 0.0f, 1.0f}) {
    SCOPED_TRACE(skip);
    std::vector<Tensor> inputs = {param, grad, lr};
    if (skip >= 0) inputs.push_back(Tensor::FromVector<float>(Shape{}, {skip}));
    std::vector<Tensor> want, got;
    ASSERT_NO_FATAL_FAILURE(RunOnBoth("sgd_update", inputs, {{"weight_decay", 0.01}}, want, got));
    ASSERT_EQ(want.size(), 1u);
    ASSERT_EQ(got.size(), 1u);
    for (int64_t i = 0; i < want[0].NumElements(); ++i) {
      const double r = ElementAsDouble(want[0], i);
      ASSERT_NEAR(ElementAsDouble(got[0], i), r, 1e-6 * std::fabs(r) + 1e-7) << i;
    }
  }
}

// matmul_bias and matmul_bias_gelu beyond their examples. matmul_bias:
// cuBLASLt's BIAS epilogue, y to the GEMM's rounding. matmul_bias_gelu: f32 (the bias in cuBLASLt's
// epilogue, the GELU kernel after) and bf16 (with the tanh GELU all in the
// GELU_AUX_BIAS epilogue when N is a multiple of 8), N a multiple of 8 and
// not, both GELUs, against the CPU kernel on the same inputs. z must agree
// to the GEMM's rounding; y too in f32; cuBLASLt's own GELU (bf16, tanh) is
// held to 1e-3 of the largest |y| and its worst difference printed.
TEST(CudaKernels, MatmulBiasAndMatmulBiasGeluMatchTheCpu) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const auto& [M, K, N] : {std::tuple{64, 96, 128}, std::tuple{33, 70, 50}, std::tuple{256, 768, 3072}}) {
      for (const std::string approximate : {"none", "tanh"}) {
        SCOPED_TRACE(StrCat(DTypeName(dtype), " M K N = ", M, " ", K, " ", N, " ", approximate));
        std::mt19937 rng(5);
        std::vector<Tensor> in = {RandomInput({DType::kF32, Shape{M, K}}, false, rng),
                                  RandomInput({DType::kF32, Shape{K, N}}, false, rng),
                                  RandomInput({DType::kF32, Shape{N}}, false, rng)};
        for (int i = 0; i < 2; ++i) {
          auto scaled = RunOp("scalar_mul", {in[i]}, {{"value", 1.0 / std::sqrt(static_cast<double>(K))}});
          ASSERT_TRUE(scaled.ok()) << scaled.status();
          in[i] = (*scaled)[0];
          if (dtype != DType::kF32) {
            auto low = RunOp("cast", {in[i]}, {{"dtype", dtype}});
            ASSERT_TRUE(low.ok()) << low.status();
            in[i] = (*low)[0];
          }
        }
        if (approximate == "none") {
          std::vector<Tensor> want, got;
          ASSERT_NO_FATAL_FAILURE(RunOnBoth("matmul_bias", in, {}, want, got, /*with_workspace=*/M != 33));
          const std::vector<double> g = got[0].ToDoubleVector(), r = want[0].ToDoubleVector();
          for (size_t i = 0; i < r.size(); ++i) {
            ASSERT_NEAR(g[i], r[i], 1e-5 * std::fabs(r[i]) + 1e-5) << "matmul_bias element " << i;
          }
        }
        const AttrMap attrs = {{"approximate", approximate}};
        std::vector<Tensor> want, got;
        // cuBLASLt with the planned workspace, and (33 rows) without one.
        ASSERT_NO_FATAL_FAILURE(RunOnBoth("matmul_bias_gelu", in, attrs, want, got, /*with_workspace=*/M != 33));
        const bool lt_gelu = dtype != DType::kF32 && approximate == "tanh" && N % 8 == 0;
        double worst = 0, largest = 0;
        for (size_t k = 0; k < 2; ++k) {
          const std::vector<double> g = got[k].ToDoubleVector(), r = want[k].ToDoubleVector();
          for (size_t i = 0; i < r.size(); ++i) {
            if (k == 0 && lt_gelu) {
              worst = std::max(worst, std::fabs(g[i] - r[i]));
              largest = std::max(largest, std::fabs(r[i]));
              continue;
            }
            ASSERT_NEAR(g[i], r[i], 1e-5 * std::fabs(r[i]) + 1e-5) << "output " << k << " element " << i;
          }
        }
        if (lt_gelu) {
          EXPECT_LE(worst, 1e-3 * largest) << "cuBLASLt's GELU epilogue against the CPU's formula";
          std::printf("matmul_bias_gelu %s %dx%dx%d tanh through GELU_AUX_BIAS: max |y - y_cpu| %.3g (max |y| %.3g)\n",
                      std::string(DTypeName(dtype)).c_str(), M, K, N, worst, largest);
        }
      }
    }
  }
}

// The fused attention beyond its example: shapes across the CUDA kernels'
// 32-row tiles and 4-row blocks, head dims 64 and 128 (the kernel's limit),
// causal with T > S, masked with T < S, with and without dropout (the same
// masks as the CPU's), forward and backward, against the CPU kernels; a
// head dim over 128 is refused by name.
// argmax and reduce_max_grad where ties abound (values from {0, 1, 2, 3},
// one NaN), over every axis and groups of axes, kept or not: the same
// indices (the lowest of the ties) and the same shares of dy as the CPU.
TEST(CudaKernels, ArgmaxAndReduceMaxGradMatchTheCpuWithTies) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> level(0, 3);
  const Shape shape{5, 300, 3};
  std::vector<float> values(static_cast<size_t>(shape.NumElements()));
  for (float& v : values) v = static_cast<float>(level(rng));
  values[17] = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::FromVector(shape, values);
  for (const int64_t axis : {0, 1, 2}) {
    for (const bool keepdim : {false, true}) {
      SCOPED_TRACE(StrCat("argmax axis ", axis, keepdim ? " keepdim" : ""));
      const AttrMap attrs = {{"axis", axis}, {"keepdim", keepdim}};
      std::vector<Tensor> want, got;
      ASSERT_NO_FATAL_FAILURE(RunOnBoth("argmax", {x}, attrs, want, got));
      EXPECT_EQ(got[0].ToVector<int64_t>(), want[0].ToVector<int64_t>());
    }
  }
  for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {}}) {
    SCOPED_TRACE(StrCat("reduce_max_grad axes ", axes.size()));
    const AttrMap attrs = {{"axes", axes}, {"keepdim", false}};
    auto y = RunOp("reduce_max", {x}, attrs);
    ASSERT_TRUE(y.ok()) << y.status();
    const Tensor dy = RandomInput((*y)[0].meta(), false, rng);
    std::vector<Tensor> want, got;
    ASSERT_NO_FATAL_FAILURE(RunOnBoth("reduce_max_grad", {x, (*y)[0], dy}, attrs, want, got));
    // (The slices holding the NaN get NaN throughout, on both.)
    ExpectEqualWithNans(got[0], want[0]);
  }
}

// The mixed-precision branches the example inputs never reach (an op
// audit found them compared nowhere): nonfinite on 16-bit tensors holding
// an infinity or a NaN, or neither; loss_scale_update's growth (no overflow,
// good steps counted, the interval reached); adamw_update without bias
// correction, with a skipped step and after skipped ones.
TEST(CudaKernels, MixedPrecisionBranchesMatchTheCpu) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> values(3 * 1000);
  for (float& v : values) v = uniform(rng);
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const float planted : {0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN()}) {
      SCOPED_TRACE(StrCat("nonfinite ", DTypeName(dtype), " planted ", planted));
      std::vector<float> x = values;
      if (planted != 0.0f) x[2345] = planted;
      auto cast = RunOp("cast", {Tensor::FromVector(Shape{3, 1000}, x)}, {{"dtype", dtype}});
      ASSERT_TRUE(cast.ok()) << cast.status();
      std::vector<Tensor> want, got;
      ASSERT_NO_FATAL_FAILURE(RunOnBoth("nonfinite", {(*cast)[0]}, {}, want, got));
      EXPECT_EQ(want[0].ToVector<float>(), std::vector<float>{planted != 0.0f ? 1.0f : 0.0f});
      EXPECT_EQ(got[0].ToVector<float>(), want[0].ToVector<float>());
    }
  }
  const auto scalar = [](float v) { return Tensor::FromVector(Shape{}, std::vector<float>{v}); };
  for (const float found_inf : {0.0f, 1.0f}) {
    for (const float good_steps : {0.0f, 2.0f, 3.0f}) {
      SCOPED_TRACE(StrCat("loss_scale_update found_inf ", found_inf, " good_steps ", good_steps));
      std::vector<Tensor> want, got;
      ASSERT_NO_FATAL_FAILURE(RunOnBoth("loss_scale_update", {scalar(1024.0f), scalar(found_inf), scalar(good_steps)},
                                        {{"growth_interval", int64_t{4}}}, want, got));
      for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(got[k].ToVector<float>(), want[k].ToVector<float>()) << k;
    }
  }
  std::vector<Tensor> adam(4);
  for (size_t k = 0; k < adam.size(); ++k) {
    std::vector<float> v(4 * 6);
    for (float& e : v) e = k == 3 ? std::fabs(uniform(rng)) : uniform(rng);  // (v: second moments, >= 0)
    adam[k] = Tensor::FromVector(Shape{4, 6}, v);
  }
  for (const bool bias_correction : {true, false}) {
    for (const float skip : {0.0f, 1.0f}) {
      for (const float skipped : {0.0f, 3.0f}) {
        SCOPED_TRACE(StrCat("adamw_update bias_correction ", bias_correction, " skip ", skip, " skipped ", skipped));
        std::vector<Tensor> inputs = adam;
        inputs.push_back(scalar(1e-3f));
        inputs.push_back(scalar(skip));
        inputs.push_back(scalar(skipped));
        const AttrMap attrs = {{"bias_correction", bias_correction}};
        // (Step 5: t = 6 - skipped.)
        EagerOptions at_step;
        at_step.step = 5;
        auto cpu = RunOp("adamw_update", inputs, attrs, at_step);
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        const std::vector<Tensor> want = *std::move(cpu);
        absl::Status status;
        const std::vector<Tensor> got = RunOnGpu("adamw_update", inputs, attrs, &status, false, /*step=*/5);
        ASSERT_TRUE(status.ok()) << status;
        for (size_t k = 0; k < want.size(); ++k) {
          const std::vector<float> w = want[k].ToVector<float>(), g = got[k].ToVector<float>();
          ASSERT_EQ(g.size(), w.size());
          for (size_t i = 0; i < w.size(); ++i) {
            ASSERT_FALSE(std::isnan(w[i])) << k << " " << i;
            EXPECT_NEAR(g[i], w[i], 1e-6 * std::fabs(w[i]) + 1e-7) << "output " << k << " element " << i;
          }
        }
      }
    }
  }
}

// reduce_max lets a NaN win wherever it lies, as the CPU's; log_softmax
// and the sparse cross-entropy keep logits near 1e4 exact (x - max first,
// not max + log Σ rounded), as the CPU's.
TEST(CudaKernels, ReduceMaxNanAndLargeLogitsMatchTheCpu) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const Shape shape{5, 300, 3};
  std::vector<float> values(static_cast<size_t>(shape.NumElements()));
  for (float& v : values) v = uniform(rng);
  for (const size_t at : {size_t{0}, size_t{17}, size_t{2000}, values.size() - 1}) {
    values[at] = std::numeric_limits<float>::quiet_NaN();
  }
  const Tensor x = Tensor::FromVector(shape, values);
  for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {}}) {
    SCOPED_TRACE(StrCat("reduce_max axes ", axes.size(), axes.empty() ? -1 : axes[0]));
    std::vector<Tensor> want, got;
    ASSERT_NO_FATAL_FAILURE(RunOnBoth("reduce_max", {x}, {{"axes", axes}, {"keepdim", false}}, want, got));
    ExpectEqualWithNans(got[0], want[0]);
  }
  std::uniform_real_distribution<float> large(9990.0f, 10010.0f);
  std::vector<float> logits(8 * 50);
  for (float& v : logits) v = large(rng);
  const Tensor wide = Tensor::FromVector(Shape{8, 50}, logits);
  std::vector<Tensor> want, got;
  const Tensor labels = Tensor::FromVector(Shape{8}, std::vector<int64_t>{0, 49, 3, 17, 25, 8, 40, 11});
  for (const auto& [name, inputs] : std::vector<std::pair<std::string, std::vector<Tensor>>>{
           {"log_softmax", {wide}}, {"sparse_softmax_cross_entropy", {wide, labels}}}) {
    SCOPED_TRACE(name);
    ASSERT_NO_FATAL_FAILURE(RunOnBoth(name, inputs, {}, want, got));
    const std::vector<float> w = want[0].ToVector<float>(), g = got[0].ToVector<float>();
    ASSERT_EQ(w.size(), g.size());
    // (Values of a few units: max + log Σ rounded at ulp(1e4) was 1e-3 off.)
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-5) << i;
  }
}

// Op `name` (no inputs) producing the shard `slice` of its output, on the
// CPU and on cuda:0 (ctx.step = step): both outputs, on the host.
std::pair<Tensor, Tensor> MakeShardOnBoth(const std::string& name, const AttrMap& attrs, const TensorSlice& slice,
                                          int64_t step) {
  const OpSchema& schema = *BuiltinOps().Find(name);
  auto canonical = schema.CanonicalizeAttrs(attrs);
  EXPECT_TRUE(canonical.ok()) << canonical.status();
  auto metas = schema.InferMeta({}, *canonical);
  EXPECT_TRUE(metas.ok()) << metas.status();
  std::vector<Tensor> outs;
  for (const Device& device : {Device{}, Device{DeviceType::kCuda, 0}}) {
    KernelContext ctx;
    ctx.outputs.push_back(*Tensor::Empty(slice.local, (*metas)[0].dtype, device));
    ctx.output_slices = {slice};
    ctx.attrs = &*canonical;
    ctx.device = device;
    ctx.step = step;
    const absl::Status status = RunKernel(schema, ctx);
    EXPECT_TRUE(status.ok()) << device.ToString() << ": " << status;
    outs.push_back(device.type == DeviceType::kCpu ? ctx.outputs[0] : ToHost(ctx.outputs[0]));
  }
  return {outs[0], outs[1]};
}

// The makers beyond their examples: arange in every dtype from a shard's
// offset (exact: one rounding from the same fma); uniform and normal on
// shards split along an inner axis (the Philox words by global index, so
// the values agree to float rounding) at a nonzero step; topk with ties,
// signed zeros and NaN, for k from 1 to the whole row (the same indices,
// the same values).
TEST(CudaKernels, MakersAndTopKMatchTheCpuOnShardsAndTies) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    const bool integral = dtype == DType::kI32 || dtype == DType::kI64;
    const AttrMap attrs = {
        {"n", int64_t{1000}}, {"dtype", dtype}, {"start", integral ? -3.0 : -1.25}, {"step", integral ? 7.0 : 0.1}};
    const TensorSlice shard{Shape{1000}, {400}, Shape{333}};
    SCOPED_TRACE(StrCat("arange ", DTypeName(dtype)));
    const auto [cpu, gpu] = MakeShardOnBoth("arange", attrs, shard, 0);
    ASSERT_EQ(cpu.NumBytes(), gpu.NumBytes());
    EXPECT_EQ(std::memcmp(cpu.raw_data(), gpu.raw_data(), cpu.NumBytes()), 0);
  }
  const TensorSlice inner{Shape{6, 50}, {2, 13}, Shape{3, 29}};
  for (const std::string name : {"uniform", "normal"}) {
    for (const TensorSlice& slice : {TensorSlice::Whole(Shape{1, 4097}), inner}) {
      SCOPED_TRACE(StrCat(name, " ", slice.local.ToString(), " of ", slice.logical.ToString()));
      AttrMap attrs = {{"shape", slice.logical.dims()}, {"seed", int64_t{1234}}, {"tensor_id", int64_t{7}}};
      if (name == "uniform") {
        attrs.Set("low", -2.0);
        attrs.Set("high", 3.0);
      } else {
        attrs.Set("mean", 0.5);
        attrs.Set("std", 2.0);
      }
      const auto [cpu, gpu] = MakeShardOnBoth(name, attrs, slice, 5);
      const std::vector<float> want = cpu.ToVector<float>(), got = gpu.ToVector<float>();
      ASSERT_EQ(want.size(), got.size());
      // A wrong word or lane would be off by O(1); the roundings of log and
      // sin/cos times a radius up to 2 sqrt(2 ln 2^24) stay within 1e-5.
      const double tolerance = name == "uniform" ? 2e-6 : 1e-5;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], tolerance * (1 + std::fabs(want[i]))) << "element " << i;
        if (name == "uniform") {
          EXPECT_GE(got[i], -2.0f);
          EXPECT_LT(got[i], 3.0f);
        }
      }
    }
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> level(0, 3);
  const Shape shape{7, 600};
  std::vector<float> values(static_cast<size_t>(shape.NumElements()));
  for (float& v : values) v = static_cast<float>(level(rng)) - 1.0f;
  values[3] = std::numeric_limits<float>::quiet_NaN();
  values[4] = -0.0f;
  values[601] = std::numeric_limits<float>::infinity();
  values[602] = -std::numeric_limits<float>::infinity();
  values[1300] = std::numeric_limits<float>::quiet_NaN();
  values[1301] = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::FromVector(shape, values);
  for (const int64_t k : {int64_t{1}, int64_t{40}, int64_t{599}, int64_t{600}}) {
    SCOPED_TRACE(StrCat("topk k ", k));
    const AttrMap attrs = {{"k", k}};
    std::vector<Tensor> want, got;
    ASSERT_NO_FATAL_FAILURE(RunOnBoth("topk", {x}, attrs, want, got));
    EXPECT_EQ(got[1].ToVector<int64_t>(), want[1].ToVector<int64_t>());
    EXPECT_EQ(std::memcmp(got[0].raw_data(), want[0].raw_data(), got[0].NumBytes()), 0);
  }
}

// matmul, batch_matmul and matmul_add (its addend as cuBLASLt's C) through
// cuBLASLt (cuBLAS where it has no algorithm) beyond their examples: every
// transpose, f32 and bf16, sizes not multiples of 8 (less aligned rows), a
// batch, with the planned workspace and without one, against the CPU kernel.
// A thread's cuBLAS handles go back to a pool when it exits: GEMMs on fresh
// threads one after another (a worker's jobs, each on threads of its own)
// make no handle past the first thread's.
TEST(CudaKernels, ThreadsReuseTheCublasHandlesOfThreadsThatExited) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(5);
  const std::vector<Tensor> in = {RandomInput({DType::kF32, Shape{16, 24}}, false, rng),
                                  RandomInput({DType::kF32, Shape{24, 8}}, false, rng)};
  const auto gemm_on_a_new_thread = [&] {
    std::thread t([&] {
      std::vector<Tensor> want, got;
      ASSERT_NO_FATAL_FAILURE(RunOnBoth("matmul", in, {}, want, got));
    });
    t.join();
  };
  gemm_on_a_new_thread();
  const int made = cuda::CublasHandlesMade(0);
  EXPECT_GE(made, 1);
  for (int i = 0; i < 8; ++i) gemm_on_a_new_thread();
  EXPECT_EQ(cuda::CublasHandlesMade(0), made) << "each new thread made handles of its own";
}

TEST(CudaKernels, GemmsMatchTheCpuForEveryTranspose) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937 rng(3);
  for (const std::string op : {"matmul", "batch_matmul", "matmul_add"}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const auto& [M, K, N] : {std::tuple{64, 96, 128}, std::tuple{33, 70, 50}}) {
        for (const bool ta : {false, true}) {
          for (const bool tb : {false, true}) {
            SCOPED_TRACE(StrCat(op, " ", DTypeName(dtype), " ", M, "x", K, "x", N, ta ? " ta" : "", tb ? " tb" : ""));
            std::vector<int64_t> a_dims = {ta ? K : M, ta ? M : K}, b_dims = {tb ? N : K, tb ? K : N};
            if (op == "batch_matmul") {
              a_dims.insert(a_dims.begin(), 3);
              b_dims.insert(b_dims.begin(), 3);
            }
            std::vector<Tensor> in = {RandomInput({DType::kF32, Shape(a_dims)}, false, rng),
                                      RandomInput({DType::kF32, Shape(b_dims)}, false, rng)};
            if (dtype != DType::kF32) {
              for (Tensor& t : in) {
                auto cast = RunOp("cast", {t}, {{"dtype", dtype}});
                ASSERT_TRUE(cast.ok()) << cast.status();
                t = (*cast)[0];
              }
            }
            if (op == "matmul_add") in.push_back(RandomInput({DType::kF32, Shape{M, N}}, false, rng));
            const AttrMap attrs = {{"transpose_a", ta}, {"transpose_b", tb}, {"alpha", 0.5}};
            for (const bool workspace : {true, false}) {
              std::vector<Tensor> want, got;
              ASSERT_NO_FATAL_FAILURE(RunOnBoth(op, in, attrs, want, got, workspace));
              const std::vector<float> g = got[0].ToVector<float>(), r = want[0].ToVector<float>();
              ASSERT_EQ(g.size(), r.size());
              // Products of values in [-3, 3] summed over K in f32 (bf16
              // inputs are exact in f32): rounding of sums up to ~9 K.
              for (size_t i = 0; i < r.size(); ++i) ASSERT_NEAR(g[i], r[i], 1e-5 * (std::fabs(r[i]) + 9.0 * K));
            }
          }
        }
      }
    }
  }
}

// Reductions long enough to be cut into ranges of reduced coordinates
// (ops/reduce_chunks.h: more than one range from 2,048 on), through both
// kernels (columns: the last kept axis contiguous, a bias gradient's shape;
// per output otherwise, a full reduction among them), and the norms'
// parameter gradients over thousands of rows, columns not a multiple of 32:
// with the planned workspace (filled with NaN bytes first, so a partial
// read before it is written shows) and without one (the launcher's own),
// against the CPU kernels; reduce_sum on bf16 and f16 inputs too. A cut
// that loses or repeats a range of rows is off by whole rows' sums.
TEST(CudaKernels, LongReductionsMatchTheCpuAcrossRanges) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  struct Case {
    std::string op;
    Shape x;
    AttrMap attrs;
    DType dtype = DType::kF32;
  };
  const std::vector<Case> cases = {
      {"reduce_sum", Shape{5, 700, 40}, {{"axes", std::vector<int64_t>{0, 1}}}},  // columns, 3 ranges
      // A 16-bit gradient's bias gradient (mixed precision's fused attention).
      {"reduce_sum", Shape{5, 700, 40}, {{"axes", std::vector<int64_t>{0, 1}}}, DType::kBF16},
      {"reduce_sum", Shape{2, 3, 2100}, {{"axes", std::vector<int64_t>{2}}}, DType::kF16},  // per output
      {"reduce_sum", Shape{3, 2500, 3}, {{"axes", std::vector<int64_t>{1}}}},               // columns, kept axes apart
      {"reduce_mean", Shape{2, 3, 2100}, {{"axes", std::vector<int64_t>{2}}, {"keepdim", true}}},  // per output
      {"reduce_max", Shape{4100, 5}, {{"axes", std::vector<int64_t>{0}}}},
      {"reduce_sum", Shape{1, 6, 1, 4100}, {{"axes", std::vector<int64_t>{1, 3}}}},  // size-1 axes left out
      {"square_sum", Shape{300000}, {}},                                             // 292 ranges
      {"layer_norm_grad", Shape{3, 1500, 70}, {}},
      {"rms_norm_grad", Shape{4500, 70}, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(StrCat(c.op, " ", DTypeName(c.dtype), c.x.ToString(), " ", c.attrs.ToString()));
    const OpSchema& schema = *BuiltinOps().Find(c.op);
    const int64_t C = c.x[c.x.rank() - 1];
    std::vector<int64_t> row_dims;
    for (int a = 0; a + 1 < c.x.rank(); ++a) row_dims.push_back(c.x[a]);
    const TensorMeta x{c.dtype, c.x}, rows{DType::kF32, Shape(row_dims)}, column{DType::kF32, Shape{C}};
    std::vector<TensorMeta> metas = {x};
    if (c.op == "layer_norm_grad") metas = {x, x, rows, rows, column};
    if (c.op == "rms_norm_grad") metas = {x, x, rows, column};
    std::mt19937 rng(5);
    std::vector<Tensor> inputs;
    for (const TensorMeta& meta : metas) inputs.push_back(RandomInput(meta, false, rng));
    auto canonical = schema.CanonicalizeAttrs(c.attrs);
    ASSERT_TRUE(canonical.ok()) << canonical.status();
    auto out = schema.InferMeta(metas, *canonical);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_GT(schema.WorkspaceBytes(metas, *out, *canonical, DeviceType::kCuda), 0) << "one range only";
    // The CPU's: the norms' per-block scratch rows (ops/cpu/norm_softmax.h).
    const bool norm = c.op.ends_with("norm_grad");
    EXPECT_EQ(schema.WorkspaceBytes(metas, *out, *canonical, DeviceType::kCpu),
              norm ? cpu::NormParamGradScratchBytes(c.x.NumElements() / C, C, c.op == "layer_norm_grad") : 0);
    for (const bool workspace : {true, false}) {
      SCOPED_TRACE(workspace ? "planned workspace" : "eager");
      std::vector<Tensor> want, got;
      ASSERT_NO_FATAL_FAILURE(RunOnBoth(c.op, inputs, c.attrs, want, got, workspace));
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) {
        ASSERT_EQ(got[k].shape(), want[k].shape());
        // Terms up to ~50 in magnitude (dy (x - mean) rstd), summed in float
        // by the CPU: its rounding grows with the count of terms, while a
        // range lost or counted twice is off by ~1,000 terms' sum.
        const int64_t terms = k == 0 && c.op.ends_with("norm_grad") ? C : c.x.NumElements() / got[k].NumElements();
        for (int64_t i = 0; i < got[k].NumElements(); ++i) {
          const double r = ElementAsDouble(want[k], i), g = ElementAsDouble(got[k], i);
          ASSERT_NEAR(g, r, 1e-5 * std::fabs(r) + 1e-5 * static_cast<double>(terms))
              << "output " << k << " element " << i;
        }
      }
    }
  }
}

// A fused attention case for the GPU comparisons below.
struct AttentionCase {
  int64_t B, H, T, S, D;
  bool causal, masked;
  double dropout;
  DType dtype = DType::kF32;  // q, k, v's
  bool bthd = false;          // layout "bthd": q (B, T, H, D), k, v (B, S, H, D)
};
// The case's ops on the CPU: (op, inputs, outputs) for the forward and the
// gradient, q, k, v random (16-bit ones rounded from random f32), a random
// mask when masked, dy random; and their attributes.
struct AttentionOnCpu {
  std::string label;
  AttrMap attrs;
  std::vector<std::tuple<std::string, std::vector<Tensor>, std::vector<Tensor>>> ops;
};
void RunAttentionOnCpu(const AttentionCase& c, std::mt19937& rng, AttentionOnCpu& out) {
  out.label = StrCat("B H T S D = ", c.B, " ", c.H, " ", c.T, " ", c.S, " ", c.D, c.causal ? " causal" : "",
                     c.masked ? " masked" : "", " dropout ", c.dropout, " ", DTypeName(c.dtype), c.bthd ? " bthd" : "");
  auto shape = [&](int64_t rows) { return c.bthd ? Shape{c.B, rows, c.H, c.D} : Shape{c.B, c.H, rows, c.D}; };
  auto qkv = [&](int64_t rows) {
    const Tensor x = RandomInput({DType::kF32, shape(rows)}, false, rng);
    if (c.dtype == DType::kF32) return x;
    auto cast = RunOp("cast", {x}, {{"dtype", c.dtype}});
    EXPECT_TRUE(cast.ok()) << cast.status();
    return (*cast)[0];
  };
  std::vector<Tensor> in = {qkv(c.T), qkv(c.S), qkv(c.S)};
  if (c.masked) in.push_back(RandomInput({DType::kBool, Shape{c.B, c.S}}, false, rng));
  const std::string name = c.masked ? "flash_attention_masked" : "flash_attention";
  out.attrs = {{"scale", 1.0 / std::sqrt(static_cast<double>(c.D))},
               {"causal", c.causal},
               {"dropout_rate", c.dropout},
               {"seed", int64_t{9}},
               {"tensor_id", int64_t{4}}};
  if (c.bthd) out.attrs.Set("layout", std::string("bthd"));
  auto want = RunOp(name, in, out.attrs);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ((*want)[0].dtype(), DType::kF32);
  std::vector<Tensor> grad_in = {in[0],      in[1],      in[2],
                                 (*want)[0], (*want)[1], RandomInput({DType::kF32, shape(c.T)}, false, rng)};
  if (c.masked) grad_in.push_back(in[3]);
  auto want_grad = RunOp(name + "_grad", grad_in, out.attrs);
  ASSERT_TRUE(want_grad.ok()) << want_grad.status();
  out.ops = {{name, in, *want}, {name + "_grad", grad_in, *want_grad}};
}

TEST(CudaKernels, FlashAttentionMatchesTheCpuAcrossTiles) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  for (const AttentionCase& c :
       {AttentionCase{2, 3, 200, 200, 64, true, false, 0.0}, AttentionCase{1, 2, 97, 40, 128, true, true, 0.0},
        AttentionCase{2, 2, 70, 150, 64, false, true, 0.1}, AttentionCase{1, 1, 33, 65, 5, false, false, 0.0},
        AttentionCase{2, 2, 130, 130, 32, true, false, 0.3},
        // Layout "bthd": rows H · D apart.
        AttentionCase{2, 3, 200, 200, 64, true, false, 0.0, DType::kF32, true},
        AttentionCase{2, 2, 70, 150, 40, false, true, 0.1, DType::kF32, true}}) {
    std::mt19937 rng(3);
    AttentionOnCpu cpu;
    ASSERT_NO_FATAL_FAILURE(RunAttentionOnCpu(c, rng, cpu));
    SCOPED_TRACE(cpu.label);
    for (const auto& [op, inputs, expected] : cpu.ops) {
      absl::Status status;
      const std::vector<Tensor> got = RunOnGpu(op, inputs, cpu.attrs, &status);
      ASSERT_TRUE(status.ok()) << op << ": " << status;
      for (size_t k = 0; k < expected.size(); ++k) {
        const std::vector<double> g = got[k].ToDoubleVector(), r = expected[k].ToDoubleVector();
        for (size_t i = 0; i < r.size(); ++i) {
          if (g[i] == r[i]) continue;
          ASSERT_NEAR(g[i], r[i], 2e-4 * std::fabs(r[i]) + 2e-5) << op << " output " << k << " element " << i;
        }
      }
    }
  }
  std::mt19937 rng(4);
  const Tensor wide = RandomInput({DType::kF32, Shape{1, 1, 4, 160}}, false, rng);
  absl::Status status;
  RunOnGpu("flash_attention", {wide, wide, wide}, {}, &status);
  EXPECT_NE(status.message().find("head dim 160 is over the kernel's 128"), std::string::npos) << status;
}

// bf16 and f16 q, k, v (what mixed precision gives the op) run on tensor
// cores: the CPU computes the same op in f32 from the same 16-bit values,
// the GPU rounds the probabilities (and dy, dS) to the 16-bit type before
// their products, as flash attention does. So the two agree to the 16-bit
// type's rounding, relative to each output's largest value; a fragment in
// the wrong place, a tile lost or a mask missed is off by far more. Head
// dims 5 to 128 cover the three padded tile widths, shapes cut tiles
// unevenly, and the planned workspace and the eager path both run.
TEST(CudaKernels, FlashAttentionOnTensorCoresMatchesTheCpu) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  for (const AttentionCase& c : {AttentionCase{1, 2, 100, 105, 64, true, false, 0.0, DType::kBF16},
                                 AttentionCase{2, 1, 70, 150, 32, false, true, 0.1, DType::kBF16},
                                 AttentionCase{1, 1, 33, 65, 5, false, false, 0.0, DType::kF16},
                                 AttentionCase{1, 2, 80, 80, 128, true, false, 0.2, DType::kF16},
                                 AttentionCase{1, 1, 130, 52, 48, true, true, 0.15, DType::kBF16},
                                 AttentionCase{1, 1, 20, 90, 96, false, false, 0.0, DType::kBF16},
                                 // Layout "bthd": rows H · D apart (16-byte
                                 // loads where H · D is a multiple of 8).
                                 AttentionCase{1, 3, 100, 105, 64, true, false, 0.0, DType::kBF16, true},
                                 AttentionCase{2, 3, 130, 52, 48, true, true, 0.15, DType::kBF16, true},
                                 AttentionCase{1, 3, 33, 65, 5, false, false, 0.0, DType::kF16, true}}) {
    std::mt19937 rng(5);
    AttentionOnCpu cpu;
    ASSERT_NO_FATAL_FAILURE(RunAttentionOnCpu(c, rng, cpu));
    SCOPED_TRACE(cpu.label);
    for (const bool workspace : {true, false}) {
      for (const auto& [op, inputs, expected] : cpu.ops) {
        absl::Status status;
        const std::vector<Tensor> got = RunOnGpu(op, inputs, cpu.attrs, &status, workspace);
        ASSERT_TRUE(status.ok()) << op << ": " << status;
        for (size_t k = 0; k < expected.size(); ++k) {
          ASSERT_EQ(got[k].dtype(), expected[k].dtype());
          const std::vector<double> g = got[k].ToDoubleVector(), r = expected[k].ToDoubleVector();
          double largest = 0;
          for (double x : r) largest = std::isfinite(x) ? std::max(largest, std::fabs(x)) : largest;
          const double tol = (c.dtype == DType::kBF16 ? 2e-2 : 4e-3) * largest;
          double worst = 0;
          for (size_t i = 0; i < r.size(); ++i) {
            if (g[i] == r[i]) continue;  // -inf lse of a row without keys
            worst = std::max(worst, std::fabs(g[i] - r[i]));
            ASSERT_NEAR(g[i], r[i], tol) << op << " output " << k << " element " << i << " (largest " << largest << ")";
          }
          std::printf("%s output %zu: worst %.3g of largest %.3g\n", op.c_str(), k, worst, largest);
        }
      }
    }
  }
}

// cast between every pair of dtypes (the example covers only f32 -> bf16),
// values spread over a wide range so integer saturation and 16-bit rounding
// are exercised: the GPU's results equal the CPU's.
TEST(CudaKernels, CastMatchesTheCpuForEveryPair) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  const Device gpu{DeviceType::kCuda, 0};
  const std::vector<DType> dtypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kBool};
  std::mt19937 rng(11);
  auto wide = *Tensor::Empty(Shape{257}, DType::kF32, Device{});
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int64_t i = 0; i < wide.NumElements(); ++i) wide.data<float>()[i] = i % 5 == 0 ? dist(rng) / 1000.0f : dist(rng);
  for (DType from : dtypes) {
    auto source = RunOp("cast", {wide}, {{"dtype", from}});
    ASSERT_TRUE(source.ok()) << source.status();
    for (DType to : dtypes) {
      SCOPED_TRACE(StrCat(DTypeName(from), " -> ", DTypeName(to)));
      auto want = RunOp("cast", {(*source)[0]}, {{"dtype", to}});
      ASSERT_TRUE(want.ok()) << want.status();
      const OpSchema& schema = *BuiltinOps().Find("cast");
      auto canonical = schema.CanonicalizeAttrs({{"dtype", to}});
      ASSERT_TRUE(canonical.ok()) << canonical.status();
      KernelContext ctx;
      ctx.inputs.push_back(ToDevice((*source)[0], gpu));
      ctx.outputs.push_back(*Tensor::Empty((*want)[0].shape(), to, gpu));
      ctx.attrs = &*canonical;
      ctx.device = gpu;
      ASSERT_TRUE(RunKernel(schema, ctx).ok());
      const Tensor got = ToHost(ctx.outputs[0]);
      ASSERT_EQ(std::memcmp(got.raw_data(), (*want)[0].raw_data(), got.NumBytes()), 0);
    }
  }
}

#ifdef TESSERA_WITH_CUDA
// A Shutdown that gives up on a kernel still running (the runtime's
// failure path, after a hung kernel) calls nothing once it returned: the
// callback behind that kernel is dropped whenever the kernel ends (it was
// called then, its actor possibly gone). And busy_since_ns counts from the
// oldest work not complete (an OnComplete while the poller waited on the
// kernel restarted it, delaying the hung-kernel report).
TEST(CudaStream, AShutdownThatGaveUpCallsNothingLaterAndBusyCountsFromTheOldestWork) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  auto stream = MakeCudaStream(0, "cuda:0 stream 0");
  ASSERT_TRUE(stream.ok()) << stream.status();
  static std::atomic<bool> release;
  release = false;
  const auto spin = [](void*) {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  (*stream)->Enqueue([&] {
    const int err = cuda::LaunchHostFunc((*stream)->native(), spin, nullptr);
    return err == 0 ? absl::OkStatus() : absl::InternalError(cuda::ErrorString(err));
  });
  std::atomic<int> calls{0};
  (*stream)->OnComplete([&calls](absl::Status) { ++calls; });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the poller waits on the kernel
  const int64_t since = (*stream)->busy_since_ns();
  ASSERT_GT(since, 0);
  (*stream)->OnComplete([&calls](absl::Status) { ++calls; });
  EXPECT_EQ((*stream)->busy_since_ns(), since);
  EXPECT_FALSE((*stream)->Shutdown(0.2));
  release = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(calls.load(), 0);
}
#endif

// The asynchronous model on a GPU: a matmul enqueued on a CUDA stream
// returns before it ran (its host side only launches), the completion
// callback comes on the poller thread after it, with the product in place;
// a failing launch (a tensor on another device) reaches the next callback,
// and everything behind it is skipped.
TEST(CudaStream, RunsKernelsAsynchronouslyAndCallsBackAfterThem) {
  if (const std::string why = NoGpu(); !why.empty()) GTEST_SKIP() << why;
  const Device gpu{DeviceType::kCuda, 0};
  auto stream = MakeCudaStream(0, "cuda:0 stream 0");
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_NE((*stream)->native(), nullptr);
  std::mt19937 rng(7);
  const TensorMeta meta{DType::kF32, Shape{512, 512}};
  const Tensor a = RandomInput(meta, false, rng), b = RandomInput(meta, false, rng);
  auto want = RunOp("matmul", {a, b}, {});
  ASSERT_TRUE(want.ok()) << want.status();
  const OpSchema& matmul = *BuiltinOps().Find("matmul");
  AttrMap attrs = *matmul.CanonicalizeAttrs({});
  KernelContext ctx;
  ctx.attrs = &attrs;
  ctx.device = gpu;
  ctx.stream = stream->get();
  ctx.inputs = {ToDevice(a, gpu), ToDevice(b, gpu)};
  auto y = Tensor::Empty(meta.shape, meta.dtype, gpu);
  ASSERT_TRUE(y.ok());
  ctx.outputs = {*y};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<absl::Status> done;
  const auto callback = [&](absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    done.push_back(std::move(status));
    cv.notify_all();
  };
  // The profile's timer (actors/op_profile.h) around them: device time
  // between its events, readable once a later callback came.
  auto timer = (*stream)->StartTimer();
  ASSERT_TRUE(timer.ok()) << timer.status();
  for (int i = 0; i < 8; ++i) (*stream)->Enqueue([&] { return RunKernel(matmul, ctx); });
  (*timer)->Stop();
  (*stream)->OnComplete(callback);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done.size() == 1; }));
    EXPECT_TRUE(done[0].ok()) << done[0];
  }
  const absl::StatusOr<int64_t> elapsed = (*timer)->ElapsedNs();
  ASSERT_TRUE(elapsed.ok()) << elapsed.status();
  EXPECT_GT(*elapsed, 0);
  EXPECT_LT(*elapsed, int64_t{30'000'000'000});
  const std::vector<float> got = ToHost(ctx.outputs[0]).ToVector<float>(), expected = (*want)[0].ToVector<float>();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-3f * (1 + std::fabs(expected[i]))) << i;
  KernelContext bad = ctx;
  bad.inputs[0] = a;  // on the host
  (*stream)->Enqueue([&] { return RunKernel(matmul, bad); });
  (*stream)->OnComplete(callback);
  (*stream)->Enqueue([&] { return RunKernel(matmul, ctx); });
  (*stream)->OnComplete(callback);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done.size() == 3; }));
  EXPECT_FALSE(done[1].ok());
  EXPECT_NE(done[1].message().find("given to a kernel on cuda:0"), std::string::npos) << done[1];
  EXPECT_EQ(done[2], done[1]);
}
#else
TEST(CudaKernels, MatchTheCpuKernels) { GTEST_SKIP() << "this build of Tessera has no CUDA (nvcc not found)"; }
#endif

}  // namespace
}  // namespace tessera::ops
