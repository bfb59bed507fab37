// nn/ layers: forward on small shapes against plain-loop references (graphs
// run by the reference interpreter), gradients present for every parameter,
// SBP hints as the convention says, names as Hugging Face's, scopes and
// layer_idx on nodes, dropout streams, errors.
// Shapes: B batch, T sequence, C hidden, H heads, D = C / H, V vocabulary.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/passes.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/transformer.h"
#include "tests/graph/graph_interpreter.h"
#include "tests/nn/reference.h"

namespace tessera::nn {
namespace {

using graph::Graph;
using graph::testing::GraphInterpreter;
using ::tessera::nn::testing::Add;
using ::tessera::nn::testing::AttentionRef;
using ::tessera::nn::testing::Floats;
using ::tessera::nn::testing::LayerNormRef;
using ::tessera::nn::testing::MatmulRef;
using ::tessera::nn::testing::MlpRef;

Floats RandomFloats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  Floats out(static_cast<size_t>(n));
  for (float& v : out) v = u(rng);
  return out;
}

// The graph's values after one run with every variable set to random values
// in [-0.5, 0.5) (so zero biases and unit norms do not hide mistakes).
struct RunResult {
  std::vector<Tensor> values;
  std::map<std::string, Floats> variables;
  Floats at(const Sym& s) const { return values[static_cast<size_t>(s.id())].ToVector<float>(); }
  Floats at(graph::ValueId id) const { return values[static_cast<size_t>(id)].ToVector<float>(); }
};

RunResult RunWithRandomVariables(const Graph& graph, const std::map<std::string, Tensor>& feeds, uint32_t seed,
                                 int64_t step = 0) {
  GraphInterpreter interpreter(graph);
  RunResult r;
  EXPECT_TRUE(interpreter.InitVariables().ok());
  for (graph::ValueId id : graph.Variables()) {
    const graph::Value& v = graph.value(id);
    Floats data = RandomFloats(v.meta.shape.NumElements(), seed++, 0.5f);
    EXPECT_TRUE(interpreter.SetVariable(v.name, Tensor::FromVector(v.meta.shape, data)).ok());
    r.variables[v.name] = std::move(data);
  }
  auto values = interpreter.Run(feeds, step);
  EXPECT_TRUE(values.ok()) << values.status();
  if (values.ok()) r.values = *std::move(values);
  return r;
}

void ExpectNear(const Floats& got, const Floats& want, double tol = 1e-4) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
  }
}

// A root module holding one child under a given name, so tests can check
// dotted names ("h.0.attn.c_attn.weight").
template <typename Child>
class Holder : public Module {
 public:
  template <typename... Args>
  explicit Holder(std::string name, Args&&... args) : Module(0), child(std::forward<Args>(args)...) {
    RegisterModule(std::move(name), child);
  }
  Child child;
};

std::map<std::string, NamedParameter> ByName(const Module& m) {
  std::map<std::string, NamedParameter> out;
  for (const NamedParameter& p : m.NamedParameters()) out.emplace(p.name, p);
  return out;
}

// Every trainable variable gets a gradient from the loss `sum(y * r)`.
void ExpectGradientsForEveryParameter(Graph graph, graph::ValueId y) {
  auto r = graph.AddOp("normal", {}, {{"shape", graph.value(y).meta.shape.dims()}, {"seed", int64_t{5}}, {"tensor_id", int64_t{1}}});
  ASSERT_TRUE(r.ok()) << r.status();
  auto prod = graph.AddOp("mul", {y, r->front()});
  ASSERT_TRUE(prod.ok());
  auto loss = graph.AddOp("reduce_sum", {prod->front()});
  ASSERT_TRUE(loss.ok());
  auto grads = graph::Autodiff(graph, loss->front());
  ASSERT_TRUE(grads.ok()) << grads.status();
  for (graph::ValueId v : graph.Variables()) {
    if (!graph.variable_info(v).trainable) continue;
    EXPECT_TRUE(grads->contains(v)) << graph.value(v).name << " has no gradient";
  }
}

// ---- naming, hints, layer_idx

TEST(Module, NamesFollowTheModuleTreeAsHuggingFace) {
  Holder<TransformerLayer> root("h.0", 8, 2, 32, TransformerLayerOptions{.layer_idx = 0});
  const std::vector<NamedParameter> params = root.NamedParameters();
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  const std::vector<std::string> want = {
      "h.0.ln_1.weight",        "h.0.ln_1.bias",           "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
      "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias",    "h.0.ln_2.weight",        "h.0.ln_2.bias",
      "h.0.mlp.c_fc.weight",    "h.0.mlp.c_fc.bias",       "h.0.mlp.c_proj.weight",  "h.0.mlp.c_proj.bias"};
  EXPECT_EQ(names, want);
  for (const auto& p : params) EXPECT_FALSE(p.value.valid()) << "declared, not materialised: " << p.name;

  // Materialised names ignore the caller's builder scope.
  GraphBuilder b;
  auto outer = b.Scope("outer");
  Sym x = b.Input("x", {DType::kF32, Shape{2, 3, 8}});
  Sym y = root.child(x);
  ASSERT_TRUE(b.status().ok()) << b.status();
  EXPECT_EQ(y.shape(), (Shape{2, 3, 8}));
  for (const auto& p : root.NamedParameters()) {
    ASSERT_TRUE(p.value.valid()) << p.name;
    EXPECT_EQ(b.graph().value(p.value.id()).name, p.name);
  }
}

TEST(Module, HintsFollowTheConvention) {
  const NdSbp BB = {Sbp::Broadcast(), Sbp::Broadcast()};
  auto BS = [](int axis) { return NdSbp{Sbp::Broadcast(), Sbp::Split(axis)}; };
  Linear col(4, 6, {.parallel = Parallel::kColumn});
  Linear row(6, 4, {.parallel = Parallel::kRow});
  Linear data(4, 4, {.parallel = Parallel::kData});
  Linear no_bias(4, 4, {.parallel = Parallel::kColumn, .bias = false});
  auto hints = [](const Module& m) {
    std::map<std::string, NdSbp> out;
    for (const auto& p : m.NamedParameters()) out[p.name] = p.spec->sbp;
    return out;
  };
  EXPECT_EQ(hints(col), (std::map<std::string, NdSbp>{{"weight", BS(1)}, {"bias", BS(0)}}));
  EXPECT_EQ(hints(row), (std::map<std::string, NdSbp>{{"weight", BS(0)}, {"bias", BB}}));
  EXPECT_EQ(hints(data), (std::map<std::string, NdSbp>{{"weight", BB}, {"bias", BB}}));
  EXPECT_EQ(hints(no_bias), (std::map<std::string, NdSbp>{{"weight", BS(1)}}));
  EXPECT_EQ(hints(VocabEmbedding(10, 4)), (std::map<std::string, NdSbp>{{"weight", BS(0)}}));
  EXPECT_EQ(hints(Embedding(10, 4)), (std::map<std::string, NdSbp>{{"weight", BB}}));
  EXPECT_EQ(hints(LayerNorm(4)), (std::map<std::string, NdSbp>{{"weight", BB}, {"bias", BB}}));

  Holder<TransformerLayer> block("h", 8, 2, 32, TransformerLayerOptions{});
  const std::map<std::string, NdSbp> want = {
      {"h.ln_1.weight", BB},         {"h.ln_1.bias", BB},       {"h.attn.c_attn.weight", BS(2)},
      {"h.attn.c_attn.bias", BS(1)}, {"h.attn.c_proj.weight", BS(0)}, {"h.attn.c_proj.bias", BB},
      {"h.ln_2.weight", BB},         {"h.ln_2.bias", BB},       {"h.mlp.c_fc.weight", BS(1)},
      {"h.mlp.c_fc.bias", BS(0)},    {"h.mlp.c_proj.weight", BS(0)}, {"h.mlp.c_proj.bias", BB}};
  EXPECT_EQ(hints(block), want);
  const std::map<std::string, NamedParameter> p = ByName(block);
  EXPECT_EQ(p.at("h.attn.c_attn.weight").spec->shape, (Shape{8, 3, 8}));
  EXPECT_EQ(p.at("h.attn.c_attn.bias").spec->shape, (Shape{3, 8}));

  // The hints reach the graph's variables.
  GraphBuilder b;
  block.child(b.Input("x", {DType::kF32, Shape{1, 2, 8}}));
  ASSERT_TRUE(b.status().ok()) << b.status();
  for (const auto& [name, sbp] : want) {
    auto id = b.graph().FindVariable(name);
    ASSERT_TRUE(id.ok()) << name;
    ASSERT_TRUE(b.graph().value(*id).sbp_hint.has_value()) << name;
    EXPECT_EQ(*b.graph().value(*id).sbp_hint, sbp) << name;
  }
}

TEST(Module, NodesCarryScopeAndLayerIdx) {
  Holder<TransformerLayer> block("h.3", 8, 2, 32, TransformerLayerOptions{.layer_idx = 3});
  LayerNorm last(8, {.layer_idx = -1});
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{1, 2, 8}});
  Sym y = last(block.child(x));
  ASSERT_TRUE(b.status().ok()) << b.status();
  int block_ops = 0;
  for (const graph::Node& n : b.graph().nodes()) {
    if (n.kind == graph::NodeKind::kInput) continue;
    if (n.scope.starts_with("h.3")) {
      EXPECT_EQ(n.layer_idx, 3) << n.op << " in " << n.scope;
      ++block_ops;
    } else {
      EXPECT_EQ(n.layer_idx, -1) << n.op << " in " << n.scope;
    }
  }
  EXPECT_GT(block_ops, 20);
  EXPECT_EQ(b.graph().producer(y.id()).layer_idx, -1);
  const graph::Node& qkv_split = b.graph().producer(ByName(block).at("h.3.attn.c_attn.weight").value.id());
  EXPECT_EQ(qkv_split.layer_idx, 3);
  EXPECT_EQ(qkv_split.scope, "h.3.attn.c_attn");
}

TEST(Module, ParseParallel) {
  EXPECT_EQ(*ParseParallel("col"), Parallel::kColumn);
  EXPECT_EQ(*ParseParallel("row"), Parallel::kRow);
  EXPECT_EQ(*ParseParallel("data"), Parallel::kData);
  EXPECT_FALSE(ParseParallel("column").ok());
  EXPECT_EQ(ParallelName(Parallel::kRow), "row");
}

TEST(Module, StreamKeysAreStableAndDistinct) {
  EXPECT_EQ(StreamKey("h.0.attn.c_attn.weight"), StreamKey("h.0.attn.c_attn.weight"));
  std::set<int64_t> keys;
  for (int i = 0; i < 48; ++i) {
    for (const char* part : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight",
                             "attn.attn_dropout#0", "attn.resid_dropout#0", "mlp.dropout#0"}) {
      const int64_t key = StreamKey("h." + std::to_string(i) + "." + part);
      EXPECT_GE(key, 0);
      EXPECT_LE(key, int64_t{0xffffffff});
      keys.insert(key);
    }
  }
  EXPECT_EQ(keys.size(), 48u * 7u);
}

// ---- forward against references, gradients

TEST(Linear, ForwardMatchesReferenceAndHasGradients) {
  const int64_t B = 2, T = 3, in = 5, out = 7;
  for (Parallel parallel : {Parallel::kColumn, Parallel::kRow, Parallel::kData}) {
    for (bool bias : {true, false}) {
      Holder<Linear> root("fc", in, out, LinearOptions{.parallel = parallel, .bias = bias});
      GraphBuilder b;
      Sym x = b.Input("x", {DType::kF32, Shape{B, T, in}});
      Sym y = root.child(x);
      Sym y2 = root.child.ForwardWithoutBias(b.Input("x2", {DType::kF32, Shape{B * T, in}}));
      ASSERT_TRUE(b.status().ok()) << b.status();
      EXPECT_EQ(y.shape(), (Shape{B, T, out}));
      EXPECT_EQ(y2.shape(), (Shape{B * T, out}));
      EXPECT_EQ(b.graph().Variables().size(), bias ? 2u : 1u);  // a second call reuses the variables
      auto graph = b.Finish();
      ASSERT_TRUE(graph.ok());
      const Floats xs = RandomFloats(B * T * in, 1);
      const RunResult r = RunWithRandomVariables(
          *graph, {{"x", Tensor::FromVector(Shape{B, T, in}, xs)}, {"x2", Tensor::FromVector(Shape{B * T, in}, xs)}}, 7);
      const Floats* b_ptr = bias ? &r.variables.at("fc.bias") : nullptr;
      ExpectNear(r.at(y), MatmulRef(xs, r.variables.at("fc.weight"), B * T, in, out, b_ptr));
      ExpectNear(r.at(y2), MatmulRef(xs, r.variables.at("fc.weight"), B * T, in, out));
      ExpectGradientsForEveryParameter(*graph, y.id());
    }
  }
}

TEST(Embedding, ForwardMatchesReference) {
  Holder<VocabEmbedding> root("wte", 11, 4);
  GraphBuilder b;
  Sym ids = b.Input("ids", {DType::kI64, Shape{2, 3}});
  Sym y = root.child(ids);
  ASSERT_TRUE(b.status().ok()) << b.status();
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok());
  const std::vector<int64_t> id_values = {0, 10, 3, 3, 7, 1};
  const RunResult r = RunWithRandomVariables(*graph, {{"ids", Tensor::FromVector(Shape{2, 3}, id_values)}}, 3);
  const Floats& w = r.variables.at("wte.weight");
  Floats want;
  for (int64_t id : id_values) want.insert(want.end(), w.begin() + id * 4, w.begin() + id * 4 + 4);
  ExpectNear(r.at(y), want);
  ExpectGradientsForEveryParameter(*graph, y.id());
}

TEST(LayerNorm, ForwardMatchesReference) {
  Holder<LayerNorm> root("ln", 6, LayerNormOptions{.eps = 1e-3});
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{2, 3, 6}});
  Sym y = root.child(x);
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Floats xs = RandomFloats(36, 2, 3.0f);
  const RunResult r = RunWithRandomVariables(*graph, {{"x", Tensor::FromVector(Shape{2, 3, 6}, xs)}}, 11);
  ExpectNear(r.at(y), LayerNormRef(xs, 6, 6, r.variables.at("ln.weight"), r.variables.at("ln.bias"), 1e-3));
  ExpectGradientsForEveryParameter(*graph, y.id());
}

TEST(MLP, ForwardMatchesReference) {
  const int64_t B = 2, T = 3, C = 4, F = 16;
  Holder<MLP> root("mlp", C, F, MlpOptions{});
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{B, T, C}});
  Sym y = root.child(x);
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Floats xs = RandomFloats(B * T * C, 4);
  const RunResult r = RunWithRandomVariables(*graph, {{"x", Tensor::FromVector(Shape{B, T, C}, xs)}}, 21);
  const auto& v = r.variables;
  ExpectNear(r.at(y), MlpRef(xs, B * T, C, F, v.at("mlp.c_fc.weight"), v.at("mlp.c_fc.bias"),
                             v.at("mlp.c_proj.weight"), v.at("mlp.c_proj.bias")));
  ExpectGradientsForEveryParameter(*graph, y.id());
}

TEST(MultiheadAttention, CausalAndPaddingMasksMatchReference) {
  const int64_t B = 2, T = 5, C = 8, H = 2;
  for (bool causal : {true, false}) {
    for (bool padded : {false, true}) {
      Holder<MultiheadAttention> root("attn", C, H, AttentionOptions{.causal = causal});
      GraphBuilder b;
      Sym x = b.Input("x", {DType::kF32, Shape{B, T, C}});
      Sym mask = padded ? b.Input("mask", {DType::kBool, Shape{B, T}}) : Sym();
      Sym y = root.child(x, mask);
      auto graph = b.Finish();
      ASSERT_TRUE(graph.ok()) << graph.status();
      const Floats xs = RandomFloats(B * T * C, 5);
      // Sample 0 has its last two tokens padded, sample 1 its first (only the
      // causal-free case may drop a query's every key: not done here).
      const std::vector<bool> keep = {true, true, true, false, false, false, true, true, true, true};
      std::map<std::string, Tensor> feeds = {{"x", Tensor::FromVector(Shape{B, T, C}, xs)}};
      if (padded) {
        Tensor m = *Tensor::Zeros(Shape{B, T}, DType::kBool);
        std::copy(keep.begin(), keep.end(), m.data<bool>());
        feeds["mask"] = m;
      }
      const RunResult r = RunWithRandomVariables(*graph, feeds, 31);
      const auto& v = r.variables;
      const Floats want = AttentionRef(xs, B, T, C, H, v.at("attn.c_attn.weight"), v.at("attn.c_attn.bias"),
                                       v.at("attn.c_proj.weight"), v.at("attn.c_proj.bias"), causal,
                                       padded ? keep : std::vector<bool>{});
      const Floats got = r.at(y);
      if (padded && causal) {
        // Sample 1, query 0 has its only causal key padded: the fused op gives
        // zero probabilities there (output = c_proj's bias), not NaN.
        for (int64_t c = 0; c < C; ++c) {
          EXPECT_NEAR(got[static_cast<size_t>((1 * T + 0) * C + c)], v.at("attn.c_proj.bias")[static_cast<size_t>(c)], 1e-5);
        }
        for (int64_t i = 0; i < B * T * C; ++i) {
          if (i / C == 1 * T + 0) continue;
          ASSERT_NEAR(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 1e-4 * (1 + std::abs(want[static_cast<size_t>(i)])))
              << "element " << i;
        }
      } else {
        ExpectNear(got, want);
      }
      ExpectGradientsForEveryParameter(*graph, y.id());
    }
  }
}

TEST(MultiheadAttention, RejectsIndivisibleHeadsAndBadShapes) {
  {
    Holder<MultiheadAttention> root("attn", 6, 4);
    GraphBuilder b;
    root.child(b.Input("x", {DType::kF32, Shape{1, 2, 6}}));
    EXPECT_NE(b.status().message().find("multiple of the number of heads"), std::string::npos) << b.status();
  }
  {
    Holder<MultiheadAttention> root("attn", 8, 2);
    GraphBuilder b;
    root.child(b.Input("x", {DType::kF32, Shape{2, 8}}));
    EXPECT_NE(b.status().message().find("takes (B, T, 8)"), std::string::npos) << b.status();
  }
}

TEST(TransformerLayer, ForwardMatchesReference) {
  const int64_t B = 2, T = 4, C = 8, H = 2, F = 32;
  Holder<TransformerLayer> root("h.0", C, H, F, TransformerLayerOptions{.layernorm_epsilon = 1e-5});
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{B, T, C}});
  Sym y = root.child(x);
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Floats xs = RandomFloats(B * T * C, 6);
  const RunResult r = RunWithRandomVariables(*graph, {{"x", Tensor::FromVector(Shape{B, T, C}, xs)}}, 41);
  const auto& v = r.variables;
  const Floats a = AttentionRef(LayerNormRef(xs, B * T, C, v.at("h.0.ln_1.weight"), v.at("h.0.ln_1.bias"), 1e-5), B, T,
                                C, H, v.at("h.0.attn.c_attn.weight"), v.at("h.0.attn.c_attn.bias"),
                                v.at("h.0.attn.c_proj.weight"), v.at("h.0.attn.c_proj.bias"), true, {});
  const Floats h = Add(xs, a);
  const Floats m = MlpRef(LayerNormRef(h, B * T, C, v.at("h.0.ln_2.weight"), v.at("h.0.ln_2.bias"), 1e-5), B * T, C,
                          F, v.at("h.0.mlp.c_fc.weight"), v.at("h.0.mlp.c_fc.bias"), v.at("h.0.mlp.c_proj.weight"),
                          v.at("h.0.mlp.c_proj.bias"));
  ExpectNear(r.at(y), Add(h, m));
  ExpectGradientsForEveryParameter(*graph, y.id());
  // The residual stream (both adds) is hinted (S(0), B).
  int hinted_adds = 0;
  for (const graph::Node& n : graph->nodes()) {
    if (n.op != "add" || n.scope != "h.0") continue;
    ASSERT_TRUE(graph->value(n.outputs[0]).sbp_hint.has_value());
    EXPECT_EQ(*graph->value(n.outputs[0]).sbp_hint, BatchSplit());
    ++hinted_adds;
  }
  EXPECT_EQ(hinted_adds, 2);
}

TEST(LossHead, TiedLogitsAndVocabParallelCrossEntropyMatchReference) {
  const int64_t N = 6, C = 4, V = 9;
  Holder<VocabEmbedding> root("wte", V, C);
  LMLogits head;
  ParallelCrossEntropyLoss loss_fn;
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{2, 3, C}});
  Sym labels = b.Input("labels", {DType::kI64, Shape{2, 3}});
  root.child.Materialize(b);
  Sym logits = head(x, root.child.weight());  // (2, 3, V)
  Sym loss = loss_fn(logits, labels);
  ASSERT_TRUE(b.status().ok()) << b.status();
  EXPECT_EQ(logits.shape(), (Shape{2, 3, V}));
  EXPECT_EQ(loss.shape(), Shape{});
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok());
  const Floats xs = RandomFloats(N * C, 8, 2.0f);
  const std::vector<int64_t> ys = {0, 8, 4, 4, 2, 7};
  const RunResult r = RunWithRandomVariables(
      *graph, {{"x", Tensor::FromVector(Shape{2, 3, C}, xs)}, {"labels", Tensor::FromVector(Shape{2, 3}, ys)}}, 51);
  const Floats& w = r.variables.at("wte.weight");  // (V, C)
  Floats want_logits(static_cast<size_t>(N * V));
  double want_loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    double max = -1e30, sum = 0;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += double(xs[static_cast<size_t>(n * C + c)]) * w[static_cast<size_t>(v * C + c)];
      want_logits[static_cast<size_t>(n * V + v)] = static_cast<float>(s);
      max = std::max(max, s);
    }
    for (int64_t v = 0; v < V; ++v) sum += std::exp(want_logits[static_cast<size_t>(n * V + v)] - max);
    want_loss += std::log(sum) + max - want_logits[static_cast<size_t>(n * V + ys[static_cast<size_t>(n)])];
  }
  ExpectNear(r.at(logits), want_logits);
  EXPECT_NEAR(r.at(loss).at(0), want_loss / N, 1e-5);
  ExpectGradientsForEveryParameter(*graph, loss.id());
}

// ---- dropout

TEST(Dropout, RateZeroIsTheIdentity) {
  Dropout drop(0.0);
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4}});
  EXPECT_EQ(drop(x).id(), x.id());
  EXPECT_EQ(b.graph().num_nodes(), 1);
}

TEST(Dropout, EverySiteHasItsOwnLayoutInvariantStream) {
  const int64_t n = 4096;
  Holder<Dropout> a("a", 0.5);
  Holder<Dropout> c("c", 0.5);
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{n}});
  Sym ya = a.child(x), ya2 = a.child(x), yc = c.child(x);
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->producer(ya.id()).attrs.Int("tensor_id"), StreamKey("a#0"));
  EXPECT_EQ(graph->producer(ya2.id()).attrs.Int("tensor_id"), StreamKey("a#1"));
  EXPECT_EQ(graph->producer(yc.id()).attrs.Int("seed"), RandomSeeds{}.dropout);
  const std::map<std::string, Tensor> feeds = {{"x", Tensor::FromVector(Shape{n}, Floats(n, 1.0f))}};
  const RunResult r0 = RunWithRandomVariables(*graph, feeds, 0, /*step=*/0);
  const RunResult again = RunWithRandomVariables(*graph, feeds, 0, /*step=*/0);
  const RunResult r1 = RunWithRandomVariables(*graph, feeds, 0, /*step=*/1);
  const Floats m = r0.at(ya);
  int kept = 0;
  for (float v : m) {
    ASSERT_TRUE(v == 0.0f || v == 2.0f) << v;
    kept += v != 0;
  }
  EXPECT_NEAR(kept, n / 2, 200);
  EXPECT_EQ(m, again.at(ya));       // deterministic
  EXPECT_NE(m, r1.at(ya));          // a new mask every step
  EXPECT_NE(m, r0.at(ya2));         // a second call is another site
  EXPECT_NE(m, r0.at(yc));          // another module is another site
}

TEST(Dropout, SeedsAreInheritedFromTheRoot) {
  Holder<MultiheadAttention> root("attn", 8, 2, AttentionOptions{.attention_dropout_prob = 0.1});
  root.set_seeds({.init = 77, .dropout = 99});
  GraphBuilder b;
  root.child(b.Input("x", {DType::kF32, Shape{1, 2, 8}}));
  ASSERT_TRUE(b.status().ok()) << b.status();
  bool saw_dropout = false;
  for (const graph::Node& n : b.graph().nodes()) {
    if (n.op == "dropout") {
      saw_dropout = true;
      EXPECT_EQ(n.attrs.Int("seed"), 99);
      EXPECT_EQ(n.attrs.Int("tensor_id"), StreamKey("attn.attn_dropout#0"));
    }
    if (n.kind == graph::NodeKind::kVariable && n.variable->init.op == "normal") {
      EXPECT_EQ(n.variable->init.attrs.Int("seed"), 77);
      EXPECT_EQ(n.variable->init.attrs.Int("tensor_id"), StreamKey(b.graph().value(n.outputs[0]).name));
    }
  }
  EXPECT_TRUE(saw_dropout);
}

// ---- errors

TEST(Module, ErrorsAreStickyAndNamed) {
  {
    Linear fc(4, 3);
    GraphBuilder b;
    EXPECT_FALSE(fc(b.Input("x", {DType::kF32, Shape{2, 5}})).valid());
    EXPECT_NE(b.status().message().find("takes (..., 4)"), std::string::npos) << b.status();
    EXPECT_FALSE(b.Finish().ok());
  }
  {
    Linear fc(4, 3);
    GraphBuilder b1, b2;
    EXPECT_TRUE(fc(b1.Input("x", {DType::kF32, Shape{2, 4}})).valid());
    EXPECT_FALSE(fc(b2.Input("x", {DType::kF32, Shape{2, 4}})).valid());
    EXPECT_NE(b2.status().message().find("another GraphBuilder"), std::string::npos) << b2.status();
  }
  {
    Linear fc(4, 3);
    EXPECT_FALSE(fc(Sym()).valid());  // invalid in, invalid out, no crash
  }
}

}  // namespace
}  // namespace tessera::nn
