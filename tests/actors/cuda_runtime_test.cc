// The actor runtime on a GPU (ctest label cuda; skips without one): a
// training loop (parameter w, source x, three computes, sgd_update, a sink
// watching w) planned on cuda:0 runs with every compute asynchronous on the
// device's CUDA stream, sources and sinks through page-locked staging, the
// parameter initialised on the host and finalized back to it, and gives the
// CPU plan's numbers. Without a GPU, loading the plan is a one-line error
// naming the device. The communicators of a plan on GPUs are NCCL ones on
// the GPUs the plan's ranks name, created together by ConnectAll: without
// the GPUs that is one error naming the group, never a hang; with two an
// all-reduce between them. The host memory limit counts none of a GPU
// plan's memory.

#include <chrono>
#include <cmath>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "actors/node_communicators.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "comm/proto/memory_plan.h"
#include "core/storage.h"
#include "core/text.h"
#include "gtest/gtest.h"
#include "tests/actors/plan_helpers.h"

namespace tessera::actors {
namespace {

struct Outcome {
  absl::Status status;
  std::vector<std::vector<float>> watched;  // w at each iteration
  std::vector<float> trained;
};

Outcome Train(DeviceType type, int64_t host_memory_limit = 0) {
  PlanBuilder b(6);
  b.set_device_type(type);
  const testing::TrainingLoop t = testing::AddTrainingLoop(b, TensorMeta{DType::kF32, Shape{1000}}, {2, 2, 2, 1});
  b.task(t.src).set_callback("x");
  b.task(t.watch).set_callback("watch");
  for (const uint64_t task : {t.c1, t.c2, t.c3}) b.task(task).set_async_acts(type == DeviceType::kCuda);
  proto::Plan plan = b.Build();
  EXPECT_TRUE(b.status().ok()) << b.status();
  Outcome out;
  RuntimeOptions options;
  options.memory_limit_bytes = host_memory_limit;
  options.callbacks.sources["x"] = [](int64_t piece, const std::vector<Tensor>& x) {
    for (int64_t i = 0; i < x[0].NumElements(); ++i) x[0].data<float>()[i] = 0.001f * static_cast<float>(piece + i % 7);
    return absl::OkStatus();
  };
  options.callbacks.sinks["watch"] = [&out](int64_t, const std::vector<Tensor>& w) {
    out.watched.push_back(w[0].ToVector<float>());
    return absl::OkStatus();
  };
  options.callbacks.initializers["w"] = [](const std::vector<Tensor>& w) {
    for (int64_t i = 0; i < w[0].NumElements(); ++i) w[0].data<float>()[i] = 0.5f + 0.001f * static_cast<float>(i % 11);
    w[2].data<float>()[0] = 0.1f;  // the learning rate
    return absl::OkStatus();
  };
  options.callbacks.finalizers["w"] = [&out](const std::vector<Tensor>& w) {
    out.trained = w[0].ToVector<float>();
    return absl::OkStatus();
  };
  auto runtime = Runtime::Load(plan, std::move(options));
  if (!runtime.ok()) {
    out.status = runtime.status();
    return out;
  }
  out.status = (*runtime)->Run();
  return out;
}

TEST(CudaRuntime, ATrainingLoopOnTheGpuGivesTheCpuNumbers) {
  const Outcome cpu = Train(DeviceType::kCpu);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  ASSERT_EQ(cpu.watched.size(), 6u);
  const Outcome gpu = Train(DeviceType::kCuda);
  if (const absl::StatusOr<int> gpus = CudaDeviceCount(); !gpus.ok()) {
    // No GPU: the load says so, naming the device, in one line.
    ASSERT_FALSE(gpu.status.ok());
    const std::string message(gpu.status.message());
    // (A build without CUDA has no CUDA kernels: the plan's check says so first.)
    EXPECT_NE(message.find(CudaBuilt() ? "the plan runs on cuda:0, but " : "has no cuda kernel"), std::string::npos)
        << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    GTEST_SKIP() << gpus.status().message();
  }
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  ASSERT_EQ(gpu.watched.size(), cpu.watched.size());
  for (size_t it = 0; it < cpu.watched.size(); ++it) {
    for (size_t i = 0; i < cpu.watched[it].size(); ++i) {
      ASSERT_NEAR(gpu.watched[it][i], cpu.watched[it][i], 1e-5f * (1 + std::abs(cpu.watched[it][i])))
          << "iteration " << it << " element " << i;
    }
  }
  ASSERT_EQ(gpu.trained.size(), cpu.trained.size());
  for (size_t i = 0; i < cpu.trained.size(); ++i) {
    ASSERT_NEAR(gpu.trained[i], cpu.trained[i], 1e-5f * (1 + std::abs(cpu.trained[i]))) << i;
  }
  EXPECT_NE(cpu.trained, cpu.watched.front());  // it trained
}

// The host memory limit counts host memory only: a GPU plan's arena and
// registers are the GPU's. (It once counted every arena: a GPU plan larger
// than the host's RAM was refused, though the host held none of it.)
TEST(CudaRuntime, TheHostMemoryLimitCountsNoDeviceMemory) {
  constexpr int64_t kLimit = 16 * 1024;  // below the loop's registers: 4000-byte tensors, several each
  const Outcome cpu = Train(DeviceType::kCpu, kLimit);
  ASSERT_EQ(cpu.status.code(), absl::StatusCode::kResourceExhausted) << cpu.status;
  EXPECT_NE(cpu.status.message().find("bytes of host memory"), std::string_view::npos) << cpu.status;
  if (const absl::StatusOr<int> gpus = CudaDeviceCount(); !gpus.ok()) GTEST_SKIP() << gpus.status().message();
  const Outcome gpu = Train(DeviceType::kCuda, kLimit);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  EXPECT_EQ(gpu.watched.size(), 6u);
}

TEST(CudaRuntime, CommunicatorsOfAGpuPlanAreNcclOnTheRanksGpus) {
  proto::Plan plan;
  // Ranks 0 and 1 on this node's cuda:0 and cuda:1, rank 2 on node 1's cuda:0.
  for (const auto& [node, device] : std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}, {0, 1}, {1, 0}}) {
    proto::RankLocation* rank = plan.add_ranks();
    rank->set_node(node);
    rank->set_device_index(device);
  }
  comm::ShmHub hub;
  NodeCommunicatorOptions options;
  options.node = 0;
  options.hub = &hub;
  options.kv_prefix = "job";
  options.timeout_s = 10;
  options.gpus = true;
  NodeCommunicators communicators(plan, options);
  auto first = communicators.Join("g", {0, 1}, 0);
  auto second = communicators.Join("g", {0, 1}, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*first)->Describe(), "nccl group 'g' rank 0/2 on cuda:0 (node 0)");
  EXPECT_EQ((*second)->Describe(), "nccl group 'g' rank 1/2 on cuda:1 (node 0)");
  // A member on another node is that node's to join.
  const auto elsewhere = communicators.Join("h", {0, 2}, 1);
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_NE(elsewhere.status().message().find("runs on node 1, not on this node 0"), std::string::npos)
      << elsewhere.status();
  const auto started = std::chrono::steady_clock::now();
  const absl::Status connected = communicators.ConnectAll();
  const absl::StatusOr<int> gpus = CudaDeviceCount();
  if (!gpus.ok() || *gpus < 2) {
    ASSERT_FALSE(connected.ok());
    EXPECT_NE(connected.message().find("nccl group 'g'"), std::string::npos) << connected;
    EXPECT_EQ(connected.message().find('\n'), std::string::npos) << connected;
    // At once, not after the group's timeout: without a GPU every member
    // fails; with one, cuda:1's member fails and cuda:0's gives up.
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(9));
    GTEST_SKIP() << "needs 2 GPUs: " << (gpus.ok() ? StrCat(*gpus, " present") : std::string(gpus.status().message()));
  }
  ASSERT_TRUE(connected.ok()) << connected;
  std::vector<std::future<absl::Status>> done;
  std::vector<Tensor> outputs;
  for (int rank = 0; rank < 2; ++rank) {
    const Device gpu{DeviceType::kCuda, rank};
    auto host = Tensor::FromVector<float>(Shape{3}, {1.0f + rank, 2.0f, 3.0f * rank});
    auto input = Tensor::Empty(Shape{3}, DType::kF32, gpu);
    ASSERT_TRUE(input.ok() && input->CopyFrom(host).ok());
    outputs.push_back(*Tensor::Empty(Shape{3}, DType::kF32, gpu));
    auto promise = std::make_shared<std::promise<absl::Status>>();
    done.push_back(promise->get_future());
    (rank == 0 ? *first : *second)
        ->AllReduce(*input, outputs.back(), comm::ReduceOp::kSum,
                    [promise](absl::Status status) { promise->set_value(std::move(status)); });
  }
  for (auto& d : done) {
    ASSERT_EQ(d.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    EXPECT_TRUE(d.get().ok());
  }
  for (const Tensor& out : outputs) {
    auto back = Tensor::Empty(Shape{3}, DType::kF32, Device{});
    ASSERT_TRUE(back.ok() && back->CopyFrom(out).ok());
    EXPECT_EQ(back->ToVector<float>(), (std::vector<float>{3, 4, 3}));
  }
}

}  // namespace
}  // namespace tessera::actors
