// Fused attention (flash_attention and its gradient op) against the unfused
// ops the models run without model.fused_attention, measured in the same
// run on the CPU kernels, 1 and 2 intra-op threads:
//   forward   unfused: batch_matmul(q, kᵀ), fused_scale_causal_softmax (or
//             fused_scale_mask_softmax), batch_matmul(P, v)
//   backward  unfused: batch_matmul(dy, vᵀ) -> dP, batch_matmul(Pᵀ, dy) -> dv,
//             softmax_grad(P, dP) · scale -> dS, batch_matmul(dS, k) -> dq,
//             batch_matmul(dSᵀ, q) -> dk
// Every op runs through RunKernel on tensors allocated once, before the
// timing (outputs, intermediates and workspaces, as the actor runtime's
// arena holds them). With --device cuda the same on cuda:0's kernels (each
// call waits for its kernels), where the threads column means nothing and
// is 1.
// Prints median milliseconds of 7 repeats and fused / unfused ratios (< 1:
// the fused op is faster), and the bytes of scores the unfused path holds
// (B·H·T·S floats, twice: scores and probabilities) that the fused one never
// allocates.
//
//   attention_bench [--quick] [--tsv] [--amp] [--dropout RATE] [--device cpu|cuda]
// --dropout RATE: attention dropout on both sides (the fused op's
// dropout_rate; a dropout op on the probabilities, and on dP backward).
// --amp: both sides as train.amp.enabled=true runs them (graph/passes/amp.cc):
// each batch_matmul's inputs cast to bf16 first; the fused op's q, k, v
// cast to bf16 (on GPUs its tensor-core kernels), its bf16 dq, dk, dv cast
// back to f32; the casts timed with them.
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

Device g_device;       // where the tensors and kernels are
bool g_tsv = false;    // --tsv: one tab-separated line per case
double g_dropout = 0;  // --dropout RATE: attention dropout on both sides
bool g_amp = false;    // --amp: products and the fused op in bf16, as under AMP

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

// A sequence of calls, each reading earlier ones' outputs.
class Sequence {
 public:
  explicit Sequence(ThreadPool* pool) : pool_(pool) {}
  // Appends `op` on `inputs`; returns its first output (all of them in
  // `outputs` when given).
  Tensor Add(const std::string& op, std::vector<Tensor> inputs, const ops::AttrMap& attrs = {},
             std::vector<Tensor>* outputs = nullptr) {
    calls_.push_back(bench::MakeKernelCall(op, std::move(inputs), attrs, pool_, g_device));
    if (outputs != nullptr) *outputs = calls_.back()->ctx.outputs;
    return calls_.back()->ctx.outputs[0];
  }
  // A product's input as the products take it: cast to bf16 under --amp.
  Tensor ProductInput(const Tensor& t) { return g_amp ? Add("cast", {t}, {{"dtype", DType::kBF16}}) : t; }
  void Run() {
    for (auto& call : calls_) bench::Run(*call);
  }

 private:
  ThreadPool* pool_;
  std::vector<std::unique_ptr<bench::KernelCall>> calls_;
};

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
  // Fused: under --amp q, k, v cast to bf16 first (the op then runs on
  // tensor cores on GPUs), and dq, dk, dv (bf16) cast back to f32 after, as
  // the casts' gradients do.
  Sequence fused_forward(p), fused_backward(p);
  const Tensor q16 = fused_forward.ProductInput(q), k16 = fused_forward.ProductInput(k),
               v16 = fused_forward.ProductInput(v);
  std::vector<Tensor> fused_out;
  fused_forward.Add("flash_attention", {q16, k16, v16}, attrs, &fused_out);
  std::vector<Tensor> fused_grads;
  fused_backward.Add("flash_attention_grad", {q16, k16, v16, fused_out[0], fused_out[1], dy}, attrs, &fused_grads);
  if (g_amp) {
    for (const Tensor& grad : fused_grads) fused_backward.Add("cast", {grad}, {{"dtype", DType::kF32}});
  }
  const double fused_fwd = MedianMs([&] { fused_forward.Run(); }, repeats);
  const double fused_bwd = MedianMs([&] { fused_backward.Run(); }, repeats);
  Sequence unfused_forward(p), unfused_backward(p);
  Sequence& f = unfused_forward;
  const Tensor scores = f.Add("batch_matmul", {f.ProductInput(q), f.ProductInput(k)}, {{"transpose_b", true}});
  const Tensor probs = f.Add("fused_scale_causal_softmax", {scores}, {{"scale", scale}});
  const Tensor dropped = g_dropout > 0 ? f.Add("dropout", {probs}, dropout) : probs;
  f.Add("batch_matmul", {f.ProductInput(dropped), f.ProductInput(v)});
  Sequence& b = unfused_backward;
  Tensor dp = b.Add("batch_matmul", {b.ProductInput(dy), b.ProductInput(v)}, {{"transpose_b", true}});
  b.Add("batch_matmul", {b.ProductInput(dropped), b.ProductInput(dy)}, {{"transpose_a", true}});
  if (g_dropout > 0) dp = b.Add("dropout", {dp}, dropout);  // the dropout's backward
  const Tensor ds = b.Add("scalar_mul", {b.Add("softmax_grad", {probs, dp})}, {{"value", scale}});
  b.Add("batch_matmul", {b.ProductInput(ds), b.ProductInput(k)});
  b.Add("batch_matmul", {b.ProductInput(ds), b.ProductInput(q)}, {{"transpose_a", true}});
  const double unfused_fwd = MedianMs([&] { unfused_forward.Run(); }, repeats);
  const double unfused_bwd = MedianMs([&] { unfused_backward.Run(); }, repeats);
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
    } else if (std::strcmp(argv[i], "--amp") == 0) {
      tessera::g_amp = true;
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
      return tessera::bench::Usage("attention_bench", "[--quick] [--tsv] [--amp] [--dropout RATE] [--device cpu|cuda]",
                                   argv[i]);
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
        "fused (flash_attention) vs unfused ops%s, causal, attention dropout %g, %s kernels; median ms; ratio "
        "fused/unfused\n",
        tessera::g_amp ? " (products and fused op in bf16, as under AMP)" : "", tessera::g_dropout,
        gpu ? "cuda:0" : "CPU");
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
