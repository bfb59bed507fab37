#include "scheduler/lower.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <vector>

#include "actors/plan.h"
#include "comm/proto/memory_plan.h"
#include "core/text.h"
#include "google/protobuf/util/message_differencer.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "tests/graph/graph_interpreter.h"
#include "tests/graph/test_mlp.h"
#include "train/engine.h"
#include "train/feeds.h"

namespace tessera {
namespace {

using graph::testing::BuildTestMlp;
using graph::testing::GraphInterpreter;
using graph::testing::TestMlpFeeds;

std::unique_ptr<Engine> CompileMlp(graph::OptimizerKind kind = graph::OptimizerKind::kAdamW) {
  CompileOptions options;
  options.optimizer.kind = kind;
  options.optimizer.momentum = 0.9;
  options.optimizer.weight_decay = 0.01;
  options.optimizer.clip_grad_max_norm = 1.0;
  options.stall_timeout_s = 20;
  auto engine = Engine::Compile(BuildTestMlp().graph, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

constexpr float kLr = 0.05f;

std::map<std::string, Tensor> Feeds(int64_t iteration) {
  auto feeds = TestMlpFeeds(7 + iteration);
  feeds["lr"] = Tensor::FromVector(Shape{}, std::vector<float>{kLr});
  return feeds;
}

// Rows of `global` (a global batch) that micro-batch k of shape `out` takes;
// `global` itself when it is no batch (the learning rate).
Tensor MicroBatch(const Tensor& global, const Tensor& out, int64_t k) {
  if (global.shape() == out.shape()) return global;
  const int64_t rows = out.shape()[0];
  return *global.SliceRows(k * rows, rows);
}

// Runs the engine, returning the per-iteration losses.
std::vector<double> RunEngine(Engine& engine, int64_t iterations, std::map<std::string, double>* last_fetch = nullptr) {
  std::vector<double> losses(static_cast<size_t>(iterations), NAN);
  const auto feed = [](int64_t iteration, int64_t micro_batch, std::string_view input, const Tensor& out) -> absl::Status {
    Tensor t = out;
    return t.CopyFrom(MicroBatch(Feeds(iteration).at(std::string(input)), out, micro_batch));
  };
  const auto fetch = [&](int64_t iteration, const std::map<std::string, Tensor>& values) -> absl::Status {
    losses.at(static_cast<size_t>(iteration)) = values.at("loss").ToVector<float>().at(0);
    if (last_fetch != nullptr) {
      for (const auto& [name, t] : values) (*last_fetch)[name] = t.ToVector<float>().at(0);
    }
    return absl::OkStatus();
  };
  const absl::Status status = engine.Run(iterations, feed, fetch);
  EXPECT_TRUE(status.ok()) << status;
  return losses;
}

TEST(LowerTest, MlpPlanHasEveryKindQuotasAndMemory) {
  auto engine = CompileMlp();
  ASSERT_NE(engine, nullptr);
  auto plan = engine->Plan(3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<proto::ActorKind, int> kinds;
  for (const auto& task : plan->tasks()) ++kinds[task.kind()];
  EXPECT_EQ(kinds[proto::ACTOR_KIND_SOURCE], 3);     // x, labels, lr
  // w1, b1, w2, b2 (Adam state inside) + the constants (autodiff seed, clip's 1).
  EXPECT_GE(kinds[proto::ACTOR_KIND_PARAMETER], 4);
  EXPECT_GT(kinds[proto::ACTOR_KIND_COMPUTE], 10);
  EXPECT_EQ(kinds[proto::ACTOR_KIND_SINK], 1);
  for (const auto& task : plan->tasks()) {
    if (task.kind() == proto::ACTOR_KIND_PARAMETER && task.name().starts_with("param:")) {
      EXPECT_EQ(task.op(), "adamw_update") << task.name();
      EXPECT_EQ(task.state_size(), 2) << task.name();
    }
  }
  std::map<uint64_t, proto::ActorKind> kind_of;
  for (const auto& task : plan->tasks()) kind_of[task.actor_id()] = task.kind();
  for (const auto& desc : plan->register_descs()) {
    EXPECT_EQ(desc.register_num(), kind_of[desc.producer()] == proto::ACTOR_KIND_SOURCE ? 2 : 1) << desc.id();
    EXPECT_GT(desc.bytes_per_register(), 0) << desc.id();
  }
  ASSERT_EQ(plan->memory_estimate_size(), 1);
  EXPECT_EQ(plan->memory_estimate(0).device(), "cpu:0");
  EXPECT_GT(plan->memory_estimate(0).bytes(), 0);
  // The scheduler's own estimate agrees with the runtime's.
  const auto runtime_estimate = actors::EstimateMemory(*plan);
  ASSERT_TRUE(runtime_estimate.ok()) << runtime_estimate.status();
  ASSERT_EQ(runtime_estimate->size(), 1u);
  EXPECT_EQ((*runtime_estimate)[0].device(), plan->memory_estimate(0).device());
  EXPECT_EQ((*runtime_estimate)[0].bytes(), plan->memory_estimate(0).bytes());
  EXPECT_TRUE(actors::ValidatePlan(*plan, ops::BuiltinOps()).ok()) << actors::ValidatePlan(*plan, ops::BuiltinOps());

  auto parsed = actors::ParsePlan(actors::SerializePlan(*plan));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*parsed, *plan));
  EXPECT_EQ(parsed->tasks_size(), plan->tasks_size());
}

TEST(LowerTest, AccumulationPlanRunsPerMicroBatchBetweenRepeatAndAcc) {
  auto mlp = BuildTestMlp();
  auto grads = graph::Autodiff(mlp.graph);
  ASSERT_TRUE(grads.ok());
  auto acc = graph::AccumulateGradients(mlp.graph, *grads, 3);
  ASSERT_TRUE(acc.ok()) << acc.status();
  auto opt = graph::ApplyOptimizer(mlp.graph, acc->gradients, {});
  ASSERT_TRUE(opt.ok()) << opt.status();
  ASSERT_TRUE(graph::EliminateDeadCode(mlp.graph).ok());
  auto lowered = scheduler::LowerToPlan(mlp.graph, {.iterations = 2});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const proto::Plan& plan = lowered->plan;
  EXPECT_TRUE(actors::ValidatePlan(plan, ops::BuiltinOps()).ok()) << actors::ValidatePlan(plan, ops::BuiltinOps());
  std::map<proto::ActorKind, int> kinds;
  for (const auto& task : plan.tasks()) {
    ++kinds[task.kind()];
    if (task.kind() == proto::ACTOR_KIND_REPEAT || task.kind() == proto::ACTOR_KIND_ACC) {
      EXPECT_EQ(task.repeat_num(), 3);
    }
    if (task.callback() == "input:x" || task.callback() == "input:labels") {
      EXPECT_EQ(actors::PiecesPerIteration(task), 3) << task.name();
    }
    if (task.callback() == "input:lr") {
      EXPECT_EQ(actors::PiecesPerIteration(task), 1);
    }
    if (task.kind() == proto::ACTOR_KIND_PARAMETER) {  // variables and constants
      EXPECT_EQ(actors::PiecesPerIteration(task), 1) << task.name();
    }
  }
  // w1, b1, w2, b2 and the constant seed of the loss gradient: backward
  // holds each micro-batch's view of it as long as its quota allows.
  EXPECT_EQ(kinds[proto::ACTOR_KIND_REPEAT], 5);
  EXPECT_EQ(kinds[proto::ACTOR_KIND_ACC], 5);     // their gradients and the loss
  // Repeat hands out views: no bytes of its own.
  std::map<uint64_t, proto::ActorKind> kind_of;
  for (const auto& task : plan.tasks()) kind_of[task.actor_id()] = task.kind();
  for (const auto& desc : plan.register_descs()) {
    if (kind_of[desc.producer()] == proto::ACTOR_KIND_REPEAT) {
      EXPECT_EQ(desc.bytes_per_register(), 0);
    }
  }
}

// The test MLP's training plan with gradients accumulated over m micro-batches.
absl::StatusOr<proto::Plan> AccumulatedMlpPlan(int64_t m) {
  auto mlp = BuildTestMlp();
  ASSIGN_OR_RETURN(graph::GradientMap grads, graph::Autodiff(mlp.graph));
  RETURN_IF_ERROR(graph::AccumulateGradients(mlp.graph, grads, m).status());
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, scheduler::LowerToPlan(mlp.graph));
  return lowered.plan;
}

TEST(LowerTest, PlanWithMismatchedRatesIsRejected) {
  auto lowered = AccumulatedMlpPlan(2);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  proto::Plan plan = *lowered;
  for (auto& task : *plan.mutable_tasks()) {
    if (task.callback() == "input:x") task.set_pieces_per_iteration(1);
  }
  const absl::Status status = actors::ValidatePlan(plan, ops::BuiltinOps());
  EXPECT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "piece(s) per iteration");
}

// Under accumulation every Acc signals the per-micro-batch Sources of its
// device through a window desc (window 1 on one stage: micro-batch k + 1
// starts once k's gradients are summed); without it there are none.
TEST(LowerTest, AccumulationGatesMicroBatchesThroughWindowDescs) {
  for (const int64_t m : {1, 3}) {
    SCOPED_TRACE(StrCat(m, " micro-batches"));
    auto lowered = AccumulatedMlpPlan(m);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    const proto::Plan& plan = *lowered;
    std::map<uint64_t, const proto::Task*> task_of;
    std::vector<uint64_t> micro_sources;
    int accs = 0;
    for (const auto& task : plan.tasks()) {
      task_of[task.actor_id()] = &task;
      if (task.kind() == proto::ACTOR_KIND_SOURCE && task.pieces_per_iteration() == m && m > 1) {
        micro_sources.push_back(task.actor_id());
      }
      accs += task.kind() == proto::ACTOR_KIND_ACC ? 1 : 0;
    }
    int windows = 0;
    for (const auto& desc : plan.register_descs()) {
      if (desc.window() == 0) continue;
      ++windows;
      EXPECT_EQ(desc.window(), 1);
      EXPECT_EQ(desc.register_num(), 1);
      EXPECT_EQ(desc.tensors_size(), 0);
      EXPECT_EQ(task_of.at(desc.producer())->kind(), proto::ACTOR_KIND_ACC);
      EXPECT_EQ(std::vector<uint64_t>(desc.consumers().begin(), desc.consumers().end()), micro_sources);
    }
    EXPECT_EQ(windows, m > 1 ? accs : 0);
    if (m > 1) {
      EXPECT_GT(windows, 0);
    }
    EXPECT_TRUE(actors::ValidatePlan(plan, ops::BuiltinOps()).ok());
    EXPECT_TRUE(comm::CheckMemoryPlan(plan).ok());
  }
  // A window desc that is not one (tensors, another producer kind) is refused.
  auto lowered = AccumulatedMlpPlan(2);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  for (int i = 0; i < lowered->register_descs_size(); ++i) {
    if (lowered->register_descs(i).window() != 0) continue;
    proto::Plan plan = *lowered;
    plan.mutable_register_descs(i)->set_window(1);
    const absl::Status status = actors::ValidatePlan(plan, ops::BuiltinOps());
    EXPECT_FALSE(status.ok());
    EXPECT_CONTAINS(status.message(), "window");
    break;
  }
  for (int i = 0; i < lowered->register_descs_size(); ++i) {
    if (lowered->register_descs(i).window() == 0) continue;
    proto::Plan plan = *lowered;
    plan.mutable_register_descs(i)->set_window(2);  // as many as the micro-batches
    const absl::Status status = actors::ValidatePlan(plan, ops::BuiltinOps());
    EXPECT_FALSE(status.ok());
    EXPECT_CONTAINS(status.message(), "window");
    break;
  }
}

TEST(EngineTest, AccumulatedMicroBatchesEqualOneLargeBatch) {
  // The test MLP is built at batch 8: m = 2 micro-batches of 4 rows see the
  // same 8 samples per iteration as one batch of 8.
  CompileOptions options;
  options.optimizer.kind = graph::OptimizerKind::kSgd;
  options.optimizer.momentum = 0.9;
  options.stall_timeout_s = 20;
  auto whole = Engine::Compile(BuildTestMlp().graph, options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  options.num_micro_batches = 2;
  auto half = graph::testing::BuildTestMlp(/*batch=*/4);
  auto micro = Engine::Compile(std::move(half.graph), options);
  ASSERT_TRUE(micro.ok()) << micro.status();
  std::map<std::string, double> last_whole, last_micro;
  const std::vector<double> a = RunEngine(**whole, 6, &last_whole);
  const std::vector<double> b = RunEngine(**micro, 6, &last_micro);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-6 * std::abs(a[i])) << "iteration " << i;
}

void ExpectMatchesOracle(graph::OptimizerKind kind) {
  auto engine = CompileMlp(kind);
  ASSERT_NE(engine, nullptr);
  constexpr int64_t kSteps = 4;
  const std::vector<double> losses = RunEngine(*engine, kSteps);

  GraphInterpreter oracle(engine->graph());
  ASSERT_TRUE(oracle.InitVariables().ok());
  const graph::ValueId loss = engine->graph().losses().at(0);
  for (int64_t it = 0; it < kSteps; ++it) {
    auto values = oracle.Run(Feeds(it), it);
    ASSERT_TRUE(values.ok()) << values.status();
    const double expected = (*values)[static_cast<size_t>(loss)].ToVector<float>().at(0);
    EXPECT_NEAR(losses[static_cast<size_t>(it)], expected, 1e-5 * std::abs(expected) + 1e-7) << "iteration " << it;
  }
}

TEST(EngineTest, AdamWLossesMatchOracle) { ExpectMatchesOracle(graph::OptimizerKind::kAdamW); }
TEST(EngineTest, SgdLossesMatchOracle) { ExpectMatchesOracle(graph::OptimizerKind::kSgd); }

TEST(EngineTest, LossFallsOver50Steps) {
  auto engine = CompileMlp();
  ASSERT_NE(engine, nullptr);
  std::map<std::string, double> last;
  const std::vector<double> losses = RunEngine(*engine, 50, &last);
  double first = 0, final = 0;
  for (int i = 0; i < 5; ++i) {
    first += losses[static_cast<size_t>(i)];
    final += losses[static_cast<size_t>(45 + i)];
  }
  EXPECT_LT(final, 0.8 * first) << "first " << first / 5 << " last " << final / 5;
  EXPECT_TRUE(last.contains("grad_norm"));
}

TEST(EngineTest, ForwardOnlyKeepsVariables) {
  CompileOptions options;
  options.train = false;
  auto engine = Engine::Compile(BuildTestMlp().graph, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE((*engine)->graph().FindInput("lr").ok());
  const std::vector<double> losses = RunEngine(**engine, 2);
  GraphInterpreter oracle((*engine)->graph());
  ASSERT_TRUE(oracle.InitVariables().ok());
  auto feeds = Feeds(1);
  feeds.erase("lr");
  auto values = oracle.Run(feeds, 1);
  ASSERT_TRUE(values.ok()) << values.status();
  const double expected = (*values)[static_cast<size_t>((*engine)->graph().losses().at(0))].ToVector<float>().at(0);
  EXPECT_NEAR(losses[1], expected, 1e-5 * std::abs(expected));
}

TEST(EngineTest, FeedErrorStopsTheRunAndIsReturned) {
  auto engine = CompileMlp();
  ASSERT_NE(engine, nullptr);
  const auto feed = [](int64_t iteration, int64_t, std::string_view input, const Tensor& out) -> absl::Status {
    if (iteration == 2 && input == "x") return absl::DataLossError("bad batch");
    Tensor t = out;
    return t.CopyFrom(Feeds(iteration).at(std::string(input)));
  };
  int64_t fetched = 0;
  const auto fetch = [&](int64_t, const std::map<std::string, Tensor>&) {
    ++fetched;
    return absl::OkStatus();
  };
  const absl::Status status = engine->Run(5, feed, fetch);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_CONTAINS(status.message(), "bad batch");
  EXPECT_LE(fetched, 2);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Data parallelism over virtual CPU devices: the same losses as one device.
TEST(EngineTest, DataParallelMatchesOneDevice) {
  auto one = CompileMlp(graph::OptimizerKind::kAdamW);
  ASSERT_NE(one, nullptr);
  const std::vector<double> expected = RunEngine(*one, 5);
  for (int64_t dp : {2, 4}) {
    SCOPED_TRACE(StrCat("dp=", dp));
    CompileOptions options;
    options.optimizer.kind = graph::OptimizerKind::kAdamW;
    options.optimizer.weight_decay = 0.01;
    options.optimizer.clip_grad_max_norm = 1.0;
    options.stall_timeout_s = 20;
    options.lower.parallel.world_size = dp;
    auto engine = Engine::Compile(BuildTestMlp().graph, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto plan = (*engine)->Plan(1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    int collectives = 0;
    for (const auto& task : plan->tasks()) collectives += task.kind() == proto::ACTOR_KIND_COLLECTIVE;
    EXPECT_GT(collectives, 0);
    const std::vector<double> losses = RunEngine(**engine, 5);
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(losses[i], expected[i], 1e-5 * std::abs(expected[i])) << "iteration " << i;
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A second Run goes on from the first: Run(3) + Run(2) = Run(5), bit for bit.
TEST(EngineTest, RunsContinueWhereTheLastStopped) {
  auto once = CompileMlp(graph::OptimizerKind::kAdamW);
  auto twice = CompileMlp(graph::OptimizerKind::kAdamW);
  ASSERT_NE(once, nullptr);
  ASSERT_NE(twice, nullptr);
  const std::vector<double> all = RunEngine(*once, 5);
  std::vector<double> parts(5, NAN);
  const auto feed = [](int64_t iteration, int64_t micro_batch, std::string_view input, const Tensor& out) -> absl::Status {
    Tensor t = out;
    return t.CopyFrom(MicroBatch(Feeds(iteration).at(std::string(input)), out, micro_batch));
  };
  const auto fetch = [&parts](int64_t iteration, const std::map<std::string, Tensor>& values) -> absl::Status {
    parts.at(static_cast<size_t>(iteration)) = values.at("loss").ToVector<float>().at(0);
    return absl::OkStatus();
  };
  ASSERT_TRUE(twice->Run(3, feed, fetch).ok());
  auto plan = twice->Plan(2);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->start_iteration(), 3);
  ASSERT_TRUE(twice->Run(2, feed, fetch).ok());
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(parts[i], all[i]) << "iteration " << i;
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Under gradient accumulation a random op draws at the indices of the
// iteration's tensor: for a transposed activation the micro-batches lie
// along axis 1, so its refs move along axis 1 (stride = the micro-batch's
// columns), and a plain one along axis 0.
TEST(LowerTest, RandomOpsMoveAlongTheValuesBatchAxis) {
  constexpr int64_t kRows = 4, kFeatures = 3;
  graph::GraphBuilder b;
  graph::Sym x = b.Input("x", {DType::kF32, Shape{kRows, kFeatures}});
  const graph::Sym w = b.Variable("w", Shape{kFeatures, kFeatures}, graph::InitRule::Normal(0, 0.3, 1, 0));
  graph::Sym h = graph::Matmul(x, w);
  h = b.Apply("dropout", {h}, {{"rate", 0.25}, {"seed", int64_t{7}}, {"tensor_id", int64_t{1}}});
  h = graph::Transpose(b.Apply("dropout", {graph::Transpose(h, {1, 0})}, {{"rate", 0.25}, {"seed", int64_t{7}}, {"tensor_id", int64_t{2}}}),
                       {1, 0});
  b.MarkLoss(graph::ReduceMean(h * h));
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  CompileOptions options;
  options.num_micro_batches = 2;
  auto engine = Engine::Compile(*std::move(graph), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto plan = (*engine)->Plan(1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<int64_t, std::pair<int32_t, int64_t>> forward;  // tensor_id -> (axis, stride) of the input
  for (const proto::Task& task : plan->tasks()) {
    if (task.op() != "dropout" || task.name().find("grad") != std::string::npos) continue;
    forward[task.attrs().at("tensor_id").i()] = {task.inputs(0).micro_batch_axis(), task.inputs(0).micro_batch_stride()};
    EXPECT_EQ(task.inputs(0).slice().logical_shape(task.inputs(0).micro_batch_axis()), 2 * task.inputs(0).micro_batch_stride());
  }
  ASSERT_EQ(forward.size(), 2u);
  EXPECT_EQ(forward[1], (std::pair<int32_t, int64_t>{0, kRows}));
  EXPECT_EQ(forward[2], (std::pair<int32_t, int64_t>{1, kRows}));
}

// `graph` compiled for one device with SGD over `m` micro-batches.
absl::StatusOr<std::unique_ptr<Engine>> CompileWithSgd(graph::Graph graph, int64_t m) {
  CompileOptions options;
  options.optimizer.kind = graph::OptimizerKind::kSgd;
  options.num_micro_batches = m;
  options.stall_timeout_s = 20;
  return Engine::Compile(std::move(graph), options);
}

// A loss normalised per micro-batch (BERT's masked-LM loss divides by its
// micro-batch's count of masked tokens) has no S/B/P layout over the
// micro-batches, nor has any gradient downstream of it; the dropout's
// gradient still draws its forward's numbers (its dy lies as the forward's
// x). With each micro-batch holding the same count, the losses are those of
// one batch; a mask drawn at the wrong micro-batch offset would change them
// from the second iteration on.
TEST(LowerTest, DropoutGradientsDrawTheForwardsMasksUnderAPerMicroBatchLoss) {
  constexpr int64_t kRows = 8, kFeatures = 5, kIterations = 4;
  std::vector<double> losses[2];
  for (const int64_t m : {1, 2}) {
    SCOPED_TRACE(StrCat(m, " micro-batches"));
    const int64_t rows = kRows / m;
    graph::GraphBuilder b;
    const graph::Sym x = b.Input("x", {DType::kF32, Shape{rows, kFeatures}});
    const graph::Sym weights = b.Input("weights", {DType::kF32, Shape{rows, 1}});
    const graph::Sym w = b.Variable("w", Shape{kFeatures, kFeatures}, graph::InitRule::Normal(0, 0.5, 1, 0));
    graph::Sym h =
        b.Apply("dropout", {graph::Matmul(x, w)}, {{"rate", 0.4}, {"seed", int64_t{7}}, {"tensor_id", int64_t{1}}});
    h = graph::Tanh(h);
    b.MarkLoss(graph::ReduceSum(h * h * weights) / graph::ReduceSum(weights));
    auto graph = b.Finish();
    ASSERT_TRUE(graph.ok()) << graph.status();
    auto engine = CompileWithSgd(*std::move(graph), m);
    ASSERT_TRUE(engine.ok()) << engine.status();
    if (m > 1) {
      auto plan = (*engine)->Plan(1);
      ASSERT_TRUE(plan.ok()) << plan.status();
      int gradients = 0;
      for (const proto::Task& task : plan->tasks()) {
        if (task.op() != "dropout" || task.name().find("grad") == std::string::npos) continue;
        ++gradients;
        EXPECT_EQ(task.inputs(0).micro_batch_axis(), 0);
        EXPECT_EQ(task.inputs(0).micro_batch_stride(), rows);
      }
      EXPECT_EQ(gradients, 1);
    }
    losses[m - 1].assign(kIterations, NAN);
    const auto feed = [rows](int64_t it, int64_t micro, std::string_view input, const Tensor& out) -> absl::Status {
      if (out.shape().rank() != 2) {  // the learning rate
        out.data<float>()[0] = 0.5f;
        return absl::OkStatus();
      }
      const int64_t columns = out.shape()[1];
      for (int64_t i = 0; i < out.NumElements(); ++i) {
        const int64_t row = micro * rows + i / columns;
        // Every micro-batch of 4 rows weighs 3 of them (1, 1, 0, 1).
        out.data<float>()[i] = input == "weights"
                                   ? (row % 4 == 2 ? 0.0f : 1.0f)
                                   : std::sin(0.9f * static_cast<float>(row) + 0.4f * static_cast<float>(i % columns) +
                                              static_cast<float>(it));
      }
      return absl::OkStatus();
    };
    const auto fetch = [&, m](int64_t it, const std::map<std::string, Tensor>& values) {
      losses[m - 1][static_cast<size_t>(it)] = values.at("loss").ToVector<float>().at(0);
      return absl::OkStatus();
    };
    ASSERT_TRUE((*engine)->Run(kIterations, feed, fetch).ok());
  }
  for (int64_t it = 0; it < kIterations; ++it) {
    EXPECT_NEAR(losses[1][static_cast<size_t>(it)], losses[0][static_cast<size_t>(it)], 1e-6) << "iteration " << it;
  }
  EXPECT_GT(std::abs(losses[0][kIterations - 1] - losses[0][0]), 1e-3);  // it trains
}

// A value fetched under several names (BERT without its next-sentence head
// fetches its loss as mlm_loss too) reaches the fetch under each, averaged
// over the micro-batches as the loss is; a sink's alias of nothing it
// fetches, or of a name taken, is an error when the fetch is bound.
TEST(LowerTest, AValueFetchedUnderSeveralNamesArrivesUnderEach) {
  for (const int64_t m : {1, 2}) {
    SCOPED_TRACE(StrCat(m, " micro-batches"));
    graph::GraphBuilder b;
    const graph::Sym x = b.Input("x", {DType::kF32, Shape{4, 3}});
    const graph::Sym w = b.Variable("w", Shape{3, 2}, graph::InitRule::Normal(0, 0.5, 1, 0));
    const graph::Sym h = graph::Matmul(x, w);
    const graph::Sym loss = graph::ReduceMean(h * h);
    b.MarkLoss(loss);
    b.MarkFetch("also_loss", loss);
    b.MarkFetch("h_sum", graph::ReduceSum(h));
    auto graph = b.Finish();
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(graph->MarkFetch("loss_twice", graph->losses()[0]).ok());
    auto engine = CompileWithSgd(*std::move(graph), m);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<std::map<std::string, float>> fetched;
    const auto feed = [](int64_t it, int64_t micro, std::string_view input, const Tensor& out) -> absl::Status {
      for (int64_t i = 0; i < out.NumElements(); ++i) {
        out.data<float>()[i] =
            input == "lr" ? 0.1f : std::cos(0.3f * static_cast<float>(i + 12 * micro) + static_cast<float>(it));
      }
      return absl::OkStatus();
    };
    const auto fetch = [&fetched](int64_t, const std::map<std::string, Tensor>& values) {
      std::map<std::string, float>& row = fetched.emplace_back();
      for (const auto& [name, tensor] : values) row[name] = tensor.ToVector<float>().at(0);
      return absl::OkStatus();
    };
    ASSERT_TRUE((*engine)->Run(2, feed, fetch).ok());
    ASSERT_EQ(fetched.size(), 2u);
    for (const auto& row : fetched) {
      EXPECT_EQ(row.size(), 4u);
      EXPECT_EQ(row.at("also_loss"), row.at("loss"));
      EXPECT_EQ(row.at("loss_twice"), row.at("loss"));
    }
    EXPECT_NE(fetched[0].at("loss"), fetched[1].at("loss"));
    if (m > 1) continue;  // each fetch is its own mean over the micro-batches

    auto plan = (*engine)->Plan(1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    proto::Task* sink = nullptr;
    for (proto::Task& task : *plan->mutable_tasks()) {
      if (task.kind() == proto::ACTOR_KIND_SINK) sink = &task;
    }
    ASSERT_NE(sink, nullptr);
    EXPECT_EQ(sink->fetch_aliases_size(), 2);
    actors::HostCallbacks callbacks;
    ASSERT_TRUE(BindFetch(*plan, fetch, callbacks).ok());
    proto::FetchAlias* bad = sink->add_fetch_aliases();
    bad->set_name("nowhere");
    bad->set_of("no_such_fetch");
    absl::Status status = BindFetch(*plan, fetch, callbacks);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("'no_such_fetch', which the sink does not fetch"), std::string::npos) << status;
    bad->set_name("h_sum");
    bad->set_of("loss");
    status = BindFetch(*plan, fetch, callbacks);
    EXPECT_NE(status.message().find("fetch alias 'h_sum' is empty or names another fetch"), std::string::npos)
        << status;
    bad->set_name("a\nb");  // a plan from the wire: still a one-line error
    bad->set_of("nothing");
    status = BindFetch(*plan, fetch, callbacks);
    EXPECT_NE(status.message().find("fetch alias 'a\\nb' is of 'nothing'"), std::string::npos) << status;
  }
}

// Reshapes cost no copy: the lowering folds each reshape whose readers are
// all computes into them (LowerOptions::fold_reshapes), a chain into one
// view of its first input; one a Send reads stays a copy. The losses are
// those of the plan that copies every reshape.
TEST(LowerTest, ReshapesFoldIntoTheirReadersAsViews) {
  graph::GraphBuilder b;
  graph::Sym h = b.Input("x", {DType::kF32, Shape{4, 6}});
  {
    auto scope = b.Scope("l0", 0);
    h = graph::Tanh(graph::Matmul(h, b.Variable("w0", Shape{6, 6}, graph::InitRule::Normal(0, 0.3, 1, 0))));
    h = graph::Reshape(graph::Reshape(h, Shape{4, 2, 3}), Shape{4, 6});
    // Reads the view in the forward, its gradient in the backward: the
    // tanh's register is kept for this stage's micro-batches in flight.
    h = graph::Matmul(h, b.Variable("w0b", Shape{6, 6}, graph::InitRule::Normal(0, 0.3, 1, 2)));
    h = graph::Reshape(h, Shape{24});  // read by the Send to stage 1: a copy
  }
  {
    auto scope = b.Scope("l1", 1);
    h = graph::Matmul(graph::Reshape(h, Shape{4, 6}),  // reads the Recv's register
                      b.Variable("w1", Shape{6, 3}, graph::InitRule::Normal(0, 0.3, 1, 1)));
    b.MarkLoss(graph::ReduceMean(graph::Reshape(h * h, Shape{12})));
  }
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<double> losses[2];
  for (const bool fold : {false, true}) {
    SCOPED_TRACE(fold ? "folded" : "copied");
    CompileOptions options;
    options.optimizer.kind = graph::OptimizerKind::kSgd;
    options.num_micro_batches = 2;
    options.stall_timeout_s = 20;
    options.lower.fold_reshapes = fold;
    options.lower.parallel = {.pipeline = 2, .world_size = 2, .pipeline_num_layers = 2};
    auto engine = Engine::Compile(*graph, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto plan = (*engine)->Plan(1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(actors::ValidatePlan(*plan, ops::BuiltinOps()).ok());
    std::map<uint64_t, const proto::Task*> tasks;
    for (const proto::Task& task : plan->tasks()) tasks[task.actor_id()] = &task;
    for (int i = 0; i < plan->register_descs_size(); ++i) EXPECT_EQ(plan->register_descs(i).id(), i);
    int reshapes = 0, views = 0, chain = 0;
    for (const proto::Task& task : plan->tasks()) {
      if (task.op() == "reshape") {
        ++reshapes;
        const proto::RegisterDesc& out = plan->register_descs(static_cast<int>(task.produced_register_desc_ids(0)));
        bool sent = false;
        for (uint64_t reader : out.consumers()) sent |= tasks.at(reader)->kind() == proto::ACTOR_KIND_SEND;
        EXPECT_TRUE(sent || !fold) << task.name() << " stayed a copy, but no Send reads it";
      }
      for (const proto::TensorRef& ref : task.inputs()) {
        if (ref.view_shape_size() == 0) continue;
        ++views;
        const proto::RegisterDesc& desc = plan->register_descs(static_cast<int>(ref.register_desc_id()));
        EXPECT_NE(tasks.at(desc.producer())->op(), "reshape") << task.name();
        if (task.op() == "matmul" && task.name().starts_with("l0/matmul") &&
            tasks.at(desc.producer())->op() == "tanh") {
          ++chain;  // the chain's one view, of the tanh's register
          EXPECT_EQ(std::vector<int64_t>(ref.view_shape().begin(), ref.view_shape().end()),
                    (std::vector<int64_t>{4, 6}));
          EXPECT_GE(desc.register_num(), 2);
        }
      }
    }
    if (fold) {
      EXPECT_EQ(reshapes, 2);  // the forward's and the backward's into a Send
      EXPECT_EQ(chain, 1);
      EXPECT_GE(views, 6);  // forward, gradient and the loss's readers
      // A plan from elsewhere with a bad view is a one-line error.
      int reader = 0;
      while (plan->tasks(reader).inputs_size() == 0 || plan->tasks(reader).inputs(0).view_shape_size() == 0) ++reader;
      const auto refused = [&](const std::function<void(proto::Task&)>& spoil, const std::string& what) {
        proto::Plan bad = *plan;
        spoil(*bad.mutable_tasks(reader));
        const absl::Status status = actors::ValidatePlan(bad, ops::BuiltinOps());
        EXPECT_FALSE(status.ok()) << what;
        EXPECT_NE(status.message().find(what), std::string::npos) << status;
        EXPECT_EQ(status.message().find('\n'), std::string::npos) << status;
      };
      refused([](proto::Task& t) { t.mutable_inputs(0)->add_view_shape(2); }, "not the same number of elements");
      refused([](proto::Task& t) { t.mutable_inputs(0)->set_view_shape(0, -4); }, "negative");
      refused([](proto::Task& t) { t.mutable_outputs(0)->add_view_shape(1); }, "only inputs may");
      refused(
          [](proto::Task& t) {
            for (int i = 0; i < 70; ++i) t.mutable_inputs(0)->add_view_shape(1);
          },
          "dimensions");
    } else {
      EXPECT_GE(reshapes, 8);
      EXPECT_EQ(views, 0);
    }
    const auto feed = [](int64_t it, int64_t micro, std::string_view input, const Tensor& out) -> absl::Status {
      for (int64_t i = 0; i < out.NumElements(); ++i) {
        out.data<float>()[i] =
            input == "lr" ? 0.1f : std::sin(0.3f * static_cast<float>(i + 24 * micro) + static_cast<float>(it));
      }
      return absl::OkStatus();
    };
    const auto fetch = [&losses, fold](int64_t, const std::map<std::string, Tensor>& values) {
      losses[fold].push_back(values.at("loss").ToVector<float>().at(0));
      return absl::OkStatus();
    };
    ASSERT_TRUE((*engine)->Run(4, feed, fetch).ok());
  }
  ASSERT_EQ(losses[1].size(), 4u);
  EXPECT_EQ(losses[1], losses[0]);  // the same arithmetic: bit for bit
}

// On GPUs an op without a CUDA kernel is a plan error naming the op and its
// task, never a host fallback. Every built-in op has one, so the op is a
// registry's own (CPU only), and the check asks the graph's registry.
TEST(LowerTest, CudaPlanNamesAnOpWithoutACudaKernel) {
  ops::OpRegistry registry;
  ops::RegisterBuiltinOps(registry);
  registry.MustRegister(
      ops::OpSchema("host_only_double")
          .Doc("test: y = 2 x, with a CPU kernel only")
          .Input("x")
          .Output("y")
          .Infer([](const std::vector<TensorMeta>& in, const ops::AttrMap&) -> absl::StatusOr<std::vector<TensorMeta>> {
            return std::vector<TensorMeta>{in[0]};
          })
          .Sbp([](const std::vector<TensorMeta>&, const ops::AttrMap&, int64_t) {
            return std::vector<ops::SbpSignature>{{{Sbp::Broadcast()}, {Sbp::Broadcast()}}};
          })
          .Grad([](ops::GradBuilder& b) { b.SetInputGrad(0, b.Op("host_only_double", {b.output_grad(0)}, {})); })
          .Kernel(DeviceType::kCpu,
                  [](ops::KernelContext& ctx) {
                    const float* x = ctx.input(0).data<float>();
                    float* y = ctx.output(0).data<float>();
                    for (int64_t i = 0; i < ctx.input(0).NumElements(); ++i) y[i] = 2 * x[i];
                    return absl::OkStatus();
                  })
          .Example({{DType::kF32, Shape{2}}}, {}));
  graph::GraphBuilder b(&registry);
  const graph::Sym x = b.Input("x", {DType::kF32, Shape{4, 3}});
  const graph::Sym w = b.Variable("w", Shape{3, 3}, graph::InitRule::Normal(0, 0.3, 1, 0));
  const graph::Sym h = b.Apply("host_only_double", {graph::Matmul(x, w)}, {});
  b.MarkLoss(graph::ReduceMean(h * h));
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (const DeviceType type : {DeviceType::kCpu, DeviceType::kCuda}) {
    CompileOptions options;
    options.lower.parallel.device_type = type;
    auto engine = Engine::Compile(*graph, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto plan = (*engine)->Plan(1);
    if (type == DeviceType::kCpu) {
      EXPECT_TRUE(plan.ok()) << plan.status();
      continue;
    }
    ASSERT_FALSE(plan.ok());
    EXPECT_NE(plan.status().message().find("op 'host_only_double' (task '"), std::string::npos) << plan.status();
    EXPECT_NE(plan.status().message().find("has no cuda kernel"), std::string::npos) << plan.status();
  }
}

// The coordinator's launch order knows backward conversions by the nodes
// autodiff marks (graph::Node::backward), not by scope names: a forward loss
// under a scope "grad/..." is reduced as forward, its weight gradient as
// backward.
TEST(LowerTest, BackwardConversionsAreTheOnesAutodiffMade) {
  graph::GraphBuilder b;
  graph::Sym x = b.Input("x", {DType::kF32, Shape{4, 5}});
  graph::Sym w = b.Variable("w", {5, 3}, graph::InitRule::Normal(0, 0.5, 5, 0));
  {
    auto scope = b.Scope("grad/head");  // a forward scope that only looks like autodiff's
    b.MarkLoss(graph::ReduceMean(graph::Matmul(x, w)));
  }
  auto built = b.Finish();
  ASSERT_TRUE(built.ok()) << built.status();
  graph::Graph graph = *std::move(built);
  auto gradients = graph::Autodiff(graph);
  ASSERT_TRUE(gradients.ok()) << gradients.status();
  ASSERT_TRUE(graph.MarkFetch("dw", gradients->at(w.id())).ok());
  auto lowered = scheduler::LowerToPlan(graph, {.parallel = {.data = 2, .world_size = 2}});
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const std::string of_loss = StrCat("boxing:", graph::ValueRef(graph.losses()[0]), ":");
  const std::string of_gradient = StrCat("boxing:", graph::ValueRef(gradients->at(w.id())), ":");
  int loss_tasks = 0, gradient_tasks = 0;
  for (const proto::Task& task : lowered->plan.tasks()) {
    if (task.name().starts_with(of_loss)) {
      ++loss_tasks;
      EXPECT_FALSE(task.boxing().launch().backward()) << task.name();
    }
    if (task.name().starts_with(of_gradient)) {
      ++gradient_tasks;
      EXPECT_TRUE(task.boxing().launch().backward()) << task.name();
    }
  }
  EXPECT_EQ(loss_tasks, 2);  // its all-reduce, on each rank
  EXPECT_EQ(gradient_tasks, 2);
}

}  // namespace
}  // namespace tessera
