// The memory planner (comm/proto/memory_plan.h) on hand-written plans, its
// checker, the runtime's arena monitor (actors/arena.h), and plans with bad
// arena offsets (they arrive from the network).

#include "comm/proto/memory_plan.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "comm/proto/actor_id.h"
#include "comm/proto/plan_codec.h"
#include "core/text.h"
#include "gtest/gtest.h"
#include "tests/actors/plan_helpers.h"

namespace tessera::actors {
namespace {

using proto::ACTOR_KIND_COMPUTE;
using proto::ACTOR_KIND_SINK;
using proto::ACTOR_KIND_SOURCE;

const TensorMeta kVec{DType::kF32, Shape{16}};  // 64 bytes: one aligned slot

const proto::RegisterDesc& Desc(const proto::Plan& plan, int64_t id) {
  for (const auto& desc : plan.register_descs()) {
    if (desc.id() == id) return desc;
  }
  ADD_FAILURE() << "no desc " << id;
  return plan.register_descs(0);
}

proto::Plan LoopPlan(testing::TrainingLoop* loop = nullptr, int64_t iterations = 5) {
  PlanBuilder b(iterations);
  const testing::TrainingLoop t = testing::AddTrainingLoop(b, kVec, {1, 1, 1, 1});
  b.task(t.watch).set_callback("watch");
  b.task(t.src).set_callback("x");
  if (loop != nullptr) *loop = t;
  proto::Plan plan = b.Build();
  EXPECT_TRUE(b.status().ok()) << b.status();
  return plan;
}

// src -> c1 -> c2 -> c3 -> sink, quota 1 each: nothing waits for the sink,
// so the source may run ahead and no two descs may share.
proto::Plan ChainPlan(std::vector<int64_t>* descs = nullptr) {
  PlanBuilder b(5);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  const uint64_t c1 = b.AddTask(ACTOR_KIND_COMPUTE, "c1");
  const uint64_t c2 = b.AddTask(ACTOR_KIND_COMPUTE, "c2");
  const uint64_t c3 = b.AddTask(ACTOR_KIND_COMPUTE, "c3");
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  const int64_t d1 = b.AddRegisterDesc(src, {c1}, 1, {kVec});
  const int64_t d2 = b.AddRegisterDesc(c1, {c2}, 1, {kVec});
  const int64_t d3 = b.AddRegisterDesc(c2, {c3}, 1, {kVec});
  const int64_t d4 = b.AddRegisterDesc(c3, {sink}, 1, {kVec});
  testing::SetCompute(b, c1, "add", {{d1, 0}, {d1, 0}}, d2);
  testing::SetCompute(b, c2, "add", {{d2, 0}, {d2, 0}}, d3);
  testing::SetCompute(b, c3, "add", {{d3, 0}, {d3, 0}}, d4);
  b.task(src).set_callback("src");
  b.task(sink).set_callback("sink");
  if (descs != nullptr) *descs = {d1, d2, d3, d4};
  return b.Build();
}

RuntimeOptions ChainOptions(std::vector<float>* seen) {
  RuntimeOptions options;
  options.callbacks.sources["src"] = [](int64_t piece, const std::vector<Tensor>& out) {
    for (int64_t i = 0; i < out[0].NumElements(); ++i) out[0].data<float>()[i] = static_cast<float>(piece + i);
    return absl::OkStatus();
  };
  options.callbacks.sinks["sink"] = [seen](int64_t, const std::vector<Tensor>& in) {
    seen->push_back(in[0].data<float>()[1]);
    return absl::OkStatus();
  };
  return options;
}

// Trains the loop plan `p` with the arena checked (the monitor stops the run
// at the first bytes two uses hold at once); returns w trained.
absl::StatusOr<std::vector<float>> TrainLoop(const proto::Plan& p) {
  RuntimeOptions options;
  options.check_arena = true;
  options.check_memory_plan = true;
  std::vector<float> w;
  options.callbacks.sources["x"] = [](int64_t piece, const std::vector<Tensor>& out) {
    for (int64_t i = 0; i < out[0].NumElements(); ++i)
      out[0].data<float>()[i] = 0.01f * static_cast<float>(piece + i);
    return absl::OkStatus();
  };
  options.callbacks.sinks["watch"] = [](int64_t, const std::vector<Tensor>&) { return absl::OkStatus(); };
  options.callbacks.initializers["w"] = [](const std::vector<Tensor>& t) {
    for (int64_t i = 0; i < t[0].NumElements(); ++i) t[0].data<float>()[i] = 0.5f;
    t[2].data<float>()[0] = 0.1f;
    return absl::OkStatus();
  };
  options.callbacks.finalizers["w"] = [&w](const std::vector<Tensor>& t) {
    w = t[0].ToVector<float>();
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(auto runtime, Runtime::Load(p, std::move(options)));
  RETURN_IF_ERROR(runtime->Run());
  if (runtime->stats().arenas.size() != static_cast<size_t>(p.arenas_size())) {
    return absl::InternalError("arena uses do not match the plan's arenas");
  }
  for (const ArenaMonitor::Use& use : runtime->stats().arenas) {
    if (use.peak_bytes <= 0 || use.peak_bytes > use.arena_bytes) {
      return absl::InternalError(StrCat("live peak ", use.peak_bytes, " of an arena of ", use.arena_bytes));
    }
  }
  return w;
}

TEST(MemoryPlan, ATrainingStepSharesWhatTheUpdateKeepsApart) {
  testing::TrainingLoop t;
  const proto::Plan plan = LoopPlan(&t);
  ASSERT_EQ(plan.arenas_size(), 1);
  // d1 (read by c2) and d3 (written by c3, read by the update, before the
  // next d1) share; x and d2 get bytes of their own; w lives across
  // iterations, outside the arena.
  EXPECT_FALSE(Desc(plan, t.w).has_arena_offset());
  EXPECT_EQ(Desc(plan, t.d1).arena_offset(), Desc(plan, t.d3).arena_offset());
  EXPECT_NE(Desc(plan, t.x).arena_offset(), Desc(plan, t.d1).arena_offset());
  EXPECT_NE(Desc(plan, t.d2).arena_offset(), Desc(plan, t.d1).arena_offset());
  EXPECT_NE(Desc(plan, t.x).arena_offset(), Desc(plan, t.d2).arena_offset());
  EXPECT_EQ(plan.arenas(0).bytes(), 3 * 64);
  EXPECT_TRUE(comm::CheckMemoryPlan(plan).ok());
  ASSERT_EQ(plan.memory_estimate_size(), 1);
  EXPECT_EQ(plan.memory_estimate(0).arena(), 3 * 64);
  EXPECT_EQ(plan.memory_estimate(0).gradients(), 64);     // d3
  EXPECT_EQ(plan.memory_estimate(0).activations(), 192);  // x, d1, d2
  EXPECT_EQ(plan.memory_estimate(0).parameters(), 64);    // w
  EXPECT_EQ(plan.memory_estimate(0).optimizer_state(), 64 + 4);

  // It trains with the arena checked, and gives what the unshared plan gives.
  auto shared = TrainLoop(plan);
  ASSERT_TRUE(shared.ok()) << shared.status();
  proto::Plan unshared = plan;
  for (auto& desc : *unshared.mutable_register_descs()) desc.clear_arena_offset();
  unshared.clear_arenas();
  auto own = TrainLoop(unshared);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(*shared, *own);
  EXPECT_NE(own->at(0), 0.5f);  // it trained
}

TEST(MemoryPlan, AFreeRunningChainSharesNothing) {
  std::vector<int64_t> d;
  const proto::Plan plan = ChainPlan(&d);
  ASSERT_EQ(plan.arenas_size(), 1);
  EXPECT_EQ(plan.arenas(0).bytes(), 4 * 64);
  EXPECT_TRUE(comm::CheckMemoryPlan(plan).ok());
}

// d1 (the source's) and d3 forced onto the same bytes: the checker says the
// protocol does not keep them apart, and a run with the checker off meets
// the overlap at run time (the source runs ahead while d3 is read).
TEST(MemoryPlan, TheCheckerAndTheMonitorCatchBytesSharedUnsafely) {
  std::vector<int64_t> d;
  proto::Plan plan = ChainPlan(&d);
  for (auto& desc : *plan.mutable_register_descs()) {
    if (desc.id() == d[2]) desc.set_arena_offset(Desc(plan, d[0]).arena_offset());
  }
  const absl::Status check = comm::CheckMemoryPlan(plan);
  ASSERT_FALSE(check.ok());
  EXPECT_NE(check.message().find(StrCat("register desc ", d[0], " ")), std::string::npos) << check;
  EXPECT_NE(check.message().find(StrCat("register desc ", d[2], " ")), std::string::npos) << check;
  EXPECT_NE(check.message().find("does not keep their lifetimes apart"), std::string::npos) << check;

  std::vector<float> seen;
  RuntimeOptions options = ChainOptions(&seen);
  options.check_arena = true;
  options.check_memory_plan = true;
  auto refused = SteppedExecutor::Load(plan, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("does not keep their lifetimes apart"), std::string::npos);

  options = ChainOptions(&seen);
  options.check_arena = true;
  options.check_memory_plan = false;
  auto exec = SteppedExecutor::Load(plan, options);
  ASSERT_TRUE(exec.ok()) << exec.status();
  (*exec)->Start();
  const absl::Status run = (*exec)->RunUntilIdle();
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.message().find("arena check"), std::string::npos) << run;
  EXPECT_NE(run.message().find("sharing its bytes, was in use"), std::string::npos) << run;
}

// What the monitor does not catch (the reads land after the writes) the
// poison does: a kernel reading bytes it did not write reads NaN. Here the
// unshared chain runs with the monitor's poisoning on and gives the
// unpoisoned results, so nothing in it reads a register after handing it back.
TEST(MemoryPlan, PoisoningHandedBackRegistersChangesNoResult) {
  std::vector<float> checked, plain;
  for (bool check : {true, false}) {
    RuntimeOptions options = ChainOptions(check ? &checked : &plain);
    options.check_arena = check;
    options.check_memory_plan = check;
    auto runtime = Runtime::Load(ChainPlan(), std::move(options));
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    ASSERT_TRUE((*runtime)->Run().ok());
  }
  EXPECT_EQ(checked, plain);
  EXPECT_EQ(checked, (std::vector<float>{8, 16, 24, 32, 40}));
}

// Gradient accumulation over 3 micro-batches with a micro-batch window of 1
// (the source starts micro-batch k + 1 once the Acc added micro-batch k), as
// the scheduler lowers it: w -> repeat -> grad = w * x -> acc -> sgd_update.
proto::Plan WindowedAccumulationPlan(bool async, int32_t m = 3, int32_t window = 1) {
  PlanBuilder b(4);
  const uint64_t param = b.AddTask(proto::ACTOR_KIND_PARAMETER, "w");
  const uint64_t rep = b.AddTask(proto::ACTOR_KIND_REPEAT, "repeat");
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "x");
  const uint64_t grad = b.AddTask(ACTOR_KIND_COMPUTE, "grad");
  const uint64_t acc = b.AddTask(proto::ACTOR_KIND_ACC, "acc");
  const int64_t w = b.AddRegisterDesc(param, {rep}, 1, {kVec});
  const int64_t views = b.AddRegisterDesc(rep, {grad}, 1, {kVec});
  const int64_t x = b.AddRegisterDesc(src, {grad}, 1, {kVec});
  const int64_t g = b.AddRegisterDesc(grad, {acc}, 1, {kVec});
  const int64_t sum = b.AddRegisterDesc(acc, {param}, 1, {kVec});
  b.AddWindowDesc(acc, {src}, window);
  b.task(rep).set_repeat_num(m);
  b.task(rep).set_pieces_per_iteration(m);
  b.task(acc).set_repeat_num(m);
  for (uint64_t task : {src, grad}) b.task(task).set_pieces_per_iteration(m);
  b.task(grad).set_acts_per_step(m);
  b.task(grad).set_async_acts(async);
  testing::SetCompute(b, grad, "mul", {{views, 0}, {x, 0}}, g);
  testing::SetSgdUpdate(b, param, w, sum, kVec, /*momentum=*/0.9);
  b.task(param).set_callback("w");
  b.task(src).set_callback("x");
  proto::Plan plan = b.Build();
  EXPECT_TRUE(b.status().ok()) << b.status();
  return plan;
}

// Asynchronous compute acts (Task.async_acts) order a task's acts by launch
// and by completion only: act k + 1 may write its outputs while act k still
// reads its inputs. A compute's inputs and outputs are in use together in
// every act, so they never shared bytes anyway, and every other ordering
// through the task still holds (what preceded act k's end preceded its
// start, hence act k + 1's): the planner gives asynchronous plans the same
// arenas, and its checker accepts one plan's offsets for the other.
TEST(MemoryPlan, AsynchronousComputeActsShareWhatSynchronousOnesShare) {
  const auto offsets = [](const proto::Plan& plan) {
    std::map<int64_t, int64_t> out;
    for (const auto& desc : plan.register_descs()) {
      if (desc.has_arena_offset()) out[desc.id()] = desc.arena_offset();
    }
    return out;
  };
  const auto with_async = [](proto::Plan plan) {
    for (auto& task : *plan.mutable_tasks()) task.set_async_acts(task.kind() == ACTOR_KIND_COMPUTE && !task.op().empty());
    return plan;
  };
  for (const bool windowed : {false, true}) {
    SCOPED_TRACE(windowed ? "windowed accumulation" : "training loop");
    const proto::Plan sync = windowed ? WindowedAccumulationPlan(false) : LoopPlan();
    proto::Plan async = with_async(sync);
    EXPECT_TRUE(comm::CheckMemoryPlan(async).ok());
    ASSERT_TRUE(comm::PlanMemory(async).ok());
    EXPECT_EQ(offsets(async), offsets(sync));
    ASSERT_EQ(async.arenas_size(), 1);
    EXPECT_EQ(async.arenas(0).bytes(), sync.arenas(0).bytes());
  }
  // The loop's d1 and d3 still share.
  testing::TrainingLoop t;
  proto::Plan async = with_async(LoopPlan(&t));
  ASSERT_TRUE(comm::PlanMemory(async).ok());
  EXPECT_EQ(Desc(async, t.d1).arena_offset(), Desc(async, t.d3).arena_offset());
}

// A compute's kernel workspace (Task.scratch_bytes, from OpSchema::Workspace)
// lies in the arena, apart from the registers its own acts read and write;
// the runs, synchronous and asynchronous, keep it apart (the monitor claims
// it while an act is in flight) and train as the plan without it.
TEST(MemoryPlan, ComputeWorkspaceLiesInTheArenaApartFromItsActsRegisters) {
  testing::TrainingLoop t;
  const proto::Plan plain = LoopPlan(&t);
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "asynchronous acts" : "synchronous acts");
    proto::Plan plan = plain;
    for (auto& task : *plan.mutable_tasks()) {
      if (task.kind() != ACTOR_KIND_COMPUTE) continue;
      task.set_scratch_bytes(100);
      task.set_async_acts(async);
    }
    ASSERT_TRUE(comm::PlanMemory(plan).ok());
    ASSERT_TRUE(comm::CheckMemoryPlan(plan).ok());
    ASSERT_EQ(plan.arenas_size(), 1);
    EXPECT_GT(plan.arenas(0).bytes(), plain.arenas(0).bytes());
    auto estimate = comm::EstimateMemory(plan);
    ASSERT_TRUE(estimate.ok()) << estimate.status();
    ASSERT_EQ(estimate->size(), 1u);
    EXPECT_EQ((*estimate)[0].boxing_scratch(), 3 * 100);  // the scratch column: c1, c2, c3's workspace
    for (const auto& task : plan.tasks()) {
      if (task.kind() != ACTOR_KIND_COMPUTE) continue;
      SCOPED_TRACE(task.name());
      ASSERT_TRUE(task.has_scratch_offset());
      EXPECT_EQ(task.scratch_offset() % comm::kArenaAlignment, 0);
      EXPECT_LE(task.scratch_offset() + 128, plan.arenas(0).bytes());
      std::vector<int64_t> touched(task.consumed_register_desc_ids().begin(), task.consumed_register_desc_ids().end());
      touched.insert(touched.end(), task.produced_register_desc_ids().begin(), task.produced_register_desc_ids().end());
      for (const int64_t id : touched) {
        const proto::RegisterDesc& desc = Desc(plan, id);
        if (!desc.has_arena_offset()) continue;
        const bool apart = desc.arena_offset() + desc.bytes_per_register() * desc.register_num() <= task.scratch_offset() ||
                           task.scratch_offset() + 128 <= desc.arena_offset();
        EXPECT_TRUE(apart) << "desc " << id;
      }
    }
    auto trained = TrainLoop(plan);
    ASSERT_TRUE(trained.ok()) << trained.status();
    auto without = TrainLoop(plain);
    ASSERT_TRUE(without.ok()) << without.status();
    EXPECT_EQ(*trained, *without);
  }
}

// Offsets come from the network: out of the arena, misaligned, on a desc
// that lives across iterations, without an arena: refused at load, naming
// the desc.
TEST(MemoryPlan, BadOffsetsAreRefusedAtLoad) {
  testing::TrainingLoop t;
  const proto::Plan good = LoopPlan(&t);
  const auto load_error = [](const proto::Plan& plan) {
    RuntimeOptions options;
    options.check_memory_plan = false;  // the bounds are checked regardless
    options.callbacks.initializers["w"] = [](const std::vector<Tensor>&) { return absl::OkStatus(); };
    options.callbacks.sources["x"] = [](int64_t, const std::vector<Tensor>&) { return absl::OkStatus(); };
    options.callbacks.sinks["watch"] = [](int64_t, const std::vector<Tensor>&) { return absl::OkStatus(); };
    auto runtime = Runtime::Load(plan, std::move(options));
    return runtime.ok() ? std::string() : std::string(runtime.status().message());
  };
  const auto with = [&](int64_t id, int64_t offset) {
    proto::Plan plan = good;
    for (auto& desc : *plan.mutable_register_descs()) {
      if (desc.id() == id) desc.set_arena_offset(offset);
    }
    return plan;
  };
  EXPECT_NE(load_error(with(t.d2, 1 << 20)).find(StrCat("register desc ", t.d2)), std::string::npos);
  EXPECT_NE(load_error(with(t.d2, 1 << 20)).find("of an arena of 192"), std::string::npos);
  EXPECT_NE(load_error(with(t.d2, 32)).find("not a multiple of 64"), std::string::npos);
  EXPECT_NE(load_error(with(t.d2, -64)).find("not a multiple of 64"), std::string::npos);
  EXPECT_NE(load_error(with(t.w, 0)).find("live across iterations"), std::string::npos);
  proto::Plan no_arena = good;
  no_arena.clear_arenas();
  EXPECT_NE(load_error(no_arena).find("its device has no arena"), std::string::npos);
  proto::Plan twice = good;
  *twice.add_arenas() = good.arenas(0);
  EXPECT_NE(load_error(twice).find("two arenas"), std::string::npos);
  proto::Plan negative = good;
  negative.mutable_arenas(0)->set_bytes(-1);
  EXPECT_NE(load_error(negative).find("-1 bytes"), std::string::npos);
  // One arena, registers of two device types (the arena is keyed by node
  // and index: cpu:0's and cuda:0's would share storage on one of them).
  proto::Plan mixed = good;
  for (auto& desc : *mixed.mutable_register_descs()) {
    if (desc.id() != t.d2) continue;
    comm::ActorId producer = comm::DecodeActorId(desc.producer());
    producer.device_type = DeviceType::kCuda;
    desc.set_producer(*comm::EncodeActorId(producer));
  }
  EXPECT_NE(std::string(comm::CheckArenaBounds(mixed).message()).find(", but the arena of node 0 device 0 holds "),
            std::string::npos)
      << comm::CheckArenaBounds(mixed);
  const auto with_scratch = [&](uint64_t task_id, int64_t bytes, std::optional<int64_t> offset) {
    proto::Plan plan = good;
    for (auto& task : *plan.mutable_tasks()) {
      if (task.actor_id() != task_id) continue;
      task.set_scratch_bytes(bytes);
      if (offset) task.set_scratch_offset(*offset);
    }
    return plan;
  };
  const std::string source_scratch = load_error(with_scratch(t.src, 64, std::nullopt));
  EXPECT_NE(source_scratch.find("task 'x'"), std::string::npos) << source_scratch;
  EXPECT_NE(source_scratch.find("has scratch, but only collectives and computes"), std::string::npos) << source_scratch;
  // A compute's kernel workspace: its own bytes without an offset; in the
  // arena only within it.
  EXPECT_EQ(load_error(with_scratch(t.c1, 64, std::nullopt)), "");
  const std::string outside = load_error(with_scratch(t.c1, 64, 1 << 20));
  EXPECT_NE(outside.find("task 'c1'"), std::string::npos) << outside;
  EXPECT_NE(outside.find("takes scratch bytes"), std::string::npos) << outside;
  EXPECT_EQ(load_error(good), "");
}

// The planner's windowed reachability walk finds the bits of walking every
// event for every source, on these hand-written plans too (the model plans
// are in tests/train/memory_test.cc).
TEST(MemoryPlan, WindowedLifetimeAnalysisMatchesTheExhaustiveWalk) {
  for (const auto& [name, plan] : std::vector<std::pair<const char*, proto::Plan>>{
           {"loop", LoopPlan()},
           {"chain", ChainPlan()},
           {"windowed accumulation", WindowedAccumulationPlan(false)},
           {"windowed accumulation, asynchronous", WindowedAccumulationPlan(true)},
           {"windowed accumulation, 12 micro-batches, window 1", WindowedAccumulationPlan(false, 12, 1)},
           {"windowed accumulation, 12 micro-batches, window 3, asynchronous",
            WindowedAccumulationPlan(true, 12, 3)}}) {
    SCOPED_TRACE(name);
    auto windowed = comm::internal::LifetimeOrders(plan, false);
    auto exhaustive = comm::internal::LifetimeOrders(plan, true);
    ASSERT_TRUE(windowed.ok()) << windowed.status();
    ASSERT_TRUE(exhaustive.ok()) << exhaustive.status();
    EXPECT_EQ(*windowed, *exhaustive);
  }
}

// The micro-batches whose uses the planner walks once are found from the
// plan: with a window of w micro-batches (M = 8), the Acc's acts M - w ..
// M - 1 write no window register and the Source's first w read none, and a
// Source's reads of iteration 0's last registers hand them back to the next
// iteration's Acc acts; the band is the longest run of layers between.
TEST(MemoryPlan, ThePeriodicBandIsFoundFromThePlan) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async);
    const std::vector<std::pair<int32_t, std::pair<int64_t, int64_t>>> expected = {
        {1, {1, 6}},  // Source acts 1 .. 6 hand back within the iteration, Acc acts 0 .. 6 write
        {2, {2, 5}},  // 2 .. 5 and 0 .. 5
        {3, {0, 2}},  // 3 .. 4 and 0 .. 4: acts 0 .. 2 (Acc writes, Source reads none) are the longest run
    };
    for (const auto& [window, band] : expected) {
      SCOPED_TRACE(window);
      auto found = comm::internal::PeriodicBand(WindowedAccumulationPlan(async, 8, window), 8);
      ASSERT_TRUE(found.ok()) << found.status();
      EXPECT_EQ(*found, band);
    }
  }
  // No task acts 8 times an iteration: no band.
  auto none = comm::internal::PeriodicBand(LoopPlan(), 8);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_GT(none->first, none->second);
}
}  // namespace
}  // namespace tessera::actors
