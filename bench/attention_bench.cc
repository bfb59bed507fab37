// Fused attention (flash_attention and its gradient op) against the unfused
// ops the models run without model.fused_attention, measured in the same
// run on the CPU kernels, 1 and 2 intra-op threads:
//   forward   unfused: batch_matmul(q, kᵀ), fused_scale_causal_softmax (or
//             fused_scale_mask_softmax), batch_matmul(P, v)
//   backward  unfused: batch_matmul(dy, vᵀ) -> dP, batch_matmul(Pᵀ, dy) -> dv,
//             softmax_grad(P, dP) · scale -> dS, batch_matmul(dS, k) -> dq,
//             batch_matmul(dSᵀ, q) -> dk
// Every op runs through RunOp (outputs allocated per call on both sides).
// With --device cuda the same on cuda:0's kernels (each call waits for its
// kernels), where the threads column means nothing and is 1.
// Prints median milliseconds of 7 repeats and fused / unfused ratios (< 1:
// the fused op is faster), and the bytes of scores the unfused path holds
// (B·H·T·S floats, twice: scores and probabilities) that the fused one never
// allocates.
//
//   attention_bench [--quick] [--tsv] [--dropout RATE] [--device cpu|cuda]
// --dropout RATE: attention dropout on both sides (the fused op's
// dropout_rate; a dropout op on the probabilities, and on dP backward).
// --tsv prints, per case and thread count, label, threads and the median ms
// of fused forward, fused backward, unfused forward, unfused backward
// (bench/attention_compare.sh reads it).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/registry.h"

namespace tessera {
namespace {

double Seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Device g_device;       // where the tensors and kernels are
bool g_tsv = false;    // --tsv: one tab-separated line per case
double g_dropout = 0;  // --dropout RATE: attention dropout on both sides

Tensor Filled(const Shape& shape, uint64_t seed) {
  auto t = Tensor::Empty(shape, DType::kF32);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  float* p = t->data<float>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t->NumElements(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<float>(static_cast<double>(x % 20001) / 10000.0 - 1.0);
  }
  if (g_device.type == DeviceType::kCpu) return *t;
  auto on_device = Tensor::Empty(shape, DType::kF32, g_device);
  TESSERA_CHECK(on_device.ok(), on_device.status().ToString());
  const absl::Status copied = on_device->CopyFrom(*t);
  TESSERA_CHECK(copied.ok(), copied.ToString());
  return *on_device;
}

std::vector<Tensor> Run(const std::string& op, const std::vector<Tensor>& in, const ops::AttrMap& attrs,
                        ThreadPool* pool) {
  ops::EagerOptions options;
  options.pool = pool;
  options.device = g_device;
  auto out = ops::RunOp(op, in, attrs, options);
  TESSERA_CHECK(out.ok(), out.status().ToString());
  return *std::move(out);
}

double MedianMs(const std::function<void()>& fn, int repeats) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const double start = Seconds();
    fn();
    t.push_back((Seconds() - start) * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Case {
  const char* label;
  int64_t B, H, T, D;
};

void Measure(const Case& c, int threads, int repeats) {
  ThreadPool pool(threads);
  ThreadPool* p = threads > 1 ? &pool : nullptr;
  const Shape shape{c.B, c.H, c.T, c.D};
  const Tensor q = Filled(shape, 1), k = Filled(shape, 2), v = Filled(shape, 3), dy = Filled(shape, 4);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  ops::AttrMap attrs = {{"scale", scale}, {"causal", true}};
  const ops::AttrMap dropout = {{"rate", g_dropout}, {"seed", int64_t{1}}, {"tensor_id", int64_t{2}}};
  if (g_dropout > 0) {
    attrs.Set("dropout_rate", g_dropout);
    attrs.Set("seed", int64_t{1});
    attrs.Set("tensor_id", int64_t{2});
  }
  std::vector<Tensor> fused = Run("flash_attention", {q, k, v}, attrs, p);
  const double fused_fwd = MedianMs([&] { fused = Run("flash_attention", {q, k, v}, attrs, p); }, repeats);
  const double fused_bwd = MedianMs(
      [&] {
        Run("flash_attention_grad", {q, k, v, fused[0], fused[1], dy}, attrs, p);
      },
      repeats);
  Tensor probs, dropped;
  const double unfused_fwd = MedianMs(
      [&] {
        const Tensor scores = Run("batch_matmul", {q, k}, {{"transpose_b", true}}, p)[0];
        probs = Run("fused_scale_causal_softmax", {scores}, {{"scale", scale}}, p)[0];
        dropped = g_dropout > 0 ? Run("dropout", {probs}, dropout, p)[0] : probs;
        Run("batch_matmul", {dropped, v}, {}, p);
      },
      repeats);
  const double unfused_bwd = MedianMs(
      [&] {
        Tensor dp = Run("batch_matmul", {dy, v}, {{"transpose_b", true}}, p)[0];
        Run("batch_matmul", {dropped, dy}, {{"transpose_a", true}}, p);
        if (g_dropout > 0) dp = Run("dropout", {dp}, dropout, p)[0];  // the dropout's backward
        const Tensor ds = Run("scalar_mul", {Run("softmax_grad", {probs, dp}, {}, p)[0]}, {{"value", scale}}, p)[0];
        Run("batch_matmul", {ds, k}, {}, p);
        Run("batch_matmul", {ds, q}, {{"transpose_a", true}}, p);
      },
      repeats);
  const double scores_mib = 2.0 * static_cast<double>(c.B * c.H * c.T * c.T) * 4 / (1 << 20);
  if (g_tsv) {
    std::printf("%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\n", c.label, threads, fused_fwd, fused_bwd, unfused_fwd, unfused_bwd);
    std::fflush(stdout);
    return;
  }
  std::printf(
      "%-28s %d thr  fwd %8.2f vs %8.2f ms (%.2fx)  bwd %8.2f vs %8.2f ms (%.2fx)  fwd+bwd %.2fx  "
      "scores not held: %.0f MiB\n",
      c.label, threads, fused_fwd, unfused_fwd, fused_fwd / unfused_fwd, fused_bwd, unfused_bwd,
      fused_bwd / unfused_bwd, (fused_fwd + fused_bwd) / (unfused_fwd + unfused_bwd), scores_mib);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--tsv") == 0) {
      tessera::g_tsv = true;
    } else if (std::strcmp(argv[i], "--dropout") == 0 && i + 1 < argc) {
      char* end = nullptr;
      tessera::g_dropout = std::strtod(argv[++i], &end);
      if (*end != '\0' || !(tessera::g_dropout >= 0 && tessera::g_dropout < 1)) {
        std::fprintf(stderr, "attention_bench: --dropout takes a rate in [0, 1), got '%s'\n", argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "cuda") == 0) {
      tessera::g_device = tessera::Device{tessera::DeviceType::kCuda, 0};
      ++i;
    } else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "cpu") == 0) {
      ++i;
    } else {
      std::fprintf(stderr,
                   "attention_bench: unknown argument '%s' (usage: attention_bench [--quick] [--tsv] [--dropout RATE] "
                   "[--device cpu|cuda])\n",
                   argv[i]);
      return 2;
    }
  }
  const bool gpu = tessera::g_device.type == tessera::DeviceType::kCuda;
  const std::vector<tessera::Case> cases = {
      {"gpt2_nano (16,4,32,16)", 16, 4, 32, 16},
      {"BERT-base seq 128 (8,12,128,64)", 8, 12, 128, 64},
      {"GPT-2 seq 1024 (1,12,1024,64)", 1, 12, 1024, 64},
  };
  if (!tessera::g_tsv) {
    std::printf(
        "fused (flash_attention) vs unfused ops, causal, attention dropout %g, %s kernels; median ms; ratio "
        "fused/unfused\n",
        tessera::g_dropout, gpu ? "cuda:0" : "CPU");
  }
  for (const tessera::Case& c : cases) {
    for (int threads : {1, 2}) {
      if (gpu && threads > 1) continue;
      tessera::Measure(c, threads, quick ? 3 : 7);
    }
  }
  if (gpu) {  // GPT-2 124M's attention at micro-batch 8
    tessera::Measure({"GPT-2 124M mb 8 (8,12,1024,64)", 8, 12, 1024, 64}, 1, quick ? 3 : 7);
  }
  return 0;
}
