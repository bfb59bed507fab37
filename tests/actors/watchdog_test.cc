// The stall watchdog (RuntimeOptions::stall_timeout_s,
// hung_kernel_timeout_s): a slow kernel is not stuck, a plan whose quotas
// deadlock is, with the actors named and what each waits for, and a
// callback that never returns fails the job without blocking Run.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/plan.h"
#include "actors/runtime.h"
#include "core/text.h"
#include "gtest/gtest.h"
#include "tests/deadline.h"

namespace tessera::actors {
namespace {

using proto::ACTOR_KIND_COMPUTE;
using proto::ACTOR_KIND_SINK;
using proto::ACTOR_KIND_SOURCE;

absl::Status RunWithDeadline(const proto::Plan& plan, RuntimeOptions options, double seconds = 5) {
  auto runtime = Runtime::Load(plan, std::move(options));
  if (!runtime.ok()) return runtime.status();
  ::tessera::testing::Deadline deadline(std::chrono::duration<double>(seconds), "Runtime::Run");
  return (*runtime)->Run();
}

// src -> relay -> sink, the sink's callback taking `sink_seconds` per call.
proto::Plan Chain(int64_t iterations) {
  PlanBuilder b(iterations);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src", 0);
  const uint64_t relay = b.AddTask(ACTOR_KIND_COMPUTE, "relay", 1);
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink", 2);
  b.task(sink).set_callback("sink");
  b.AddRegisterDesc(src, {relay}, 1, {});
  b.AddRegisterDesc(relay, {sink}, 1, {});
  return b.Build();
}

// A kernel (here a host callback) that runs four times the stall timeout:
// the other actors have nothing to do meanwhile, yet the job is slow, not
// stuck.
TEST(WatchdogTest, SlowKernelDoesNotTrip) {
  RuntimeOptions options;
  options.stall_timeout_s = 0.2;
  int calls = 0;
  options.callbacks.sinks["sink"] = [&calls](int64_t, const std::vector<Tensor>&) {
    // The slowness under test, not a wait for something.
    if (calls++ == 1) std::this_thread::sleep_for(std::chrono::milliseconds(800));
    return absl::OkStatus();
  };
  const absl::Status status = RunWithDeadline(Chain(3), std::move(options));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(calls, 3);
}

// src -> a -> c, with c also reading d, which reads c: c and d wait on each
// other, a waits for c to free its register, src for a. Nobody runs a
// kernel, so the job is stuck; each actor is named with what it waits for.
TEST(WatchdogTest, QuotaDeadlockNamesTheActorsAndWhatTheyWaitFor) {
  PlanBuilder b(3);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src", 0);
  const uint64_t a = b.AddTask(ACTOR_KIND_COMPUTE, "a", 0);
  const uint64_t c = b.AddTask(ACTOR_KIND_COMPUTE, "c", 1);
  const uint64_t d = b.AddTask(ACTOR_KIND_COMPUTE, "d", 2);
  const int64_t src_a = b.AddRegisterDesc(src, {a}, 1, {});
  const int64_t a_c = b.AddRegisterDesc(a, {c}, 1, {});
  const int64_t d_c = b.AddRegisterDesc(d, {c}, 1, {});
  b.AddRegisterDesc(c, {d}, 1, {});
  RuntimeOptions options;
  options.stall_timeout_s = 0.2;
  const auto started = std::chrono::steady_clock::now();
  const absl::Status status = RunWithDeadline(b.Build(), std::move(options));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  const std::string message(status.message());
  EXPECT_NE(message.find("no actor made progress for 0.2 s"), std::string::npos) << message;
  const std::vector<std::string> wants = {"actor 'src'", StrCat("a free register of desc ", src_a),
                                          "actor 'a'",   StrCat("a free register of desc ", a_c),
                                          "actor 'c'",   StrCat("a ready register of desc ", d_c, " from 'd'"),
                                          "actor 'd'"};
  for (const std::string& want : wants) {
    EXPECT_NE(message.find(want), std::string::npos) << want << " in " << message;
  }
}

// A sink callback that blocks until the test lets it go (after Run
// returned). It is inside Handle, so never "stuck"; after
// hung_kernel_timeout_s Run fails the job, names it and returns while its
// thread is still blocked. Released, the thread finishes on the state it
// keeps alive (the callback's own state is shared with it, so it outlives
// the test's scope).
TEST(WatchdogTest, CallbackThatNeverReturnsIsReportedAfterTheHungKernelTimeout) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    bool entered = false;
  };
  auto gate = std::make_shared<Gate>();
  RuntimeOptions options;
  options.stall_timeout_s = 0.1;
  options.hung_kernel_timeout_s = 0.5;
  options.callbacks.sinks["sink"] = [gate](int64_t, const std::vector<Tensor>&) {
    std::unique_lock<std::mutex> lock(gate->mu);
    gate->entered = true;
    gate->cv.wait(lock, [&] { return gate->open; });
    return absl::OkStatus();
  };
  const auto started = std::chrono::steady_clock::now();
  absl::Status status;
  {
    auto runtime = Runtime::Load(Chain(3), std::move(options));
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    ::tessera::testing::Deadline deadline(std::chrono::seconds(5), "Runtime::Run with a hung callback");
    status = (*runtime)->Run();
  }  // the Runtime is gone; the blocked thread keeps what it needs
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  {
    std::lock_guard<std::mutex> lock(gate->mu);
    EXPECT_TRUE(gate->entered);
    gate->open = true;
  }
  gate->cv.notify_all();
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 3);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  const std::string message(status.message());
  EXPECT_NE(message.find("actor 'sink'"), std::string::npos) << message;
  EXPECT_NE(message.find("inside one Handle"), std::string::npos) << message;
  EXPECT_NE(message.find("left running"), std::string::npos) << message;
  EXPECT_EQ(message.find("no actor made progress"), std::string::npos) << "a running callback is not a stall: " << message;
}

}  // namespace
}  // namespace tessera::actors
