// Pipeline parallelism through the runtime: with kernels of fixed cost, the
// schedule that emerges from register quotas (DESIGN §7) is 1F1B: its bubble
// is (p - 1) / (m + p - 1), and no stage holds more micro-batches in flight
// than its quota allows.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/actor_id.h"
#include "core/status.h"
#include "core/text.h"
#include "graph/builder.h"
#include "ops/registry.h"
#include "tests/deadline.h"
#include "train/engine.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// What the fixed-cost kernels did, per device.
struct Event {
  int device;
  bool forward;
  Clock::time_point start, end;
};
std::mutex events_mu;
std::vector<Event> events;

// y = x + w (w over the last axis), taking `ms` milliseconds; its gradient
// dx = dy takes as long.
absl::Status TimedKernel(ops::KernelContext& ctx, bool forward) {
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ctx.attr().Float("ms")));
  const Tensor& x = ctx.input(0);
  const Tensor& y = ctx.output(0);
  const int64_t n = x.shape().dims().back();
  for (int64_t i = 0; i < x.NumElements(); ++i) {
    y.data<float>()[i] = x.data<float>()[i] + (forward ? ctx.input(1).data<float>()[i % n] : 0.0f);
  }
  std::lock_guard<std::mutex> lock(events_mu);
  events.push_back({static_cast<int>(ctx.device.index), forward, start, Clock::now()});
  return absl::OkStatus();
}

const ops::OpRegistry& TimedOps() {
  static const ops::OpRegistry* registry = [] {
    auto* r = new ops::OpRegistry;
    ops::RegisterBuiltinOps(*r);
    const auto same_as_x = [](const std::vector<TensorMeta>& in, const ops::AttrMap&) -> absl::StatusOr<std::vector<TensorMeta>> {
      return std::vector<TensorMeta>{in[0]};
    };
    const auto all_b = [](const std::vector<TensorMeta>& in, const ops::AttrMap&, int64_t) {
      return std::vector<ops::SbpSignature>{{std::vector<Sbp>(in.size(), Sbp::Broadcast()), {Sbp::Broadcast()}}};
    };
    r->MustRegister(ops::OpSchema("timed")
                        .Doc("test: y = x + w in `ms` milliseconds")
                        .Input("x")
                        .Input("w")
                        .Output("y")
                        .Attr("ms", ops::AttrType::kFloat)
                        .Infer(same_as_x)
                        .Sbp(all_b)
                        .Grad([](ops::GradBuilder& b) {
                          // Like a real backward, it reads the forward's input.
                          b.SetInputGrad(0, b.Op("timed_grad", {b.output_grad(0), b.input(0)}, {{"ms", b.attrs().Float("ms")}}));
                          b.SetInputGrad(1, b.SumToShape(b.output_grad(0), b.meta(b.input(1)).shape));
                        })
                        .Kernel(DeviceType::kCpu, [](ops::KernelContext& ctx) { return TimedKernel(ctx, true); })
                        .Example({{DType::kF32, Shape{2, 3}}, {DType::kF32, Shape{3}}}, {{"ms", 0.0}}));
    r->MustRegister(ops::OpSchema("timed_grad")
                        .Doc("test: dx = dy in `ms` milliseconds (x read, unused)")
                        .Input("dy")
                        .Input("x")
                        .Output("dx")
                        .Attr("ms", ops::AttrType::kFloat)
                        .Infer(same_as_x)
                        .Sbp(all_b)
                        .Kernel(DeviceType::kCpu, [](ops::KernelContext& ctx) { return TimedKernel(ctx, false); })
                        .Example({{DType::kF32, Shape{2, 3}}, {DType::kF32, Shape{2, 3}}}, {{"ms", 0.0}}));
    return r;
  }();
  return *registry;
}

TEST(Pipeline, OneFOneBEmergesFromQuotas) {
  constexpr int64_t kStages = 4, kMicro = 8;
  constexpr double kMs = 100;
  graph::GraphBuilder b(&TimedOps());
  graph::Sym h = b.Input("x", {DType::kF32, Shape{2, 4}});
  for (int64_t layer = 0; layer < kStages; ++layer) {
    auto scope = b.Scope(StrCat("layer", layer), layer);
    // A scale before stage 0's timed op, so its backward runs too.
    if (layer == 0) h = h * b.Variable("scale", Shape{4}, graph::InitRule::Ones());
    graph::Sym w = b.Variable("w", Shape{4}, graph::InitRule::Constant(0.5));
    h = b.Apply("timed", {h, w}, {{"ms", kMs}});
    if (layer == kStages - 1) b.MarkLoss(graph::ReduceSum(h));
  }
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  CompileOptions options;
  options.optimizer.kind = graph::OptimizerKind::kSgd;
  options.num_micro_batches = kMicro;
  options.lower.parallel.pipeline = kStages;
  options.lower.parallel.world_size = kStages;
  options.lower.parallel.pipeline_num_layers = kStages;
  options.stall_timeout_s = 30;
  auto engine = Engine::Compile(*std::move(graph), options);
  ASSERT_TRUE(engine.ok()) << engine.status();

  // The quotas the plan gives (DESIGN §7): on stage s the forward value that
  // the backward reads (the timed op's input x, kept for timed_grad) has
  // quota >= stages - s, and every cross-stage buffer (a Recv's register)
  // quota >= 2.
  auto plan = (*engine)->Plan(1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<uint64_t, const proto::Task*> task_of;
  for (const auto& task : plan->tasks()) task_of[task.actor_id()] = &task;
  std::map<int64_t, const proto::RegisterDesc*> desc_of;
  for (const auto& desc : plan->register_descs()) desc_of[desc.id()] = &desc;
  int kept = 0, buffers = 0;
  for (const auto& task : plan->tasks()) {
    if (task.op() != "timed_grad") continue;
    const int64_t stage = actors::DecodeActorId(task.actor_id()).device_index;
    const proto::RegisterDesc& x = *desc_of.at(task.inputs(1).register_desc_id());
    EXPECT_GE(x.register_num(), kStages - stage) << "stage " << stage << ": " << task_of.at(x.producer())->name();
    ++kept;
  }
  for (const auto& desc : plan->register_descs()) {
    if (task_of.at(desc.producer())->kind() != proto::ACTOR_KIND_RECV) continue;
    EXPECT_GE(desc.register_num(), 2) << task_of.at(desc.producer())->name();
    ++buffers;
  }
  EXPECT_EQ(kept, kStages);
  // Forward and backward between each pair of neighbouring stages.
  EXPECT_GE(buffers, 2 * (kStages - 1));

  if (std::getenv("TESSERA_PIPELINE_TRACE") != nullptr) {
    for (const auto& task : plan->tasks()) {
      if (task.op() == "timed" || task.op() == "timed_grad") std::printf("%s %s %llx\n", task.name().c_str(), task.op().c_str(), static_cast<unsigned long long>(task.actor_id()));
    }
  }
  const auto feed = [](int64_t, int64_t, std::string_view input, const Tensor& out) -> absl::Status {
    for (int64_t i = 0; i < out.NumElements(); ++i) out.data<float>()[i] = input == "lr" ? 0.1f : 1.0f;
    return absl::OkStatus();
  };
  const double expected = static_cast<double>(kStages - 1) / static_cast<double>(kMicro + kStages - 1);
  // An iteration's bubble per stage (and 1F1B's bound on each one's).
  // The bubble is a timing: the machine pausing the process (another
  // program on CI's two cores) stretches it, once by 11 %, so up to three
  // iterations run and one must be within 5 % on every stage; a runtime
  // that adds latency to the critical path misses it every time.
  bool within = false;
  for (int attempt = 0; attempt < 3 && !within; ++attempt) {
    events.clear();
    {
      ::tessera::testing::Deadline deadline(std::chrono::seconds(60), "Engine::Run of the 4-stage pipeline");
      ASSERT_TRUE((*engine)->Run(1, feed, nullptr).ok());
    }
    ASSERT_EQ(events.size(), static_cast<size_t>(2 * kStages * kMicro));
    if (std::getenv("TESSERA_PIPELINE_TRACE") != nullptr) {
      for (const Event& e : events) {
        std::printf("dev %d %s %.1f %.1f\n", e.device, e.forward ? "F" : "B",
                    std::chrono::duration<double, std::milli>(e.start - events[0].start).count(),
                    std::chrono::duration<double, std::milli>(e.end - events[0].start).count());
      }
    }
    Clock::time_point first = events[0].start, last = events[0].end;
    for (const Event& e : events) {
      first = std::min(first, e.start);
      last = std::max(last, e.end);
    }
    const double span = std::chrono::duration<double>(last - first).count();
    within = true;
    for (int64_t stage = 0; stage < kStages; ++stage) {
      double busy = 0;
      std::vector<std::pair<Clock::time_point, int>> steps;  // +1 forward starts, -1 backward ends
      for (const Event& e : events) {
        if (e.device != stage) continue;
        busy += std::chrono::duration<double>(e.end - e.start).count();
        steps.push_back(e.forward ? std::pair{e.start, +1} : std::pair{e.end, -1});
      }
      std::sort(steps.begin(), steps.end());
      int in_flight = 0, most = 0;
      for (const auto& [when, delta] : steps) most = std::max(most, in_flight += delta);
      const double bubble = 1.0 - busy / span;
      // Within 5 % of the ideal (a run without pipelining would be 1 - 1/p =
      // 0.75, GPipe without the quota limit the same 0.273). Kernels sleep, so
      // only the runtime's own latency on the critical path (a wake-up, a
      // message, a transfer per step) adds to the bubble.
      within = within && std::abs(bubble - expected) <= 0.05 * expected;
      std::printf("iteration %d stage %lld bubble %.4f ideal %.4f (ratio %.3f) span %.3f s\n", attempt + 1,
                  static_cast<long long>(stage), bubble, expected, bubble / expected, span);
      // 1F1B: stage s runs at most p - s forwards ahead of its backwards,
      // in every iteration.
      EXPECT_LE(most, kStages - stage) << "stage " << stage;
      EXPECT_EQ(most, kStages - stage) << "stage " << stage << " (the quota is what limits it)";
    }
  }
  EXPECT_TRUE(within) << "no iteration of three had every stage's bubble within 5 % of the ideal " << expected
                      << " (printed above)";
}

}  // namespace
}  // namespace tessera
