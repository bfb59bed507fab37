// FuseBiasDropoutAdd (graph/passes/bias_dropout_add.cc): which chains fuse,
// and that a fused graph gives the unfused one's loss and gradients bit for
// bit, in f32 and under mixed precision.

#include <gtest/gtest.h>

#include <cmath>

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
std::map<std::string, std::vector<float>> LossAndGradients(Graph g, DType amp) {
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

}  // namespace
}  // namespace tessera::graph
