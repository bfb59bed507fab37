// Memory-bandwidth efficiency of the element-wise and row-normalising CPU
// kernels, against memcpy measured in the same run (DESIGN §12: compare,
// don't quote absolutes). Kernels: gelu (tanh approximation and exact),
// layer_norm and softmax forward on (8192, 1024) f32 tensors (8M elements,
// 32 MiB each: input and output together exceed a core's caches, so every
// kernel streams).
//
// Each kernel is the registered CPU kernel run through RunKernel on
// preallocated (already touched) inputs and outputs, on an intra-op
// ThreadPool of 1 and 2 threads, as the actor runtime runs it: allocation is
// not measured.
//
// Effective bandwidth = (bytes read + bytes written) / time, counting each
// tensor once (x, y; layer_norm also its gamma, beta, mean and rstd). memcpy
// copies a buffer of the same size as x with std::memcpy, split into equal
// halves across the threads (same pool) for 2 threads, and counts its read
// plus its write, so the ratio is 1 for a kernel that moves its bytes as fast
// as a copy.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/registry.h"

namespace tessera {
namespace {

constexpr int64_t kRows = 8192, kCols = 1024;  // 8M elements
constexpr int kRepeats = 21;

double Seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A tensor with every page touched, holding values in a kernel's usual range.
Tensor Filled(const Shape& shape, float scale) {
  auto t = Tensor::Empty(shape, DType::kF32);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  float* p = t->data<float>();
  for (int64_t i = 0; i < t->NumElements(); ++i) p[i] = scale * static_cast<float>((i * 7919) % 2001 - 1000) / 1000.0f;
  return *t;
}

struct KernelSpec {
  std::string label;
  std::string op;
  ops::AttrMap attrs;
  std::vector<Tensor> inputs;
};

// A runnable kernel of `spec` on preallocated outputs, and the bytes it moves.
struct PreparedKernel {
  const ops::OpSchema* schema;
  ops::AttrMap attrs;
  ops::KernelContext ctx;
  double bytes = 0;

  void Run() {
    const absl::Status status = ops::RunKernel(*schema, ctx);
    TESSERA_CHECK(status.ok(), status.ToString());
  }
};

std::unique_ptr<PreparedKernel> Prepare(const KernelSpec& spec, ThreadPool& pool) {
  auto k = std::make_unique<PreparedKernel>();
  k->schema = ops::BuiltinOps().Find(spec.op);
  auto attrs = k->schema->CanonicalizeAttrs(spec.attrs);
  TESSERA_CHECK(attrs.ok(), attrs.status().ToString());
  k->attrs = *attrs;
  std::vector<TensorMeta> metas;
  for (const Tensor& t : spec.inputs) metas.push_back(t.meta());
  auto out_metas = k->schema->InferMeta(metas, k->attrs);
  TESSERA_CHECK(out_metas.ok(), out_metas.status().ToString());
  k->ctx.inputs = spec.inputs;
  k->ctx.attrs = &k->attrs;
  k->ctx.pool = &pool;
  for (const Tensor& t : spec.inputs) k->bytes += static_cast<double>(t.NumBytes());
  for (const TensorMeta& m : *out_metas) {
    k->ctx.outputs.push_back(Filled(m.shape, 0.0f));
    k->bytes += static_cast<double>(k->ctx.outputs.back().NumBytes());
  }
  return k;
}

// std::memcpy of `src` into `dst`, cut into one equal piece per thread.
void Memcpy(const Tensor& src, const Tensor& dst, ThreadPool& pool) {
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
  const Shape shape{kRows, kCols};
  const Tensor x = Filled(shape, 3.0f);
  const Tensor gamma = Filled(Shape{kCols}, 1.0f), beta = Filled(Shape{kCols}, 0.5f);
  const Tensor copy = Filled(shape, 0.0f);
  const std::vector<KernelSpec> specs = {
      {"gelu (tanh)", "gelu", {{"approximate", std::string("tanh")}}, {x}},
      {"gelu (exact, erf)", "gelu", {{"approximate", std::string("none")}}, {x}},
      {"layer_norm", "layer_norm", {}, {x, gamma, beta}},
      {"softmax", "softmax", {}, {x}},
  };
  const double copy_bytes = 2.0 * static_cast<double>(x.NumBytes());

  std::printf("f32 (%lld, %lld): %.0f MiB per tensor; %d repetitions after a warm-up, each timing memcpy and\n"
              "then the kernel back to back; the ratio is taken per repetition and its median printed, so\n"
              "drift in the machine's speed cancels out\n",
              static_cast<long long>(kRows), static_cast<long long>(kCols),
              static_cast<double>(x.NumBytes()) / (1 << 20), kRepeats);
  std::printf("GB/s = (bytes read + bytes written) / time; ratio = kernel GB/s / memcpy GB/s, same threads\n\n");
  std::printf("%-20s %7s %10s %9s %11s %9s\n", "kernel", "threads", "ms", "GB/s", "memcpy GB/s", "ratio");
  for (int threads : {1, 2}) {
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
      std::printf("%-20s %7d %10.2f %9.1f %11.1f %9.2f\n", spec.label.c_str(), threads, tk * 1e3,
                  kernel->bytes / tk / 1e9, copy_bytes / tc / 1e9, Median(ratios));
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main() { return tessera::Main(); }
