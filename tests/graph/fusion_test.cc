// The fusion passes: FuseBiasDropoutAdd (graph/passes/bias_dropout_add.cc)
// and FoldAddsIntoProducers (graph/passes/add_folds.cc): which chains fuse, and
// that a fused graph gives the unfused one's loss and gradients bit for bit,
// in f32 and under mixed precision.

#include <gtest/gtest.h>

#include <cmath>

#include "core/text.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "tests/graph/graph_interpreter.h"

namespace tessera::graph {
namespace {

using testing::GraphInterpreter;

constexpr int64_t B = 2, T = 3, C = 8, N = B * T;

// Two projections into a residual stream, as a transformer layer's
// row-parallel outputs: reshape((B·T, C) -> (B, T, C)) after the dropout
// (the attention's) and, in the second, no dropout at all (rate 0).
// `extra_reader`: the first dropout's output is also read elsewhere, so its
// chain must stay.
Graph Build(bool extra_reader) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{B, T, C}});
  Sym w1 = b.Variable("w1", {C, C}, InitRule::Normal(0, 0.5, 5, 1));
  Sym w2 = b.Variable("w2", {C, C}, InitRule::Normal(0, 0.5, 5, 2));
  Sym b1 = b.Variable("b1", {C}, InitRule::Normal(0, 0.5, 5, 3));
  Sym b2 = b.Variable("b2", {C}, InitRule::Normal(0, 0.5, 5, 4));
  Sym flat = Reshape(x, Shape{N, C});
  Sym d = b.Apply("dropout", {b.Apply("bias_add", {Matmul(Tanh(flat), w1), b1})},
                  {{"rate", 0.3}, {"seed", int64_t{7}}, {"tensor_id", int64_t{11}}});
  Sym h = x + Reshape(d, Shape{B, T, C});
  Sym y = Reshape(b.Apply("bias_add", {Matmul(Reshape(h, Shape{N, C}), w2), b2}), Shape{B, T, C}) + h;
  Sym loss = ReduceMean(y * y);
  if (extra_reader) loss = loss + ReduceMean(d);
  b.MarkLoss(loss);
  auto built = b.Finish();
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? *std::move(built) : Graph();
}

int Count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.kind == NodeKind::kOp && node.op == op;
  return n;
}

// The loss and every gradient (by variable name) of `g` after `amp` (f32:
// none), autodiff and, under AMP, the cast pass, as the engine runs them.
std::map<std::string, std::vector<float>> LossAndGradients(Graph g, DType amp, bool fold_adds = false) {
  if (amp != DType::kF32) {
    EXPECT_TRUE(AutoMixedPrecision(g, amp).ok());
  }
  auto gradients = Autodiff(g);
  EXPECT_TRUE(gradients.ok()) << gradients.status();
  GradientMap grads = *gradients;
  if (amp != DType::kF32) {
    auto folded = FoldCastRoundTrips(g, grads);
    EXPECT_TRUE(folded.ok()) << folded.status();
    grads = folded->gradients;
  }
  if (fold_adds) {
    auto summed = FoldAddsIntoProducers(g, grads);
    EXPECT_TRUE(summed.ok()) << summed.status();
    EXPECT_GT(summed->folded, 0);
    grads = summed->gradients;
  }
  std::vector<float> xs(static_cast<size_t>(B * T * C));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.61f * static_cast<float>(i) + 0.3f);
  GraphInterpreter interpreter(g);
  EXPECT_TRUE(interpreter.InitVariables().ok());
  auto values = interpreter.Run({{"x", Tensor::FromVector(Shape{B, T, C}, xs)}});
  EXPECT_TRUE(values.ok()) << values.status();
  std::map<std::string, std::vector<float>> out;
  if (!values.ok()) return out;
  out["loss"] = (*values)[static_cast<size_t>(g.losses()[0])].ToVector<float>();
  for (const auto& [var, grad] : grads) out[g.value(var).name] = (*values)[static_cast<size_t>(grad)].ToVector<float>();
  return out;
}

TEST(BiasDropoutAddTest, FusesBothChainsAndKeepsEveryBit) {
  const Graph unfused = Build(/*extra_reader=*/false);
  Graph fused = unfused;
  auto result = FuseBiasDropoutAdd(fused);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->fused, 2);
  EXPECT_EQ(Count(fused, "bias_dropout_add"), 2);
  EXPECT_EQ(Count(fused, "bias_add"), 0);
  EXPECT_EQ(Count(fused, "dropout"), 0);
  for (const Node& n : fused.nodes()) {
    if (n.op != "bias_dropout_add") continue;
    EXPECT_EQ(fused.value(n.outputs[0]).meta.shape, (Shape{B, T, C}));
  }
  for (const DType amp : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(amp));
    const auto want = LossAndGradients(unfused, amp), got = LossAndGradients(fused, amp);
    ASSERT_EQ(want.size(), 5u);  // the loss and four variables' gradients
    for (const auto& [name, values] : want) {
      EXPECT_EQ(got.at(name), values) << name;
    }
  }
}

TEST(BiasDropoutAddTest, LeavesAChainWhoseValueIsReadElsewhere) {
  Graph g = Build(/*extra_reader=*/true);
  auto result = FuseBiasDropoutAdd(g);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->fused, 1);  // the second chain only
  EXPECT_EQ(Count(g, "dropout"), 1);
  EXPECT_EQ(Count(g, "bias_add"), 1);
}

TEST(BiasDropoutAddTest, RunsBeforeAutodiffOnly) {
  Graph g = Build(false);
  ASSERT_TRUE(Autodiff(g).ok());
  auto result = FuseBiasDropoutAdd(g);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("before autodiff"), std::string::npos) << result.status();
}

// Three projections of one value (q, k and v's), whose input gradients
// autodiff sums with two adds: both fold into matmul_adds, and the loss and
// every gradient keep their bits, in f32 and under mixed precision.
Graph BuildProjections(bool fetch_product) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{B, T, C}});
  Sym w0 = b.Variable("w0", {C, C}, InitRule::Normal(0, 0.5, 5, 5));
  Sym h = Tanh(Matmul(Reshape(x, Shape{N, C}), w0));
  std::vector<Sym> p;
  for (int i = 0; i < 3; ++i) {
    p.push_back(Matmul(h, b.Variable(StrCat("w", i + 1), {C, C}, InitRule::Normal(0, 0.5, 5, 6 + i))));
  }
  Sym y = Tanh(p[0]) * p[1] + Tanh(p[2]);  // no forward sum of a product
  b.MarkLoss(ReduceMean(y * y));
  if (fetch_product) b.MarkFetch("q", p[0]);
  auto built = b.Finish();
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? *std::move(built) : Graph();
}

// Autodiff, then FoldAddsIntoProducers on `g`; how many sums folded (-1: an
// error, reported).
int64_t FoldAfterAutodiff(Graph& g) {
  auto gradients = Autodiff(g);
  EXPECT_TRUE(gradients.ok()) << gradients.status();
  if (!gradients.ok()) return -1;
  auto summed = FoldAddsIntoProducers(g, *gradients);
  EXPECT_TRUE(summed.ok()) << summed.status();
  return summed.ok() ? summed->folded : -1;
}

TEST(AddFoldTest, FoldsTheProjectionsInputGradientSumsAndKeepsEveryBit) {
  {
    Graph g = BuildProjections(false);
    EXPECT_EQ(FoldAfterAutodiff(g), 2);
    EXPECT_EQ(Count(g, "matmul_add"), 2);
    for (const Node& n : g.nodes()) {  // no add of a product read only by it is left
      if (n.op != "add") continue;
      for (ValueId in : n.inputs) {
        int readers = 0;
        for (const Node& m : g.nodes()) {
          for (ValueId v : m.inputs) readers += v == in;
        }
        EXPECT_FALSE(g.producer(in).op == "matmul" && readers == 1) << n.scope;
      }
    }
  }
  const Graph g = BuildProjections(false);
  for (const DType amp : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(amp));
    const auto want = LossAndGradients(g, amp), got = LossAndGradients(g, amp, /*fold_adds=*/true);
    ASSERT_EQ(want.size(), 5u);  // the loss and four weights' gradients
    for (const auto& [name, values] : want) EXPECT_EQ(got.at(name), values) << name;
  }
}

// s = x w1 + x w2 with the products fetched or not: the add folds the later
// product, the earlier one when the later is fetched, neither when both
// are. (The weights' gradients are kept for the optimizer and x's is dead:
// nothing folds backward.)
TEST(AddFoldTest, LeavesAProductReadElsewhere) {
  for (int fetched = 0; fetched < 3; ++fetched) {
    SCOPED_TRACE(StrCat(fetched, " fetched"));
    GraphBuilder b;
    Sym x = b.Input("x", {DType::kF32, Shape{N, C}});
    Sym p1 = Matmul(x, b.Variable("w1", {C, C}, InitRule::Normal(0, 0.5, 5, 20)));
    Sym p2 = Matmul(x, b.Variable("w2", {C, C}, InitRule::Normal(0, 0.5, 5, 21)));
    Sym s = p1 + p2;
    b.MarkLoss(ReduceMean(s * s));
    if (fetched >= 1) b.MarkFetch("p2", p2);
    if (fetched >= 2) b.MarkFetch("p1", p1);
    auto built = b.Finish();
    ASSERT_TRUE(built.ok()) << built.status();
    Graph g = *std::move(built);
    EXPECT_EQ(FoldAfterAutodiff(g), fetched < 2 ? 1 : 0);
    for (const auto& [name, v] : g.fetches()) EXPECT_EQ(g.producer(v).op, "matmul") << name;
    for (const Node& n : g.nodes()) {
      if (n.op != "matmul_add") continue;
      // Its addend is the other product, fetched or not.
      EXPECT_EQ(g.producer(n.inputs[2]).op, "matmul");
    }
  }
}

// A pre-norm residual block, y = h + layer_norm(h) w: h's gradient is the
// residual's plus the layer norm's dx, which layer_norm_grad_add sums
// itself; the loss and every gradient keep their bits.
TEST(AddFoldTest, FoldsTheResidualSumIntoTheLayerNormGradient) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{B, T, C}});
  Sym w0 = b.Variable("w0", {C, C}, InitRule::Normal(0, 0.5, 5, 30));
  Sym w1 = b.Variable("w1", {C, C}, InitRule::Normal(0, 0.5, 5, 31));
  Sym gamma = b.Variable("gamma", {C}, InitRule::Normal(1, 0.2, 5, 32));
  Sym beta = b.Variable("beta", {C}, InitRule::Normal(0, 0.2, 5, 33));
  Sym h = Tanh(Matmul(Reshape(x, Shape{N, C}), w0));
  const std::vector<Sym> norm = b.Op("layer_norm", {h, gamma, beta});
  ASSERT_EQ(norm.size(), 3u);
  Sym y = h + Tanh(Matmul(norm[0], w1));
  b.MarkLoss(ReduceMean(y * y));
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  Graph folded = *built;
  EXPECT_GE(FoldAfterAutodiff(folded), 1);
  EXPECT_EQ(Count(folded, "layer_norm_grad_add"), 1);
  EXPECT_EQ(Count(folded, "layer_norm_grad"), 0);
  for (const DType amp : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(amp));
    const auto want = LossAndGradients(*built, amp), got = LossAndGradients(*built, amp, /*fold_adds=*/true);
    ASSERT_EQ(want.size(), 5u);  // the loss and four variables' gradients
    for (const auto& [name, values] : want) EXPECT_EQ(got.at(name), values) << name;
  }
}

}  // namespace
}  // namespace tessera::graph
