// The NCCL communicator (ctest label cuda). Everywhere: bad arguments are
// one-line errors before any GPU is touched, and without a GPU creation
// says why. With a GPU: a one-rank group's ops and its abort; with two,
// every op between two ranks (threads of this process) against the
// expected values, and a rank whose peer never comes fails within its
// timeout instead of waiting.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective/kv_store.h"
#include "comm/collective/nccl_communicator.h"
#include "core/storage.h"
#include "core/text.h"

namespace tessera::comm {
namespace {

std::string NoGpus(int wanted) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return std::string(count.status().message());
  if (*count < wanted) return StrCat("needs ", wanted, " GPUs, ", *count, " present");
  return "";
}

Tensor OnGpu(const std::vector<float>& values, int device) {
  auto host = Tensor::Empty(Shape{static_cast<int64_t>(values.size())}, DType::kF32, Device{});
  EXPECT_TRUE(host.ok());
  for (size_t i = 0; i < values.size(); ++i) host->data<float>()[i] = values[i];
  auto gpu = Tensor::Empty(host->shape(), DType::kF32, Device{DeviceType::kCuda, device});
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_TRUE(gpu->CopyFrom(*host).ok());
  return *gpu;
}

std::vector<float> Back(const Tensor& gpu) {
  auto host = Tensor::Empty(gpu.shape(), gpu.dtype(), Device{});
  EXPECT_TRUE(host.ok());
  EXPECT_TRUE(host->CopyFrom(gpu).ok());
  return host->ToVector<float>();
}

// Runs an op and waits for its `done`.
absl::Status Wait(const std::function<void(DoneFn)>& op) {
  std::promise<absl::Status> done;
  auto result = done.get_future();
  op([&done](absl::Status status) { done.set_value(std::move(status)); });
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return absl::DeadlineExceededError("the op never completed");
  }
  return result.get();
}

TEST(Nccl, BadArgumentsAreNamedErrors) {
  NcclOptions options;
  options.group = "g";
  options.size = 2;
  options.rank = 2;
  auto bad = MakeNcclCommunicator(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("nccl group 'g' rank 2/2: no such rank"), std::string::npos) << bad.status();
  options.rank = 1;
  bad = MakeNcclCommunicator(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("needs a KvStore"), std::string::npos) << bad.status();
}

TEST(Nccl, WithoutAGpuCreationSaysWhy) {
  if (NoGpus(1).empty()) GTEST_SKIP() << "this machine has a GPU";
  NcclOptions options;
  options.group = "g";
  auto comm = MakeNcclCommunicator(options);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(std::string(comm.status().message()).find('\n'), std::string::npos);
  const std::string message(comm.status().message());
  EXPECT_TRUE(message.find("cuda") != std::string::npos || message.find("CUDA") != std::string::npos) << message;
}

TEST(Nccl, OneRankGroupRunsItsOpsAndAborts) {
  if (const std::string why = NoGpus(1); !why.empty()) GTEST_SKIP() << why;
  NcclOptions options;
  options.group = "solo";
  auto comm = MakeNcclCommunicator(options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  const Tensor x = OnGpu({1, 2, 3}, 0);
  Tensor y = OnGpu({0, 0, 0}, 0);
  ASSERT_TRUE(Wait([&](DoneFn done) { c.AllReduce(x, y, ReduceOp::kSum, std::move(done)); }).ok());
  EXPECT_EQ(Back(y), (std::vector<float>{1, 2, 3}));
  Tensor z = OnGpu({0, 0, 0}, 0);
  ASSERT_TRUE(Wait([&](DoneFn done) { c.AllGather(x, z, {3}, std::move(done)); }).ok());
  EXPECT_EQ(Back(z), (std::vector<float>{1, 2, 3}));
  // A host tensor, a bad count: errors through done.
  auto host = Tensor::Zeros(Shape{3}, DType::kF32);
  const absl::Status off = Wait([&](DoneFn done) { c.AllReduce(*host, y, ReduceOp::kSum, std::move(done)); });
  EXPECT_NE(off.message().find("a tensor on cpu:0"), std::string::npos) << off;
  const absl::Status counts = Wait([&](DoneFn done) { c.AllGather(x, z, {2}, std::move(done)); });
  EXPECT_NE(counts.message().find("counts say 2"), std::string::npos) << counts;
  c.Abort(absl::AbortedError("the job failed"));
  const absl::Status after = Wait([&](DoneFn done) { c.AllReduce(x, y, ReduceOp::kSum, std::move(done)); });
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
}

TEST(Nccl, TwoRanksRunEveryOp) {
  if (const std::string why = NoGpus(2); !why.empty()) GTEST_SKIP() << why;
  InProcessKvStore kv;
  std::vector<std::string> errors(2);
  std::vector<std::vector<std::vector<float>>> results(2);
  const auto rank_main = [&](int rank) {
    NcclOptions options;
    options.group = "pair";
    options.rank = rank;
    options.size = 2;
    options.device = rank;
    options.kv = &kv;
    auto comm = MakeNcclCommunicator(options);
    if (!comm.ok()) {
      errors[static_cast<size_t>(rank)] = std::string(comm.status().message());
      return;
    }
    Communicator& c = **comm;
    const auto r = static_cast<float>(rank);
    std::vector<Tensor> outs;
    std::vector<absl::Status> statuses;
    const Tensor x = OnGpu({1 + r, 10 + r}, rank);
    outs.push_back(OnGpu({0, 0}, rank));
    statuses.push_back(Wait([&](DoneFn d) { c.AllReduce(x, outs.back(), ReduceOp::kSum, std::move(d)); }));
    // Uneven: rank 0 gives 1 element, rank 1 gives 2.
    const Tensor part = rank == 0 ? OnGpu({5}, rank) : OnGpu({6, 7}, rank);
    outs.push_back(OnGpu({0, 0, 0}, rank));
    statuses.push_back(Wait([&](DoneFn d) { c.AllGather(part, outs.back(), {1, 2}, std::move(d)); }));
    const Tensor chunks = OnGpu({1 + r, 2 + r, 3 + r}, rank);
    outs.push_back(rank == 0 ? OnGpu({0}, rank) : OnGpu({0, 0}, rank));
    statuses.push_back(Wait([&](DoneFn d) {
      c.ReduceScatter(chunks, outs.back(), {1, 2}, ReduceOp::kSum, std::move(d));
    }));
    outs.push_back(OnGpu({rank == 0 ? 42.0f : 0.0f}, rank));
    statuses.push_back(Wait([&](DoneFn d) { c.Broadcast(outs.back(), 0, std::move(d)); }));
    const Tensor mine = OnGpu({100 + r, 200 + r}, rank);
    outs.push_back(OnGpu({0, 0}, rank));
    statuses.push_back(Wait([&](DoneFn d) { c.AllToAll(mine, {1, 1}, outs.back(), {1, 1}, std::move(d)); }));
    for (size_t i = 0; i < statuses.size(); ++i) {
      if (!statuses[i].ok()) errors[static_cast<size_t>(rank)] = StrCat("op ", i, ": ", statuses[i].message());
    }
    for (const Tensor& t : outs) results[static_cast<size_t>(rank)].push_back(Back(t));
  };
  std::thread one(rank_main, 1);
  rank_main(0);
  one.join();
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  for (int rank = 0; rank < 2; ++rank) {
    const auto& got = results[static_cast<size_t>(rank)];
    EXPECT_EQ(got[0], (std::vector<float>{3, 21}));
    EXPECT_EQ(got[1], (std::vector<float>{5, 6, 7}));
    EXPECT_EQ(got[2], (rank == 0 ? std::vector<float>{3} : std::vector<float>{5, 7}));
    EXPECT_EQ(got[3], (std::vector<float>{42}));
    EXPECT_EQ(got[4], rank == 0 ? (std::vector<float>{100, 101}) : (std::vector<float>{200, 201}));
  }
}

TEST(Nccl, ARankWhosePeerNeverComesFailsWithinItsTimeout) {
  if (const std::string why = NoGpus(1); !why.empty()) GTEST_SKIP() << why;
  InProcessKvStore kv;
  NcclOptions options;
  options.group = "lonely";
  options.rank = 1;
  options.size = 2;
  options.kv = &kv;
  options.timeout_s = 1;
  const auto started = std::chrono::steady_clock::now();
  auto comm = MakeNcclCommunicator(options);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("rank 0's unique id never came"), std::string::npos) << comm.status();
  EXPECT_LT(took, 10);
  // Rank 0 alone: the id is published, the group never forms.
  options.rank = 0;
  auto alone = MakeNcclCommunicator(options);
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("did not form within 1 s"), std::string::npos) << alone.status();
}

}  // namespace
}  // namespace tessera::comm
