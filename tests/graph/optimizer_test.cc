// The optimizer pass on the test MLP, run by the reference interpreter,
// against updates computed here from the gradients (PyTorch semantics:
// torch.optim.SGD, torch.optim.AdamW, torch.nn.utils.clip_grad_norm_).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "graph/builder.h"
#include "graph/passes.h"
#include "tests/graph/graph_interpreter.h"
#include "tests/graph/test_mlp.h"

namespace tessera::graph {
namespace {

using testing::GraphInterpreter;

struct OptimizedMlp {
  testing::TestMlp mlp;
  GradientMap gradients;
  OptimizerResult result;
  std::vector<ValueId> variables() const { return {mlp.w1, mlp.b1, mlp.w2, mlp.b2}; }
};

OptimizedMlp BuildOptimizedMlp(const OptimizerOptions& options) {
  OptimizedMlp out{testing::BuildTestMlp(), {}, {}};
  auto gradients = Autodiff(out.mlp.graph);
  EXPECT_TRUE(gradients.ok()) << gradients.status();
  out.gradients = *gradients;
  auto result = ApplyOptimizer(out.mlp.graph, out.gradients, options);
  EXPECT_TRUE(result.ok()) << result.status();
  out.result = *result;
  return out;
}

std::map<std::string, Tensor> Feeds(float lr) {
  auto feeds = testing::TestMlpFeeds();
  feeds["lr"] = Tensor::FromVector<float>(Shape{}, {lr});
  return feeds;
}

std::vector<double> ValueOf(const std::vector<Tensor>& values, ValueId id) {
  return values[static_cast<size_t>(id)].ToDoubleVector();
}

// Weight decay as the test expects it: not on the biases.
double DecayOf(const Graph& graph, ValueId var, double weight_decay) {
  return graph.value(var).name.ends_with(".bias") ? 0.0 : weight_decay;
}

// Two SGD steps (lr 0.1, decay 0.1 on weights) against torch.optim.SGD's
// arithmetic in double. With momentum, a buffer per variable (".momentum",
// zeros, not trainable); at momentum 0 none (a buffer as large as the
// model was kept and checkpointed, holding the last gradient).
void CheckSgdSteps(double momentum) {
  constexpr double kLr = 0.1, kDecay = 0.1;
  OptimizedMlp m = BuildOptimizedMlp({.kind = OptimizerKind::kSgd, .weight_decay = kDecay, .momentum = momentum});
  const Graph& graph = m.mlp.graph;
  for (ValueId var : m.variables()) {
    EXPECT_EQ(graph.producer(graph.variable_updates().at(var)).op, "sgd_update");
    if (momentum == 0) continue;
    ASSERT_EQ(m.result.state.at(var).size(), 1u);
    const ValueId buffer = m.result.state.at(var)[0];
    EXPECT_FALSE(graph.variable_info(buffer).trainable);
    EXPECT_EQ(graph.variable_info(buffer).init.op, "zeros");
    EXPECT_EQ(graph.value(buffer).name, graph.value(var).name + ".momentum");
  }
  if (momentum == 0) {
    EXPECT_TRUE(m.result.state.empty());
    for (ValueId id = 0; id < static_cast<ValueId>(graph.num_values()); ++id) {
      if (graph.IsVariable(id)) {
        EXPECT_FALSE(graph.value(id).name.ends_with(".momentum")) << graph.value(id).name;
      }
    }
  }

  GraphInterpreter interpreter(graph);
  ASSERT_TRUE(interpreter.InitVariables().ok());
  std::map<ValueId, std::vector<double>> buffers;
  for (int64_t step = 0; step < 2; ++step) {  // the second step exercises the momentum
    std::map<ValueId, std::vector<double>> before;
    for (ValueId var : m.variables()) before[var] = interpreter.variable(var).ToDoubleVector();
    auto values = interpreter.Run(Feeds(static_cast<float>(kLr)), step);
    ASSERT_TRUE(values.ok()) << values.status();
    for (ValueId var : m.variables()) {
      const std::vector<double> g = ValueOf(*values, m.gradients.at(var));
      const std::vector<double>& p = before[var];
      std::vector<double>& buf = buffers[var];
      buf.resize(p.size(), 0.0);
      const double decay = DecayOf(graph, var, kDecay);
      const std::vector<double> got = interpreter.variable(var).ToDoubleVector();
      const std::vector<double> got_buf =
          momentum == 0 ? std::vector<double>() : interpreter.variable(m.result.state.at(var)[0]).ToDoubleVector();
      bool decay_visible = false;
      for (size_t i = 0; i < p.size(); ++i) {
        buf[i] = momentum * buf[i] + g[i] + decay * p[i];
        const double want = p[i] - kLr * buf[i];
        EXPECT_NEAR(got[i], want, 1e-5) << graph.value(var).name << "[" << i << "] step " << step;
        if (momentum != 0) {
          EXPECT_NEAR(got_buf[i], buf[i], 1e-5);
        }
        decay_visible = decay_visible || std::fabs(kLr * kDecay * p[i]) > 1e-3;
      }
      EXPECT_TRUE(decay_visible) << "decay would not show in " << graph.value(var).name;
    }
  }
}

TEST(OptimizerTest, SgdMomentumMatchesTorch) { CheckSgdSteps(0.9); }

TEST(OptimizerTest, SgdWithoutMomentumKeepsNoState) { CheckSgdSteps(0.0); }

TEST(OptimizerTest, AdamWMatchesTorch) {
  constexpr double kLr = 0.01, kDecay = 0.1, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  OptimizedMlp m = BuildOptimizedMlp({.kind = OptimizerKind::kAdamW, .weight_decay = kDecay});
  const Graph& graph = m.mlp.graph;
  GraphInterpreter interpreter(graph);
  ASSERT_TRUE(interpreter.InitVariables().ok());
  std::map<ValueId, std::vector<double>> first, second;
  for (int64_t step = 0; step < 2; ++step) {  // t = 1, 2: bias correction changes
    std::map<ValueId, std::vector<double>> before;
    for (ValueId var : m.variables()) before[var] = interpreter.variable(var).ToDoubleVector();
    auto values = interpreter.Run(Feeds(static_cast<float>(kLr)), step);
    ASSERT_TRUE(values.ok()) << values.status();
    const double t = static_cast<double>(step + 1);
    for (ValueId var : m.variables()) {
      const std::vector<double> g = ValueOf(*values, m.gradients.at(var));
      const std::vector<double>& p = before[var];
      std::vector<double>& mv = first[var];
      std::vector<double>& vv = second[var];
      mv.resize(p.size(), 0.0);
      vv.resize(p.size(), 0.0);
      const double decay = DecayOf(graph, var, kDecay);
      const std::vector<double> got = interpreter.variable(var).ToDoubleVector();
      for (size_t i = 0; i < p.size(); ++i) {
        mv[i] = kBeta1 * mv[i] + (1 - kBeta1) * g[i];
        vv[i] = kBeta2 * vv[i] + (1 - kBeta2) * g[i] * g[i];
        const double m_hat = mv[i] / (1 - std::pow(kBeta1, t));
        const double v_hat = vv[i] / (1 - std::pow(kBeta2, t));
        const double want = p[i] * (1 - kLr * decay) - kLr * m_hat / (std::sqrt(v_hat) + kEps);
        EXPECT_NEAR(got[i], want, 2e-6) << graph.value(var).name << "[" << i << "] step " << step;
      }
      const std::vector<double> got_m = interpreter.variable(m.result.state.at(var)[0]).ToDoubleVector();
      const std::vector<double> got_v = interpreter.variable(m.result.state.at(var)[1]).ToDoubleVector();
      for (size_t i = 0; i < p.size(); ++i) {
        EXPECT_NEAR(got_m[i], mv[i], 1e-6);
        EXPECT_NEAR(got_v[i], vv[i], 1e-7);
      }
    }
  }
}

TEST(OptimizerTest, WeightDecayMaskExcludesBiasesAndNorms) {
  GraphBuilder b;
  for (const char* name :
       {"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight", "ln_f.bias", "encoder.layernorm.gamma",
        "lm_head.weight", "embeddings.LayerNorm.weight", "cls.predictions.transform.LayerNorm.weight"}) {
    b.Variable(name, {2}, InitRule::Zeros());
  }
  b.Variable("flagged_off", {2}, InitRule::Zeros(), {.weight_decay = false});
  b.Variable("flagged_on.bias", {2}, InitRule::Zeros(), {.weight_decay = true});
  ASSERT_TRUE(b.status().ok()) << b.status();
  const Graph& graph = b.graph();
  const OptimizerOptions options;
  auto applies = [&](const char* name) { return WeightDecayApplies(graph, *graph.FindVariable(name), options); };
  EXPECT_TRUE(applies("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(applies("lm_head.weight"));
  EXPECT_FALSE(applies("h.0.attn.c_attn.bias"));
  EXPECT_FALSE(applies("h.0.ln_1.weight"));
  EXPECT_FALSE(applies("ln_f.bias"));
  EXPECT_FALSE(applies("encoder.layernorm.gamma"));
  // Hugging Face BERT's names (the match is case-insensitive).
  EXPECT_FALSE(applies("embeddings.LayerNorm.weight"));
  EXPECT_FALSE(applies("cls.predictions.transform.LayerNorm.weight"));
  EXPECT_FALSE(applies("flagged_off"));
  EXPECT_TRUE(applies("flagged_on.bias"));  // the per-variable flag wins
}

// One plain SGD step (lr 1, no momentum, no decay) with clipping at max_norm
// in the norm_type-norm: checks the new parameters and the fetched norm
// against torch.nn.utils.clip_grad_norm_'s arithmetic in double; returns the
// norm.
double CheckClippedStep(double max_norm, double norm_type = 2.0) {
  OptimizedMlp m = BuildOptimizedMlp(
      {.kind = OptimizerKind::kSgd, .clip_grad_max_norm = max_norm, .clip_grad_norm_type = norm_type});
  const Graph& graph = m.mlp.graph;
  GraphInterpreter interpreter(graph);
  EXPECT_TRUE(interpreter.InitVariables().ok());
  std::map<ValueId, std::vector<double>> before;
  for (ValueId var : m.variables()) before[var] = interpreter.variable(var).ToDoubleVector();
  auto values = interpreter.Run(Feeds(1.0f));
  EXPECT_TRUE(values.ok()) << values.status();
  double sum = 0, largest = 0;
  int64_t count = 0;
  for (ValueId var : m.variables()) {
    for (double g : ValueOf(*values, m.gradients.at(var))) {
      sum += std::pow(std::fabs(g), norm_type);
      largest = std::max(largest, std::fabs(g));
      ++count;
    }
  }
  EXPECT_GT(count, 50);
  // (A p past f32's range: its limit, the largest.)
  const double norm = norm_type > std::numeric_limits<float>::max() ? largest : std::pow(sum, 1.0 / norm_type);
  EXPECT_EQ(*graph.FindFetch("grad_norm"), m.result.grad_norm);
  EXPECT_NEAR(ValueOf(*values, m.result.grad_norm)[0], norm, 1e-5 * norm);
  const double scale = std::min(1.0, max_norm / (norm + 1e-6));
  for (ValueId var : m.variables()) {
    const std::vector<double> g = ValueOf(*values, m.gradients.at(var));
    const std::vector<double> got = interpreter.variable(var).ToDoubleVector();
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_NEAR(got[i], before[var][i] - scale * g[i], 1e-5) << graph.value(var).name << "[" << i << "]";
    }
  }
  return norm;
}

TEST(OptimizerTest, ClippingScalesWhenNormExceedsMax) {
  const double norm = CheckClippedStep(0.05);
  EXPECT_GT(norm, 0.1);  // so the clip really scaled by < 0.5
}

TEST(OptimizerTest, ClippingLeavesSmallNormsAlone) {
  const double norm = CheckClippedStep(100.0);
  EXPECT_LT(norm, 100.0);
}

// Other p-norms (p = 1, 3, 0.5, infinity): each norm differs from the
// others, so the one computed is the one asked for.
TEST(OptimizerTest, ClippingInOtherNorms) {
  std::map<double, double> norms;
  for (double p : {1.0, 3.0, 0.5, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(p);
    norms[p] = CheckClippedStep(1e-3, p);
    EXPECT_GT(norms[p], 2e-3);  // so each step really clipped
  }
  norms[2.0] = CheckClippedStep(1e-3);
  // ‖g‖∞ <= ‖g‖3 <= ‖g‖2 <= ‖g‖1 <= ‖g‖0.5, strictly for these gradients.
  EXPECT_LT(norms[std::numeric_limits<double>::infinity()], norms[3.0]);
  EXPECT_LT(norms[3.0], norms[2.0]);
  EXPECT_LT(norms[2.0], norms[1.0]);
  EXPECT_LT(norms[1.0], norms[0.5]);
  // p past f32's range is the max norm (it gave 0, clipping off, or 1).
  for (double p : {1e39, 1e300}) {
    SCOPED_TRACE(p);
    EXPECT_EQ(CheckClippedStep(1e-3, p), norms[std::numeric_limits<double>::infinity()]);
  }
}

TEST(OptimizerTest, RejectsBadInputs) {
  testing::TestMlp mlp = testing::BuildTestMlp();
  auto gradients = Autodiff(mlp.graph);
  ASSERT_TRUE(gradients.ok());
  GradientMap wrong = *gradients;
  wrong[mlp.w1] = gradients->at(mlp.b1);  // shape mismatch
  auto result = ApplyOptimizer(mlp.graph, wrong, {});
  ASSERT_FALSE(result.ok());
  EXPECT_CONTAINS(result.status().message(), "fc1.weight");
  EXPECT_FALSE(ApplyOptimizer(mlp.graph, *gradients, {.clip_grad_max_norm = -1.0}).ok());
  for (double p : {0.0, -1.0, std::nan(""), -std::numeric_limits<double>::infinity()}) {
    auto bad = ApplyOptimizer(mlp.graph, *gradients, {.clip_grad_max_norm = 1.0, .clip_grad_norm_type = p});
    ASSERT_FALSE(bad.ok()) << p;
    EXPECT_CONTAINS(bad.status().message(), "clip_grad_norm_type must be positive");
  }
}

TEST(TrainingTest, SgdLossGoesDownOver20Steps) {
  OptimizedMlp m = BuildOptimizedMlp({.kind = OptimizerKind::kSgd, .momentum = 0.9});
  ASSERT_TRUE(EliminateDeadCode(m.mlp.graph).ok());  // ids of the MLP survive: nothing is dead
  const Graph& graph = m.mlp.graph;
  GraphInterpreter interpreter(graph);
  ASSERT_TRUE(interpreter.InitVariables().ok());
  const auto feeds = Feeds(0.1f);
  std::vector<double> losses;
  for (int64_t step = 0; step < 20; ++step) {
    auto values = interpreter.Run(feeds, step);
    ASSERT_TRUE(values.ok()) << values.status();
    losses.push_back(ValueOf(*values, graph.losses().front())[0]);
    ASSERT_TRUE(std::isfinite(losses.back()));
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "first " << losses.front() << ", last " << losses.back();
  for (size_t i = 5; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 5]) << "step " << i;
}

// Two micro-batches of 4 with accumulation give the same gradients and
// updates as one batch of 8 (loss normalised by the global batch).
TEST(GradientAccumulationTest, TwoMicroBatchesMatchOneBatch) {
  const OptimizerOptions options{.kind = OptimizerKind::kSgd, .weight_decay = 0.1, .momentum = 0.9};
  OptimizedMlp whole = BuildOptimizedMlp(options);

  testing::TestMlp micro = testing::BuildTestMlp(testing::kBatch / 2);
  auto gradients = Autodiff(micro.graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  auto accumulated = AccumulateGradients(micro.graph, *gradients, 2);
  ASSERT_TRUE(accumulated.ok()) << accumulated.status();
  ASSERT_EQ(accumulated->gradients.size(), 4u);
  auto optimized = ApplyOptimizer(micro.graph, accumulated->gradients, options);
  ASSERT_TRUE(optimized.ok()) << optimized.status();
  ASSERT_TRUE(EliminateDeadCode(micro.graph).ok());
  const std::string text = micro.graph.ToText();
  EXPECT_CONTAINS(text, "repeat(%");
  EXPECT_CONTAINS(text, "acc(%");
  EXPECT_CONTAINS(text, "{num_micro_batches=2}");
  // Autodiff belongs before accumulation.
  Graph again = micro.graph;
  EXPECT_FALSE(Autodiff(again).ok());

  GraphInterpreter reference(whole.mlp.graph), accumulating(micro.graph);
  ASSERT_TRUE(reference.InitVariables().ok());
  ASSERT_TRUE(accumulating.InitVariables().ok());
  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(reference.Run(Feeds(0.1f), step).ok());
    auto values = accumulating.Run(Feeds(0.1f), step);
    ASSERT_TRUE(values.ok()) << values.status();
    for (ValueId var : whole.variables()) {
      const std::string& name = whole.mlp.graph.value(var).name;
      const std::vector<double> want = reference.GetVariable(name)->ToDoubleVector();
      const std::vector<double> got = accumulating.GetVariable(name)->ToDoubleVector();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << name << "[" << i << "] step " << step;
    }
  }
}

TEST(GradientAccumulationTest, OneMicroBatchChangesNothing) {
  testing::TestMlp mlp = testing::BuildTestMlp();
  auto gradients = Autodiff(mlp.graph);
  ASSERT_TRUE(gradients.ok());
  const std::string before = mlp.graph.ToText();
  auto accumulated = AccumulateGradients(mlp.graph, *gradients, 1);
  ASSERT_TRUE(accumulated.ok());
  EXPECT_EQ(accumulated->gradients, *gradients);
  EXPECT_EQ(mlp.graph.ToText(), before);
  EXPECT_FALSE(AccumulateGradients(mlp.graph, *gradients, 0).ok());
}

}  // namespace
}  // namespace tessera::graph
