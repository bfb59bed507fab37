#include "tests/graph/test_mlp.h"

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "ops/eager.h"

namespace tessera::graph::testing {

TestMlp BuildTestMlp(int64_t batch) {
  GraphBuilder b;
  Sym x = b.Input("x", {DType::kF32, Shape{batch, kIn}});
  Sym labels = b.Input("labels", {DType::kI64, Shape{batch}});
  Sym w1, b1, w2, b2;
  {
    auto scope = b.Scope("fc1", 0);
    w1 = b.Variable("weight", {kIn, kHidden}, InitRule::Normal(0, 0.5, 1, 0));
    b1 = b.Variable("bias", {kHidden}, InitRule::Normal(0, 0.5, 1, 1));
  }
  {
    auto scope = b.Scope("fc2", 1);
    w2 = b.Variable("weight", {kHidden, kClasses}, InitRule::Normal(0, 0.5, 1, 2));
    b2 = b.Variable("bias", {kClasses}, InitRule::Normal(0, 0.5, 1, 3));
  }
  Sym h = Gelu(Matmul(x, w1) + b1);                   // (B, 7)
  Sym logits = Matmul(h, w2) + b2;                    // (B, 3)
  Sym loss = ReduceMean(SparseSoftmaxCrossEntropy(logits, labels));  // ()
  b.MarkLoss(loss);
  TestMlp mlp{Graph(), x.id(), labels.id(), w1.id(), b1.id(), w2.id(), b2.id(), loss.id()};
  auto graph = b.Finish();
  EXPECT_TRUE(graph.ok()) << graph.status();
  mlp.graph = *std::move(graph);
  return mlp;
}

std::map<std::string, Tensor> TestMlpFeeds(int64_t seed) {
  auto x = ops::RunOp("normal", {}, {{"shape", std::vector<int64_t>{kBatch, kIn}}, {"seed", seed}, {"tensor_id", int64_t{0}}});
  EXPECT_TRUE(x.ok()) << x.status();
  const std::vector<float> xs = x->front().ToVector<float>();
  std::vector<int64_t> labels;
  for (int64_t n = 0; n < kBatch; ++n) {
    int64_t best = 0;
    for (int64_t c = 1; c < kClasses; ++c) {
      if (xs[static_cast<size_t>(n * kIn + c)] > xs[static_cast<size_t>(n * kIn + best)]) best = c;
    }
    labels.push_back(best);
  }
  return {{"x", x->front()}, {"labels", Tensor::FromVector(Shape{kBatch}, labels)}};
}

}  // namespace tessera::graph::testing
