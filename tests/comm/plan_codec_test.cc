// The plan codec and runtime loading against bad plans (issue 9): PlanBuilder
// turns sizes that do not fit into sticky errors instead of aborts;
// ValidatePlan refuses dangling and inconsistent ids and absurd counts;
// loading refuses plans whose registers exceed the memory limit. (The
// fuzzer, tests/fuzz, throws random mutations at the same path.)

#include "comm/proto/plan_codec.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "actors/plan.h"
#include "actors/runtime.h"
#include "comm/proto/actor_id.h"

namespace tessera {
namespace {

using actors::ValidatePlan;
using comm::PlanBuilder;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing \"" << (part) << "\" in: " << (text)

const TensorMeta kRow{DType::kF32, Shape{2, 3}};

// src -> relu -> sink, one device.
proto::Plan SmallPlan(int32_t quota = 1) {
  PlanBuilder b(3);
  const uint64_t src = b.AddTask(proto::ACTOR_KIND_SOURCE, "src");
  const uint64_t relu = b.AddTask(proto::ACTOR_KIND_COMPUTE, "relu");
  const uint64_t sink = b.AddTask(proto::ACTOR_KIND_SINK, "sink");
  const int64_t x = b.AddRegisterDesc(src, {relu}, quota, {kRow});
  const int64_t y = b.AddRegisterDesc(relu, {sink}, 1, {kRow});
  b.AddInput(relu, x);
  b.AddOutput(relu, y);
  b.SetOp(relu, "relu");
  proto::Plan plan = b.Build();
  EXPECT_TRUE(b.status().ok()) << b.status();
  return plan;
}

std::string Validate(const proto::Plan& plan) { return std::string(ValidatePlan(plan, ops::BuiltinOps()).message()); }

TEST(PlanBuilderTest, IdsThatDoNotFitAreStickyErrors) {
  PlanBuilder b(1);
  const uint64_t ok = b.AddTask(proto::ACTOR_KIND_SOURCE, "src", 0, 255);
  EXPECT_NE(ok, comm::kNoActorId);
  // Device 999 of a 1000-device job used to abort in the codec.
  EXPECT_EQ(b.AddTask(proto::ACTOR_KIND_SINK, "sink@999", 0, 999), comm::kNoActorId);
  EXPECT_CONTAINS(b.status().message(), "task 'sink@999' on cpu:999: actor ids hold at most 256 devices per node");
  // Later calls add nothing; the first error stays.
  EXPECT_EQ(b.AddTask(proto::ACTOR_KIND_SINK, "sink", 5000), comm::kNoActorId);
  EXPECT_EQ(b.AddRegisterDesc(ok, {}, 1, {kRow}), -1);
  b.Build();
  EXPECT_CONTAINS(b.status().message(), "cpu:999");
  EXPECT_FALSE(comm::ValidateActorId(comm::kNoActorId).ok());

  PlanBuilder streams(1);
  EXPECT_EQ(streams.AddTask(proto::ACTOR_KIND_SOURCE, "s", 4096), comm::kNoActorId);
  EXPECT_CONTAINS(streams.status().message(), "stream is 12 bits");
}

TEST(PlanBuilderTest, RegisterSizesAndQuotasAreChecked) {
  for (const int32_t quota : {0, -1, comm::kMaxRegisterNum + 1}) {
    PlanBuilder b(1);
    const uint64_t src = b.AddTask(proto::ACTOR_KIND_SOURCE, "src");
    EXPECT_EQ(b.AddRegisterDesc(src, {}, quota, {kRow}), -1);
    EXPECT_CONTAINS(b.status().message(), "register_num");
  }
  PlanBuilder b(1);
  const uint64_t src = b.AddTask(proto::ACTOR_KIND_SOURCE, "src");
  EXPECT_EQ(b.AddRegisterDesc(src, {}, 1, {{DType::kF32, Shape{int64_t{1} << 62}}}), -1);
  EXPECT_CONTAINS(b.status().message(), "task 'src': f32 tensor");
  // Each tensor fits, their sum x quota does not: no negative memory estimate.
  PlanBuilder sum(1);
  const uint64_t s = sum.AddTask(proto::ACTOR_KIND_SOURCE, "src");
  const TensorMeta big{DType::kBool, Shape{int64_t{1} << 50}};
  EXPECT_EQ(sum.AddRegisterDesc(s, {}, 1000, {big, big, big, big, big, big, big, big, big}), -1);
  EXPECT_CONTAINS(sum.status().message(), "overflows int64");
}

TEST(PlanCodecTest, MemoryEstimateOverflowIsAnError) {
  proto::Plan plan = SmallPlan();
  plan.mutable_register_descs(0)->set_bytes_per_register(std::numeric_limits<int64_t>::max() / 2);
  plan.mutable_register_descs(1)->set_bytes_per_register(std::numeric_limits<int64_t>::max() / 2 + 8);
  auto estimate = comm::EstimateMemory(plan);
  ASSERT_FALSE(estimate.ok());
  EXPECT_CONTAINS(estimate.status().message(), "memory estimate of node 0 cpu:0");
  plan.mutable_register_descs(0)->set_register_num(3);
  EXPECT_CONTAINS(comm::EstimateMemory(plan).status().message(), "bytes of register desc 0");
}

TEST(PlanCodecTest, TensorDescsAndSlicesAreChecked) {
  proto::TensorDesc desc;
  desc.set_name("x");
  desc.add_shape(int64_t{1} << 62);
  desc.add_shape(int64_t{1} << 62);
  EXPECT_CONTAINS(comm::TensorMetaFromProto(desc).status().message(), "tensor 'x': f32 tensor");
  proto::TensorSlice slice;
  slice.add_logical_shape(4);
  slice.add_offset(std::numeric_limits<int64_t>::max());
  EXPECT_CONTAINS(comm::TensorSliceFromProto(slice, Shape{2}).status().message(), "out of range on axis 0");
  slice.set_offset(0, 2);
  EXPECT_TRUE(comm::TensorSliceFromProto(slice, Shape{2}).ok());
  slice.set_logical_shape(0, -4);
  EXPECT_FALSE(comm::TensorSliceFromProto(slice, Shape{2}).ok());
}

TEST(ValidatePlanTest, DanglingIdsAreErrors) {
  const proto::Plan good = SmallPlan();
  ASSERT_EQ(Validate(good), "");
  {
    proto::Plan plan = good;  // a consumer that is no task
    plan.mutable_register_descs(0)->set_consumers(0, 12345);
    EXPECT_CONTAINS(Validate(plan), "register desc 0: consumer");
  }
  {
    proto::Plan plan = good;  // a producer that is no task
    plan.mutable_register_descs(1)->set_producer(comm::kNoActorId >> 8);
    EXPECT_CONTAINS(Validate(plan), "register desc 1: producer");
  }
  {
    proto::Plan plan = good;  // a task consuming a desc that does not exist
    plan.mutable_tasks(2)->add_consumed_register_desc_ids(77);
    EXPECT_CONTAINS(Validate(plan), "consumes unknown register desc 77");
  }
  {
    proto::Plan plan = good;  // a ref to a desc the task does not consume
    plan.mutable_tasks(1)->mutable_inputs(0)->set_register_desc_id(1);
    EXPECT_CONTAINS(Validate(plan), "input refers to desc 1 which it does not consume");
  }
  {
    proto::Plan plan = good;  // a ref without a location
    plan.mutable_tasks(1)->mutable_inputs(0)->clear_location();
    EXPECT_CONTAINS(Validate(plan), "neither a register nor a state tensor");
  }
  {
    proto::Plan plan = good;  // a tensor index past the register's tensors
    plan.mutable_tasks(1)->mutable_inputs(0)->set_tensor_index(std::numeric_limits<int32_t>::max());
    EXPECT_CONTAINS(Validate(plan), "refers to tensor 2147483647 of desc 0");
  }
  {
    proto::Plan plan = good;  // a task consuming what it produces
    plan.mutable_tasks(1)->add_consumed_register_desc_ids(1);
    plan.mutable_register_descs(1)->add_consumers(plan.tasks(1).actor_id());
    EXPECT_CONTAINS(Validate(plan), "consumes desc 1 it produces");
  }
  {
    proto::Plan plan = good;  // two tasks with one id
    plan.mutable_tasks(2)->set_actor_id(plan.tasks(0).actor_id());
    EXPECT_CONTAINS(Validate(plan), "two tasks have actor id");
  }
}

// A transfer or collective naming a rank the plan does not list is an
// error where the plan is split by node (it was taken for node 0's).
TEST(PlanCodecTest, SplittingAPlanRefusesARankItDoesNotList) {
  proto::Plan plan = SmallPlan();
  plan.add_ranks()->set_node(0);
  plan.add_ranks()->set_node(0);
  ASSERT_TRUE(comm::SplitPlan(plan).ok());
  plan.mutable_tasks(1)->mutable_transfer()->set_peer(7);
  const auto split = comm::SplitPlan(plan);
  ASSERT_FALSE(split.ok());
  EXPECT_CONTAINS(split.status().message(), "names rank 7, but the plan lists only 2 ranks");
}

TEST(ValidatePlanTest, AbsurdCountsAreErrors) {
  const proto::Plan good = SmallPlan();
  {
    proto::Plan plan = good;
    plan.mutable_register_descs(0)->set_register_num(std::numeric_limits<int32_t>::max());
    EXPECT_CONTAINS(Validate(plan), "register_num 2147483647 (must be in [1, 1024])");
  }
  {
    proto::Plan plan = good;
    plan.set_iterations(std::numeric_limits<int64_t>::max());
    EXPECT_CONTAINS(Validate(plan), "at most 2^62 in all");
  }
  {
    proto::Plan plan = good;  // each in range, their end past int64
    plan.set_iterations(int64_t{1} << 62);
    plan.set_start_iteration(int64_t{1} << 62);
    EXPECT_CONTAINS(Validate(plan), "at most 2^62 in all");
  }
  {
    proto::Plan plan = good;  // iterations x pieces would overflow the act counters
    plan.set_iterations(int64_t{1} << 62);
    for (auto& task : *plan.mutable_tasks()) task.set_pieces_per_iteration(4);
    EXPECT_CONTAINS(Validate(plan), "acts over the run");
  }
  {
    proto::Plan plan = good;
    for (int i = 0; i < comm::kMaxTaskArity + 1; ++i) plan.mutable_tasks(2)->add_consumed_register_desc_ids(i);
    EXPECT_CONTAINS(Validate(plan), "at most 4096");
  }
  {
    proto::Plan plan = good;  // a tensor of a register with a wrapped size
    proto::TensorDesc* t = plan.mutable_register_descs(0)->mutable_tensors(0);
    t->set_shape(0, int64_t{1} << 62);
    t->set_shape(1, 4);
    plan.mutable_register_descs(0)->set_bytes_per_register(0);  // what 2^62 x 4 x 4 wraps to
    EXPECT_CONTAINS(Validate(plan), "more than 2^50 elements");
  }
  {
    proto::Plan plan = good;  // a micro-batch stride past the logical rows
    plan.mutable_tasks(1)->set_pieces_per_iteration(2);
    for (int t = 0; t < 3; ++t) plan.mutable_tasks(t)->set_pieces_per_iteration(2);
    proto::TensorRef* ref = plan.mutable_tasks(1)->mutable_inputs(0);
    ref->mutable_slice()->add_logical_shape(4);
    ref->mutable_slice()->add_logical_shape(3);
    ref->mutable_slice()->add_offset(0);
    ref->mutable_slice()->add_offset(0);
    ref->set_micro_batch_stride(3);
    EXPECT_CONTAINS(Validate(plan), "micro_batch_stride 3");
    ref->set_micro_batch_stride(2);  // rows [0, 2) and [2, 4) of 4: fine for the ref
    EXPECT_EQ(Validate(plan).find("micro_batch_stride"), std::string::npos) << Validate(plan);
  }
}

TEST(RuntimeLoadTest, RegistersBeyondTheMemoryLimitAreRefusedBeforeAllocating) {
  PlanBuilder b(1);
  const uint64_t src = b.AddTask(proto::ACTOR_KIND_SOURCE, "src");
  const uint64_t sink = b.AddTask(proto::ACTOR_KIND_SINK, "sink");
  b.AddRegisterDesc(src, {sink}, 1000, {{DType::kF32, Shape{1 << 20}}});  // 1000 x 4 MiB
  const proto::Plan plan = b.Build();
  ASSERT_TRUE(b.status().ok()) << b.status();
  actors::RuntimeOptions options;
  options.memory_limit_bytes = int64_t{64} << 20;
  auto runtime = actors::Runtime::Load(plan, options);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_CONTAINS(runtime.status().message(), "take 4194304000 bytes of host memory, more than the limit of 67108864");
  // Empty tensors count one allocator block each: a million of them is not free.
  PlanBuilder empty(1);
  const uint64_t s = empty.AddTask(proto::ACTOR_KIND_SOURCE, "src");
  std::vector<TensorMeta> tensors(comm::kMaxTaskArity, TensorMeta{DType::kF32, Shape{0}});
  empty.AddRegisterDesc(s, {}, comm::kMaxRegisterNum, tensors);
  options.memory_limit_bytes = int64_t{1} << 20;
  EXPECT_EQ(actors::Runtime::Load(empty.Build(), options).status().code(), absl::StatusCode::kResourceExhausted);
  // Bytes that are no plan.
  EXPECT_FALSE(actors::Runtime::LoadSerialized("\x0a\xff\xff\xff\xff\x0f", options).ok());
  // An input fed in 1000 micro-batches of 4 MiB: the feed fills the whole
  // batch at once, 4000 MiB of host memory the registers do not show (a
  // run of 2^20 micro-batches mapped them mid-run, or swapped).
  PlanBuilder fed(1);
  const uint64_t source = fed.AddTask(proto::ACTOR_KIND_SOURCE, "input:x");
  const TensorMeta micro_batch{DType::kF32, Shape{1 << 10, 1 << 10}};
  fed.AddRegisterDesc(source, {}, 1, {micro_batch});
  fed.SetSource(source, "x", micro_batch, TensorSlice::Whole(micro_batch.shape));
  fed.task(source).set_callback("x");
  fed.task(source).set_pieces_per_iteration(1000);
  const proto::Plan fed_plan = fed.Build();
  ASSERT_TRUE(fed.status().ok()) << fed.status();
  ASSERT_EQ(fed_plan.memory_estimate_size(), 1);
  EXPECT_EQ(fed_plan.memory_estimate(0).feed_buffers(), int64_t{1000} << 22);
  options.memory_limit_bytes = int64_t{1} << 30;
  runtime = actors::Runtime::Load(fed_plan, options);
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_CONTAINS(runtime.status().message(), "registers, state and feed buffers take");
}

}  // namespace
}  // namespace tessera
