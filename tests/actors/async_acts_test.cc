// Asynchronous acts (Task.async_acts, core/stream.h) on the threaded
// runtime: the CPU stream's order and errors; a run gives the synchronous
// run's results while the device's actor thread does host work (a source's
// fills) during kernels; a failing kernel names its actor; the watchdog
// counts a stream's kernel as running and reports one that never returns.
// (Random delivery and completion orders: protocol_random_test's Async
// plans; the memory planner's model: memory_plan_test.)

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/plan.h"
#include "actors/runtime.h"
#include "core/stream.h"
#include "core/text.h"
#include "gtest/gtest.h"
#include "ops/op_schema.h"
#include "ops/registry.h"
#include "tests/actors/plan_helpers.h"
#include "tests/deadline.h"

namespace tessera::actors {
namespace {

using proto::ACTOR_KIND_COMPUTE;
using proto::ACTOR_KIND_SINK;
using proto::ACTOR_KIND_SOURCE;

TEST(CpuStream, RunsWorkInOrderAndCallsBackAfterIt) {
  std::unique_ptr<Stream> stream = MakeCpuStream("cpu:0 stream 0");
  EXPECT_EQ(stream->name(), "cpu:0 stream 0");
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> log;
  int callbacks = 0;
  std::vector<absl::Status> results;
  const auto note = [&](std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back(std::move(what));
  };
  const auto callback = [&](absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back(StrCat("done ", status.ok() ? "ok" : std::string(status.message())));
    results.push_back(std::move(status));
    ++callbacks;
    cv.notify_all();
  };
  stream->Enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the callback must wait for it
    note("a");
    return absl::OkStatus();
  });
  stream->OnComplete(callback);
  stream->Enqueue([&] {
    note("b");
    return absl::InternalError("b failed");
  });
  stream->Enqueue([&] {
    note("c");  // never: behind an error
    return absl::OkStatus();
  });
  stream->OnComplete(callback);
  stream->OnComplete(callback);  // errors are sticky
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return callbacks == 3; }));
    EXPECT_EQ(log, (std::vector<std::string>{"a", "done ok", "b", "done b failed", "done b failed"}));
  }
  EXPECT_TRUE(stream->Shutdown(5));
  EXPECT_EQ(stream->busy_since_ns(), 0);
  // After Shutdown nothing runs and no callback is called.
  stream->Enqueue([&] {
    note("late");
    return absl::OkStatus();
  });
  stream->OnComplete(callback);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(log.size(), 5u);
}

// The profile's timer (actors/op_profile.h): the worker's time between the
// start and the stop, readable once a later callback came; a stop behind an
// error never ran, and the timer says so.
TEST(CpuStream, TimersMeasureTheWorkBetweenStartAndStop) {
  std::unique_ptr<Stream> stream = MakeCpuStream("s");
  std::promise<absl::Status> first, second;
  auto timer = stream->StartTimer();
  ASSERT_TRUE(timer.ok()) << timer.status();
  stream->Enqueue([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return absl::OkStatus();
  });
  (*timer)->Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // not timed: after the stop
  stream->OnComplete([&](absl::Status status) { first.set_value(std::move(status)); });
  ASSERT_TRUE(first.get_future().get().ok());
  const absl::StatusOr<int64_t> elapsed = (*timer)->ElapsedNs();
  ASSERT_TRUE(elapsed.ok()) << elapsed.status();
  EXPECT_GE(*elapsed, 30'000'000);
  EXPECT_LT(*elapsed, 5'000'000'000);
  auto failed = stream->StartTimer();
  ASSERT_TRUE(failed.ok());
  stream->Enqueue([] { return absl::InternalError("kernel failed"); });
  (*failed)->Stop();
  stream->OnComplete([&](absl::Status status) { second.set_value(std::move(status)); });
  EXPECT_FALSE(second.get_future().get().ok());
  EXPECT_FALSE((*failed)->ElapsedNs().ok());
  EXPECT_TRUE(stream->Shutdown(5));
}

TEST(CpuStream, ShutdownSkipsQueuedWorkAndWaitsForTheRunningOne) {
  std::unique_ptr<Stream> stream = MakeCpuStream("s");
  std::atomic<int> ran{0};
  std::atomic<bool> called{false};
  for (int i = 0; i < 5; ++i) {
    stream->Enqueue([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ++ran;
      return absl::OkStatus();
    });
  }
  stream->OnComplete([&](absl::Status) { called = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the first is running
  EXPECT_NE(stream->busy_since_ns(), 0);
  EXPECT_TRUE(stream->Shutdown(5));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(called.load());
}

// Test ops: "slow" copies x to y after sleeping `ms` (attr) and counts the
// kernels running; "fail" fails. The slow kernel blocks while the gate of
// the test's log is closed.
struct KernelLog {
  std::mutex mu;
  std::condition_variable cv;
  bool gate_open = true;
  bool entered = false;
  std::atomic<int> running{0};
};

// The log the kernels write; each kernel keeps the one it started with (a
// kernel left running outlives its test).
std::mutex log_mu;
std::shared_ptr<KernelLog> current_log;
std::shared_ptr<KernelLog> NewLog() {
  std::lock_guard<std::mutex> lock(log_mu);
  current_log = std::make_shared<KernelLog>();
  return current_log;
}
std::shared_ptr<KernelLog> CurrentLog() {
  std::lock_guard<std::mutex> lock(log_mu);
  return current_log;
}

// Built once and never destroyed: a runtime borrows its registry, and a
// kernel left running uses it after the runtime is gone.
const ops::OpRegistry& TestOps() {
  static const ops::OpRegistry* const registry = [] {
    auto* r = new ops::OpRegistry;
    ops::OpRegistry& registry = *r;
    ops::RegisterBuiltinOps(registry);
    const auto same = [](const std::vector<TensorMeta>& in,
                         const ops::AttrMap&) -> absl::StatusOr<std::vector<TensorMeta>> {
      return std::vector<TensorMeta>{in[0]};
    };
    registry.MustRegister(ops::OpSchema("slow")
                              .Doc("y = x, after `ms` milliseconds")
                              .Input("x")
                              .Output("y")
                              .Attr("ms", ops::AttrType::kInt, ops::AttrValue(int64_t{0}))
                              .Infer(same)
                              .Kernel(DeviceType::kCpu,
                                      [](ops::KernelContext& ctx) {
                                        const std::shared_ptr<KernelLog> log = CurrentLog();
                                        ++log->running;
                                        {
                                          std::unique_lock<std::mutex> lock(log->mu);
                                          log->entered = true;
                                          log->cv.wait(lock, [&] { return log->gate_open; });
                                        }
                                        std::this_thread::sleep_for(std::chrono::milliseconds(ctx.attr().Int("ms")));
                                        for (int64_t i = 0; i < ctx.input(0).NumElements(); ++i) {
                                          ctx.output(0).data<float>()[i] = ctx.input(0).data<float>()[i];
                                        }
                                        --log->running;
                                        return absl::OkStatus();
                                      })
                              .Example({{DType::kF32, Shape{3}}}));
    registry.MustRegister(
        ops::OpSchema("fail")
            .Doc("fails")
            .Input("x")
            .Output("y")
            .Infer(same)
            .Kernel(DeviceType::kCpu, [](ops::KernelContext&) { return absl::DataLossError("the kernel broke"); })
            .Example({{DType::kF32, Shape{3}}}));
    return r;
  }();
  return *registry;
}

const TensorMeta kVec{DType::kF32, Shape{3}};

// src -> first (op) -> second (add) -> sink, on one device stream, quotas 2.
proto::Plan ChainPlan(int64_t iterations, const std::string& op, int64_t ms, bool async) {
  PlanBuilder b(iterations);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  const uint64_t first = b.AddTask(ACTOR_KIND_COMPUTE, "first");
  const uint64_t second = b.AddTask(ACTOR_KIND_COMPUTE, "second");
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  const int64_t x = b.AddRegisterDesc(src, {first}, 2, {kVec});
  const int64_t y = b.AddRegisterDesc(first, {second}, 2, {kVec});
  const int64_t z = b.AddRegisterDesc(second, {sink}, 2, {kVec});
  b.AddInput(first, x);
  b.AddOutput(first, y);
  if (op == "slow") {
    b.SetOp(first, op, {{"ms", ms}});
  } else {
    b.SetOp(first, op);
  }
  testing::SetCompute(b, second, "add", {{y, 0}, {y, 0}}, z);
  b.task(src).set_callback("src");
  b.task(sink).set_callback("sink");
  for (uint64_t task : {first, second}) b.task(task).set_async_acts(async);
  proto::Plan plan = b.Build();
  EXPECT_TRUE(b.status().ok()) << b.status();
  return plan;
}

struct ChainRun {
  absl::Status status;
  std::vector<std::vector<float>> sunk;
  int fills_during_kernels = 0;  // source fills while a kernel ran
};

ChainRun RunChain(const proto::Plan& plan, const std::shared_ptr<KernelLog>& log, RuntimeOptions options = {}) {
  ChainRun run;
  options.registry = &TestOps();
  options.callbacks.sources["src"] = [&run, log](int64_t piece, const std::vector<Tensor>& out) {
    // A fill takes a little while (as real host work does), so that a
    // kernel queued just before it has started on its stream by the time it
    // looks: without this a loaded machine could have every fill fall in
    // the gap between a kernel's end and the next one's start.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (log->running.load() > 0) ++run.fills_during_kernels;
    for (int64_t i = 0; i < 3; ++i) out[0].data<float>()[i] = static_cast<float>(piece * 10 + i);
    return absl::OkStatus();
  };
  options.callbacks.sinks["sink"] = [&run](int64_t, const std::vector<Tensor>& in) {
    run.sunk.push_back(in[0].ToVector<float>());
    return absl::OkStatus();
  };
  auto runtime = Runtime::Load(plan, std::move(options));
  if (!runtime.ok()) {
    run.status = runtime.status();
    return run;
  }
  ::tessera::testing::Deadline deadline(std::chrono::seconds(20), "Runtime::Run of the chain");
  run.status = (*runtime)->Run();
  return run;
}

TEST(AsyncActs, ThreadedRunGivesTheSynchronousResultsWhileHostWorkOverlapsKernels) {
  auto log = NewLog();
  const ChainRun sync = RunChain(ChainPlan(8, "slow", 40, false), log);
  ASSERT_TRUE(sync.status.ok()) << sync.status;
  const ChainRun async = RunChain(ChainPlan(8, "slow", 40, true), log);
  ASSERT_TRUE(async.status.ok()) << async.status;
  ASSERT_EQ(sync.sunk.size(), 8u);
  EXPECT_EQ(async.sunk, sync.sunk);
  EXPECT_EQ(sync.sunk[3], (std::vector<float>{60, 62, 64}));
  // On one actor thread a synchronous kernel and the source's fill never
  // overlap; with the kernels on the stream the source fills the next
  // pieces while they run (40 ms kernels: time enough for the actor thread
  // to wake even on a loaded machine).
  EXPECT_EQ(sync.fills_during_kernels, 0);
  EXPECT_GT(async.fills_during_kernels, 0);
}

TEST(AsyncActs, AFailingKernelNamesItsActorAndStopsTheRun) {
  auto log = NewLog();
  const ChainRun run = RunChain(ChainPlan(4, "fail", 0, true), log);
  ASSERT_EQ(run.status.code(), absl::StatusCode::kDataLoss) << run.status;
  const std::string message(run.status.message());
  EXPECT_NE(message.find("actor 'first' (op 'fail')"), std::string::npos) << message;
  EXPECT_NE(message.find("the kernel broke"), std::string::npos) << message;
  EXPECT_TRUE(run.sunk.empty());
}

TEST(AsyncActs, ASlowKernelOnAStreamIsNotAStall) {
  auto log = NewLog();
  RuntimeOptions options;
  options.stall_timeout_s = 0.1;
  const ChainRun run = RunChain(ChainPlan(2, "slow", 500, true), log, options);
  EXPECT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.sunk.size(), 2u);
}

TEST(AsyncActs, AKernelThatNeverReturnsIsReportedAndLeftBehind) {
  auto log = NewLog();
  log->gate_open = false;
  RuntimeOptions options;
  options.stall_timeout_s = 0.1;
  options.hung_kernel_timeout_s = 0.4;
  const auto started = std::chrono::steady_clock::now();
  const ChainRun run = RunChain(ChainPlan(2, "slow", 0, true), log, options);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  {
    std::lock_guard<std::mutex> lock(log->mu);
    EXPECT_TRUE(log->entered);
    log->gate_open = true;
  }
  log->cv.notify_all();
  EXPECT_GE(took, 0.4);
  EXPECT_LT(took, 5);
  ASSERT_EQ(run.status.code(), absl::StatusCode::kDeadlineExceeded) << run.status;
  const std::string message(run.status.message());
  EXPECT_NE(message.find("a kernel on cpu:0 stream 0"), std::string::npos) << message;
  EXPECT_NE(message.find("left running"), std::string::npos) << message;
  EXPECT_EQ(message.find("no actor made progress"), std::string::npos)
      << "a running kernel is not a stall: " << message;
}

TEST(AsyncActs, OnlyTasksThatRunKernelsActAsynchronously) {
  PlanBuilder b(1);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  const uint64_t relay = b.AddTask(ACTOR_KIND_COMPUTE, "relay");
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  b.AddRegisterDesc(src, {relay}, 1, {kVec});
  b.AddRegisterDesc(relay, {sink}, 1, {kVec});
  for (uint64_t task : {src, relay, sink}) {
    proto::Plan plan = b.Build();
    for (auto& t : *plan.mutable_tasks()) t.set_async_acts(t.actor_id() == task);
    auto runtime = Runtime::Load(plan, {});
    ASSERT_FALSE(runtime.ok());
    EXPECT_NE(runtime.status().message().find(
                  "has async_acts, which only an acc and a compute or parameter task with an op may have"),
              std::string::npos)
        << runtime.status();
  }
}

}  // namespace
}  // namespace tessera::actors
