// Memory-bandwidth efficiency of memory-bound kernels against a plain copy
// measured in the same run (DESIGN §12: compare, don't quote absolutes).
//
// CPU (default): gelu (tanh approximation and exact), layer_norm,
// layer_norm_grad, a bias gradient (reduce_sum over the rows), softmax
// forward and square_sum (global-norm clipping's) on (8192, 1024) f32 tensors (8M elements, 32 MiB each: input and
// output together exceed a core's caches, so every kernel streams), on an
// intra-op ThreadPool of 1 and 2 threads; the copy is std::memcpy of a
// buffer of x's size, split into equal halves across the threads (same
// pool) for 2 threads.
//
// --device cuda: cuda:0's kernels at GPT-2 124M's shapes at micro-batch 64
// (65,536 rows of 768; every tensor several times the L2): gelu, layer_norm,
// layer_norm_grad, a bias gradient (reduce_sum over the rows), cast to
// bf16, square_sum over the token embedding (50,257 x 768, global-norm
// clipping's largest term) and sparse_softmax_cross_entropy over 8,192 rows
// of 50,257 logits; the copy is a device-to-device copy of x. Each call
// waits for its kernels, the copy too.
//
// Each kernel is the registered kernel run through RunKernel on
// preallocated (already touched) inputs and outputs, as the actor runtime
// runs it: allocation is not measured. Effective bandwidth = (bytes read +
// bytes written) / time, counting each tensor once (inputs and outputs), and
// the copy its read plus its write, so the ratio is 1 for a kernel that
// moves its bytes as fast as a copy.
//
//   kernel_bench [--device cpu|cuda]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
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

constexpr int64_t kRows = 8192, kCols = 1024;  // 8M elements
constexpr int kRepeats = 21;

double Seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Device g_device;  // where the tensors and kernels are

// A tensor on g_device with every page touched, holding values in a
// kernel's usual range (`dtype` f32 or i64; i64 values in [0, 1000)).
Tensor Filled(const Shape& shape, float scale, DType dtype = DType::kF32) {
  auto t = Tensor::Empty(shape, dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  for (int64_t i = 0; i < t->NumElements(); ++i) {
    if (dtype == DType::kI64) {
      t->data<int64_t>()[i] = (i * 7919) % 1000;
    } else {
      t->data<float>()[i] = scale * static_cast<float>((i * 7919) % 2001 - 1000) / 1000.0f;
    }
  }
  if (g_device.type == DeviceType::kCpu) return *t;
  auto on_device = Tensor::Empty(shape, dtype, g_device);
  TESSERA_CHECK(on_device.ok(), on_device.status().ToString());
  const absl::Status copied = on_device->CopyFrom(*t);
  TESSERA_CHECK(copied.ok(), copied.ToString());
  return *on_device;
}

struct KernelSpec {
  std::string label;
  std::string op;
  ops::AttrMap attrs;
  std::vector<Tensor> inputs;
};

// A runnable kernel of `spec` on preallocated outputs (and workspace: the
// long reductions' partials on GPUs, not counted), and the bytes it moves.
struct PreparedKernel {
  std::unique_ptr<bench::KernelCall> call;
  double bytes = 0;

  void Run() { bench::Run(*call); }
};

std::unique_ptr<PreparedKernel> Prepare(const KernelSpec& spec, ThreadPool& pool) {
  auto k = std::make_unique<PreparedKernel>();
  k->call = bench::MakeKernelCall(spec.op, spec.inputs, spec.attrs, &pool, g_device);
  for (const Tensor& t : k->call->ctx.inputs) k->bytes += static_cast<double>(t.NumBytes());
  for (const Tensor& t : k->call->ctx.outputs) k->bytes += static_cast<double>(t.NumBytes());
  return k;
}

// std::memcpy of `src` into `dst`, cut into one equal piece per thread; on
// a GPU one device-to-device copy, waited for.
void Memcpy(const Tensor& src, Tensor& dst, ThreadPool& pool) {
  if (g_device.type != DeviceType::kCpu) {
    const absl::Status copied = dst.CopyFrom(src);
    TESSERA_CHECK(copied.ok(), copied.ToString());
    return;
  }
  const char* from = static_cast<const char*>(src.raw_data());
  char* to = static_cast<char*>(dst.raw_data());
  const int64_t bytes = static_cast<int64_t>(src.NumBytes());
  const int64_t pieces = pool.num_threads();
  ParallelFor(&pool, pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t lo = bytes * p / pieces, hi = bytes * (p + 1) / pieces;
      std::memcpy(to + lo, from + lo, static_cast<size_t>(hi - lo));
    }
  });
}

template <typename Fn>
double TimeOnce(const Fn& fn) {
  const double start = Seconds();
  fn();
  return Seconds() - start;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  const bool gpu = g_device.type != DeviceType::kCpu;
  // GPT-2 124M at micro-batch 64 on a GPU; (8192, 1024) on the CPU.
  const int64_t rows = gpu ? 65536 : kRows, cols = gpu ? 768 : kCols;
  const Shape shape{rows, cols};
  const Tensor x = Filled(shape, 3.0f);
  const Tensor gamma = Filled(Shape{cols}, 1.0f), beta = Filled(Shape{cols}, 0.5f);
  Tensor copy = Filled(shape, 0.0f);
  std::vector<KernelSpec> specs = {
      {"gelu (tanh)", "gelu", {{"approximate", std::string("tanh")}}, {x}},
      {"gelu (exact, erf)", "gelu", {{"approximate", std::string("none")}}, {x}},
      {"layer_norm", "layer_norm", {}, {x, gamma, beta}},
  };
  const Tensor stats = Filled(Shape{rows}, 1.0f);
  specs.push_back({"layer_norm_grad", "layer_norm_grad", {}, {x, x, stats, stats, gamma}});
  specs.push_back({"bias grad (reduce_sum)", "reduce_sum", {{"axes", std::vector<int64_t>{0}}}, {x}});
  if (gpu) {
    specs.push_back({"cast to bf16", "cast", {{"dtype", DType::kBF16}}, {x}});
    specs.push_back({"square_sum (50257x768)", "square_sum", {}, {Filled(Shape{50257, 768}, 1.0f)}});
    specs.push_back({"cross entropy (8192x50257)",
                     "sparse_softmax_cross_entropy",
                     {},
                     {Filled(Shape{8192, 50257}, 3.0f), Filled(Shape{8192}, 0.0f, DType::kI64)}});
  } else {
    specs.push_back({"softmax", "softmax", {}, {x}});
    specs.push_back({"square_sum", "square_sum", {}, {x}});
  }
  const double copy_bytes = 2.0 * static_cast<double>(x.NumBytes());

  std::printf(
      "%s: f32 (%lld, %lld): %.0f MiB per tensor; %d repetitions after a warm-up, each timing the copy\n"
      "and then the kernel back to back; the ratio is taken per repetition and its median printed, so\n"
      "drift in the machine's speed cancels out\n",
      gpu ? "cuda:0" : "CPU", static_cast<long long>(rows), static_cast<long long>(cols),
      static_cast<double>(x.NumBytes()) / (1 << 20), kRepeats);
  std::printf("GB/s = (bytes read + bytes written) / time; ratio = kernel GB/s / %s GB/s%s\n\n",
              gpu ? "device-to-device copy" : "memcpy", gpu ? "" : ", same threads");
  std::printf("%-28s %7s %10s %9s %11s %9s\n", "kernel", "threads", "ms", "GB/s", "copy GB/s", "ratio");
  for (int threads : {1, 2}) {
    if (gpu && threads > 1) continue;
    ThreadPool pool(threads);
    for (const KernelSpec& spec : specs) {
      auto kernel = Prepare(spec, pool);
      Memcpy(x, copy, pool);
      kernel->Run();
      std::vector<double> kernel_times, copy_times, ratios;
      for (int r = 0; r < kRepeats; ++r) {
        const double tc = TimeOnce([&] { Memcpy(x, copy, pool); });
        const double tk = TimeOnce([&] { kernel->Run(); });
        copy_times.push_back(tc);
        kernel_times.push_back(tk);
        ratios.push_back((kernel->bytes / tk) / (copy_bytes / tc));
      }
      const double tk = Median(kernel_times), tc = Median(copy_times);
      std::printf("%-28s %7d %10.3f %9.1f %11.1f %9.2f\n", spec.label.c_str(), threads, tk * 1e3,
                  kernel->bytes / tk / 1e9, copy_bytes / tc / 1e9, Median(ratios));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--device") == 0 && has_value && std::strcmp(argv[i + 1], "cuda") == 0) {
      tessera::g_device = tessera::Device{tessera::DeviceType::kCuda, 0};
      ++i;
    } else if (std::strcmp(argv[i], "--device") == 0 && has_value && std::strcmp(argv[i + 1], "cpu") == 0) {
      ++i;
    } else {
      return tessera::bench::Usage("kernel_bench", "[--device cpu|cuda]", argv[i]);
    }
  }
  return tessera::Main();
}
