// Actor runtime tests: ids, plan round trips, the register protocol on the
// stepped executor, and whole plans on threads. Every test that runs threads
// does so under a deadline (tests/deadline.h), so a hang fails promptly,
// naming the test, instead of blocking ctest.

#include <chrono>
#include <cmath>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "actors/actor_id.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "gtest/gtest.h"
#include "ops/eager.h"
#include "tests/actors/plan_helpers.h"
#include "tests/deadline.h"

namespace tessera::actors {
namespace {

using proto::ACTOR_KIND_ACC;
using proto::ACTOR_KIND_COMPUTE;
using proto::ACTOR_KIND_PARAMETER;
using proto::ACTOR_KIND_REPEAT;
using proto::ACTOR_KIND_SINK;
using proto::ACTOR_KIND_SOURCE;

constexpr auto kDeadline = std::chrono::seconds(10);

// Runs the plan on threads; past kDeadline the process ends naming the test
// (tests/deadline.h).
absl::Status RunWithDeadline(const proto::Plan& plan, RuntimeOptions options) {
  auto runtime = Runtime::LoadSerialized(SerializePlan(plan), std::move(options));
  if (!runtime.ok()) return runtime.status();
  ::tessera::testing::Deadline deadline(kDeadline, "Runtime::Run");
  return (*runtime)->Run();
}

// Delivers the first pending message matching `pred`.
template <typename Pred>
void DeliverFirst(SteppedExecutor& exec, Pred pred) {
  const auto& pending = exec.pending();
  for (size_t i = 0; i < pending.size(); ++i) {
    if (pred(pending[i])) {
      ASSERT_TRUE(exec.Deliver(i).ok());
      return;
    }
  }
  FAIL() << "no such pending message";
}

bool IsAckTo(const Message& m, uint64_t dst) { return m.type == MessageType::kRegisterAck && m.dst == dst; }
bool IsTo(const Message& m, uint64_t dst) { return m.dst == dst && m.type != MessageType::kRegisterAck; }

const TensorMeta kScalarF32{DType::kF32, Shape{}};

TEST(ActorIdTest, RoundTripsEveryField) {
  ActorId id{.node = 65535, .device_type = DeviceType::kCuda, .device_index = 255, .stream = 4095, .task = 16777215};
  auto encoded = EncodeActorId(id);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(*encoded, ~uint64_t{0} - (uint64_t{0xE} << kDeviceTypeShift));  // device type 1 of 4 bits
  EXPECT_EQ(DecodeActorId(*encoded), id);
  ActorId small{.node = 3, .device_type = DeviceType::kCpu, .device_index = 2, .stream = 5, .task = 9};
  auto e = EncodeActorId(small);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(DecodeActorId(*e), small);
  EXPECT_EQ(StreamOf(*e), *e >> kTaskBits);
  EXPECT_EQ(small.ToString(), "node 3 cpu:2 stream 5 task 9");
}

TEST(ActorIdTest, OutOfRangeFieldIsAnError) {
  auto e = EncodeActorId(ActorId{.stream = 4096});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("stream"), std::string_view::npos);
  EXPECT_FALSE(EncodeActorId(ActorId{.task = 1u << 24}).ok());
}

TEST(PlanTest, SerialisesAndParsesBack) {
  PlanBuilder b(3);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  uint64_t add = b.AddTask(ACTOR_KIND_COMPUTE, "add", 1);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  int64_t x = b.AddRegisterDesc(src, {add}, 2, {{DType::kF32, Shape{2, 3}}});
  int64_t y = b.AddRegisterDesc(add, {sink}, 1, {{DType::kF32, Shape{2, 3}}});
  b.AddInput(add, x);
  b.AddInput(add, x);
  b.AddOutput(add, y);
  b.SetOp(add, "add", {{"unused_ints", std::vector<int64_t>{1, 2}}});
  proto::Plan plan = b.Build();
  auto parsed = ParsePlan(SerializePlan(plan));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(SerializePlan(*parsed), SerializePlan(plan));
  EXPECT_EQ(parsed->memory_estimate_size(), 1);
  // Three registers in the arena, each rounded up to 64 bytes, none sharing
  // (the source may run ahead of the sink).
  EXPECT_EQ(parsed->memory_estimate(0).arena(), 3 * 64);
  EXPECT_EQ(parsed->memory_estimate(0).bytes(), 3 * 64);
  auto attrs = AttrMapFromProto(parsed->tasks(1).attrs());
  ASSERT_TRUE(attrs.ok());
  EXPECT_EQ(attrs->Ints("unused_ints"), (std::vector<int64_t>{1, 2}));
  // The unknown attribute is caught by validation, naming the task.
  absl::Status status = ValidatePlan(*parsed, ops::BuiltinOps());
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("task 'add'"), std::string_view::npos) << status;
  EXPECT_FALSE(ParsePlan("\xff\xff garbage").ok());
}

TEST(PlanTest, ValidationCatchesWrongRegisterSizes) {
  PlanBuilder b(1);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  b.AddRegisterDesc(src, {sink}, 1, {{DType::kF32, Shape{4}}});
  proto::Plan plan = b.Build();
  plan.mutable_register_descs(0)->set_bytes_per_register(8);
  absl::Status status = ValidatePlan(plan, ops::BuiltinOps());
  EXPECT_NE(status.message().find("bytes per register"), std::string_view::npos) << status;
}

// Source -> Sink on the stepped executor with a given quota.
struct Pair {
  proto::Plan plan;
  uint64_t source, sink;
};
Pair SourceSink(int32_t quota, int64_t iterations) {
  PlanBuilder b(iterations);
  Pair p;
  p.source = b.AddTask(ACTOR_KIND_SOURCE, "src");
  p.sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  b.AddRegisterDesc(p.source, {p.sink}, quota, {kScalarF32});
  p.plan = b.Build();
  return p;
}

TEST(ProtocolTest, QuotaOneProducerWaitsForTheAck) {
  Pair p = SourceSink(1, 5);
  auto exec = SteppedExecutor::Load(p.plan);
  ASSERT_TRUE(exec.ok()) << exec.status();
  SteppedExecutor& e = **exec;
  e.Start();
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, p.source); });  // start
  EXPECT_EQ(e.actor(p.source).act_count(), 1);
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, p.sink); });  // start
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, p.sink); });  // ready
  EXPECT_EQ(e.actor(p.sink).act_count(), 1);
  // The sink acked, but the ack is still in flight: no second act yet.
  EXPECT_EQ(e.actor(p.source).act_count(), 1);
  DeliverFirst(e, [&](const Message& m) { return IsAckTo(m, p.source); });
  EXPECT_EQ(e.actor(p.source).act_count(), 2);
}

TEST(ProtocolTest, QuotaTwoProducerRunsOneAhead) {
  Pair p = SourceSink(2, 5);
  auto exec = SteppedExecutor::Load(p.plan);
  ASSERT_TRUE(exec.ok()) << exec.status();
  SteppedExecutor& e = **exec;
  e.Start();
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, p.source); });
  EXPECT_EQ(e.actor(p.source).act_count(), 2);  // both registers written, none read yet
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, p.sink); });  // start
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, p.sink); });  // ready #0
  DeliverFirst(e, [&](const Message& m) { return IsAckTo(m, p.source); });
  EXPECT_EQ(e.actor(p.source).act_count(), 3);
  ASSERT_TRUE(e.RunUntilIdle().ok());
  EXPECT_EQ(e.actor(p.source).act_count(), 5);
  EXPECT_EQ(e.actor(p.sink).act_count(), 5);
  EXPECT_TRUE(e.AllDone());
}

TEST(ProtocolTest, RegisterIsFreeOnlyWhenEveryConsumerAcked) {
  PlanBuilder b(3);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  uint64_t a = b.AddTask(ACTOR_KIND_SINK, "a");
  uint64_t c = b.AddTask(ACTOR_KIND_SINK, "c");
  b.AddRegisterDesc(src, {a, c}, 1, {kScalarF32});
  auto exec = SteppedExecutor::Load(b.Build());
  ASSERT_TRUE(exec.ok()) << exec.status();
  SteppedExecutor& e = **exec;
  e.Start();
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, src); });
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, a); });  // start
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, a); });  // ready
  DeliverFirst(e, [&](const Message& m) { return IsAckTo(m, src); });
  EXPECT_EQ(e.actor(src).act_count(), 1);  // c still reads it
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, c); });  // start
  DeliverFirst(e, [&](const Message& m) { return IsTo(m, c); });  // ready
  DeliverFirst(e, [&](const Message& m) { return IsAckTo(m, src); });
  EXPECT_EQ(e.actor(src).act_count(), 2);
  ASSERT_TRUE(e.RunUntilIdle().ok());
  EXPECT_EQ(e.actor(a).act_count(), 3);
  EXPECT_EQ(e.actor(c).act_count(), 3);
  EXPECT_TRUE(e.AllDone());
}

TEST(ProtocolTest, EordPropagatesAndActorsWaitForTheirRegisters) {
  PlanBuilder b(2);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  uint64_t relay = b.AddTask(ACTOR_KIND_COMPUTE, "relay");
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  b.AddRegisterDesc(src, {relay}, 2, {kScalarF32});
  b.AddRegisterDesc(relay, {sink}, 2, {kScalarF32});
  auto exec = SteppedExecutor::Load(b.Build());
  ASSERT_TRUE(exec.ok()) << exec.status();
  SteppedExecutor& e = **exec;
  e.Start();
  // Deliver everything except acks to the source.
  for (int guard = 0; guard < 100; ++guard) {
    const auto& pending = e.pending();
    size_t i = 0;
    while (i < pending.size() && IsAckTo(pending[i], src)) ++i;
    if (i == pending.size()) break;
    ASSERT_TRUE(e.Deliver(i).ok());
  }
  EXPECT_TRUE(e.actor(src).eord_sent());
  EXPECT_FALSE(e.actor(src).done());  // zombie: both registers still out
  EXPECT_TRUE(e.actor(relay).done());
  EXPECT_TRUE(e.actor(sink).done());
  EXPECT_EQ(e.actor(sink).act_count(), 2);
  EXPECT_EQ(e.pending().size(), 2u);
  ASSERT_TRUE(e.RunUntilIdle().ok());
  EXPECT_TRUE(e.actor(src).done());
  EXPECT_TRUE(e.AllDone());
}

// Parameter w (lr 0.5, no momentum) read by grad = w * 1 and by a sink: the
// update waits for the gradient AND for the sink's ack.
TEST(ProtocolTest, ParameterUpdatesOnlyAfterEveryReaderAckedAndTheGradientArrived) {
  const TensorMeta vec{DType::kF32, Shape{2}};
  PlanBuilder b(2);
  uint64_t param = b.AddTask(ACTOR_KIND_PARAMETER, "w");
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "ones");
  uint64_t grad = b.AddTask(ACTOR_KIND_COMPUTE, "grad");
  uint64_t watch = b.AddTask(ACTOR_KIND_SINK, "watch");
  int64_t w = b.AddRegisterDesc(param, {grad, watch}, 1, {vec});
  int64_t x = b.AddRegisterDesc(src, {grad}, 1, {vec});
  int64_t g = b.AddRegisterDesc(grad, {param}, 1, {vec});
  testing::SetCompute(b, grad, "mul", {{w, 0}, {x, 0}}, g);
  testing::SetSgdUpdate(b, param, w, g, vec, /*momentum=*/0);
  b.task(param).set_callback("init");
  b.task(src).set_callback("ones");
  Tensor variable;
  RuntimeOptions options;
  options.callbacks.initializers["init"] = [&variable](const std::vector<Tensor>& t) {
    variable = t[0];
    variable.data<float>()[0] = 1;
    variable.data<float>()[1] = 2;
    t.back().data<float>()[0] = 0.5f;  // the lr (no momentum buffer)
    return absl::OkStatus();
  };
  options.callbacks.sources["ones"] = [](int64_t, const std::vector<Tensor>& t) {
    t[0].data<float>()[0] = t[0].data<float>()[1] = 1;
    return absl::OkStatus();
  };
  auto exec = SteppedExecutor::Load(b.Build(), std::move(options));
  ASSERT_TRUE(exec.ok()) << exec.status();
  SteppedExecutor& e = **exec;
  e.Start();
  const auto held = [&](const Message& m) { return IsAckTo(m, param) && m.src == watch; };
  for (int guard = 0; guard < 100; ++guard) {
    const auto& pending = e.pending();
    size_t i = 0;
    while (i < pending.size() && held(pending[i])) ++i;
    if (i == pending.size()) break;
    ASSERT_TRUE(e.Deliver(i).ok());
  }
  EXPECT_EQ(e.actor(grad).act_count(), 1);  // the gradient went out...
  EXPECT_EQ(e.actor(param).act_count(), 1);
  EXPECT_EQ(variable.ToVector<float>(), (std::vector<float>{1, 2}));  // ...but the sink still reads w
  ASSERT_EQ(e.pending().size(), 1u);
  ASSERT_TRUE(e.Deliver(0).ok());
  EXPECT_EQ(variable.ToVector<float>(), (std::vector<float>{0.5f, 1}));
  EXPECT_EQ(e.actor(param).act_count(), 2);
  ASSERT_TRUE(e.RunUntilIdle().ok());
  EXPECT_EQ(variable.ToVector<float>(), (std::vector<float>{0.25f, 0.5f}));
  EXPECT_TRUE(e.AllDone());
}

// Source (x_i = i + [0, 1, 2, 3], y = 2) -> add(x, y) -> mul(a, x) -> sink,
// each compute on its own thread, the sink sharing the source's.
TEST(RuntimeTest, ChainComputesTheRightNumbersOver100Iterations) {
  constexpr int64_t kIterations = 100;
  const TensorMeta vec{DType::kF32, Shape{4}};
  PlanBuilder b(kIterations);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src", 0);
  uint64_t add = b.AddTask(ACTOR_KIND_COMPUTE, "add", 1);
  uint64_t mul = b.AddTask(ACTOR_KIND_COMPUTE, "mul", 2);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink", 0);
  int64_t xy = b.AddRegisterDesc(src, {add, mul}, 2, {vec, vec});
  int64_t a = b.AddRegisterDesc(add, {mul}, 2, {vec});
  int64_t out = b.AddRegisterDesc(mul, {sink}, 2, {vec});
  b.AddInput(add, xy, 0);
  b.AddInput(add, xy, 1);
  b.AddOutput(add, a);
  b.SetOp(add, "add");
  b.AddInput(mul, a);
  b.AddInput(mul, xy, 0);
  b.AddOutput(mul, out);
  b.SetOp(mul, "mul");
  b.task(src).set_callback("feed");
  b.task(sink).set_callback("collect");

  RuntimeOptions options;
  options.callbacks.sources["feed"] = [](int64_t i, const std::vector<Tensor>& t) {
    for (int k = 0; k < 4; ++k) {
      t[0].data<float>()[k] = static_cast<float>(i + k);
      t[1].data<float>()[k] = 2.0f;
    }
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> got;
  options.callbacks.sinks["collect"] = [&got](int64_t i, const std::vector<Tensor>& t) {
    EXPECT_EQ(i, static_cast<int64_t>(got.size()));
    got.push_back(t[0].ToVector<float>());
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunWithDeadline(b.Build(), std::move(options)).ok());
  ASSERT_EQ(got.size(), static_cast<size_t>(kIterations));
  for (int64_t i = 0; i < kIterations; ++i) {
    for (int k = 0; k < 4; ++k) {
      const float x = static_cast<float>(i + k);
      EXPECT_EQ(got[static_cast<size_t>(i)][static_cast<size_t>(k)], (x + 2) * x) << "iteration " << i;
    }
  }
}

TEST(RuntimeTest, KernelErrorAbortsTheJobNamingActorOpAndDevice) {
  PlanBuilder b(1000);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src", 0);
  uint64_t emb = b.AddTask(ACTOR_KIND_COMPUTE, "token_embedding", 1);
  uint64_t relay = b.AddTask(ACTOR_KIND_COMPUTE, "relay", 2);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink", 0);
  int64_t in = b.AddRegisterDesc(src, {emb}, 2, {{DType::kF32, Shape{10, 4}}, {DType::kI64, Shape{3}}});
  int64_t y = b.AddRegisterDesc(emb, {relay}, 2, {{DType::kF32, Shape{3, 4}}});
  b.AddRegisterDesc(relay, {sink}, 2, {kScalarF32});
  b.AddInput(emb, in, 0);
  b.AddInput(emb, in, 1);
  b.AddOutput(emb, y);
  b.SetOp(emb, "embedding");
  b.task(src).set_callback("ids");
  RuntimeOptions options;
  options.callbacks.sources["ids"] = [](int64_t i, const std::vector<Tensor>& t) {
    int64_t* ids = t[1].data<int64_t>();
    ids[0] = 1;
    ids[1] = i == 5 ? 99 : 2;  // out of the vocabulary of 10
    ids[2] = 3;
    return absl::OkStatus();
  };
  absl::Status status = RunWithDeadline(b.Build(), std::move(options));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_NE(message.find("actor 'token_embedding'"), std::string::npos) << message;
  EXPECT_NE(message.find("op 'embedding'"), std::string::npos) << message;
  EXPECT_NE(message.find("cpu:0"), std::string::npos) << message;
  EXPECT_NE(message.find("id 99"), std::string::npos) << message;
}

// The plan's TensorSlice reaches the kernel: a vocabulary shard (rows 5..9
// of a 10-row embedding) looks up id 7 as its local row 2 and gives zeros
// for id 1, which another shard owns.
TEST(RuntimeTest, KernelsSeeThePlansTensorSlices) {
  PlanBuilder b(1);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src", 0);
  uint64_t emb = b.AddTask(ACTOR_KIND_COMPUTE, "emb", 1);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink", 0);
  int64_t in = b.AddRegisterDesc(src, {emb}, 1, {{DType::kF32, Shape{5, 2}}, {DType::kI64, Shape{2}}});
  int64_t y = b.AddRegisterDesc(emb, {sink}, 1, {{DType::kF32, Shape{2, 2}}});
  b.AddInput(emb, in, 0);
  b.AddInput(emb, in, 1);
  b.AddOutput(emb, y);
  b.SetOp(emb, "embedding");
  proto::TensorSlice* slice = b.task(emb).mutable_inputs(0)->mutable_slice();
  slice->add_logical_shape(10);
  slice->add_logical_shape(2);
  slice->add_offset(5);
  slice->add_offset(0);
  b.task(src).set_callback("shard");
  b.task(sink).set_callback("out");
  RuntimeOptions options;
  options.callbacks.sources["shard"] = [](int64_t, const std::vector<Tensor>& t) {
    for (int k = 0; k < 10; ++k) t[0].data<float>()[k] = static_cast<float>(50 + k);  // rows 5..9
    t[1].data<int64_t>()[0] = 7;
    t[1].data<int64_t>()[1] = 1;
    return absl::OkStatus();
  };
  std::vector<float> got;
  options.callbacks.sinks["out"] = [&got](int64_t, const std::vector<Tensor>& t) {
    got = t[0].ToVector<float>();
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunWithDeadline(b.Build(), std::move(options)).ok());
  EXPECT_EQ(got, (std::vector<float>{54, 55, 0, 0}));
}

// Under micro-batching a random op sees where its micro-batch sits in the
// iteration's global batch: m micro-batches of dropout give exactly the mask
// of one dropout over the whole global batch (DESIGN §4).
TEST(RuntimeTest, MicroBatchedDropoutDrawsTheGlobalBatchMask) {
  constexpr int64_t kIterations = 2, kM = 3, kRows = 4, kCols = 5;
  const TensorMeta piece{DType::kF32, Shape{kRows, kCols}};
  PlanBuilder b(kIterations);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "x", 0);
  uint64_t drop = b.AddTask(ACTOR_KIND_COMPUTE, "dropout", 0);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "y", 0);
  int64_t x = b.AddRegisterDesc(src, {drop}, 2, {piece});
  int64_t y = b.AddRegisterDesc(drop, {sink}, 2, {piece});
  b.AddInput(drop, x);
  b.AddOutput(drop, y);
  const ops::AttrMap attrs = {{"rate", 0.5}, {"seed", int64_t{3}}, {"tensor_id", int64_t{9}}};
  b.SetOp(drop, "dropout", attrs);
  for (proto::TensorRef* ref : {b.task(drop).mutable_inputs(0), b.task(drop).mutable_outputs(0)}) {
    ref->mutable_slice()->add_logical_shape(kM * kRows);
    ref->mutable_slice()->add_logical_shape(kCols);
    ref->mutable_slice()->add_offset(0);
    ref->mutable_slice()->add_offset(0);
    ref->set_micro_batch_stride(kRows);
  }
  for (uint64_t t : {src, drop, sink}) b.task(t).set_pieces_per_iteration(kM);
  b.task(drop).set_acts_per_step(kM);
  b.task(sink).set_acts_per_step(kM);
  b.task(src).set_callback("x");
  b.task(sink).set_callback("y");
  RuntimeOptions options;
  options.callbacks.sources["x"] = [](int64_t, const std::vector<Tensor>& t) {
    for (int64_t k = 0; k < kRows * kCols; ++k) t[0].data<float>()[k] = 1.0f;
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> got;  // per micro-batch, in order
  options.callbacks.sinks["y"] = [&got](int64_t, const std::vector<Tensor>& t) {
    got.push_back(t[0].ToVector<float>());
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunWithDeadline(b.Build(), std::move(options)).ok());
  ASSERT_EQ(got.size(), static_cast<size_t>(kIterations * kM));
  auto ones = Tensor::Zeros(Shape{kM * kRows, kCols}, DType::kF32);
  ASSERT_TRUE(ones.ok());
  for (int64_t k = 0; k < kM * kRows * kCols; ++k) ones->data<float>()[k] = 1.0f;
  for (int64_t it = 0; it < kIterations; ++it) {
    const ops::OpSchema* schema = *ops::BuiltinOps().Get("dropout");
    auto canonical = schema->CanonicalizeAttrs(attrs);
    ASSERT_TRUE(canonical.ok());
    auto whole = Tensor::Zeros(Shape{kM * kRows, kCols}, DType::kF32);
    ASSERT_TRUE(whole.ok());
    ops::KernelContext ctx;
    ctx.schema = schema;
    ctx.attrs = &*canonical;
    ctx.inputs = {*ones};
    ctx.outputs = {*whole};
    ctx.step = it;
    ASSERT_TRUE(ops::RunKernel(*schema, ctx).ok());
    const std::vector<float> expected = whole->ToVector<float>();
    bool some_dropped = false;
    for (int64_t m = 0; m < kM; ++m) {
      const std::vector<float>& micro = got[static_cast<size_t>(it * kM + m)];
      for (int64_t k = 0; k < kRows * kCols; ++k) {
        EXPECT_EQ(micro[static_cast<size_t>(k)], expected[static_cast<size_t>(m * kRows * kCols + k)])
            << "iteration " << it << " micro-batch " << m << " element " << k;
        some_dropped |= micro[static_cast<size_t>(k)] == 0.0f;
      }
    }
    EXPECT_TRUE(some_dropped);
  }
}

TEST(PlanTest, ParameterUpdateRunsOncePerIteration) {
  PlanBuilder b(1);
  uint64_t param = b.AddTask(ACTOR_KIND_PARAMETER, "w", 0);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "g", 0);
  const TensorMeta vec{DType::kF32, Shape{3}};
  int64_t w = b.AddRegisterDesc(param, {}, 1, {vec});
  int64_t g = b.AddRegisterDesc(src, {param}, 1, {vec});
  b.SetOp(param, "add");  // w += g
  b.AddInput(param, w);
  b.AddInput(param, g);
  b.AddOutput(param, w);
  b.task(param).set_pieces_per_iteration(2);
  b.task(src).set_pieces_per_iteration(2);
  const absl::Status status = ValidatePlan(b.Build(), ops::BuiltinOps());
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("once per iteration"), std::string_view::npos) << status;
}

TEST(RuntimeTest, CallbackErrorAbortsToo) {
  Pair p = SourceSink(2, 100);
  p.plan.mutable_tasks(1)->set_callback("fail");
  RuntimeOptions options;
  options.callbacks.sinks["fail"] = [](int64_t i, const std::vector<Tensor>&) {
    return i == 7 ? absl::DataLossError("bad batch") : absl::OkStatus();
  };
  absl::Status status = RunWithDeadline(p.plan, std::move(options));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("actor 'sink'"), std::string_view::npos) << status;
}

// A callback (or kernel) that throws fails the job with an error naming the
// actor, instead of terminating the process.
TEST(RuntimeTest, ThrowingCallbackIsAnError) {
  for (const bool out_of_memory : {true, false}) {
    Pair p = SourceSink(2, 100);
    p.plan.mutable_tasks(1)->set_callback("throw");
    RuntimeOptions options;
    options.callbacks.sinks["throw"] = [out_of_memory](int64_t i, const std::vector<Tensor>&) -> absl::Status {
      if (i == 5 && out_of_memory) throw std::bad_alloc();
      if (i == 5) throw std::runtime_error("library failure");
      return absl::OkStatus();
    };
    absl::Status status = RunWithDeadline(p.plan, std::move(options));
    EXPECT_EQ(status.code(), out_of_memory ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal) << status;
    EXPECT_NE(status.message().find("actor 'sink'"), std::string_view::npos) << status;
    if (!out_of_memory) {
      EXPECT_NE(status.message().find("library failure"), std::string_view::npos) << status;
      // The message handled, its actors by their fields (the packed ids
      // read as 68719476736).
      EXPECT_NE(status.message().find("threw while handling ready(desc "), std::string_view::npos) << status;
      EXPECT_NE(status.message().find(" -> node 0 cpu:"), std::string_view::npos) << status;
    }
  }
}

// Parameter "w" (f32 (4), callback "init") -> grad = w * x (source "x",
// quota 2) -> sgd_update with momentum 0.9 (lr: the init callback's state
// tensor 2); sink "watch" reads each iteration's w.
proto::Plan SgdPlan(int64_t iterations) {
  const TensorMeta vec{DType::kF32, Shape{4}};
  PlanBuilder b(iterations);
  uint64_t param = b.AddTask(ACTOR_KIND_PARAMETER, "w", 0);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "x", 1);
  uint64_t grad = b.AddTask(ACTOR_KIND_COMPUTE, "grad", 2);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "watch", 1);
  int64_t w = b.AddRegisterDesc(param, {grad, sink}, 1, {vec});
  int64_t x = b.AddRegisterDesc(src, {grad}, 2, {vec});
  int64_t g = b.AddRegisterDesc(grad, {param}, 1, {vec});
  testing::SetCompute(b, grad, "mul", {{w, 0}, {x, 0}}, g);
  testing::SetSgdUpdate(b, param, w, g, vec, /*momentum=*/0.9);
  b.task(param).set_callback("init");
  b.task(src).set_callback("x");
  b.task(sink).set_callback("watch");
  return b.Build();
}

// w <- sgd_update(w, grad = w * x_i, momentum 0.9, lr 0.1); the sink records
// the w each iteration reads.
TEST(RuntimeTest, ParameterActorDoesSgdLikeTheHandComputation) {
  constexpr int64_t kIterations = 6;
  RuntimeOptions options;
  options.callbacks.initializers["init"] = [](const std::vector<Tensor>& t) {
    for (int k = 0; k < 4; ++k) t[0].data<float>()[k] = static_cast<float>(k + 1);
    t[2].data<float>()[0] = 0.1f;
    return absl::OkStatus();
  };
  options.callbacks.sources["x"] = [](int64_t i, const std::vector<Tensor>& t) {
    for (int k = 0; k < 4; ++k) t[0].data<float>()[k] = 0.5f + 0.25f * static_cast<float>(i) - 0.1f * static_cast<float>(k);
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> seen;
  options.callbacks.sinks["watch"] = [&seen](int64_t, const std::vector<Tensor>& t) {
    seen.push_back(t[0].ToVector<float>());
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunWithDeadline(SgdPlan(kIterations), std::move(options)).ok());

  std::vector<double> wv = {1, 2, 3, 4}, buf(4, 0.0);
  ASSERT_EQ(seen.size(), static_cast<size_t>(kIterations));
  for (int64_t i = 0; i < kIterations; ++i) {
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_NEAR(seen[static_cast<size_t>(i)][k], wv[k], 1e-5) << "iteration " << i << " element " << k;
      const double xi = 0.5f + 0.25f * static_cast<float>(i) - 0.1f * static_cast<float>(k);
      const double gk = wv[k] * xi;
      buf[k] = 0.9 * buf[k] + gk;
      wv[k] -= 0.1 * buf[k];
    }
  }
}

// The iteration gate (Ctrl-C's early stop): closed from the sink at its
// fifth iteration of 100, the run ends at an iteration boundary, every actor
// agreeing: the sink saw `limit` iterations, and the parameter's finalizer
// got exactly what a plan of `limit` iterations gives.
TEST(RuntimeTest, ClosedGateEndsTheRunLikeAShorterPlan) {
  const auto run = [&](int64_t iterations, IterationGate* gate, std::vector<float>* trained) -> int64_t {
    RuntimeOptions options;
    options.gate = gate;
    options.callbacks.initializers["init"] = [](const std::vector<Tensor>& t) {
      for (int k = 0; k < 4; ++k) t[0].data<float>()[k] = static_cast<float>(k + 1);
      t[2].data<float>()[0] = 0.01f;
      return absl::OkStatus();
    };
    options.callbacks.finalizers["init"] = [trained](const std::vector<Tensor>& t) {
      *trained = t[0].ToVector<float>();
      return absl::OkStatus();
    };
    options.callbacks.sources["x"] = [](int64_t i, const std::vector<Tensor>& t) {
      for (int k = 0; k < 4; ++k) t[0].data<float>()[k] = 0.5f + 0.01f * static_cast<float>(i + k);
      return absl::OkStatus();
    };
    int64_t seen = 0;
    options.callbacks.sinks["watch"] = [&seen, gate](int64_t iteration, const std::vector<Tensor>&) {
      EXPECT_EQ(iteration, seen);
      if (++seen == 5 && gate != nullptr) gate->Close();
      return absl::OkStatus();
    };
    const absl::Status status = RunWithDeadline(SgdPlan(iterations), std::move(options));
    EXPECT_TRUE(status.ok()) << status;
    return seen;
  };
  IterationGate gate;
  std::vector<float> stopped, shorter;
  const int64_t seen = run(100, &gate, &stopped);
  ASSERT_TRUE(gate.limit().has_value());
  const int64_t limit = *gate.limit();
  EXPECT_GE(limit, 5);
  EXPECT_LE(limit, 8);  // the source runs at most its quota (2) and a piece ahead
  EXPECT_EQ(seen, limit);
  ASSERT_EQ(run(limit, nullptr, &shorter), limit);
  EXPECT_EQ(stopped, shorter);
  // Closed before anything ran: no iteration, the initial values finalized.
  IterationGate closed;
  EXPECT_EQ(closed.Close(), 0);
  EXPECT_EQ(run(100, &closed, &stopped), 0);
  EXPECT_EQ(stopped, (std::vector<float>{1, 2, 3, 4}));

  // Paused (as a node does while the nodes agree where to stop), the actors
  // wait before any new iteration; a limit set later, past what the gate
  // had admitted (as another node's answer may be), is run to exactly.
  IterationGate paused;
  std::thread agree;
  std::vector<float> agreed;
  int64_t admitted = -1;
  {
    RuntimeOptions options;
    options.gate = &paused;
    options.callbacks.initializers["init"] = [](const std::vector<Tensor>& t) {
      for (int k = 0; k < 4; ++k) t[0].data<float>()[k] = static_cast<float>(k + 1);
      t[2].data<float>()[0] = 0.01f;
      return absl::OkStatus();
    };
    options.callbacks.finalizers["init"] = [&agreed](const std::vector<Tensor>& t) {
      agreed = t[0].ToVector<float>();
      return absl::OkStatus();
    };
    options.callbacks.sources["x"] = [](int64_t i, const std::vector<Tensor>& t) {
      for (int k = 0; k < 4; ++k) t[0].data<float>()[k] = 0.5f + 0.01f * static_cast<float>(i + k);
      return absl::OkStatus();
    };
    int64_t seen = 0;
    options.callbacks.sinks["watch"] = [&](int64_t, const std::vector<Tensor>&) {
      if (++seen == 3) {
        admitted = paused.Pause();
        agree = std::thread([&paused, &admitted] {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          paused.SetLimit(admitted + 4);
        });
      }
      return absl::OkStatus();
    };
    const absl::Status status = RunWithDeadline(SgdPlan(100), std::move(options));
    EXPECT_TRUE(status.ok()) << status;
    agree.join();
    EXPECT_EQ(seen, admitted + 4);
  }
  ASSERT_EQ(run(admitted + 4, nullptr, &shorter), admitted + 4);
  EXPECT_EQ(agreed, shorter);
}

// batch (m*k, n) -> Repeat (m row pieces, views) -> square -> Acc (m) ->
// sink: equals the sum over pieces computed directly.
TEST(RuntimeTest, RepeatThenAccEqualsTheDirectSum) {
  constexpr int64_t kIterations = 3, kM = 4, kK = 2, kN = 3;
  const TensorMeta batch{DType::kF32, Shape{kM * kK, kN}};
  const TensorMeta piece{DType::kF32, Shape{kK, kN}};
  PlanBuilder b(kIterations);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "batch", 0);
  uint64_t rep = b.AddTask(ACTOR_KIND_REPEAT, "unpack", 0);
  uint64_t sq = b.AddTask(ACTOR_KIND_COMPUTE, "square", 1);
  uint64_t acc = b.AddTask(ACTOR_KIND_ACC, "acc", 2);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sum", 0);
  b.AddRegisterDesc(src, {rep}, 1, {batch});
  int64_t pieces = b.AddRegisterDesc(rep, {sq}, 2, {piece});
  int64_t squared = b.AddRegisterDesc(sq, {acc}, 2, {piece});
  b.AddRegisterDesc(acc, {sink}, 1, {piece});
  b.task(rep).set_repeat_num(kM);
  b.task(acc).set_repeat_num(kM);
  b.task(rep).set_pieces_per_iteration(kM);  // per micro-batch between repeat and acc
  b.task(sq).set_pieces_per_iteration(kM);
  b.task(sq).set_acts_per_step(kM);
  b.AddInput(sq, pieces);
  b.AddInput(sq, pieces);
  b.AddOutput(sq, squared);
  b.SetOp(sq, "mul");
  b.task(src).set_callback("batch");
  b.task(sink).set_callback("sum");
  auto value = [](int64_t i, int64_t row, int64_t col) {
    return static_cast<float>(i) + 0.5f * static_cast<float>(row) - 0.25f * static_cast<float>(col);
  };
  RuntimeOptions options;
  options.callbacks.sources["batch"] = [&](int64_t i, const std::vector<Tensor>& t) {
    for (int64_t r = 0; r < kM * kK; ++r) {
      for (int64_t c = 0; c < kN; ++c) t[0].data<float>()[r * kN + c] = value(i, r, c);
    }
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> sums;
  options.callbacks.sinks["sum"] = [&sums](int64_t, const std::vector<Tensor>& t) {
    sums.push_back(t[0].ToVector<float>());
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunWithDeadline(b.Build(), std::move(options)).ok());
  ASSERT_EQ(sums.size(), static_cast<size_t>(kIterations));
  for (int64_t i = 0; i < kIterations; ++i) {
    for (int64_t r = 0; r < kK; ++r) {
      for (int64_t c = 0; c < kN; ++c) {
        double direct = 0;
        for (int64_t p = 0; p < kM; ++p) direct += std::pow(value(i, p * kK + r, c), 2);
        EXPECT_NEAR(sums[static_cast<size_t>(i)][static_cast<size_t>(r * kN + c)], direct, 1e-4);
      }
    }
  }
}

// A parameter repeated m times (the same tensor, zero-copy) and accumulated.
TEST(RuntimeTest, RepeatOfTheWholeTensorAccumulatesToMTimesIt) {
  const TensorMeta vec{DType::kF32, Shape{3}};
  PlanBuilder b(2);
  uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "w", 0);
  uint64_t rep = b.AddTask(ACTOR_KIND_REPEAT, "repeat", 1);
  uint64_t acc = b.AddTask(ACTOR_KIND_ACC, "acc", 1);
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink", 0);
  b.AddRegisterDesc(src, {rep}, 1, {vec});
  b.AddRegisterDesc(rep, {acc}, 1, {vec});
  b.AddRegisterDesc(acc, {sink}, 1, {vec});
  b.task(rep).set_repeat_num(5);
  b.task(rep).set_pieces_per_iteration(5);
  b.task(acc).set_repeat_num(5);
  b.task(src).set_callback("w");
  b.task(sink).set_callback("sink");
  RuntimeOptions options;
  options.callbacks.sources["w"] = [](int64_t i, const std::vector<Tensor>& t) {
    for (int k = 0; k < 3; ++k) t[0].data<float>()[k] = static_cast<float>(k + 10 * i);
    return absl::OkStatus();
  };
  std::vector<std::vector<float>> got;
  options.callbacks.sinks["sink"] = [&got](int64_t, const std::vector<Tensor>& t) {
    got.push_back(t[0].ToVector<float>());
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunWithDeadline(b.Build(), std::move(options)).ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], (std::vector<float>{0, 5, 10}));
  EXPECT_EQ(got[1], (std::vector<float>{50, 55, 60}));
}

TEST(RuntimeTest, StalledPlanFailsWithTheWatchdogInsteadOfHanging) {
  // Two relays waiting on each other: valid structure, nothing can ever act.
  PlanBuilder b(3);
  uint64_t a = b.AddTask(ACTOR_KIND_COMPUTE, "a", 0);
  uint64_t c = b.AddTask(ACTOR_KIND_COMPUTE, "c", 1);
  b.AddRegisterDesc(a, {c}, 1, {});
  b.AddRegisterDesc(c, {a}, 1, {});
  RuntimeOptions options;
  options.stall_timeout_s = 0.3;
  absl::Status status = RunWithDeadline(b.Build(), std::move(options));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("actor 'a'"), std::string_view::npos) << status;
}

// Many relays over several threads, quotas 1 and 2 mixed: every piece
// arrives, in order, and every actor finishes.
TEST(RuntimeTest, LongRelayChainAcrossThreadsFinishes) {
  constexpr int64_t kIterations = 500;
  PlanBuilder b(kIterations);
  uint64_t prev = b.AddTask(ACTOR_KIND_SOURCE, "src", 0);
  for (int i = 0; i < 60; ++i) {
    uint64_t relay = b.AddTask(ACTOR_KIND_COMPUTE, "relay", static_cast<uint32_t>(i % 3));
    b.AddRegisterDesc(prev, {relay}, i % 2 + 1, {});
    prev = relay;
  }
  uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink", 1);
  b.AddRegisterDesc(prev, {sink}, 2, {});
  b.task(sink).set_callback("count");
  int64_t count = 0;
  RuntimeOptions options;
  options.callbacks.sinks["count"] = [&count](int64_t i, const std::vector<Tensor>&) {
    EXPECT_EQ(i, count);
    ++count;
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunWithDeadline(b.Build(), std::move(options)).ok());
  EXPECT_EQ(count, kIterations);
}

}  // namespace
}  // namespace tessera::actors
