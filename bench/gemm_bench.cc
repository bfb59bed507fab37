// GEMM throughput of the matmul kernels against this CPU's FP32 FMA peak,
// both measured in the same run (DESIGN §13: matmul >= 85% of peak on large
// shapes). Prints one table:
//   - peak: every thread runs its own loop of independent vector FMA chains
//     (AVX-512, else AVX2+FMA, else GCC vectors) -> GFLOP/s for 1 and 2
//     threads;
//   - kernel: the registered matmul / batch_matmul CPU kernel through
//     RunKernel, on an intra-op ThreadPool of 1 and 2 threads, inputs and
//     outputs preallocated (what the actor runtime does), after a warm-up;
//     best and median of several repetitions;
//   - omp: dnnl_sgemm threaded by oneDNN itself with OpenMP on the same
//     shapes, for comparison with the kernel's own cutting over the pool.
// Shapes are M x N x K: y (M, N) = a (M, K) @ b (K, N). faults/call counts
// minor page faults (process-wide) per timed call. Usage:
//   gemm_bench [rounds]   (passes over the table, default 3; each row keeps
//                          its best and the median of all its samples)
//   gemm_bench --peak N   (only the FMA peak of N threads: "peak_gflops X")

#include <dnnl.h>
#include <omp.h>
#include <sys/resource.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/bench_args.h"
#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/registry.h"

namespace tessera {
namespace {

double Seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Independent accumulator chains: enough to cover FMA latency (4-5 cycles) x
// FMA pipes (2) on current x86 cores with room to spare, and few enough to
// stay in registers with the two constants: AVX2 has 16 ymm registers (16
// chains spilled there and measured two thirds of the peak), AVX-512 32.
#if defined(__AVX512F__)
constexpr int kChains = 16;
#else
constexpr int kChains = 12;
#endif

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr const char* kIsa = "AVX-512";
__attribute__((noinline)) float FmaLoop(int64_t iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
  }
  // Stored and summed in scalar code: GCC 12's _mm512_reduce_add_ps trips
  // -Wuninitialized inside its own header.
  float lanes[16];
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  _mm512_storeu_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
constexpr const char* kIsa = "AVX2";
__attribute__((noinline)) float FmaLoop(int64_t iterations) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
  }
  float lanes[8];
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  _mm256_storeu_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}
#else
constexpr int kLanes = 4;
constexpr const char* kIsa = "generic 128-bit vectors (no AVX2/AVX-512 at compile time)";
typedef float Vec4 __attribute__((vector_size(16)));
__attribute__((noinline)) float FmaLoop(int64_t iterations) {
  Vec4 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = Vec4{} + static_cast<float>(c);
  const Vec4 mul = Vec4{} + 0.999999f, add = Vec4{} + 1e-6f;
  for (int64_t it = 0; it < iterations; ++it) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * mul + add;
  }
  float total = 0;
  for (int c = 0; c < kChains; ++c) total += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  return total;
}
#endif

// FP32 GFLOP/s of `threads` threads each running FmaLoop at once, timed from
// a common start to the last finish; best of `repeats`.
double MeasurePeak(int threads, int repeats) {
  constexpr int64_t kIterations = 20'000'000;  // ~0.1 s per thread
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> workers;
    std::vector<float> sinks(static_cast<size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        sinks[static_cast<size_t>(t)] = FmaLoop(kIterations);
      });
    }
    while (ready.load() < threads) {
    }
    const double start = Seconds();
    go.store(true, std::memory_order_release);
    for (auto& w : workers) w.join();
    const double elapsed = Seconds() - start;
    const double flops = 2.0 * kLanes * kChains * static_cast<double>(kIterations) * threads;
    best = std::max(best, flops / elapsed / 1e9);
  }
  return best;
}

struct Shape3 {
  int64_t batch, m, n, k;
  std::string Name() const {
    std::string s = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    return batch > 1 ? std::to_string(batch) + " x " + s : s;
  }
  double Flops() const { return 2.0 * static_cast<double>(batch * m * n * k); }
};

Tensor Filled(const Shape& shape, float value) {
  auto t = Tensor::Empty(shape, DType::kF32);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  std::fill(t->data<float>(), t->data<float>() + t->NumElements(), value);
  return *t;
}

int64_t MinorPageFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

struct Samples {
  std::vector<double> rates;  // GFLOP/s per call
  int64_t page_faults = 0;    // minor page faults during the timed calls
};

// Times each call of `run` (one GEMM of `flops`) after warm-up calls.
template <typename Fn>
Samples Measure(double flops, const Fn& run) {
  for (int i = 0; i < 3; ++i) run();
  const int repeats = std::clamp(static_cast<int>(20e9 / flops), 5, 20);
  Samples samples;
  const int64_t faults = MinorPageFaults();
  for (int r = 0; r < repeats; ++r) {
    const double start = Seconds();
    run();
    samples.rates.push_back(flops / (Seconds() - start) / 1e9);
  }
  samples.page_faults = MinorPageFaults() - faults;
  return samples;
}

// The registered CPU kernel on preallocated tensors, on `pool`'s threads.
Samples MeasureKernel(const Shape3& s, ThreadPool& pool) {
  const bool batched = s.batch > 1;
  const ops::OpSchema& schema = *ops::BuiltinOps().Find(batched ? "batch_matmul" : "matmul");
  auto attrs = schema.CanonicalizeAttrs({});
  TESSERA_CHECK(attrs.ok(), attrs.status().ToString());
  auto shape = [&](int64_t rows, int64_t cols) { return batched ? Shape{s.batch, rows, cols} : Shape{rows, cols}; };
  ops::KernelContext ctx;
  ctx.inputs = {Filled(shape(s.m, s.k), 0.5f), Filled(shape(s.k, s.n), 0.25f)};
  ctx.outputs = {Filled(shape(s.m, s.n), 0.0f)};
  ctx.attrs = &*attrs;
  ctx.pool = &pool;
  return Measure(s.Flops(), [&] {
    const absl::Status status = ops::RunKernel(schema, ctx);
    TESSERA_CHECK(status.ok(), status.ToString());
  });
}

// dnnl_sgemm threaded by oneDNN's OpenMP, one call per batch item.
Samples MeasureOpenMp(const Shape3& s, int threads) {
  std::vector<float> a(static_cast<size_t>(s.batch * s.m * s.k), 0.5f);
  std::vector<float> b(static_cast<size_t>(s.batch * s.k * s.n), 0.25f);
  std::vector<float> y(static_cast<size_t>(s.batch * s.m * s.n));
  omp_set_num_threads(threads);
  return Measure(s.Flops(), [&] {
    for (int64_t i = 0; i < s.batch; ++i) {
      const dnnl_status_t status = dnnl_sgemm('N', 'N', s.m, s.n, s.k, 1.0f, a.data() + i * s.m * s.k, s.k,
                                              b.data() + i * s.k * s.n, s.n, 0.0f, y.data() + i * s.m * s.n, s.n);
      TESSERA_CHECK(status == dnnl_success, "dnnl_sgemm status ", static_cast<int>(status));
    }
  });
}

// One line of the table: every sample of every round.
struct Row {
  size_t shape_index = 0;
  Shape3 shape;
  bool openmp = false;
  size_t thread_index = 0;
  std::vector<double> rates;
  int64_t page_faults = 0;
};

int Main(int argc, char** argv) {
  // `gemm_bench --peak THREADS`: the FMA peak alone (best of 5), one line
  // "peak_gflops X", for the comparison scripts.
  constexpr const char* kUsage = "[ROUNDS] | --peak THREADS";
  if (argc > 1 && std::string_view(argv[1]) == "--peak") {
    const std::optional<long long> given = argc == 3 ? bench::PositiveInteger(argv[2]) : std::nullopt;
    if (argc > 3) return bench::Usage("gemm_bench", kUsage, argv[3]);
    if (!given || *given > 1024) return bench::BadValue("gemm_bench", kUsage, "--peak", "a thread count in [1, 1024]");
    const int threads = static_cast<int>(*given);
    double best = 0;
    for (int i = 0; i < 5; ++i) best = std::max(best, MeasurePeak(threads, 2));
    std::printf("peak_gflops %.1f\n", best);
    return 0;
  }
  // Rounds over the whole table: the machines are shared and noisy, so each
  // row keeps its best over several passes spread in time.
  if (argc > 2 || (argc == 2 && !bench::PositiveInteger(argv[1]))) {
    return bench::Usage("gemm_bench", kUsage, argv[argc > 2 && bench::PositiveInteger(argv[1]) ? 2 : 1]);
  }
  const int rounds = argc == 2 ? static_cast<int>(std::min<long long>(*bench::PositiveInteger(argv[1]), 1000)) : 3;
  const std::vector<Shape3> shapes = {
      {1, 1024, 1024, 1024},
      {1, 4096, 3072, 768},
      {1, 4096, 768, 3072},
      {32, 128, 128, 64},  // attention scores of the GPT bench model (batch 8 x 4 heads)
  };
  const std::vector<int> thread_counts = {1, 2};
  std::vector<double> peak(thread_counts.size(), 0.0);
  // One pool per thread count for the whole run, as the runtime keeps its
  // threads. A fresh thread's first ~10 large GEMMs are up to 25% slower:
  // oneDNN mallocs its packing buffers on every call, and until glibc's
  // malloc thresholds adapt it returns them to the kernel each time, so every
  // call page-faults them in again (~2,600 faults per 4096x3072x768 call,
  // counted with getrusage).
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : thread_counts) pools.push_back(std::make_unique<ThreadPool>(t));
  // Per round: the kernel rows, then the OpenMP rows with 1 thread, then
  // with 2, so the OpenMP team's idle threads, which spin for a few
  // milliseconds after each parallel region, never overlap a kernel row.
  std::vector<Row> rows;
  for (bool openmp : {false, true}) {
    for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
      for (size_t si = 0; si < shapes.size(); ++si) rows.push_back({si, shapes[si], openmp, ti, {}});
    }
  }
  for (int round = 0; round < rounds; ++round) {
    for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
      peak[ti] = std::max(peak[ti], MeasurePeak(thread_counts[ti], 2));
    }
    for (Row& row : rows) {
      const int threads = thread_counts[row.thread_index];
      const Samples samples =
          row.openmp ? MeasureOpenMp(row.shape, threads) : MeasureKernel(row.shape, *pools[row.thread_index]);
      row.rates.insert(row.rates.end(), samples.rates.begin(), samples.rates.end());
      row.page_faults += samples.page_faults;
    }
    // Outlasts the spinning (libgomp's default spin count is ~300k pauses).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.shape_index < y.shape_index; });
  std::printf("FP32 FMA peak (%s, %d chains), best of the run:\n", kIsa, kChains);
  for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
    std::printf("  %d thread%s: %8.1f GFLOP/s\n", thread_counts[ti], thread_counts[ti] > 1 ? "s" : " ", peak[ti]);
  }
  std::printf(
      "\nGEMM, shape M x N x K: y (M, N) = a (M, K) @ b (K, N); %d rounds; pk = FMA peak of the same thread "
      "count\n",
      rounds);
  std::printf("%-20s %-7s %8s %12s %12s %7s %7s %10s\n", "shape", "path", "threads", "best GF/s", "median GF/s",
              "best/pk", "med/pk", "faults/call");
  for (Row& row : rows) {
    std::sort(row.rates.begin(), row.rates.end());
    const double best = row.rates.back(), median = row.rates[row.rates.size() / 2];
    std::printf("%-20s %-7s %8d %12.1f %12.1f %7.3f %7.3f %10.0f\n", row.shape.Name().c_str(),
                row.openmp ? "omp" : "kernel", thread_counts[row.thread_index], best, median,
                best / peak[row.thread_index], median / peak[row.thread_index],
                static_cast<double>(row.page_faults) / row.rates.size());
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
