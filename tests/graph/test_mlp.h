#pragma once
// The small MLP the graph tests share:
//   x (batch = 8, 5) -> Linear(5, 7) with bias -> gelu -> Linear(7, 3) with bias
//   -> sparse_softmax_cross_entropy vs labels (8,) -> reduce_mean -> loss ()

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"

// EXPECT_THAT(text, HasSubstr(part)) without gmock.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing \"" << (part) << "\" in:\n" << (text)

namespace tessera::graph::testing {

inline constexpr int64_t kBatch = 8, kIn = 5, kHidden = 7, kClasses = 3;

struct TestMlp {
  Graph graph;
  ValueId x, labels, w1, b1, w2, b2, loss;
};

// Variables are drawn N(0, 0.5^2) with seed 1 (biases too, so their
// gradients are tested on non-trivial values).
TestMlp BuildTestMlp(int64_t batch = kBatch);
// x ~ N(0, 1) (seed `seed`); label = argmax of the first three features, so
// the data is learnable.
std::map<std::string, Tensor> TestMlpFeeds(int64_t seed = 7);

}  // namespace tessera::graph::testing
