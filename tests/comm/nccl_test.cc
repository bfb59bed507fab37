// The NCCL communicator (ctest label cuda). Everywhere: bad arguments are
// one-line errors before any GPU is touched, and without a GPU creation
// says why. With a GPU: a one-rank group's ops and its abort, an abort from
// another thread while ops are launched (no call with the freed handle); with two,
// every op between two ranks (threads of this process) against the
// expected values, a rank whose peer never comes fails within its timeout
// instead of waiting, and the communicators of one NcclSequence running
// their ops in issue order. Boxing on GPUs against the CPU's: with one
// GPU the conversions without a collective (slices, zero fills, copies)
// for each rank on cuda:0; with two every 1-D conversion of two ranks,
// its collectives on NCCL.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective/boxing.h"
#include "comm/collective/kv_store.h"
#include "comm/collective/nccl_communicator.h"
#include "comm/collective/shm_communicator.h"
#include "core/storage.h"
#include "core/text.h"
#include "tests/comm/completion.h"
#include "tests/gpus.h"

namespace tessera::comm {
namespace {

using ::tessera::testing::MissingGpus;

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

// Tessera sets CUDA_MODULE_LOADING=EAGER before the CUDA runtime starts
// (core/cuda_allocator.cc) unless the user set it: under lazy loading a
// kernel's first launch may wait for an NCCL collective waiting for peers
// (the emulator, which waits so, hangs gpu_equivalence_test's pipeline
// layout). A group of several ranks warns when the variable says otherwise.
TEST(Nccl, KernelsLoadEagerlyUnlessTheUserSaidOtherwise) {
#ifdef TESSERA_WITH_CUDA
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  ASSERT_NE(mode, nullptr) << "nothing set CUDA_MODULE_LOADING before the CUDA runtime started";
  EXPECT_STREQ(mode, "EAGER");
#endif
  EXPECT_EQ(LazyModuleLoadingWarning("EAGER"), "");
  for (const char* lazy : {"LAZY", "DEFAULT", static_cast<const char*>(nullptr)}) {
    const std::string warning = LazyModuleLoadingWarning(lazy);
    EXPECT_NE(
        warning.find(lazy == nullptr ? "CUDA_MODULE_LOADING=(unset)" : std::string("CUDA_MODULE_LOADING=") + lazy),
        std::string::npos)
        << warning;
    EXPECT_NE(warning.find("can hang"), std::string::npos) << warning;
  }
}

TEST(Nccl, WithoutAGpuCreationSaysWhy) {
  if (MissingGpus(1).empty()) GTEST_SKIP() << "this machine has a GPU";
  NcclOptions options;
  options.group = "g";
  auto comm = MakeNcclCommunicator(options);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(std::string(comm.status().message()).find('\n'), std::string::npos);
  const std::string message(comm.status().message());
  EXPECT_TRUE(message.find("cuda") != std::string::npos || message.find("CUDA") != std::string::npos) << message;
}

TEST(Nccl, OneRankGroupRunsItsOpsAndAborts) {
  if (const std::string why = MissingGpus(1); !why.empty()) GTEST_SKIP() << why;
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

// ncclCommAbort frees the communicator: an abort from another thread (the
// watcher's, a failing job's) while ops are being launched must never let a
// launch call NCCL with the freed handle (the emulator stops the process on
// such a call; on a GPU it reads freed memory). Every op either ran or
// fails with the abort's reason.
TEST(Nccl, AnAbortWhileOpsAreLaunchedLeavesNoCallOnTheFreedHandle) {
  if (const std::string why = MissingGpus(1); !why.empty()) GTEST_SKIP() << why;
  for (int round = 0; round < 40; ++round) {
    NcclOptions options;
    options.group = StrCat("race", round);
    auto comm = MakeNcclCommunicator(options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::shared_ptr<Communicator> c = *comm;
    const Tensor x = OnGpu({1, 2, 3}, 0);
    Tensor y = OnGpu({0, 0, 0}, 0);
    std::atomic<int> started{0};
    std::atomic<int> aborted{0};
    std::atomic<int> other{0};
    std::thread launcher([&] {
      // Launches without waiting, as a collective actor does, until one fails.
      for (int i = 0; i < 2000 && aborted.load() == 0; ++i) {
        started.fetch_add(1);
        c->AllReduce(x, y, ReduceOp::kSum, [&](absl::Status status) {
          if (status.ok()) return;
          if (status.code() == absl::StatusCode::kAborted && status.message() == "stop") {
            aborted.fetch_add(1);
          } else {
            other.fetch_add(1);
          }
        });
      }
    });
    while (started.load() < 1 + round) std::this_thread::yield();
    c->Abort(absl::AbortedError("stop"));
    launcher.join();
    c.reset();  // the destructor waits for what is still on the stream
    EXPECT_EQ(other.load(), 0) << "round " << round;
  }
}

TEST(Nccl, TwoRanksRunEveryOp) {
  if (const std::string why = MissingGpus(2); !why.empty()) GTEST_SKIP() << why;
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

// Two communicators A and B over GPUs 0 and 1. GPU 0's share an
// NcclSequence and issue an all-reduce on A, then one on B; GPU 1's have
// none and issue B's at once, A's only 300 ms later. So GPU 0's B could
// run at once, but the sequence holds it behind A, which completes only
// once GPU 1 issued its A: B completes no sooner than that.
TEST(Nccl, TheCommunicatorsOfOneSequenceRunTheirOpsInIssueOrder) {
  if (const std::string why = MissingGpus(2); !why.empty()) GTEST_SKIP() << why;
  InProcessKvStore kv;
  auto sequence = MakeNcclSequence(0);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  constexpr auto kLate = std::chrono::milliseconds(300);
  std::vector<std::string> errors(2);
  std::vector<std::vector<float>> sums(2);
  std::chrono::steady_clock::duration a_done{}, b_done{};
  std::chrono::steady_clock::time_point start;
  const auto rank_main = [&](int rank) {
    std::vector<std::shared_ptr<Communicator>> comms;
    for (const std::string group : {"A", "B"}) {
      NcclOptions options;
      options.group = group;
      options.rank = rank;
      options.size = 2;
      options.device = rank;
      options.kv = &kv;
      if (rank == 0) options.sequence = *sequence;
      auto comm = MakeNcclCommunicator(options);
      if (!comm.ok()) {
        errors[static_cast<size_t>(rank)] = std::string(comm.status().message());
        return;
      }
      comms.push_back(*comm);
    }
    const auto r = static_cast<float>(rank);
    const Tensor a = OnGpu({1 + r}, rank), b = OnGpu({10 + r}, rank);
    Tensor a_out = OnGpu({0}, rank), b_out = OnGpu({0}, rank);
    testing::Completion a_completion, b_completion;
    if (rank == 0) {
      start = std::chrono::steady_clock::now();
      comms[0]->AllReduce(a, a_out, ReduceOp::kSum, [&, fn = a_completion.Fn()](absl::Status status) {
        a_done = std::chrono::steady_clock::now() - start;
        fn(std::move(status));
      });
      comms[1]->AllReduce(b, b_out, ReduceOp::kSum, [&, fn = b_completion.Fn()](absl::Status status) {
        b_done = std::chrono::steady_clock::now() - start;
        fn(std::move(status));
      });
    } else {
      comms[1]->AllReduce(b, b_out, ReduceOp::kSum, b_completion.Fn());
      std::this_thread::sleep_for(kLate);
      comms[0]->AllReduce(a, a_out, ReduceOp::kSum, a_completion.Fn());
    }
    for (const auto* c : {&a_completion, &b_completion}) {
      if (absl::Status status = c->Wait(); !status.ok()) errors[static_cast<size_t>(rank)] = status.ToString();
    }
    sums[static_cast<size_t>(rank)] = {Back(a_out)[0], Back(b_out)[0]};
  };
  // Both groups meet before GPU 0 starts issuing: rank 1 waits for them too.
  std::thread one(rank_main, 1);
  rank_main(0);
  one.join();
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(sums[0], (std::vector<float>{3, 21}));
  EXPECT_EQ(sums[1], (std::vector<float>{3, 21}));
  // B waited for A on GPU 0, and A for GPU 1's late issue.
  EXPECT_GE(b_done, kLate - std::chrono::milliseconds(50))
      << "GPU 0's B completed " << std::chrono::duration_cast<std::chrono::milliseconds>(b_done).count()
      << " ms after it was issued, before the A issued before it could";
  EXPECT_GE(a_done, kLate - std::chrono::milliseconds(50));
}

// Rank r's output of `spec` (hierarchy [2]) at coordinate r, its input
// values f(i, r), on `devices[r]`; `comms[r]` its communicator (null: none).
std::vector<std::vector<float>> BoxOnRanks(const BoxingSpec& spec, const std::vector<Device>& devices,
                                           const std::vector<Communicator*>& comms, std::string& error) {
  std::vector<std::vector<float>> outputs(2);
  std::vector<std::string> errors(2);
  const auto rank_main = [&](int rank) {
    const auto r = static_cast<size_t>(rank);
    auto routine = BoxingRoutine::Create(spec, {rank});
    if (!routine.ok()) {
      errors[r] = std::string(routine.status().message());
      return;
    }
    std::vector<float> values(static_cast<size_t>(routine->input_shape().NumElements()));
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(i) * 0.5f + 100.0f * static_cast<float>(rank);
    auto host = Tensor::Empty(routine->input_shape(), DType::kF32, Device{});
    auto input = Tensor::Empty(routine->input_shape(), DType::kF32, devices[r]);
    auto output = Tensor::Empty(routine->output_shape(), DType::kF32, devices[r]);
    if (!host.ok() || !input.ok() || !output.ok()) {
      errors[r] = "allocation failed";
      return;
    }
    for (size_t i = 0; i < values.size(); ++i) host->data<float>()[i] = values[i];
    if (absl::Status copied = input->CopyFrom(*host); !copied.ok()) {
      errors[r] = std::string(copied.message());
      return;
    }
    BoxingComms boxing_comms;
    if (comms[r] != nullptr) boxing_comms.axis = {comms[r]};
    const absl::Status done = Wait([&](DoneFn d) { routine->Launch(*input, *output, boxing_comms, std::move(d)); });
    if (!done.ok()) {
      errors[r] = std::string(done.message());
      return;
    }
    auto back = Tensor::Empty(output->shape(), DType::kF32, Device{});
    if (back.ok() && back->CopyFrom(*output).ok()) outputs[r] = back->ToVector<float>();
  };
  const bool parallel = comms[0] != nullptr;  // collectives: both ranks at once
  std::thread other;
  if (parallel) other = std::thread(rank_main, 1);
  rank_main(0);
  if (parallel) {
    other.join();
  } else {
    rank_main(1);
  }
  error = errors[0].empty() ? errors[1] : errors[0];
  return outputs;
}

TEST(Nccl, BoxingOnGpusGivesTheCpuBits) {
  if (const std::string why = MissingGpus(1); !why.empty()) GTEST_SKIP() << why;
  const bool two = MissingGpus(2).empty();
  struct Case {
    const char* from;
    const char* to;
    bool collective;
  };
  const Case cases[] = {{"B", "S(0)", false},  {"B", "S(1)", false},    {"S(1)", "P", false}, {"S(0)", "P", false},
                        {"B", "P", false},     {"S(1)", "S(1)", false}, {"P", "B", true},     {"P", "S(0)", true},
                        {"P", "S(1)", true},   {"S(0)", "B", true},     {"S(1)", "B", true},  {"S(0)", "S(1)", true},
                        {"S(1)", "S(0)", true}};
  ShmHub hub;
  InProcessKvStore kv;
  for (const Shape& shape : {Shape{4, 6}, Shape{5, 7}, Shape{3, 1, 5}}) {
    for (const Case& c : cases) {
      if (c.collective && !two) continue;
      BoxingSpec spec;
      spec.logical = TensorMeta{DType::kF32, shape};
      spec.from = *ParseNdSbp(c.from);
      spec.to = *ParseNdSbp(c.to);
      spec.hierarchy = {2};
      const std::string name = StrCat(spec.ToString());
      SCOPED_TRACE(name);
      std::vector<std::shared_ptr<Communicator>> owned;
      std::vector<Communicator*> cpu_comms(2, nullptr), gpu_comms(2, nullptr);
      if (c.collective) {
        for (int rank = 0; rank < 2; ++rank) {
          auto joined = hub.Join(name, 2, rank);
          ASSERT_TRUE(joined.ok()) << joined.status();
          owned.push_back(*joined);
          cpu_comms[static_cast<size_t>(rank)] = owned.back().get();
        }
        std::vector<absl::StatusOr<std::shared_ptr<Communicator>>> made(2);
        const auto make = [&](int rank) {
          NcclOptions options;
          options.group = name;
          options.rank = rank;
          options.size = 2;
          options.device = rank;
          options.kv = &kv;
          made[static_cast<size_t>(rank)] = MakeNcclCommunicator(options);
        };
        std::thread one(make, 1);
        make(0);
        one.join();
        for (int rank = 0; rank < 2; ++rank) {
          ASSERT_TRUE(made[static_cast<size_t>(rank)].ok()) << made[static_cast<size_t>(rank)].status();
          owned.push_back(*made[static_cast<size_t>(rank)]);
          gpu_comms[static_cast<size_t>(rank)] = owned.back().get();
        }
      }
      std::string cpu_error, gpu_error;
      const auto cpu = BoxOnRanks(spec, {Device{}, Device{}}, cpu_comms, cpu_error);
      ASSERT_EQ(cpu_error, "");
      const Device gpu1{DeviceType::kCuda, c.collective ? 1 : 0};
      const auto gpu = BoxOnRanks(spec, {Device{DeviceType::kCuda, 0}, gpu1}, gpu_comms, gpu_error);
      ASSERT_EQ(gpu_error, "");
      EXPECT_EQ(gpu, cpu);
    }
  }
}

TEST(Nccl, ARankWhosePeerNeverComesFailsWithinItsTimeout) {
  if (const std::string why = MissingGpus(1); !why.empty()) GTEST_SKIP() << why;
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
