// Compile time (DESIGN §13: a 48-layer GPT job compiles to a plan in under
// 2 s). The job: a GPT-2-style decoder written with the builder API, 48
// layers, hidden 1024, 16 heads, sequence 1024, batch 8, vocabulary 50304
// (GPT-2's 50257 padded to a multiple of 128), tied input / output
// embedding. Shapes only drive inference: nothing is allocated or executed.
//
// Phases, chained as tessera::Engine and the trainer do (train/engine.cc):
//   build      GraphBuilder calls + Finish (forward graph, loss marked)
//   autodiff   graph::Autodiff
//   optimizer  graph::ApplyOptimizer (AdamW, weight decay 0.1, global-norm
//              clipping at 1.0)
//   dce        graph::EliminateDeadCode
//   lower      scheduler::LowerToPlan (one device)
//   serialise  comm::SerializePlan (what a worker receives, DESIGN §2)
// Each phase is timed separately; the whole sequence runs kRepetitions times
// and the median of each phase and of the per-repetition totals is printed,
// with the total's ratio to the target (<= 1 meets it).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/bench_args.h"
#include "comm/proto/plan_codec.h"
#include "core/status.h"
#include "core/text.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "scheduler/lower.h"

namespace tessera {
namespace {

constexpr double kTargetSeconds = 2.0;
constexpr int kRepetitions = 5;

// B batch, T sequence, C hidden, NH heads, HS head size, V vocabulary.
constexpr int64_t kLayers = 48;
constexpr int64_t B = 8;
constexpr int64_t T = 1024;
constexpr int64_t C = 1024;
constexpr int64_t NH = 16;
constexpr int64_t HS = C / NH;
constexpr int64_t V = 50304;

using graph::GraphBuilder;
using graph::InitRule;
using graph::Sym;

// ln(x) with its own weight and bias: (B*T, C) -> (B*T, C).
Sym LayerNorm(GraphBuilder& b, const std::string& name, const Sym& x) {
  auto scope = b.Scope(name);
  Sym weight = b.Variable("weight", {C}, InitRule::Ones());
  Sym bias = b.Variable("bias", {C}, InitRule::Zeros());
  return b.Op("layer_norm", {x, weight, bias}).at(0);
}

// x @ weight + bias, weight (in, out) ~ N(0, 0.02^2).
Sym Linear(GraphBuilder& b, const std::string& name, const Sym& x, int64_t in, int64_t out, int64_t* tensor_id) {
  auto scope = b.Scope(name);
  Sym weight = b.Variable("weight", {in, out}, InitRule::Normal(0, 0.02, 1, (*tensor_id)++));
  Sym bias = b.Variable("bias", {out}, InitRule::Zeros());
  return graph::BiasAdd(graph::Matmul(x, weight), bias);
}

// (B*T, C) -> (B, NH, T, HS)
Sym SplitHeads(const Sym& x) { return graph::Transpose(graph::Reshape(x, Shape{B, T, NH, HS}), {0, 2, 1, 3}); }

absl::StatusOr<graph::Graph> BuildGpt() {
  GraphBuilder b;
  int64_t tensor_id = 0;
  Sym ids = b.Input("ids", {DType::kI64, Shape{B, T}});           // (B, T)
  Sym labels = b.Input("labels", {DType::kI64, Shape{B * T}});    // (B*T,)
  Sym positions = b.Apply("arange", {}, {{"n", T}, {"dtype", DType::kI64}});  // (T,)
  Sym wte = b.Variable("wte.weight", {V, C}, InitRule::Normal(0, 0.02, 1, tensor_id++));
  Sym wpe = b.Variable("wpe.weight", {T, C}, InitRule::Normal(0, 0.01, 1, tensor_id++));
  Sym x = b.Apply("embedding", {wte, ids}) + b.Apply("embedding", {wpe, positions});  // (B, T, C)
  x = graph::Reshape(x, Shape{B * T, C});                                            // (B*T, C)
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    auto block = b.Scope(StrCat("h.", layer), layer);
    Sym ln_1 = LayerNorm(b, "ln_1", x);
    {
      auto attn = b.Scope("attn");
      Sym qkv = Linear(b, "c_attn", ln_1, C, 3 * C, &tensor_id);  // (B*T, 3C)
      std::vector<Sym> parts = b.Op("split", {qkv}, {{"axis", int64_t{1}}, {"sizes", std::vector<int64_t>{C, C, C}}});
      if (parts.size() != 3) break;  // the builder holds the error
      Sym q = SplitHeads(parts[0]), k = SplitHeads(parts[1]), v = SplitHeads(parts[2]);  // (B, NH, T, HS)
      Sym scores = graph::BatchMatmul(q, k, {.transpose_b = true});                        // (B, NH, T, T)
      Sym probs = b.Apply("fused_scale_causal_softmax", {scores},
                          {{"scale", 1.0 / std::sqrt(static_cast<double>(HS))}});
      Sym y = graph::BatchMatmul(probs, v);                                       // (B, NH, T, HS)
      y = graph::Reshape(graph::Transpose(y, {0, 2, 1, 3}), Shape{B * T, C});    // (B*T, C)
      x = x + Linear(b, "c_proj", y, C, C, &tensor_id);
    }
    Sym ln_2 = LayerNorm(b, "ln_2", x);
    {
      auto mlp = b.Scope("mlp");
      Sym h = graph::Gelu(Linear(b, "c_fc", ln_2, C, 4 * C, &tensor_id), "tanh");  // (B*T, 4C)
      x = x + Linear(b, "c_proj", h, 4 * C, C, &tensor_id);
    }
  }
  Sym logits = graph::Matmul(LayerNorm(b, "ln_f", x), wte, {.transpose_b = true});  // (B*T, V)
  b.MarkLoss(graph::ReduceMean(graph::SparseSoftmaxCrossEntropy(logits, labels)));
  return b.Finish();
}

// Seconds of one phase: wall clock, and CPU time of the process (the
// passes are single-threaded, so on a machine shared with other jobs the CPU
// time is what the phase costs and the wall time what it took).
struct Time {
  double wall = 0, cpu = 0;
};

struct Sample {
  Time build, autodiff, optimizer, dce, lower, serialise;
  Time total() const {
    Time t;
    for (const Time* p : {&build, &autodiff, &optimizer, &dce, &lower, &serialise}) {
      t.wall += p->wall;
      t.cpu += p->cpu;
    }
    return t;
  }
  int64_t forward_nodes = 0, nodes = 0, tasks = 0, register_descs = 0, plan_bytes = 0;
};

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Stamp {
  std::chrono::steady_clock::time_point wall;
  double cpu;
};
Stamp Now() { return {std::chrono::steady_clock::now(), CpuSeconds()}; }
Time Since(const Stamp& start) {
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - start.wall).count(), CpuSeconds() - start.cpu};
}

absl::StatusOr<Sample> CompileOnce() {
  Sample s;
  auto start = Now();
  ASSIGN_OR_RETURN(graph::Graph graph, BuildGpt());
  s.build = Since(start);
  s.forward_nodes = graph.num_nodes();

  start = Now();
  ASSIGN_OR_RETURN(graph::GradientMap gradients, graph::Autodiff(graph));
  s.autodiff = Since(start);

  graph::OptimizerOptions adamw;
  adamw.kind = graph::OptimizerKind::kAdamW;
  adamw.weight_decay = 0.1;
  adamw.beta2 = 0.95;
  adamw.clip_grad_max_norm = 1.0;
  start = Now();
  ASSIGN_OR_RETURN(graph::OptimizerResult optimizer, graph::ApplyOptimizer(graph, gradients, adamw));
  s.optimizer = Since(start);
  (void)optimizer;

  start = Now();
  ASSIGN_OR_RETURN(std::vector<graph::ValueId> remap, graph::EliminateDeadCode(graph));
  s.dce = Since(start);
  (void)remap;
  s.nodes = graph.num_nodes();

  start = Now();
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, scheduler::LowerToPlan(graph, {}));
  s.lower = Since(start);
  s.tasks = lowered.plan.tasks_size();
  s.register_descs = lowered.plan.register_descs_size();

  start = Now();
  const std::string bytes = comm::SerializePlan(lowered.plan);
  s.serialise = Since(start);
  s.plan_bytes = static_cast<int64_t>(bytes.size());
  return s;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  if (argc > 1) return bench::Usage("compile_bench", "(no arguments): compile and lowering times", argv[1]);
  std::vector<Sample> samples;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    absl::StatusOr<Sample> s = CompileOnce();
    if (!s.ok()) {
      std::fprintf(stderr, "compile: %s\n", s.status().ToString().c_str());
      return 1;
    }
    samples.push_back(*s);
  }
  const Sample& first = samples.front();
  std::printf("GPT: %lld layers, hidden %lld, %lld heads, seq %lld, batch %lld, vocab %lld; AdamW + clipping; one device\n",
              static_cast<long long>(kLayers), static_cast<long long>(C), static_cast<long long>(NH),
              static_cast<long long>(T), static_cast<long long>(B), static_cast<long long>(V));
  std::printf("graph: %lld forward nodes, %lld nodes after autodiff + optimizer + dce; plan: %lld tasks, %lld register descs, %lld bytes\n",
              static_cast<long long>(first.forward_nodes), static_cast<long long>(first.nodes),
              static_cast<long long>(first.tasks), static_cast<long long>(first.register_descs),
              static_cast<long long>(first.plan_bytes));
  std::printf("median of %d repetitions: wall ms (min), process CPU ms (min)\n", kRepetitions);
  auto median_of = [&](auto get, double* median, double* min) {
    std::vector<double> values;
    for (const Sample& s : samples) values.push_back(get(s));
    *median = Median(values);
    *min = *std::min_element(values.begin(), values.end());
  };
  auto phase = [&](const char* name, auto get) {
    double wall, wall_min, cpu, cpu_min;
    median_of([&](const Sample& s) { return get(s).wall; }, &wall, &wall_min);
    median_of([&](const Sample& s) { return get(s).cpu; }, &cpu, &cpu_min);
    std::printf("  %-10s wall %8.1f ms (%7.1f)  cpu %8.1f ms (%7.1f)", name, wall * 1e3, wall_min * 1e3, cpu * 1e3,
                cpu_min * 1e3);
    return std::pair<double, double>{wall, cpu};
  };
  auto line = [&](const char* name, Time Sample::*field) {
    phase(name, [&](const Sample& s) { return s.*field; });
    std::printf("\n");
  };
  line("build", &Sample::build);
  line("autodiff", &Sample::autodiff);
  line("optimizer", &Sample::optimizer);
  line("dce", &Sample::dce);
  line("lower", &Sample::lower);
  line("serialise", &Sample::serialise);
  const auto [wall, cpu] = phase("total", [](const Sample& s) { return s.total(); });
  std::printf("   target < %.0f s: wall %.3fx, cpu %.3fx target (<= 1 meets it)\n", kTargetSeconds, wall / kTargetSeconds,
              cpu / kTargetSeconds);
  return 0;
}
