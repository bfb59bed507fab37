// The fused Linear + bias + GELU (matmul_bias_gelu: the bias and GELU as the
// GEMM's epilogue) against what runs without model.bias_gelu_fusion (matmul,
// then bias_gelu), and a Linear's GEMM with its bias (matmul_bias, what
// every Linear but a row-parallel one runs) against matmul then bias_add (what
// ran before), measured in the same run, on the registered kernels
// through RunKernel with preallocated inputs, outputs and workspaces (what
// the actor runtime does): the CPU's on intra-op pools of 1 and 2 threads, or with
// --device cuda cuda:0's (each call waits for its kernels; cuBLASLt's
// epilogue). Prints the median milliseconds of each side, fused / unfused
// (< 1: the fused op is faster) and the fused op's TFLOP/s (2·M·N·K per
// call).
//
//   linear_gelu_bench [--quick] [--device cpu|cuda] [--dtype f32|bf16]
// --dtype bf16: x and weight in bf16 (mixed precision's matmul inputs).
// --quick: fewer rows and repeats (a smoke run).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "bench/kernel_call.h"
#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/registry.h"

namespace tessera {
namespace {

double Seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Device g_device;              // where the tensors and kernels are
DType g_dtype = DType::kF32;  // x's and weight's

// Values in [-1, 1] / 16 (GELU's interesting range once summed over K),
// in `dtype`, on g_device.
Tensor Filled(const Shape& shape, uint64_t seed, DType dtype) {
  std::vector<float> values(static_cast<size_t>(shape.NumElements()));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : values) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<double>(x % 20001) / 160000.0 - 0.0625);
  }
  Tensor t = Tensor::FromVector<float>(shape, values);
  if (dtype != DType::kF32) {
    auto cast = ops::RunOp("cast", {t}, {{"dtype", dtype}});
    TESSERA_CHECK(cast.ok(), cast.status().ToString());
    t = (*cast)[0];
  }
  if (g_device.type == DeviceType::kCpu) return t;
  auto on_device = Tensor::Empty(shape, dtype, g_device);
  TESSERA_CHECK(on_device.ok(), on_device.status().ToString());
  const absl::Status copied = on_device->CopyFrom(t);
  TESSERA_CHECK(copied.ok(), copied.ToString());
  return *on_device;
}

double MedianMs(const std::function<void()>& fn, int repeats) {
  fn();  // warm-up (oneDNN's packing buffers, cuBLASLt's heuristics)
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const double start = Seconds();
    fn();
    ms.push_back((Seconds() - start) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Case {
  const char* label;
  int64_t m, k, n;
  const char* approximate;  // the GELU's; nullptr: matmul_bias, no GELU
};

void Measure(const Case& c, ThreadPool* pool, int threads, int repeats) {
  const Tensor x = Filled(Shape{c.m, c.k}, 1, g_dtype), w = Filled(Shape{c.k, c.n}, 2, g_dtype);
  const Tensor bias = Filled(Shape{c.n}, 3, DType::kF32);
  const bool gelu = c.approximate != nullptr;
  const ops::AttrMap attrs = gelu ? ops::AttrMap{{"approximate", std::string(c.approximate)}} : ops::AttrMap{};
  auto fused = bench::MakeKernelCall(gelu ? "matmul_bias_gelu" : "matmul_bias", {x, w, bias}, attrs, pool, g_device);
  auto matmul = bench::MakeKernelCall("matmul", {x, w}, {}, pool, g_device);
  auto epilogue =
      bench::MakeKernelCall(gelu ? "bias_gelu" : "bias_add", {matmul->ctx.outputs[0], bias}, attrs, pool, g_device);
  const double fused_ms = MedianMs([&] { bench::Run(*fused); }, repeats);
  const double unfused_ms = MedianMs(
      [&] {
        bench::Run(*matmul);
        bench::Run(*epilogue);
      },
      repeats);
  const double tflops = 2.0 * static_cast<double>(c.m * c.n * c.k) / (fused_ms * 1e-3) / 1e12;
  std::printf("%-34s %d thr  fused %8.3f ms  matmul+%-9s %8.3f ms  (%.3fx)  fused %.2f TFLOP/s\n", c.label, threads,
              fused_ms, gelu ? "bias_gelu" : "bias_add", unfused_ms, fused_ms / unfused_ms, tflops);
  std::fflush(stdout);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--device") == 0 && has_value && std::strcmp(argv[i + 1], "cuda") == 0) {
      tessera::g_device = tessera::Device{tessera::DeviceType::kCuda, 0};
      ++i;
    } else if (std::strcmp(argv[i], "--device") == 0 && has_value && std::strcmp(argv[i + 1], "cpu") == 0) {
      ++i;
    } else if (std::strcmp(argv[i], "--dtype") == 0 && has_value &&
               (std::strcmp(argv[i + 1], "f32") == 0 || std::strcmp(argv[i + 1], "bf16") == 0)) {
      tessera::g_dtype = std::strcmp(argv[++i], "bf16") == 0 ? tessera::DType::kBF16 : tessera::DType::kF32;
    } else {
      return tessera::bench::Usage("linear_gelu_bench", "[--quick] [--device cpu|cuda] [--dtype f32|bf16]", argv[i]);
    }
  }
  const bool gpu = tessera::g_device.type == tessera::DeviceType::kCuda;
  const int64_t rows = quick ? 1024 : 4096;
  std::vector<tessera::Case> cases = {
      {"GPT-2 c_fc (tanh), 768 -> 3072", rows, 768, 3072, "tanh"},
      {"BERT-base dense (erf), 768 -> 3072", rows, 768, 3072, "none"},
      {"GPT-2 q, k or v (bias), 768 -> 768", rows, 768, 768, nullptr},
  };
  if (gpu) cases.push_back({"4096^3 (tanh)", 4096, 4096, 4096, "tanh"});
  const int repeats = quick ? 3 : 7;
  std::printf(
      "matmul_bias_gelu / matmul_bias vs matmul + bias_gelu / bias_add on %s, x and weight %s, %s rows; median of %d\n",
      gpu ? "cuda:0" : "the CPU", std::string(tessera::DTypeName(tessera::g_dtype)).c_str(),
      std::to_string(rows).c_str(), repeats);
  for (const tessera::Case& c : cases) {
    if (gpu) {
      tessera::Measure(c, nullptr, 1, repeats);
      continue;
    }
    for (int threads : {1, 2}) {
      tessera::ThreadPool pool(threads);
      tessera::Measure(c, &pool, threads, repeats);
    }
  }
  return 0;
}
