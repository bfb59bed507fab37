// The static coordinator: the 1F1B launch slots and the global clock, the
// per-device launch sequence, the sequence of a pair's transfers on both
// sides, one lane per device (GPUs) over all its communicators, and runs in
// which two devices' collectives, or two transfers over one pair
// communicator, become ready in the wrong order.
#include "actors/launch_order.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
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

// The 1F1B sequence of one stage as (backward, micro-batch) in slot order.
std::vector<std::pair<bool, int64_t>> Sequence(int64_t stage, int64_t stages, int64_t m) {
  std::vector<std::pair<int64_t, std::pair<bool, int64_t>>> slots;
  for (int64_t k = 0; k < m; ++k) {
    for (bool backward : {false, true}) slots.push_back({OneFOneBSlot(stage, stages, m, backward, k), {backward, k}});
  }
  std::sort(slots.begin(), slots.end());
  std::vector<std::pair<bool, int64_t>> out;
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(slots[i].first, static_cast<int64_t>(i)) << "slots are a permutation of 0..2m-1";
    out.push_back(slots[i].second);
  }
  return out;
}

TEST(LaunchOrder, OneFOneBSlotsFollowTheTextbookSchedule) {
  // p = 4, m = 8, stage 1: two warm-up forwards, then F B alternating, then
  // the last backwards.
  const auto seq = Sequence(1, 4, 8);
  const std::vector<std::pair<bool, int64_t>> want = {
      {false, 0}, {false, 1}, {false, 2}, {true, 0}, {false, 3}, {true, 1}, {false, 4}, {true, 2},
      {false, 5}, {true, 3},  {false, 6}, {true, 4}, {false, 7}, {true, 5}, {true, 6},  {true, 7}};
  EXPECT_EQ(seq, want);
  // Every stage, for every m: forwards and backwards each in micro-batch
  // order, every backward after its forward, and at most p - s forwards in
  // flight (the quota the scheduler gives values kept for backward).
  for (int64_t stages : {1, 2, 4}) {
    for (int64_t m : {1, 2, 3, 8}) {
      for (int64_t s = 0; s < stages; ++s) {
        int64_t next_f = 0, next_b = 0, in_flight = 0, most = 0;
        for (const auto& [backward, k] : Sequence(s, stages, m)) {
          if (backward) {
            EXPECT_EQ(k, next_b++);
            EXPECT_LT(k, next_f);
            --in_flight;
          } else {
            EXPECT_EQ(k, next_f++);
            most = std::max(most, ++in_flight);
          }
        }
        EXPECT_EQ(most, std::min(stages - s, m)) << "stage " << s << " of " << stages << ", m " << m;
      }
    }
  }
}

// A COLLECTIVE task of an all-reduce over devices 0 and 1.
uint64_t AddAllReduce(comm::PlanBuilder& b, const std::string& name, uint32_t device, int64_t n, int64_t order,
                      bool backward = false, int32_t pieces = 1) {
  const uint64_t id = b.AddTask(proto::ACTOR_KIND_COLLECTIVE, name, 1, device);
  proto::BoxingDesc* box = b.task(id).mutable_boxing();
  box->mutable_logical()->set_dtype(proto::DTYPE_F32);
  box->mutable_logical()->add_shape(n);
  box->set_from("P");
  box->set_to("B");
  box->add_hierarchy(2);
  box->add_ranks(0);
  box->add_ranks(1);
  box->set_rank_index(static_cast<int32_t>(device));
  box->set_group("coll");
  box->set_order(order);
  box->mutable_launch()->set_backward(backward);
  box->mutable_launch()->set_num_stages(1);
  if (pieces > 1) {
    b.task(id).set_pieces_per_iteration(pieces);
    b.task(id).set_acts_per_step(pieces);
  }
  return id;
}

TEST(LaunchOrder, CoordinatorAdmitsEachDevicesHeadOneAtATime) {
  comm::PlanBuilder b(2);
  // On device 0: a backward and a forward collective per micro-batch (m = 2,
  // one stage: F0 B0 F1 B1), and one per iteration after accumulation.
  const uint64_t fwd = AddAllReduce(b, "fwd", 0, 4, /*order=*/5, false, 2);
  const uint64_t bwd = AddAllReduce(b, "bwd", 0, 4, /*order=*/1, true, 2);
  const uint64_t post = AddAllReduce(b, "post", 0, 4, /*order=*/0);
  b.task(post).mutable_boxing()->mutable_launch()->set_epoch(1);
  const proto::Plan plan = b.plan();
  auto coordinator = CollectiveCoordinator::Build(plan);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  CollectiveCoordinator& c = **coordinator;
  for (uint64_t id : {fwd, bwd, post}) ASSERT_TRUE(c.Use(id, {"coll/0,1"}).ok());
  const std::vector<std::pair<uint64_t, int64_t>> want = {{fwd, 0}, {bwd, 0}, {fwd, 1}, {bwd, 1}, {post, 0},
                                                          {fwd, 2}, {bwd, 2}, {fwd, 3}, {bwd, 3}, {post, 1}};
  std::map<uint64_t, int64_t> acts;
  for (size_t i = 0; i < want.size(); ++i) {
    // Nobody else may go first, not even the head's own later act.
    for (uint64_t other : {fwd, bwd, post}) {
      if (other != want[i].first) {
        EXPECT_FALSE(c.TryLaunch(other, acts[other])) << i;
      }
    }
    EXPECT_FALSE(c.TryLaunch(want[i].first, want[i].second + 1)) << i;
    ASSERT_TRUE(c.TryLaunch(want[i].first, want[i].second)) << "step " << i << ": " << c.Describe();
    // One at a time: until it has issued, even the next head waits.
    if (i + 1 < want.size()) {
      EXPECT_FALSE(c.TryLaunch(want[i + 1].first, want[i + 1].second)) << i;
    }
    ++acts[want[i].first];
    const std::vector<uint64_t> wake = c.Issued(want[i].first);
    if (i + 1 < want.size() && want[i + 1].first != want[i].first) {
      EXPECT_EQ(wake, std::vector<uint64_t>{want[i + 1].first}) << i;
    } else {
      EXPECT_TRUE(wake.empty()) << i;
    }
  }
}

TEST(LaunchOrder, LanesAreIndependentAndLocalConversionsNeverWait) {
  comm::PlanBuilder b(1);
  const uint64_t tp = AddAllReduce(b, "tp", 0, 4, /*order=*/0);      // on communicator "t"
  const uint64_t dp = AddAllReduce(b, "dp", 0, 4, /*order=*/1);      // on communicator "d"
  const uint64_t both = AddAllReduce(b, "both", 0, 4, /*order=*/2);  // 2 steps: "t", then "d#1"
  const uint64_t also = AddAllReduce(b, "also", 0, 4, /*order=*/3);  // 2 steps: "t", then "d#1"
  const uint64_t local = AddAllReduce(b, "local", 0, 4, /*order=*/4);  // B -> S: no communicator
  const proto::Plan plan = b.plan();
  auto coordinator = CollectiveCoordinator::Build(plan);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  CollectiveCoordinator& c = **coordinator;
  ASSERT_TRUE(c.Use(tp, {"t"}).ok());
  ASSERT_TRUE(c.Use(dp, {"d"}).ok());
  ASSERT_TRUE(c.Use(both, {"t", "d#1"}).ok());
  ASSERT_TRUE(c.Use(also, {"t", "d#1"}).ok());
  EXPECT_FALSE(c.Use(dp, {"d"}).ok());  // once only
  EXPECT_TRUE(c.TryLaunch(local, 0));   // ahead of everything: it issues nothing
  EXPECT_TRUE(c.TryLaunch(dp, 0));      // its lane does not wait for tp's
  EXPECT_TRUE(c.Issued(dp).empty());
  EXPECT_FALSE(c.TryLaunch(both, 0));   // behind tp on "t"
  EXPECT_TRUE(c.TryLaunch(tp, 0));
  EXPECT_EQ(c.Issued(tp), std::vector<uint64_t>{both});
  EXPECT_TRUE(c.TryLaunch(both, 0));
  EXPECT_EQ(c.Issued(both, 0), std::vector<uint64_t>{also});
  // While both's second step waits (for its first step's peers), "t" is
  // free: also's first step goes, but its second waits for both's.
  EXPECT_TRUE(c.TryLaunch(also, 0));
  EXPECT_TRUE(c.Issued(also, 0).empty());
  EXPECT_FALSE(c.TryLaunch(also, 0, 1));
  EXPECT_NE(c.Describe().find("cpu:0 d#1: 'both' act 0 step 1 next"), std::string::npos) << c.Describe();
  EXPECT_TRUE(c.TryLaunch(both, 0, 1));
  EXPECT_EQ(c.Issued(both, 1), std::vector<uint64_t>{also});
  EXPECT_TRUE(c.TryLaunch(also, 0, 1));
  EXPECT_TRUE(c.Issued(also, 1).empty());
  EXPECT_TRUE(c.Describe().empty()) << c.Describe();
}

TEST(LaunchOrder, BadLaunchOrderIsRefused) {
  comm::PlanBuilder b(1);
  const uint64_t id = AddAllReduce(b, "x", 0, 4, 0);
  b.task(id).mutable_boxing()->mutable_launch()->set_stage(3);
  auto coordinator = CollectiveCoordinator::Build(b.plan());
  ASSERT_FALSE(coordinator.ok());
  EXPECT_NE(coordinator.status().message().find("task 'x'"), std::string::npos) << coordinator.status();
}

// Devices 0 and 1 all-reduce a (3 floats) then b (5 floats) every iteration
// over one shared communicator. Each source runs on its own thread; on
// device 0 `a` is late, on device 1 `b` is: the late source fills its piece
// only once the other source of its device has filled (and so handed on)
// the same piece, and 20 ms after that. So device 0 has b ready first and
// device 1 has a, every iteration (recorded, and asserted below). Launched
// as they become ready, the first op of the shared group would pair device
// 0's b with device 1's a (a mismatch); the coordinator launches a then b on
// both.
TEST(LaunchOrder, CollectivesReadyInOppositeOrdersShareOneCommunicator) {
  constexpr int64_t kIterations = 4;
  comm::PlanBuilder b(kIterations);
  RuntimeOptions options;
  options.stall_timeout_s = 20;
  std::mutex mu;
  std::condition_variable filled_cv;
  std::map<std::string, std::vector<std::vector<float>>> got;  // sink -> per iteration [a..., b...]
  std::map<std::string, std::vector<int64_t>> ready_at;  // source -> when each piece was filled (a count of fills)
  int64_t fills = 0;
  for (uint32_t device = 0; device < 2; ++device) {
    std::vector<uint64_t> collectives;
    for (const auto& [name, n, order] : {std::tuple<std::string, int64_t, int64_t>{"a", 3, 0}, {"b", 5, 1}}) {
      const std::string callback = name + std::to_string(device);
      const uint64_t src = b.AddTask(proto::ACTOR_KIND_SOURCE, "src:" + callback, name == "a" ? 2 : 3, device);
      b.task(src).set_callback(callback);
      const bool late = (device == 0) == (name == "a");
      std::string early(1, name == "a" ? 'b' : 'a');  // the other source of the device
      early += std::to_string(device);
      options.callbacks.sources[callback] = [&, late, device, callback, early, n = n](int64_t piece,
                                                                                      const std::vector<Tensor>& out) {
        if (late) {
          std::unique_lock<std::mutex> lock(mu);
          // Bounded: the early source's piece needs nothing from this one.
          filled_cv.wait_for(lock, std::chrono::seconds(10),
                             [&] { return static_cast<int64_t>(ready_at[early].size()) > piece; });
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        float* p = out[0].data<float>();
        for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(100 * piece + 10 * i + device + 1);
        // The source hands the register on right after this returns.
        std::lock_guard<std::mutex> lock(mu);
        ready_at[callback].push_back(fills++);
        filled_cv.notify_all();
        return absl::OkStatus();
      };
      const uint64_t coll = AddAllReduce(b, "allreduce:" + callback, device, n, order);
      b.AddRegisterDesc(src, {coll}, 1, {TensorMeta{DType::kF32, Shape{n}}});
      collectives.push_back(coll);
    }
    const std::string sink_name = "sink" + std::to_string(device);
    const uint64_t sink = b.AddTask(proto::ACTOR_KIND_SINK, sink_name, 0, device);
    b.task(sink).set_callback(sink_name);
    b.AddRegisterDesc(collectives[0], {sink}, 1, {TensorMeta{DType::kF32, Shape{3}}});
    b.AddRegisterDesc(collectives[1], {sink}, 1, {TensorMeta{DType::kF32, Shape{5}}});
    options.callbacks.sinks[sink_name] = [&mu, &got, sink_name](int64_t, const std::vector<Tensor>& in) {
      std::vector<float> values;
      for (const Tensor& t : in) values.insert(values.end(), t.data<float>(), t.data<float>() + t.NumElements());
      std::lock_guard<std::mutex> lock(mu);
      got[sink_name].push_back(values);
      return absl::OkStatus();
    };
  }
  auto runtime = Runtime::Load(b.Build(), options);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  absl::Status status;
  {
    ::tessera::testing::Deadline deadline(std::chrono::seconds(30), "Runtime::Run of the opposite-order plan");
    status = (*runtime)->Run();
  }
  ASSERT_TRUE(status.ok()) << status;
  // The readiness really was opposite: in every iteration, b before a on
  // device 0 and a before b on device 1.
  for (const std::string source : {"a0", "b0", "a1", "b1"}) {
    ASSERT_EQ(ready_at[source].size(), static_cast<size_t>(kIterations)) << source;
  }
  for (size_t it = 0; it < static_cast<size_t>(kIterations); ++it) {
    EXPECT_LT(ready_at["b0"][it], ready_at["a0"][it]) << "iteration " << it;
    EXPECT_LT(ready_at["a1"][it], ready_at["b1"][it]) << "iteration " << it;
  }
  for (const std::string sink : {"sink0", "sink1"}) {
    ASSERT_EQ(got[sink].size(), static_cast<size_t>(kIterations)) << sink;
    for (int64_t it = 0; it < kIterations; ++it) {
      std::vector<float> want;
      for (int64_t n : {3, 5}) {
        for (int64_t i = 0; i < n; ++i) want.push_back(static_cast<float>(2 * (100 * it + 10 * i) + 1 + 2));
      }
      EXPECT_EQ(got[sink][static_cast<size_t>(it)], want) << sink << " iteration " << it;
    }
  }
}


// One value crossing from device `from` (stage from_stage) to device `to`
// (stage to_stage) of num_stages: a SEND on `from` and a RECV on `to`, over
// the pair's communicator "p2p/<from>-><to>".
struct TransferSpec {
  std::string name;
  int64_t order = 0;
  bool backward = false;
  int32_t epoch = 0;
  int32_t pieces = 1;  // per iteration: > 1 for per-micro-batch values
};
struct TransferPair {
  uint64_t send = 0;
  uint64_t recv = 0;
};
TransferPair AddTransfer(comm::PlanBuilder& b, const TransferSpec& spec, uint32_t from, uint32_t to, int32_t from_stage,
                         int32_t to_stage, int32_t num_stages, uint32_t stream = 1) {
  TransferPair pair;
  pair.send = b.AddTask(proto::ACTOR_KIND_SEND, "send:" + spec.name, stream, from);
  pair.recv = b.AddTask(proto::ACTOR_KIND_RECV, "recv:" + spec.name, stream, to);
  for (uint64_t id : {pair.send, pair.recv}) {
    const bool send = id == pair.send;
    proto::TransferDesc* t = b.task(id).mutable_transfer();
    t->set_peer(send ? to : from);
    t->set_group(StrCat("p2p/", from, "->", to));
    t->set_order(spec.order);
    t->mutable_launch()->set_epoch(spec.epoch);
    t->mutable_launch()->set_backward(spec.backward);
    t->mutable_launch()->set_stage(send ? from_stage : to_stage);
    t->mutable_launch()->set_num_stages(num_stages);
    t->set_peer_stage(send ? to_stage : from_stage);
    if (spec.pieces > 1) {
      b.task(id).set_pieces_per_iteration(spec.pieces);
      b.task(id).set_acts_per_step(spec.pieces);
    }
  }
  return pair;
}

// What one device's lane issues when every task is always ready: "<name>
// <act>" in admission order.
std::vector<std::string> LaneSequence(CollectiveCoordinator& c,
                                      const std::vector<std::pair<uint64_t, std::string>>& tasks) {
  std::map<uint64_t, int64_t> next;
  std::vector<std::string> out;
  for (bool admitted = true; admitted;) {
    admitted = false;
    for (const auto& [id, name] : tasks) {
      if (!c.TryLaunch(id, next[id])) continue;
      out.push_back(StrCat(name, " ", next[id]++));
      c.Issued(id);
      admitted = true;
      break;
    }
  }
  return out;
}

// Stage 1 -> 2 of 4 (different warm-ups, so different slots on the two
// sides), m = 4, two iterations: forward activations x and y, a weight w
// read by the later stage (once per iteration), and back 2 -> 1 the
// gradients g and h and w's accumulated gradient (epoch 1). Both sides of
// each pair issue one sequence: iteration-rate values first in their epoch,
// then per micro-batch in the global order.
TEST(LaunchOrder, BothSidesOfAPairIssueItsTransfersInOneSequence) {
  constexpr int32_t kPieces = 4;
  comm::PlanBuilder b(2);
  std::vector<std::pair<uint64_t, std::string>> sends_forward, recvs_forward, sends_backward, recvs_backward;
  for (const TransferSpec& spec : {TransferSpec{"y", 9, false, 0, kPieces}, TransferSpec{"x", 4, false, 0, kPieces},
                                   TransferSpec{"w", 12, false, 0, 1}}) {
    const TransferPair pair = AddTransfer(b, spec, 1, 2, 1, 2, 4);
    sends_forward.push_back({pair.send, spec.name});
    recvs_forward.push_back({pair.recv, spec.name});
  }
  for (const TransferSpec& spec : {TransferSpec{"wg", 3, true, 1, 1}, TransferSpec{"g", 20, true, 0, kPieces},
                                   TransferSpec{"h", 15, true, 0, kPieces}}) {
    const TransferPair pair = AddTransfer(b, spec, 2, 1, 2, 1, 4);
    sends_backward.push_back({pair.send, spec.name});
    recvs_backward.push_back({pair.recv, spec.name});
  }
  const proto::Plan plan = b.plan();
  auto coordinator = CollectiveCoordinator::Build(plan);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  CollectiveCoordinator& c = **coordinator;
  for (const auto* lane : {&sends_forward, &recvs_forward, &sends_backward, &recvs_backward}) {
    for (const auto& [id, name] : *lane) {
      const proto::Task& task = *std::find_if(plan.tasks().begin(), plan.tasks().end(),
                                              [id = id](const proto::Task& t) { return t.actor_id() == id; });
      ASSERT_TRUE(c.Use(id, {task.transfer().group()}).ok());
    }
  }
  std::vector<std::string> forward, backward;
  for (int64_t it = 0; it < 2; ++it) {
    forward.push_back(StrCat("w ", it));
    backward.push_back(StrCat("wg ", it));
    for (int64_t k = 0; k < kPieces; ++k) {
      forward.push_back(StrCat("x ", it * kPieces + k));
      forward.push_back(StrCat("y ", it * kPieces + k));
      backward.insert(backward.end() - 1, StrCat("h ", it * kPieces + k));
      backward.insert(backward.end() - 1, StrCat("g ", it * kPieces + k));
    }
  }
  EXPECT_EQ(LaneSequence(c, sends_forward), forward);
  EXPECT_EQ(LaneSequence(c, recvs_forward), forward);
  EXPECT_EQ(LaneSequence(c, sends_backward), backward);
  EXPECT_EQ(LaneSequence(c, recvs_backward), backward);
  EXPECT_TRUE(c.Describe().empty()) << c.Describe();
}

TEST(LaunchOrder, TransfersAgainstThePipelineAreRefused) {
  struct Case {
    TransferSpec spec;
    int32_t from_stage, to_stage;
    std::string error;  // "" = accepted
  };
  const std::vector<Case> cases = {
      {{"act", 0, false, 0, 2}, 0, 1, ""},
      {{"grad", 0, true, 0, 2}, 1, 0, ""},
      {{"act", 0, false, 0, 2}, 1, 0, "a forward value per micro-batch from stage 1 to stage 0"},
      {{"grad", 0, true, 0, 2}, 0, 1, "a backward value per micro-batch from stage 0 to stage 1"},
      {{"lr", 0, false, 0, 1}, 1, 0, ""},  // once per iteration: ordered before the micro-batches
  };
  for (const Case& c : cases) {
    comm::PlanBuilder b(1);
    AddTransfer(b, c.spec, 0, 1, c.from_stage, c.to_stage, 2);
    auto coordinator = CollectiveCoordinator::Build(b.plan());
    if (c.error.empty()) {
      EXPECT_TRUE(coordinator.ok()) << coordinator.status();
    } else {
      ASSERT_FALSE(coordinator.ok()) << c.error;
      EXPECT_NE(coordinator.status().message().find("task 'send:" + c.spec.name + "': " + c.error), std::string::npos)
          << coordinator.status();
    }
  }
  comm::PlanBuilder b(1);
  const TransferPair pair = AddTransfer(b, TransferSpec{"act", 0, false, 0, 2}, 0, 1, 0, 1, 2);
  b.task(pair.send).mutable_transfer()->set_peer_stage(2);
  auto coordinator = CollectiveCoordinator::Build(b.plan());
  ASSERT_FALSE(coordinator.ok());
  EXPECT_NE(coordinator.status().message().find("task 'send:act': peer stage 2 of 2"), std::string::npos)
      << coordinator.status();
}

TEST(LaunchOrder, TheClockRunsEachStageAsEarlyAsItsDataAllows) {
  // p = 2, m = 3, by hand. Stage 0: F0 F1 B0 F2 B1 B2; stage 1: F0 B0 F1 B1
  // F2 B2. Stage 1's F0 waits for stage 0's (step 2); stage 0's B0 for
  // stage 1's (step 4), and so on.
  const OneFOneBClock clock(2, 3);
  const std::vector<std::vector<int64_t>> forward = {{1, 2, 5}, {2, 4, 6}}, backward = {{4, 6, 8}, {3, 5, 7}};
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t k = 0; k < 3; ++k) {
      EXPECT_EQ(clock.Time(s, false, k), forward[static_cast<size_t>(s)][static_cast<size_t>(k)]) << s << " F" << k;
      EXPECT_EQ(clock.Time(s, true, k), backward[static_cast<size_t>(s)][static_cast<size_t>(k)]) << s << " B" << k;
    }
  }
  // What the no-deadlock argument of launch_order.h rests on, for every p
  // and m: each stage runs its 1F1B sequence in order, one step at a time;
  // a forward after the previous stage's, a backward after the next
  // stage's; a value sent on is read on the next stage no later than the
  // step in which the sender writes its next one (so one register
  // suffices); and a stage holds at most p - s micro-batches in flight.
  for (int64_t p = 1; p <= 8; ++p) {
    for (int64_t m = 1; m <= 16; ++m) {
      const OneFOneBClock c(p, m);
      for (int64_t s = 0; s < p; ++s) {
        const auto seq = Sequence(s, p, m);
        for (size_t i = 1; i < seq.size(); ++i) {
          ASSERT_LT(c.Time(s, seq[i - 1].first, seq[i - 1].second), c.Time(s, seq[i].first, seq[i].second))
              << "p " << p << " m " << m << " stage " << s << " slot " << i;
        }
        ASSERT_GE(c.Time(s, seq[0].first, seq[0].second), 1);
        for (int64_t k = 0; k < m; ++k) {
          if (s > 0) {
            ASSERT_GT(c.Time(s, false, k), c.Time(s - 1, false, k)) << p << " " << m << " " << s << " " << k;
          }
          if (s + 1 < p) {
            ASSERT_GT(c.Time(s, true, k), c.Time(s + 1, true, k)) << p << " " << m << " " << s << " " << k;
          }
          if (s + 1 < p && k + 1 < m) {
            ASSERT_LE(c.Time(s + 1, false, k), c.Time(s, false, k + 1)) << p << " " << m << " " << s << " " << k;
            ASSERT_LE(c.Time(s, true, k), c.Time(s + 1, true, k + 1)) << p << " " << m << " " << s << " " << k;
          }
        }
        for (int64_t k = 0; k < m; ++k) {
          int64_t in_flight = 0;
          for (int64_t j = 0; j < m; ++j) {
            in_flight += c.Time(s, false, j) <= c.Time(s, false, k) && c.Time(s, true, j) > c.Time(s, false, k) ? 1 : 0;
          }
          ASSERT_LE(in_flight, p - s) << "p " << p << " m " << m << " stage " << s << " F" << k;
        }
      }
    }
  }
}

// A COLLECTIVE task of a pipeline stage's collective (one per micro-batch
// when pieces > 1).
uint64_t AddStageCollective(comm::PlanBuilder& b, const std::string& name, uint32_t device, int64_t order,
                            bool backward, int32_t epoch, int32_t stage, int32_t stages, int32_t pieces) {
  const uint64_t id = b.AddTask(proto::ACTOR_KIND_COLLECTIVE, name, 1, device);
  proto::BoxingDesc* box = b.task(id).mutable_boxing();
  box->set_order(order);
  box->mutable_launch()->set_backward(backward);
  box->mutable_launch()->set_epoch(epoch);
  box->mutable_launch()->set_stage(stage);
  box->mutable_launch()->set_num_stages(stages);
  if (pieces > 1) {
    b.task(id).set_pieces_per_iteration(pieces);
    b.task(id).set_acts_per_step(pieces);
  }
  return id;
}

// Three stages of two tensor-parallel ranks each (devices 2s and 2s+1), m =
// 4, two iterations, with LaneScope::kDevice. Per micro-batch: a forward
// and a backward all-reduce in each stage; activations s -> s+1 and
// gradients s+1 -> s on each rank's pair; a tied weight 0 -> 2 and its
// gradient 2 -> 0. Per iteration: the learning rate 0 -> 1 and 1 -> 2, and a
// gradient all-reduce per stage after accumulation. Each device issues all
// of it in one lane, and a GPU may run one NCCL operation at a time in that
// order: then every operation must find all its members at it, with no
// device holding up another (the lanes drain one operation at a time).
// Each stage's own 1F1B slots instead of the global clock would deadlock
// here: stage 0 sends F2 before it receives B0, stage 1 sends B0 before it
// receives F2 (OneFOneBSlot).
TEST(LaunchOrder, OneLanePerDeviceGivesEveryGpuOneConsistentSequence) {
  constexpr int32_t kStages = 3, kPieces = 4;
  constexpr int64_t kIterations = 2;
  comm::PlanBuilder b(kIterations);
  // op name -> devices; device -> (task, op name, communicator).
  std::map<std::string, std::set<uint32_t>> members;
  std::map<uint32_t, std::vector<std::tuple<uint64_t, std::string, std::string>>> tasks;
  int64_t order = 0;
  auto collective = [&](const std::string& name, int32_t stage, bool backward, int32_t epoch, int32_t pieces) {
    const int64_t o = order++;
    for (uint32_t rank = 0; rank < 2; ++rank) {
      const auto device = static_cast<uint32_t>(2 * stage) + rank;
      const uint64_t id =
          AddStageCollective(b, StrCat(name, "@", device), device, o, backward, epoch, stage, kStages, pieces);
      tasks[device].push_back({id, name, StrCat(name[0] == 't' ? "tp/" : "dp/", stage)});
      members[name].insert(device);
    }
  };
  auto transfer = [&](const std::string& name, int32_t from, int32_t to, bool backward, int32_t pieces) {
    const int64_t o = order++;
    for (uint32_t rank = 0; rank < 2; ++rank) {
      const auto a = static_cast<uint32_t>(2 * from) + rank, z = static_cast<uint32_t>(2 * to) + rank;
      const TransferPair pair =
          AddTransfer(b, TransferSpec{StrCat(name, rank), o, backward, backward && pieces == 1 ? 1 : 0, pieces}, a, z,
                      from, to, kStages);
      const std::string op = StrCat(name, rank);
      tasks[a].push_back({pair.send, op, StrCat("p2p/", a, "->", z)});
      tasks[z].push_back({pair.recv, op, StrCat("p2p/", a, "->", z)});
      members[op] = {a, z};
    }
  };
  transfer("lr01.", 0, 1, false, 1);
  transfer("lr12.", 1, 2, false, 1);
  transfer("tied02.", 0, 2, false, kPieces);
  for (int32_t s = 0; s < kStages; ++s) {
    collective(StrCat("tp_fwd", s), s, false, 0, kPieces);
    if (s + 1 < kStages) transfer(StrCat("act", s, s + 1, "."), s, s + 1, false, kPieces);
  }
  transfer("tiedgrad20.", 2, 0, true, kPieces);
  for (int32_t s = kStages - 1; s >= 0; --s) {
    collective(StrCat("tp_bwd", s), s, true, 0, kPieces);
    if (s > 0) transfer(StrCat("grad", s, s - 1, "."), s, s - 1, true, kPieces);
  }
  for (int32_t s = 0; s < kStages; ++s) collective(StrCat("dp_grads", s), s, false, 1, 1);

  const proto::Plan plan = b.plan();
  auto coordinator = CollectiveCoordinator::Build(plan, LaneScope::kDevice);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  CollectiveCoordinator& c = **coordinator;
  for (const auto& [device, list] : tasks) {
    for (const auto& [id, op, communicator] : list) ASSERT_TRUE(c.Use(id, {communicator}).ok()) << op;
  }
  // Each device's sequence, "<op> <act>", with every task always ready.
  std::map<uint32_t, std::vector<std::string>> sequence;
  for (const auto& [device, list] : tasks) {
    std::vector<std::pair<uint64_t, std::string>> named;
    for (const auto& [id, op, communicator] : list) named.push_back({id, op});
    sequence[device] = LaneSequence(c, named);
  }
  EXPECT_TRUE(c.Describe().empty()) << c.Describe();
  // Run them one operation at a time per device: an operation goes once it
  // heads the sequence of every member.
  std::map<uint32_t, size_t> at;
  size_t done = 0, total = 0;
  for (const auto& [device, seq] : sequence) total += seq.size();
  for (bool moved = true; moved;) {
    moved = false;
    for (const auto& [device, seq] : sequence) {
      if (at[device] >= seq.size()) continue;
      const std::string& head = seq[at[device]];
      const std::string op = head.substr(0, head.find(' '));
      const bool all = std::all_of(members[op].begin(), members[op].end(), [&](uint32_t d) {
        return at[d] < sequence[d].size() && sequence[d][at[d]] == head;
      });
      if (!all) continue;
      for (uint32_t d : members[op]) ++at[d];
      done += members[op].size();
      moved = true;
    }
  }
  std::string stuck;
  for (const auto& [device, seq] : sequence) {
    if (at[device] < seq.size()) stuck += StrCat(" device ", device, " at '", seq[at[device]], "';");
  }
  EXPECT_EQ(done, total) << "stuck:" << stuck;
  // Every micro-batch of every operation ran: 2 iterations.
  EXPECT_EQ(sequence[2].size(),
            static_cast<size_t>(kIterations * (1 + 1 + 2 * kPieces + 4 * kPieces + 1)))  // lr in, lr out, tp, p2p, dp
      << Join(sequence[2], ", ");
}

TEST(LaunchOrder, OneLanePerDeviceRefusesTwoTasksOfOneConversion) {
  comm::PlanBuilder b(1);
  const uint64_t x = AddStageCollective(b, "x", 0, 7, false, 0, 0, 1, 1);
  const uint64_t y = AddStageCollective(b, "y", 0, 7, false, 0, 0, 1, 1);
  const proto::Plan plan = b.plan();
  auto coordinator = CollectiveCoordinator::Build(plan, LaneScope::kDevice);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE((*coordinator)->Use(x, {"a"}).ok());
  const absl::Status status = (*coordinator)->Use(y, {"b"});
  EXPECT_NE(status.message().find("tasks 'x' and 'y' of one conversion (order 7) share device cpu:0's launch lane"),
            std::string::npos)
      << status;
  // Per communicator they are apart.
  auto apart = CollectiveCoordinator::Build(plan);
  ASSERT_TRUE(apart.ok());
  EXPECT_TRUE((*apart)->Use(x, {"a"}).ok());
  EXPECT_TRUE((*apart)->Use(y, {"b"}).ok());
}

// A two-step collective on one device lane: its second step follows its
// first, before anything of a later key, and a step admitted while the
// lane issues is woken when it is free.
TEST(LaunchOrder, OneLanePerDeviceOrdersAStepAfterItsAct) {
  comm::PlanBuilder b(1);
  const uint64_t two = AddStageCollective(b, "two", 0, 1, false, 0, 0, 1, 1);
  const uint64_t later = AddStageCollective(b, "later", 0, 2, false, 0, 0, 1, 1);
  const proto::Plan plan = b.plan();
  auto coordinator = CollectiveCoordinator::Build(plan, LaneScope::kDevice);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  CollectiveCoordinator& c = **coordinator;
  ASSERT_TRUE(c.Use(two, {"t", "d#1"}).ok());
  ASSERT_TRUE(c.Use(later, {"t"}).ok());
  EXPECT_FALSE(c.TryLaunch(later, 0));
  EXPECT_FALSE(c.TryLaunch(two, 0, 1));
  ASSERT_TRUE(c.TryLaunch(two, 0));
  EXPECT_FALSE(c.TryLaunch(two, 0, 1));                     // the lane is issuing step 0
  EXPECT_EQ(c.Issued(two, 0), std::vector<uint64_t>{two});  // wake it: its step 1 heads the lane
  EXPECT_FALSE(c.TryLaunch(later, 0));
  EXPECT_NE(c.Describe().find("cpu:0: 'two' act 0 step 1 next"), std::string::npos) << c.Describe();
  ASSERT_TRUE(c.TryLaunch(two, 0, 1));
  EXPECT_EQ(c.Issued(two, 1), std::vector<uint64_t>{later});
  EXPECT_TRUE(c.TryLaunch(later, 0));
  EXPECT_TRUE(c.Issued(later).empty());
  EXPECT_TRUE(c.Describe().empty()) << c.Describe();
}

// Device 0 sends a (3 floats) then b (5 floats) to device 1 every iteration
// over their one pair communicator; a is late (filled only after b was,
// and 20 ms after that), so device 0 has b ready first, while device 1 posts
// its receive of a first. Launched as they become ready, the pair's first
// Send (b) meets the first Recv (a): a mismatch that fails the job. The
// coordinator issues a then b on both sides.
absl::Status RunLateTransfer(bool ordered, std::vector<std::vector<float>>* got) {
  constexpr int64_t kIterations = 3;
  comm::PlanBuilder b(kIterations);
  RuntimeOptions options;
  options.stall_timeout_s = 20;
  options.ordered_launches = ordered;
  std::mutex mu;
  std::condition_variable filled_cv;
  std::map<std::string, int64_t> filled;  // source -> pieces filled
  const uint64_t sink = b.AddTask(proto::ACTOR_KIND_SINK, "sink", 0, 1);
  b.task(sink).set_callback("sink");
  for (const auto& [name, n, order] : {std::tuple<std::string, int64_t, int64_t>{"a", 3, 0}, {"b", 5, 1}}) {
    const uint64_t src = b.AddTask(proto::ACTOR_KIND_SOURCE, "src:" + name, name == "a" ? 2 : 3, 0);
    b.task(src).set_callback(name);
    options.callbacks.sources[name] = [&, name = name, n = n](int64_t piece, const std::vector<Tensor>& out) {
      if (name == "a") {
        std::unique_lock<std::mutex> lock(mu);
        // Bounded: b's piece needs nothing from a.
        filled_cv.wait_for(lock, std::chrono::seconds(10), [&] { return filled["b"] > piece; });
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      float* p = out[0].data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(100 * piece + 10 * i + (name == "a" ? 1 : 2));
      std::lock_guard<std::mutex> lock(mu);
      ++filled[name];
      filled_cv.notify_all();
      return absl::OkStatus();
    };
    const TransferPair pair = AddTransfer(b, TransferSpec{name, order}, 0, 1, 0, 1, 2);
    b.AddRegisterDesc(src, {pair.send}, 1, {TensorMeta{DType::kF32, Shape{n}}});
    b.AddRegisterDesc(pair.recv, {sink}, 1, {TensorMeta{DType::kF32, Shape{n}}});
  }
  options.callbacks.sinks["sink"] = [&mu, got](int64_t, const std::vector<Tensor>& in) {
    std::vector<float> values;
    for (const Tensor& t : in) values.insert(values.end(), t.data<float>(), t.data<float>() + t.NumElements());
    std::lock_guard<std::mutex> lock(mu);
    got->push_back(values);
    return absl::OkStatus();
  };
  auto runtime = Runtime::Load(b.Build(), options);
  if (!runtime.ok()) return runtime.status();
  ::tessera::testing::Deadline deadline(std::chrono::seconds(30), "Runtime::Run of the late-transfer plan");
  return (*runtime)->Run();
}

TEST(LaunchOrder, TransfersReadyOutOfOrderShareOnePairCommunicator) {
  std::vector<std::vector<float>> got;
  const absl::Status status = RunLateTransfer(/*ordered=*/true, &got);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(got.size(), 3u);
  for (int64_t it = 0; it < 3; ++it) {
    std::vector<float> want;
    for (int64_t i = 0; i < 3; ++i) want.push_back(static_cast<float>(100 * it + 10 * i + 1));
    for (int64_t i = 0; i < 5; ++i) want.push_back(static_cast<float>(100 * it + 10 * i + 2));
    EXPECT_EQ(got[static_cast<size_t>(it)], want) << "iteration " << it;
  }
}

TEST(LaunchOrder, WithoutTheOrderTheLateTransferMismatches) {
  std::vector<std::vector<float>> got;
  const absl::Status status = RunLateTransfer(/*ordered=*/false, &got);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("mismatched Send/Recv #0"), std::string::npos) << status;
  EXPECT_TRUE(got.empty());
}

}  // namespace
}  // namespace tessera::actors
