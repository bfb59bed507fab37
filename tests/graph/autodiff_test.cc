// Autodiff: gradients of the symbolic backward graph, run by the reference
// interpreter, against central finite differences of the loss.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/status.h"
#include "core/text.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/eager.h"
#include "tests/graph/graph_interpreter.h"
#include "tests/graph/test_mlp.h"

namespace tessera::graph {
namespace {

using testing::GraphInterpreter;

double RunLoss(GraphInterpreter& interpreter, const std::map<std::string, Tensor>& feeds, ValueId loss) {
  auto values = interpreter.Run(feeds);
  EXPECT_TRUE(values.ok()) << values.status();
  return (*values)[static_cast<size_t>(loss)].ToDoubleVector().at(0);
}

// Checks every element of every gradient in `gradients` (computed by the
// graph, run by the interpreter) against central differences of `loss`.
void ExpectGradientsMatchFiniteDifferences(const Graph& graph, ValueId loss, const GradientMap& gradients,
                                           const std::map<std::string, Tensor>& feeds) {
  GraphInterpreter interpreter(graph);
  ASSERT_TRUE(interpreter.InitVariables().ok());
  auto values = interpreter.Run(feeds);
  ASSERT_TRUE(values.ok()) << values.status();

  constexpr float kEps = 1e-2f;
  for (const auto& [var, grad] : gradients) {
    const std::string& name = graph.value(var).name;
    EXPECT_EQ(graph.value(grad).meta, graph.value(var).meta) << name;
    EXPECT_EQ(graph.producer(grad).scope.substr(0, 5), "grad/") << name;
    const std::vector<double> analytic = (*values)[static_cast<size_t>(grad)].ToDoubleVector();
    const Tensor base = interpreter.variable(var).Clone();
    double largest = 0;
    for (int64_t i = 0; i < base.NumElements(); ++i) {
      Tensor shifted = base.Clone();
      shifted.data<float>()[i] += kEps;
      ASSERT_TRUE(interpreter.SetVariable(name, shifted).ok());
      const double plus = RunLoss(interpreter, feeds, loss);
      shifted.data<float>()[i] -= 2 * kEps;
      ASSERT_TRUE(interpreter.SetVariable(name, shifted).ok());
      const double minus = RunLoss(interpreter, feeds, loss);
      const double numeric = (plus - minus) / (2 * kEps);
      EXPECT_NEAR(analytic[static_cast<size_t>(i)], numeric, 2e-3 + 2e-2 * std::fabs(numeric))
          << name << "[" << i << "]";
      largest = std::max(largest, std::fabs(analytic[static_cast<size_t>(i)]));
    }
    ASSERT_TRUE(interpreter.SetVariable(name, base).ok());
    EXPECT_GT(largest, 1e-3) << name << ": the check would be vacuous";
  }
}

TEST(AutodiffTest, MlpGradientsMatchFiniteDifferences) {
  testing::TestMlp mlp = testing::BuildTestMlp();
  auto gradients = Autodiff(mlp.graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  ASSERT_EQ(gradients->size(), 4u);
  ExpectGradientsMatchFiniteDifferences(mlp.graph, mlp.loss, *gradients, testing::TestMlpFeeds());
}

// Multi-output ops (layer_norm's mean and rstd get no gradient), a value
// used twice, and layer_idx carried into the backward nodes.
TEST(AutodiffTest, LayerNormGraphMatchesFiniteDifferences) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 5}});
  Sym loss;
  {
    auto scope = b.Scope("block", 2);
    Sym w = b.Variable("proj.weight", {5, 6}, InitRule::Normal(0, 0.5, 5, 0));
    Sym gamma = b.Variable("norm.weight", {6}, InitRule::Normal(1, 0.3, 5, 1));
    Sym beta = b.Variable("norm.bias", {6}, InitRule::Normal(0, 0.3, 5, 2));
    std::vector<Sym> ln = b.Op("layer_norm", {Matmul(x, w), gamma, beta});
    ASSERT_EQ(ln.size(), 3u);
    Sym h = ln[0];                                                    // (4, 6)
    loss = ReduceMean(Tanh(h) * h) + ReduceSum(ln[2]) * 0.0;          // rstd reaches the loss, gradient ignored
  }
  b.MarkLoss(loss);
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  auto gradients = Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  ASSERT_EQ(gradients->size(), 3u);
  for (const auto& [var, grad] : *gradients) EXPECT_EQ(graph.producer(grad).layer_idx, 2);
  auto x_value = ops::RunOp("normal", {}, {{"shape", std::vector<int64_t>{4, 5}}, {"seed", int64_t{9}}, {"tensor_id", int64_t{0}}});
  ASSERT_TRUE(x_value.ok());
  ExpectGradientsMatchFiniteDifferences(graph, loss.id(), *gradients, {{"x", x_value->front()}});
}

// A hinted activation's gradient (summed over its two uses) gets the hint,
// partial entries broadcast; a variable's gradient gets none.
TEST(AutodiffTest, HintedActivationGradientGetsTheHint) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 5}});
  Sym w = b.Variable("w", {5, 6}, InitRule::Normal(0, 0.5, 5, 0));
  Sym h = Matmul(x, w);
  b.SetHints(h, std::nullopt, NdSbp{Sbp::Split(0), Sbp::PartialSum()});
  b.MarkLoss(ReduceMean(Tanh(h) * h));
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  auto gradients = Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  int hinted = 0;
  for (const Node& n : graph.nodes()) {
    if (!n.scope.starts_with("grad/")) continue;  // autodiff's nodes, the summing add included
    for (ValueId out : n.outputs) {
      if (!graph.value(out).sbp_hint) continue;
      ++hinted;
      EXPECT_EQ(*graph.value(out).sbp_hint, (NdSbp{Sbp::Split(0), Sbp::Broadcast()})) << n.op;
      EXPECT_EQ(graph.value(out).meta, graph.value(h.id()).meta) << n.op;
    }
  }
  EXPECT_EQ(hinted, 1);
  EXPECT_FALSE(graph.value(gradients->at(w.id())).sbp_hint.has_value());
}

// Mixed precision casts the fused attention's q, k, v (not its mask) to
// bf16: its gradient op then gives bf16 dq, dk, dv, which the casts'
// gradients bring back to f32 for the variables, and the gradients are the
// f32 graph's to bf16's rounding.
TEST(AutodiffTest, MixedPrecisionCastsTheFusedAttentionsInputs) {
  auto build = [](bool amp) -> absl::StatusOr<std::pair<Graph, GradientMap>> {
    GraphBuilder b;
    Sym mask = b.Input("mask", {DType::kBool, Shape{2, 6}});
    Sym q = b.Variable("q", {2, 2, 6, 8}, InitRule::Normal(0, 1, 5, 0));
    Sym k = b.Variable("k", {2, 2, 6, 8}, InitRule::Normal(0, 1, 5, 1));
    Sym v = b.Variable("v", {2, 2, 6, 8}, InitRule::Normal(0, 1, 5, 2));
    Sym y = b.Apply("flash_attention_masked", {q, k, v, mask}, {{"scale", 0.35}});
    Sym loss = ReduceMean(Tanh(y) * y);
    b.MarkLoss(loss);
    ASSIGN_OR_RETURN(Graph graph, b.Finish());
    if (amp) {
      ASSIGN_OR_RETURN(MixedPrecisionResult mixed, AutoMixedPrecision(graph, DType::kBF16));
      if (mixed.ops != 1) return absl::InternalError(StrCat("cast ", mixed.ops, " ops"));
    }
    ASSIGN_OR_RETURN(GradientMap gradients, Autodiff(graph));
    return std::pair{std::move(graph), std::move(gradients)};
  };
  auto mixed = build(true);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  auto plain = build(false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const Graph& graph = mixed->first;
  int attention = 0, grads = 0;
  for (const Node& n : graph.nodes()) {
    if (n.op == "flash_attention_masked") {
      ++attention;
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(graph.value(n.inputs[i]).meta.dtype, DType::kBF16) << i;
      EXPECT_EQ(graph.value(n.inputs[3]).meta.dtype, DType::kBool);
      EXPECT_EQ(graph.value(n.outputs[0]).meta.dtype, DType::kF32);
    } else if (n.op == "flash_attention_masked_grad") {
      ++grads;
      for (ValueId out : n.outputs) EXPECT_EQ(graph.value(out).meta.dtype, DType::kBF16);
    }
  }
  EXPECT_EQ(attention, 1);
  EXPECT_EQ(grads, 1);
  Tensor mask = *Tensor::Empty(Shape{2, 6}, DType::kBool, Device{});
  for (int64_t i = 0; i < mask.NumElements(); ++i) mask.data<bool>()[i] = i % 4 != 2;
  auto gradient_values = [&mask](const Graph& g, const GradientMap& gradients) {
    GraphInterpreter interpreter(g);
    EXPECT_TRUE(interpreter.InitVariables().ok());
    auto values = interpreter.Run({{"mask", mask}});
    EXPECT_TRUE(values.ok()) << values.status();
    std::map<std::string, std::vector<double>> out;
    for (const auto& [var, grad] : gradients) {
      EXPECT_EQ(g.value(grad).meta.dtype, DType::kF32);
      out[g.value(var).name] = (*values)[static_cast<size_t>(grad)].ToDoubleVector();
    }
    return out;
  };
  const auto low = gradient_values(graph, mixed->second), f32 = gradient_values(plain->first, plain->second);
  ASSERT_EQ(low.size(), 3u);
  for (const auto& [name, want] : f32) {
    const std::vector<double>& got = low.at(name);
    double largest = 0, worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      largest = std::max(largest, std::fabs(want[i]));
      worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
    EXPECT_GT(worst, 0) << name << ": nothing was rounded";
    EXPECT_LT(worst, 3e-2 * largest) << name;
  }
}

// f rounded to the nearest bf16 (ties to even), as a float.
float RoundToBf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The f32 gradients of `g` (by variable name) on `feeds`.
std::map<std::string, std::vector<float>> GradientsOf(const Graph& g, const GradientMap& grads,
                                                      const std::map<std::string, Tensor>& feeds) {
  GraphInterpreter interpreter(g);
  EXPECT_TRUE(interpreter.InitVariables().ok());
  auto values = interpreter.Run(feeds);
  EXPECT_TRUE(values.ok()) << values.status();
  std::map<std::string, std::vector<float>> out;
  if (!values.ok()) return out;
  for (const auto& [var, grad] : grads) out[g.value(var).name] = (*values)[static_cast<size_t>(grad)].ToVector<float>();
  return out;
}

// `b`'s graph under bf16 mixed precision with its gradients, and a copy
// with the cast round trips folded.
struct AmpFolded {
  Graph graph, folded_graph;
  GradientMap gradients;
  CastRoundTripResult folded;
};
void BuildAmpFolded(GraphBuilder& b, AmpFolded& out) {
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  out.graph = *std::move(built);
  ASSERT_TRUE(AutoMixedPrecision(out.graph, DType::kBF16).ok());
  auto gradients = Autodiff(out.graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  out.gradients = *gradients;
  out.folded_graph = out.graph;
  auto folded = FoldCastRoundTrips(out.folded_graph, out.gradients);
  ASSERT_TRUE(folded.ok()) << folded.status();
  out.folded = *std::move(folded);
}

// Under mixed precision each matmul's input gradient is its f32 product
// cast to the input's bf16 and back to f32 by the AMP cast's gradient;
// FoldCastRoundTrips has the readers take the product itself: the same
// values unrounded (each old gradient is exactly the new one rounded to
// bf16), and no cast left that undoes the cast before it.
TEST(AutodiffTest, MixedPrecisionGradientsSkipTheirCastRoundTrips) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 6}});
  Sym w1 = b.Variable("w1", {6, 5}, InitRule::Normal(0, 1, 5, 0));
  Sym w2 = b.Variable("w2", {5, 3}, InitRule::Normal(0, 1, 5, 1));
  Sym y = Matmul(Tanh(Matmul(x, w1)), w2);
  b.MarkLoss(ReduceMean(y * y));
  AmpFolded amp;
  ASSERT_NO_FATAL_FAILURE(BuildAmpFolded(b, amp));
  const Graph &graph = amp.graph, &folded_graph = amp.folded_graph;
  const GradientMap& gradients = amp.gradients;
  const CastRoundTripResult* folded = &amp.folded;
  EXPECT_EQ(folded->folded, 3);  // w1's, w2's and the tanh's gradients
  for (const Node& n : folded_graph.nodes()) {
    if (n.op != "cast") continue;
    const Node& before = folded_graph.producer(n.inputs[0]);
    if (before.op != "cast") continue;
    const bool undone = folded_graph.value(before.inputs[0]).meta.dtype == folded_graph.value(n.outputs[0]).meta.dtype;
    bool read_once = true;  // a middle value read elsewhere keeps its pair
    for (const Node& other : folded_graph.nodes()) {
      for (ValueId in : other.inputs) read_once = read_once && (in != n.inputs[0] || other.id == n.id);
    }
    EXPECT_FALSE(undone && read_once) << n.scope;
  }
  const Tensor feed = Tensor::FromVector(Shape{4, 6}, [] {
    std::vector<float> v(24);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7f * static_cast<float>(i));
    return v;
  }());
  const auto run = [&feed](const Graph& g, const GradientMap& grads) {
    GraphInterpreter interpreter(g);
    EXPECT_TRUE(interpreter.InitVariables().ok());
    auto values = interpreter.Run({{"x", feed}});
    EXPECT_TRUE(values.ok()) << values.status();
    std::map<std::string, std::vector<float>> out;
    for (const auto& [var, grad] : grads) {
      EXPECT_EQ(g.value(grad).meta.dtype, DType::kF32);
      out[g.value(var).name] = (*values)[static_cast<size_t>(grad)].ToVector<float>();
    }
    return out;
  };
  const auto rounded = run(graph, gradients), kept = run(folded_graph, folded->gradients);
  ASSERT_EQ(kept.size(), 2u);
  // w2's gradient is the first product of the backward: exactly the old one
  // unrounded. w1's also reads the tanh's gradient, which was rounded too.
  int unrounded = 0;
  for (const auto& [name, want] : rounded) {
    const std::vector<float>& got = kept.at(name);
    ASSERT_EQ(got.size(), want.size());
    float largest = 0;
    for (float w : want) largest = std::max(largest, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i) {
      if (name == "w2") {
        EXPECT_EQ(RoundToBf16(got[i]), want[i]) << name << "[" << i << "]";
      } else {
        EXPECT_NEAR(got[i], want[i], 2e-2f * largest) << name << "[" << i << "]";
      }
      unrounded += got[i] != want[i];
    }
  }
  EXPECT_GT(unrounded, 0) << "no gradient kept a bit bf16 drops";
}

// A round trip the program itself makes in the forward pass (it rounds to
// bf16 on purpose) is kept: only the gradients' pairs fold (the forward
// pair folded too, its rounding lost without a word).
TEST(AutodiffTest, AForwardCastRoundTripIsKept) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 6}});
  Sym w = b.Variable("w", {6, 3}, InitRule::Normal(0, 1, 5, 0));
  Sym rounded = Cast(Cast(Tanh(Matmul(x, w)), DType::kBF16), DType::kF32);
  b.MarkLoss(ReduceMean(rounded * rounded));
  AmpFolded amp;
  ASSERT_NO_FATAL_FAILURE(BuildAmpFolded(b, amp));
  int forward_pairs = 0;
  for (const Node& n : amp.folded_graph.nodes()) {
    if (n.op != "cast" || n.backward) continue;
    const Node& before = amp.folded_graph.producer(n.inputs[0]);
    if (before.op == "cast" && amp.folded_graph.value(before.outputs[0]).meta.dtype == DType::kBF16 &&
        amp.folded_graph.value(n.outputs[0]).meta.dtype == DType::kF32 &&
        amp.folded_graph.producer(before.inputs[0]).op == "tanh") {
      ++forward_pairs;
    }
  }
  EXPECT_EQ(forward_pairs, 1);
}

// The exact direction through reshapes: the fused attention's 16-bit dq
// is cast to f32 (the AMP cast's rule), reshaped back to the projection's
// (B·T, C) and cast to bf16 again for the projection's GEMMs. The fold has
// those GEMMs read the reshaped bf16 dq, and the bias's gradient (a
// reduce_sum) sum it, widening it itself, so no f32 copy of dq is left.
// Nothing rounds differently: the bias's gradient keeps its bits and the
// weight's is the old one before its (folded) rounding.
TEST(AutodiffTest, SixteenBitGradientsSkipTheExactRoundTripThroughReshapes) {
  GraphBuilder b;
  const int64_t B = 2, T = 5, H = 2, D = 4, C = H * D;
  Sym x = b.Input("x", {DType::kF32, Shape{B * T, C}});
  Sym k = b.Input("k", {DType::kF32, Shape{B, T, H, D}});
  Sym v = b.Input("v", {DType::kF32, Shape{B, T, H, D}});
  Sym w = b.Variable("w", {C, C}, InitRule::Normal(0, 1, 5, 2));
  Sym bias = b.Variable("bias", {C}, InitRule::Normal(0, 1, 5, 3));
  Sym q = Reshape(MatmulBias(x, w, bias), Shape{B, T, H, D});
  const std::vector<Sym> attention =
      b.Op("flash_attention", {q, k, v}, {{"scale", 0.5}, {"causal", true}, {"layout", std::string("bthd")}});
  ASSERT_EQ(attention.size(), 2u);
  b.MarkLoss(ReduceMean(attention[0] * attention[0]));
  AmpFolded amp;
  ASSERT_NO_FATAL_FAILURE(BuildAmpFolded(b, amp));
  const Graph &graph = amp.graph, &folded_graph = amp.folded_graph;
  const GradientMap& gradients = amp.gradients;
  const CastRoundTripResult* folded = &amp.folded;
  EXPECT_EQ(folded->folded, 2);   // dq's exact trip, w's rounding
  EXPECT_EQ(folded->widened, 1);  // the bias's reduce_sum
  // No cast is left that undoes a cast through reshapes, and no reduce_sum
  // reads a 16-bit value's f32 copy.
  int sums = 0;
  for (const Node& n : folded_graph.nodes()) {
    if (n.op == "reduce_sum") {
      ValueId in = n.inputs[0];
      while (folded_graph.producer(in).op == "reshape") in = folded_graph.producer(in).inputs[0];
      EXPECT_EQ(folded_graph.value(in).meta.dtype, DType::kBF16) << n.scope;
      EXPECT_NE(folded_graph.producer(in).op, "cast") << n.scope;
      ++sums;
    }
    if (n.op != "cast") continue;
    ValueId in = n.inputs[0];
    while (folded_graph.producer(in).op == "reshape") in = folded_graph.producer(in).inputs[0];
    const Node& before = folded_graph.producer(in);
    if (before.op != "cast") continue;
    EXPECT_NE(folded_graph.value(before.inputs[0]).meta.dtype, folded_graph.value(n.outputs[0]).meta.dtype) << n.scope;
  }
  EXPECT_EQ(sums, 1);
  std::map<std::string, Tensor> feeds;
  uint64_t seed = 1;
  for (const auto& [name, shape] :
       {std::pair{"x", Shape{B * T, C}}, std::pair{"k", Shape{B, T, H, D}}, std::pair{"v", Shape{B, T, H, D}}}) {
    std::vector<float> values(static_cast<size_t>(shape.NumElements()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * static_cast<float>(i + 11 * seed));
    feeds[name] = Tensor::FromVector(shape, values);
    ++seed;
  }
  const auto run = [&feeds](const Graph& g, const GradientMap& grads) { return GradientsOf(g, grads, feeds); };
  const auto before = run(graph, gradients), after = run(folded_graph, folded->gradients);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after.at("bias"), before.at("bias"));
  const std::vector<float>& dw = after.at("w");
  ASSERT_EQ(dw.size(), before.at("w").size());
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(RoundToBf16(dw[i]), before.at("w")[i]) << "w[" << i << "]";
}

// The logits' gradient (cross_entropy_partials_grad), read only by the
// head's cast to bf16 for its GEMMs, is given in bf16 by the op itself: no
// cast left after it, and the head's weight gradient is the old one before
// its (folded) rounding, so the op rounded dlogits exactly as the cast did.
TEST(AutodiffTest, MixedPrecisionLogitGradientsComeOutInBf16) {
  GraphBuilder b;
  const int64_t N = 6, C = 5, V = 11;
  Sym x = b.Input("x", {DType::kF32, Shape{N, C}});
  Sym labels = b.Input("labels", {DType::kI64, Shape{N}});
  Sym w = b.Variable("head", {C, V}, InitRule::Normal(0, 1, 5, 4));
  Sym logits = Matmul(x, w);
  Sym row_max = b.Apply("reduce_max", {logits}, {{"axes", std::vector<int64_t>{1}}, {"keepdim", true}});
  const std::vector<Sym> parts = b.Op("cross_entropy_partials", {logits, row_max, labels});
  ASSERT_EQ(parts.size(), 2u);
  b.MarkLoss(ReduceMean(Log(parts[0]) - parts[1]));
  AmpFolded amp;
  ASSERT_NO_FATAL_FAILURE(BuildAmpFolded(b, amp));
  EXPECT_EQ(amp.folded.folded, 2);  // dlogits' cast, the head's rounding
  int narrowed = 0;
  for (const Node& n : amp.folded_graph.nodes()) {
    if (n.op != "cross_entropy_partials_grad") continue;
    ++narrowed;
    EXPECT_EQ(amp.folded_graph.value(n.outputs[0]).meta.dtype, DType::kBF16);
    for (const Node& reader : amp.folded_graph.nodes()) {
      for (ValueId in : reader.inputs) EXPECT_FALSE(in == n.outputs[0] && reader.op == "cast");
    }
  }
  EXPECT_EQ(narrowed, 1);
  std::vector<float> xs(static_cast<size_t>(N * C));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::cos(1.3f * static_cast<float>(i));
  const std::map<std::string, Tensor> feeds = {{"x", Tensor::FromVector(Shape{N, C}, xs)},
                                               {"labels", Tensor::FromVector<int64_t>(Shape{N}, {0, 3, 10, 7, 3, 5})}};
  const auto head_gradient = [&feeds](const Graph& g, const GradientMap& grads) {
    GraphInterpreter interpreter(g);
    EXPECT_TRUE(interpreter.InitVariables().ok());
    auto values = interpreter.Run(feeds);
    EXPECT_TRUE(values.ok()) << values.status();
    return values.ok() ? (*values)[static_cast<size_t>(grads.begin()->second)].ToVector<float>() : std::vector<float>{};
  };
  const std::vector<float> before = head_gradient(amp.graph, amp.gradients);
  const std::vector<float> after = head_gradient(amp.folded_graph, amp.folded.gradients);
  ASSERT_EQ(after.size(), static_cast<size_t>(C * V));
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(RoundToBf16(after[i]), before[i]) << "head[" << i << "]";
}

// Three GEMMs reading one value (q, k and v's reading the layer norm's
// output) each had it cast to bf16: one cast is left for all three, and the
// gradients are what they were (before their folded rounding).
TEST(AutodiffTest, MixedPrecisionCastsOneValueOnceForItsGemms) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 6}});
  std::vector<Sym> w;
  for (int i = 0; i < 3; ++i) w.push_back(b.Variable(StrCat("w", i), {6, 5}, InitRule::Normal(0, 1, 5, 10 + i)));
  Sym y = Matmul(x, w[0]) * Matmul(x, w[1]) + Matmul(x, w[2]);
  b.MarkLoss(ReduceMean(y * y));
  AmpFolded amp;
  ASSERT_NO_FATAL_FAILURE(BuildAmpFolded(b, amp));
  EXPECT_EQ(amp.folded.merged, 2);
  const auto casts_of_x = [](const Graph& g) {
    int n = 0;
    for (const Node& node : g.nodes()) n += node.op == "cast" && g.value(node.inputs[0]).name == "x";
    return n;
  };
  EXPECT_EQ(casts_of_x(amp.graph), 3);
  EXPECT_EQ(casts_of_x(amp.folded_graph), 1);
  std::vector<float> xs(24);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.9f * static_cast<float>(i) + 0.2f);
  const std::map<std::string, Tensor> feeds = {{"x", Tensor::FromVector(Shape{4, 6}, xs)}};
  const auto run = [&feeds](const Graph& g, const GradientMap& grads) { return GradientsOf(g, grads, feeds); };
  const auto before = run(amp.graph, amp.gradients), after = run(amp.folded_graph, amp.folded.gradients);
  ASSERT_EQ(after.size(), 3u);
  for (const auto& [name, want] : before) {
    const std::vector<float>& got = after.at(name);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(RoundToBf16(got[i]), want[i]) << name << "[" << i << "]";
  }
}

TEST(AutodiffTest, ValueUsedTwiceSumsContributions) {
  GraphBuilder b;
  Sym w = b.Variable("w", {4}, InitRule::Normal(0, 1, 3, 0));
  Sym loss = ReduceSum(w * w + w);  // d/dw = 2w + 1
  b.MarkLoss(loss);
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  auto gradients = Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  // w gets three contributions (both mul inputs and the add), summed by adds.
  EXPECT_EQ(graph.producer(gradients->at(w.id())).op, "add");

  GraphInterpreter interpreter(graph);
  ASSERT_TRUE(interpreter.InitVariables().ok());
  auto values = interpreter.Run({});
  ASSERT_TRUE(values.ok()) << values.status();
  const std::vector<double> wv = interpreter.variable(w.id()).ToDoubleVector();
  const std::vector<double> g = (*values)[static_cast<size_t>(gradients->at(w.id()))].ToDoubleVector();
  for (size_t i = 0; i < wv.size(); ++i) EXPECT_NEAR(g[i], 2 * wv[i] + 1, 1e-5);
}

TEST(AutodiffTest, NonDifferentiablePathsGetNoGradient) {
  testing::TestMlp mlp = testing::BuildTestMlp();
  auto gradients = Autodiff(mlp.graph, {.wrt = {mlp.labels, mlp.x, mlp.w1}});
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  EXPECT_EQ(gradients->count(mlp.labels), 0u);  // labels feed a no-grad input
  EXPECT_EQ(gradients->count(mlp.x), 1u);
  EXPECT_EQ(gradients->count(mlp.w1), 1u);
  EXPECT_EQ(mlp.graph.value(gradients->at(mlp.x)).meta, mlp.graph.value(mlp.x).meta);
}

TEST(AutodiffTest, FrozenAndUnusedVariablesGetNoGradient) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{2, 3}});
  Sym frozen = b.Variable("frozen", {3}, InitRule::Ones(), {.trainable = false});
  Sym trained = b.Variable("trained", {3}, InitRule::Ones());
  Sym unused = b.Variable("unused", {3}, InitRule::Ones());
  b.MarkLoss(ReduceSum(x * frozen * trained));
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  auto gradients = Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  EXPECT_EQ(gradients->size(), 1u);
  EXPECT_EQ(gradients->count(trained.id()), 1u);
  EXPECT_EQ(gradients->count(frozen.id()), 0u);
  EXPECT_EQ(gradients->count(unused.id()), 0u);
}

TEST(AutodiffTest, NonScalarLossIsAnError) {
  GraphBuilder b;
  Sym w = b.Variable("w", {4}, InitRule::Ones());
  Sym y = Exp(w);
  Graph graph = b.graph();
  auto gradients = Autodiff(graph, y.id());
  ASSERT_FALSE(gradients.ok());
  EXPECT_CONTAINS(gradients.status().message(), "scalar");
  EXPECT_CONTAINS(gradients.status().message(), "f32(4,)");
}

TEST(AutodiffTest, MissingGradientRuleNamesTheOp) {
  GraphBuilder b;
  Sym w = b.Variable("w", {4}, InitRule::Ones());
  Sym y = b.Apply("gelu_grad", {w, w});  // an op without a gradient rule
  b.MarkLoss(ReduceSum(y));
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  auto gradients = Autodiff(graph);
  ASSERT_FALSE(gradients.ok());
  EXPECT_CONTAINS(gradients.status().message(), "'gelu_grad'");
  EXPECT_CONTAINS(gradients.status().message(), "no gradient rule");
}

// Backward nodes are what Autodiff emits, whatever their scopes say; passes
// that copy nodes keep the mark.
TEST(AutodiffTest, MarksTheNodesItEmitsBackward) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{4, 5}});
  Sym w = b.Variable("w", {5, 6}, InitRule::Normal(0, 0.5, 5, 0));
  Sym h;
  {
    auto scope = b.Scope("grad/h");  // a forward scope that only looks like autodiff's
    h = Tanh(Matmul(x, w));
  }
  b.MarkLoss(ReduceMean(h * h));
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph graph = *std::move(built);
  const NodeId num_forward = graph.num_nodes();
  ASSERT_TRUE(graph.producer(h.id()).scope.starts_with("grad/")) << graph.producer(h.id()).scope;
  auto gradients = Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  ASSERT_GT(graph.num_nodes(), num_forward);
  for (const Node& n : graph.nodes()) EXPECT_EQ(n.backward, n.id >= num_forward) << n.op << " " << n.scope;

  // Gradient accumulation rebuilds the graph: the copies keep the mark, and
  // its own repeat / acc / scale nodes are not backward.
  const int num_backward = static_cast<int>(graph.num_nodes() - num_forward);
  auto accumulated = AccumulateGradients(graph, *gradients, 2);
  ASSERT_TRUE(accumulated.ok()) << accumulated.status();
  int marked = 0;
  for (const Node& n : graph.nodes()) {
    marked += n.backward ? 1 : 0;
    if (n.kind == NodeKind::kRepeat || n.kind == NodeKind::kAcc) {
      EXPECT_FALSE(n.backward) << n.op;
    }
  }
  EXPECT_EQ(marked, num_backward);
  EXPECT_TRUE(graph.producer(accumulated->remap[static_cast<size_t>(gradients->at(w.id()))]).backward);
  EXPECT_FALSE(graph.producer(accumulated->remap[static_cast<size_t>(h.id())]).backward);
}

// Over pipeline stages (each layer its own stage here), a variable of
// layer 0 that matmuls read on layers 0 .. n-1 (a tied weight) gets a repeat
// on each stage, and its gradient, which the autodiff sums over the stages,
// is accumulated on each stage and the sums added once per iteration on the
// variable's stage. The add folds (FoldAddsIntoProducers, run before as the
// engine runs it) leave the terms of other stages apart. The gradient is
// the one-stage accumulation's (up to rounding: the sum is taken in another
// order).
TEST(AutodiffTest, AccumulationOverStagesRepeatsAndAccumulatesATiedVariableOnEachStage) {
  for (const int64_t layers : {2, 3}) {
    SCOPED_TRACE(StrCat(layers, " layers"));
    const auto build = [layers] {
      GraphBuilder b;
      Sym h = b.Input("x", {DType::kF32, Shape{2, 5}});
      Sym w;
      for (int64_t l = 0; l < layers; ++l) {
        auto scope = b.Scope(StrCat("layer", l), l);
        if (l == 0) w = b.Variable("w", {5, 5}, InitRule::Normal(0, 0.5, 5, 0));
        h = Tanh(Matmul(h, w));
        if (l == layers - 1) b.MarkLoss(ReduceMean(h * h));
      }
      auto built = b.Finish();
      EXPECT_TRUE(built.ok()) << built.status();
      return *std::move(built);
    };
    const auto x_value = ops::RunOp(
        "normal", {}, {{"shape", std::vector<int64_t>{4, 5}}, {"seed", int64_t{3}}, {"tensor_id", int64_t{0}}});
    ASSERT_TRUE(x_value.ok());
    std::vector<double> gradient[2];
    for (const bool stages : {false, true}) {
      SCOPED_TRACE(stages ? "a stage per layer" : "one stage");
      Graph graph = build();
      const ValueId w = graph.Variables().front();
      auto gradients = Autodiff(graph);
      ASSERT_TRUE(gradients.ok()) << gradients.status();
      const SameStageFn same_stage = stages ? SameStageFn([](int64_t a, int64_t b) { return a == b; }) : SameStageFn();
      auto folded = FoldAddsIntoProducers(graph, *gradients, same_stage);
      ASSERT_TRUE(folded.ok()) << folded.status();
      auto accumulated = AccumulateGradients(graph, folded->gradients, 2, same_stage);
      ASSERT_TRUE(accumulated.ok()) << accumulated.status();
      std::vector<int64_t> repeat_layers, acc_layers;
      for (const Node& n : graph.nodes()) {
        if (n.kind == NodeKind::kRepeat) repeat_layers.push_back(n.layer_idx);
        if (n.kind == NodeKind::kAcc && n.scope.starts_with("accumulate/")) acc_layers.push_back(n.layer_idx);
        if (n.kind != NodeKind::kOp || (n.op != "matmul" && n.op != "matmul_add") || n.backward) continue;
        ASSERT_EQ(graph.producer(n.inputs[1]).kind, NodeKind::kRepeat) << "a matmul of layer " << n.layer_idx;
        EXPECT_EQ(graph.producer(n.inputs[1]).layer_idx, stages ? n.layer_idx : 0)
            << "a matmul of layer " << n.layer_idx;
      }
      std::sort(acc_layers.begin(), acc_layers.end());  // in the autodiff's order of the terms
      std::vector<int64_t> every_layer;
      for (int64_t l = 0; l < layers; ++l) every_layer.push_back(l);
      EXPECT_EQ(repeat_layers, stages ? every_layer : std::vector<int64_t>({0}));
      EXPECT_EQ(acc_layers, stages ? every_layer : std::vector<int64_t>({0}));
      const ValueId grad = accumulated->gradients.at(accumulated->remap[static_cast<size_t>(w)]);
      // scalar_mul(acc) on one stage; scalar_mul(add(.., acc)) over stages, on the variable's layer.
      const Node& mean = graph.producer(grad);
      EXPECT_EQ(mean.op, "scalar_mul");
      EXPECT_EQ(mean.layer_idx, 0);
      EXPECT_EQ(graph.producer(mean.inputs[0]).kind, stages ? NodeKind::kOp : NodeKind::kAcc);
      GraphInterpreter interpreter(graph);
      ASSERT_TRUE(interpreter.InitVariables().ok());
      auto values = interpreter.Run({{"x", x_value->front()}});
      ASSERT_TRUE(values.ok()) << values.status();
      gradient[stages ? 1 : 0] = (*values)[static_cast<size_t>(grad)].ToDoubleVector();
    }
    ASSERT_EQ(gradient[0].size(), 25u);
    double largest = 0;
    for (size_t i = 0; i < gradient[0].size(); ++i) {
      EXPECT_NEAR(gradient[1][i], gradient[0][i], 1e-6 * (1 + std::fabs(gradient[0][i]))) << i;
      largest = std::max(largest, std::fabs(gradient[0][i]));
    }
    EXPECT_GT(largest, 1e-3);
  }
}

}  // namespace
}  // namespace tessera::graph
