// Absurd sizes from a config, all the way from graph building to a loaded
// plan: each is an error naming what is wrong, never a wrapped count, an
// abort or an allocation of the size asked for (issue 9).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "actors/plan.h"
#include "actors/runtime.h"
#include "comm/proto/actor_id.h"
#include "graph/builder.h"
#include "scheduler/lower.h"
#include "scheduler/mesh.h"
#include "tests/graph/test_mlp.h"

namespace tessera {
namespace {

constexpr int64_t kHuge = int64_t{1} << 62;  // model.seq_length=4611686018427387904

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// (batch, 4) -> linear -> mean: the smallest trainable graph.
absl::StatusOr<graph::Graph> Linear(int64_t batch, int64_t width = 4) {
  graph::GraphBuilder b;
  graph::Sym x = b.Input("x", {DType::kF32, Shape{batch, width}});
  graph::Sym w = b.Variable("w", Shape{width, 2}, graph::InitRule::Zeros());
  b.MarkLoss(graph::ReduceMean(graph::Matmul(x, w)));
  return b.Finish();
}

TEST(Sizes, GraphValuesThatOverflowNameTheTensorAndDimension) {
  auto input = Linear(8, kHuge);
  ASSERT_FALSE(input.ok());
  EXPECT_CONTAINS(Message(input.status()), "graph input 'x'");
  EXPECT_CONTAINS(Message(input.status()), "dimension 1");

  graph::GraphBuilder b;
  b.Variable("wte", Shape{kHuge, 768}, graph::InitRule::Zeros());
  EXPECT_CONTAINS(Message(b.status()), "variable 'wte'");
  EXPECT_CONTAINS(Message(b.status()), "(4611686018427387904, 768)");
}

TEST(Sizes, OpOutputsMadeFromAttributesAreChecked) {
  const auto fails = [](const std::string& op, const std::vector<graph::Sym>& inputs, const ops::AttrMap& attrs,
                        const std::string& part) {
    graph::GraphBuilder* b = inputs.empty() ? nullptr : inputs[0].builder();
    std::unique_ptr<graph::GraphBuilder> own;
    if (b == nullptr) b = (own = std::make_unique<graph::GraphBuilder>()).get();
    b->Apply(op, inputs, attrs);
    EXPECT_FALSE(b->status().ok()) << op;
    EXPECT_CONTAINS(Message(b->status()), part);
  };
  fails("arange", {}, {{"n", kHuge}}, "op 'arange'");
  fails("zeros", {}, {{"shape", std::vector<int64_t>{1 << 20, 1 << 20, 1 << 20}}}, "dimension 2");
  fails("normal", {}, {{"shape", std::vector<int64_t>{kHuge, 2}}, {"seed", int64_t{1}}, {"tensor_id", int64_t{0}}},
        "more than 2^50 elements");
  {
    graph::GraphBuilder b;
    graph::Sym x = b.Input("x", {DType::kF32, Shape{4, 3}});
    fails("reshape", {x}, {{"shape", std::vector<int64_t>{kHuge, kHuge, -1}}}, "overflows int64");
  }
  {
    graph::GraphBuilder b;
    graph::Sym x = b.Input("x", {DType::kF32, Shape{4, 3}});
    fails("broadcast_to", {x}, {{"shape", std::vector<int64_t>{kHuge, 4, 3}}}, "output y");
  }
  {
    graph::GraphBuilder b;
    graph::Sym x = b.Input("x", {DType::kF32, Shape{4, 3}});
    fails("split", {x}, {{"axis", int64_t{0}}, {"sizes", std::vector<int64_t>{kHuge, kHuge, kHuge, 4}}},
          "overflows int64");
  }
  {
    // Each input fits; their concatenation (or product) does not.
    graph::GraphBuilder b;
    graph::Sym x = b.Input("x", {DType::kF32, Shape{int64_t{1} << 47}});
    fails("concat", {x, x, x}, {{"axis", int64_t{0}}}, "more than the limit of 2^50 bytes");
  }
  {
    graph::GraphBuilder b;
    graph::Sym a = b.Input("a", {DType::kF32, Shape{int64_t{1} << 30, 1}});
    graph::Sym c = b.Input("c", {DType::kF32, Shape{1, int64_t{1} << 30}});
    fails("matmul", {a, c}, {}, "op 'matmul'");
  }
}

TEST(Sizes, ThousandDevicesOnOneNodeAreAnError) {
  auto graph = Linear(8);
  ASSERT_TRUE(graph.ok()) << graph.status();
  scheduler::LowerOptions options;
  options.parallel.data = 1000;  // train.dist.data_parallel_size=1000
  options.parallel.world_size = 1000;
  auto plan = scheduler::LowerToPlan(*graph, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(Message(plan.status()), "1000 devices on one node: actor ids hold at most 256 (device index is 8 bits)");
  // 256 devices from cpu:1 do not fit either.
  options.parallel.data = 256;
  options.parallel.world_size = 256;
  options.device_index = 1;
  EXPECT_CONTAINS(Message(scheduler::LowerToPlan(*graph, options).status()), "256 devices from cpu:1 on one node");
}

TEST(Sizes, MeshRefusesAbsurdWorldsAndKeepsNoPerLayerTable) {
  auto huge = scheduler::DeviceMesh::Make({.data = -1, .world_size = int64_t{1} << 40});
  ASSERT_FALSE(huge.ok());
  EXPECT_CONTAINS(Message(huge.status()), "more than the 65536 devices");
  auto product = scheduler::DeviceMesh::Make({.data = kHuge, .tensor = kHuge, .pipeline = 4, .world_size = 16});
  ASSERT_FALSE(product.ok());
  // A trillion pipeline layers cost nothing to map (the stage is computed).
  const auto start = std::chrono::steady_clock::now();
  auto mesh = scheduler::DeviceMesh::Make({.pipeline = 4, .world_size = 4, .pipeline_num_layers = int64_t{1} << 40});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(*mesh->StageOfLayer(0), 0);
  EXPECT_EQ(*mesh->StageOfLayer((int64_t{1} << 40) - 1), 3);
  EXPECT_EQ(mesh->LayersPerStage(), (std::vector<int64_t>{int64_t{1} << 38, (int64_t{1} << 38) + 1,
                                                          (int64_t{1} << 38) + 1, (int64_t{1} << 38) - 2}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

TEST(Sizes, IterationCountsNeverSizeStorage) {
  auto graph = Linear(8);
  ASSERT_TRUE(graph.ok()) << graph.status();
  scheduler::LowerOptions options;
  options.iterations = 1'000'000'000'000;  // train.train_iter=1000000000000
  const auto start = std::chrono::steady_clock::now();
  auto lowered = scheduler::LowerToPlan(*graph, options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->plan.iterations(), 1'000'000'000'000);
  // Loading allocates per register, not per iteration.
  actors::RuntimeOptions runtime;
  for (const auto& task : lowered->plan.tasks()) {
    if (task.kind() == proto::ACTOR_KIND_PARAMETER)
      runtime.callbacks.initializers[task.callback()] = [](auto&) { return absl::OkStatus(); };
    if (task.kind() == proto::ACTOR_KIND_SOURCE)
      runtime.callbacks.sources[task.callback()] = [](int64_t, auto&) { return absl::OkStatus(); };
    if (task.kind() == proto::ACTOR_KIND_SINK)
      runtime.callbacks.sinks[task.callback()] = [](int64_t, auto&) { return absl::OkStatus(); };
  }
  auto loaded = actors::Runtime::Load(lowered->plan, runtime);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  // What does not fit in the act counts is refused.
  options.iterations = int64_t{1} << 62;
  options.start_iteration = int64_t{1} << 62;
  EXPECT_CONTAINS(Message(scheduler::LowerToPlan(*graph, options).status()), "overflows int64");
  options.start_iteration = 0;
  options.iterations = std::numeric_limits<int64_t>::max();
  EXPECT_CONTAINS(Message(scheduler::LowerToPlan(*graph, options).status()), "at most 2^62");
}

TEST(Sizes, MemoryEstimateNeverWrapsAndLoadingRefusesWhatDoesNotFit) {
  // 2^24 x 2^24 f32... too many bytes for one tensor; 2^23 x 2^23 f32 = 2^48 bytes fits.
  auto graph = Linear(int64_t{1} << 23, int64_t{1} << 23);
  ASSERT_TRUE(graph.ok()) << graph.status();
  scheduler::LowerOptions options;
  options.source_quota = 1000;
  auto lowered = scheduler::LowerToPlan(*graph, options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  ASSERT_EQ(lowered->plan.memory_estimate_size(), 1);
  EXPECT_GT(lowered->plan.memory_estimate(0).bytes(), int64_t{1000} << 48);  // the input's 1000 registers
  auto loaded = actors::Runtime::Load(lowered->plan, {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kResourceExhausted) << loaded.status();
  EXPECT_CONTAINS(Message(loaded.status()), "bytes of host memory, more than the limit");
  // Quotas beyond kMaxRegisterNum are refused by the scheduler.
  options.source_quota = comm::kMaxRegisterNum + 1;
  EXPECT_CONTAINS(Message(scheduler::LowerToPlan(*graph, options).status()), "quotas must be in [1, 1024]");
}

}  // namespace
}  // namespace tessera
