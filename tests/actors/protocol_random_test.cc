// The register protocol under randomised delivery: the stepped executor
// delivers pending messages in a seeded random order — any order the
// threaded runtime could produce, where each (sender, receiver) channel stays
// FIFO and nothing else is ordered — and after every delivery a checker that
// mirrors the protocol from the messages alone asserts its invariants:
//   - a producer never has more registers of a desc in flight (ready sent,
//     not every consumer's ack delivered) than the desc's register_num, and
//     never hands out a register that a consumer still holds;
//   - each consumer acks the registers of a desc in the order they became
//     ready to it (FIFO), and only registers it was handed (acks match
//     readies);
//   - a Source reading window descs (RegisterDesc.window w) hands out
//     micro-batch k >= w of an iteration only after each window desc's
//     register for micro-batch k - w was delivered to it;
//   - at the end every actor is done, every register came home, every
//     consumer got one Eord, and the results equal those of the scripted
//     (oldest-first) run of the same plan.
// Plans: a chain, fan-out / fan-in, Repeat -> Acc, gradient accumulation
// into a parameter (also with a micro-batch window), and a training step whose arena shares bytes, each with
// quotas drawn from 1..3. The arenas are checked at every delivery
// (actors/arena.h): no register is taken while another sharing its bytes is
// in use, whatever the order.
//
// Each plan also runs with asynchronous acts (Task.async_acts on every
// compute, acc and updating parameter; its memory planned for them): the random order then also draws when each
// stream runs its next kernel or completion callback, acts pile up in
// flight, and the results must still be those of the synchronous plan.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "comm/proto/memory_plan.h"
#include "core/status.h"
#include "core/text.h"
#include "gtest/gtest.h"
#include "tests/actors/plan_helpers.h"

namespace tessera::actors {
namespace {

using proto::ACTOR_KIND_ACC;
using proto::ACTOR_KIND_COMPUTE;
using proto::ACTOR_KIND_PARAMETER;
using proto::ACTOR_KIND_REPEAT;
using proto::ACTOR_KIND_SINK;
using proto::ACTOR_KIND_SOURCE;
using testing::SetCompute;
using testing::SetSgdUpdate;

constexpr int kSeedsPerPlan = 25;

// Mirrors every register desc's protocol state from the messages sent and
// delivered; each method returns the first invariant broken, in words.
class ProtocolChecker {
 public:
  explicit ProtocolChecker(const proto::Plan& plan) {
    for (const auto& desc : plan.register_descs()) {
      Desc& d = descs_[desc.id()];
      d.producer = desc.producer();
      d.quota = desc.register_num();
      if (desc.window() > 0) window_of_[desc.id()] = desc.window();
      for (uint64_t consumer : desc.consumers()) d.channels[consumer];
      if (desc.window() > 0) {
        for (uint64_t consumer : desc.consumers()) windows_[consumer].push_back(desc.id());
      }
    }
    for (const auto& task : plan.tasks()) {
      if (windows_.contains(task.actor_id())) pieces_[task.actor_id()] = PiecesPerIteration(task);
    }
  }

  absl::Status Sent(const Message& m) {
    if (m.type == MessageType::kCommand) return absl::OkStatus();
    Desc* d = nullptr;
    Channel* c = nullptr;
    RETURN_IF_ERROR(Find(m, /*from_producer=*/m.type != MessageType::kRegisterAck, d, c));
    switch (m.type) {
      case MessageType::kRegisterReady: {
        if (c->eord_sent) return Broken(m, "a register after Eord");
        if (m.register_index < 0 || m.register_index >= d->quota) {
          return Broken(m, StrCat("index outside the quota ", d->quota));
        }
        if (!c->held.insert(m.register_index).second) return Broken(m, "a register the consumer still holds");
        ++c->readies;
        if (auto w = windows_.find(m.src); w != windows_.end() && c->readies > 0) {
          const int64_t k = c->readies - 1, per = pieces_.at(m.src);
          for (int64_t id : w->second) {
            const int64_t window = window_of_.contains(id) ? window_of_.at(id) : 0;
            const Channel& signal = descs_.at(id).channels.at(m.src);
            const int64_t needed = k % per < window ? k / per * (per - window)
                                                    : k / per * (per - window) + k % per - window + 1;
            if (signal.delivered < needed) {
              return Broken(m, StrCat("micro-batch ", k, " handed out after ", signal.delivered,
                                      " window registers of desc ", id, ", ", needed, " needed"));
            }
          }
        }
        const int64_t in_flight = InFlight(*d);
        if (in_flight > d->quota) return Broken(m, StrCat(in_flight, " registers in flight, quota ", d->quota));
        d->most_in_flight = std::max(d->most_in_flight, in_flight);
        return absl::OkStatus();
      }
      case MessageType::kRegisterAck:
        if (c->unacked.empty()) return Broken(m, "an ack of nothing the consumer was handed");
        if (c->unacked.front() != m.register_index) {
          return Broken(m, StrCat("out of FIFO order: register #", c->unacked.front(), " became ready first"));
        }
        c->unacked.pop_front();
        return absl::OkStatus();
      case MessageType::kEord:
        if (c->eord_sent) return Broken(m, "a second Eord");
        c->eord_sent = true;
        return absl::OkStatus();
      case MessageType::kCommand:
        break;
    }
    return absl::OkStatus();
  }

  absl::Status Delivered(const Message& m) {
    if (m.type == MessageType::kCommand) return absl::OkStatus();
    Desc* d = nullptr;
    Channel* c = nullptr;
    RETURN_IF_ERROR(Find(m, m.type != MessageType::kRegisterAck, d, c));
    switch (m.type) {
      case MessageType::kRegisterReady:
        c->unacked.push_back(m.register_index);
        ++c->delivered;
        break;
      case MessageType::kRegisterAck:
        // Free again, as far as the producer knows, only now.
        if (c->held.erase(m.register_index) == 0) return Broken(m, "an ack the producer did not wait for");
        ++c->acks;
        break;
      case MessageType::kEord:
        c->eord_delivered = true;
        break;
      case MessageType::kCommand:
        break;
    }
    return absl::OkStatus();
  }

  // After the last delivery.
  absl::Status Finished() const {
    for (const auto& [id, d] : descs_) {
      for (const auto& [consumer, c] : d.channels) {
        const std::string where = StrCat("desc ", id, " -> ", consumer, ": ");
        if (!c.held.empty() || !c.unacked.empty()) {
          return absl::InternalError(StrCat(where, "registers never came back"));
        }
        if (c.readies != c.acks) return absl::InternalError(StrCat(where, c.readies, " readies but ", c.acks, " acks"));
        if (!c.eord_delivered) return absl::InternalError(StrCat(where, "no Eord"));
      }
    }
    return absl::OkStatus();
  }

  // The most registers of desc `id` that were in flight at once.
  int64_t most_in_flight(int64_t id) const { return descs_.at(id).most_in_flight; }

 private:
  struct Channel {                // one (desc, consumer)
    std::set<int32_t> held;       // ready sent, ack not yet delivered to the producer
    std::deque<int32_t> unacked;  // delivered to the consumer, not yet acked, in delivery order
    int64_t readies = 0, acks = 0, delivered = 0;
    bool eord_sent = false, eord_delivered = false;
  };
  struct Desc {
    uint64_t producer = 0;
    int32_t quota = 0;
    std::map<uint64_t, Channel> channels;  // by consumer
    int64_t most_in_flight = 0;
  };

  static absl::Status Broken(const Message& m, const std::string& what) {
    return absl::InternalError(StrCat(m.ToString(), ": ", what));
  }
  static int64_t InFlight(const Desc& d) {
    std::set<int32_t> out;
    for (const auto& [consumer, c] : d.channels) out.insert(c.held.begin(), c.held.end());
    return static_cast<int64_t>(out.size());
  }
  absl::Status Find(const Message& m, bool from_producer, Desc*& d, Channel*& c) {
    auto it = descs_.find(m.register_desc_id);
    if (it == descs_.end()) return Broken(m, "no such desc");
    d = &it->second;
    const uint64_t producer = from_producer ? m.src : m.dst;
    const uint64_t consumer = from_producer ? m.dst : m.src;
    if (producer != d->producer) return Broken(m, "not the desc's producer");
    auto channel = d->channels.find(consumer);
    if (channel == d->channels.end()) return Broken(m, "not a consumer of the desc");
    c = &channel->second;
    return absl::OkStatus();
  }

  std::map<int64_t, Desc> descs_;
  std::map<uint64_t, std::vector<int64_t>> windows_;  // source -> the window descs it reads
  std::map<uint64_t, int64_t> pieces_;                // source -> micro-batches per iteration
  std::map<int64_t, int64_t> window_of_;              // window desc -> its window
};

// What a run computed: every sink call and every finalized parameter, by
// callback name, and each actor's act count.
struct Outcome {
  std::map<std::string, std::vector<std::vector<float>>> sinks;
  std::map<std::string, std::vector<std::vector<float>>> finals;
  std::map<uint64_t, int64_t> acts;
  bool operator==(const Outcome&) const = default;
};

// A plan and the host callbacks that record into an Outcome.
struct Case {
  proto::Plan plan;
  std::function<void(RuntimeOptions&, Outcome&)> bind;
};

// Source callback: tensor k of piece i holds i + 0.25 k + 0.5 j at element j.
absl::Status Ramp(int64_t piece, const std::vector<Tensor>& t) {
  for (size_t k = 0; k < t.size(); ++k) {
    for (int64_t j = 0; j < t[k].NumElements(); ++j) {
      t[k].data<float>()[j] = static_cast<float>(piece) + 0.25f * static_cast<float>(k) + 0.5f * static_cast<float>(j);
    }
  }
  return absl::OkStatus();
}

// Names each source's and sink's callback after its task; the binding fills
// the sources with Ramp and records every sink call in the Outcome.
std::function<void(RuntimeOptions&, Outcome&)> Ramps(const std::vector<uint64_t>& sources,
                                                     const std::vector<uint64_t>& sinks, PlanBuilder& b) {
  const auto name_callbacks = [&b](const std::vector<uint64_t>& tasks) {
    std::vector<std::string> names;
    for (uint64_t task : tasks) names.push_back(b.task(task).name());
    for (uint64_t task : tasks) b.task(task).set_callback(b.task(task).name());
    return names;
  };
  const std::vector<std::string> source_names = name_callbacks(sources), sink_names = name_callbacks(sinks);
  return [source_names, sink_names](RuntimeOptions& options, Outcome& out) {
    for (const std::string& name : source_names) options.callbacks.sources[name] = Ramp;
    for (const std::string& name : sink_names) {
      options.callbacks.sinks[name] = [&out, name](int64_t, const std::vector<Tensor>& t) {
        std::vector<float>& values = out.sinks[name].emplace_back();
        for (const Tensor& x : t) {
          const std::vector<float> v = x.ToVector<float>();
          values.insert(values.end(), v.begin(), v.end());
        }
        return absl::OkStatus();
      };
    }
  };
}

int32_t DrawQuota(std::mt19937& rng) { return static_cast<int32_t>(1 + rng() % 3); }

const TensorMeta kVec{DType::kF32, Shape{3}};

// src (x, y) -> add(x, y) -> mul(a, x) -> sink.
Case Chain(std::mt19937& rng) {
  PlanBuilder b(5);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  const uint64_t add = b.AddTask(ACTOR_KIND_COMPUTE, "add");
  const uint64_t mul = b.AddTask(ACTOR_KIND_COMPUTE, "mul");
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  const int64_t xy = b.AddRegisterDesc(src, {add, mul}, DrawQuota(rng), {kVec, kVec});
  const int64_t a = b.AddRegisterDesc(add, {mul}, DrawQuota(rng), {kVec});
  const int64_t out = b.AddRegisterDesc(mul, {sink}, DrawQuota(rng), {kVec});
  SetCompute(b, add, "add", {{xy, 0}, {xy, 1}}, a);
  SetCompute(b, mul, "mul", {{a, 0}, {xy, 0}}, out);
  auto bind = Ramps({src}, {sink}, b);  // names the callbacks: before Build
  return {b.Build(), bind};
}

// src -> {square, double, raw sink}; join = square + double -> sink.
Case FanOutFanIn(std::mt19937& rng) {
  PlanBuilder b(6);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  const uint64_t square = b.AddTask(ACTOR_KIND_COMPUTE, "square");
  const uint64_t twice = b.AddTask(ACTOR_KIND_COMPUTE, "twice");
  const uint64_t join = b.AddTask(ACTOR_KIND_COMPUTE, "join");
  const uint64_t raw = b.AddTask(ACTOR_KIND_SINK, "raw");
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  const int64_t x = b.AddRegisterDesc(src, {square, twice, raw}, DrawQuota(rng), {kVec});
  const int64_t sq = b.AddRegisterDesc(square, {join}, DrawQuota(rng), {kVec});
  const int64_t tw = b.AddRegisterDesc(twice, {join}, DrawQuota(rng), {kVec});
  const int64_t out = b.AddRegisterDesc(join, {sink}, DrawQuota(rng), {kVec});
  SetCompute(b, square, "mul", {{x, 0}, {x, 0}}, sq);
  SetCompute(b, twice, "add", {{x, 0}, {x, 0}}, tw);
  SetCompute(b, join, "add", {{sq, 0}, {tw, 0}}, out);
  auto bind = Ramps({src}, {raw, sink}, b);  // names the callbacks: before Build
  return {b.Build(), bind};
}

// batch (m*2, 3) -> Repeat (m row pieces) -> square -> Acc (m) -> sink.
Case RepeatAcc(std::mt19937& rng) {
  const int64_t m = 2 + static_cast<int64_t>(rng() % 2);
  const TensorMeta batch{DType::kF32, Shape{m * 2, 3}};
  const TensorMeta piece{DType::kF32, Shape{2, 3}};
  PlanBuilder b(3);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "batch");
  const uint64_t rep = b.AddTask(ACTOR_KIND_REPEAT, "unpack");
  const uint64_t sq = b.AddTask(ACTOR_KIND_COMPUTE, "square");
  const uint64_t acc = b.AddTask(ACTOR_KIND_ACC, "acc");
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sum");
  b.AddRegisterDesc(src, {rep}, DrawQuota(rng), {batch});
  const int64_t pieces = b.AddRegisterDesc(rep, {sq}, DrawQuota(rng), {piece});
  const int64_t squared = b.AddRegisterDesc(sq, {acc}, DrawQuota(rng), {piece});
  b.AddRegisterDesc(acc, {sink}, DrawQuota(rng), {piece});
  b.task(rep).set_repeat_num(static_cast<int32_t>(m));
  b.task(acc).set_repeat_num(static_cast<int32_t>(m));
  b.task(rep).set_pieces_per_iteration(static_cast<int32_t>(m));
  b.task(sq).set_pieces_per_iteration(static_cast<int32_t>(m));
  b.task(sq).set_acts_per_step(static_cast<int32_t>(m));
  SetCompute(b, sq, "mul", {{pieces, 0}, {pieces, 0}}, squared);
  auto bind = Ramps({src}, {sink}, b);  // names the callbacks: before Build
  return {b.Build(), bind};
}

// Gradient accumulation as the scheduler lowers it: the parameter w goes
// through Repeat (m whole-tensor views), grad = w * x per micro-batch, Acc
// sums the m gradients, sgd_update (momentum 0.9) applies them; a sink
// watches w every iteration, and the finalizer keeps the trained w. With
// `windowed`, also the micro-batch window the scheduler adds
// (RegisterDesc.window w in [1, m)): the Acc signals the source after each
// of micro-batches 0 .. m - w - 1, the source waits for it from micro-batch
// w on (the checker asserts the wait).
Case AccumulationOf(std::mt19937& rng, bool windowed) {
  const int32_t m = 2 + static_cast<int32_t>(rng() % (windowed ? 3 : 2));
  PlanBuilder b(4);
  const uint64_t param = b.AddTask(ACTOR_KIND_PARAMETER, "w");
  const uint64_t rep = b.AddTask(ACTOR_KIND_REPEAT, "repeat");
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "x");
  const uint64_t grad = b.AddTask(ACTOR_KIND_COMPUTE, "grad");
  const uint64_t acc = b.AddTask(ACTOR_KIND_ACC, "acc");
  const uint64_t watch = b.AddTask(ACTOR_KIND_SINK, "watch");
  const int64_t w = b.AddRegisterDesc(param, {rep, watch}, 1, {kVec});
  const int64_t views = b.AddRegisterDesc(rep, {grad}, DrawQuota(rng), {kVec});
  const int64_t x = b.AddRegisterDesc(src, {grad}, DrawQuota(rng), {kVec});
  const int64_t g = b.AddRegisterDesc(grad, {acc}, DrawQuota(rng), {kVec});
  const int64_t sum = b.AddRegisterDesc(acc, {param}, DrawQuota(rng), {kVec});
  if (windowed) b.AddWindowDesc(acc, {src}, 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(m - 1)));
  b.task(rep).set_repeat_num(m);
  b.task(rep).set_pieces_per_iteration(m);
  b.task(acc).set_repeat_num(m);
  for (uint64_t task : {src, grad}) b.task(task).set_pieces_per_iteration(m);
  b.task(grad).set_acts_per_step(m);
  SetCompute(b, grad, "mul", {{views, 0}, {x, 0}}, g);
  SetSgdUpdate(b, param, w, sum, kVec, /*momentum=*/0.9);
  b.task(param).set_callback("w");
  auto ramps = Ramps({src}, {watch}, b);  // names the callbacks: before Build
  return {b.Build(), [ramps](RuntimeOptions& options, Outcome& out) {
            ramps(options, out);
            options.callbacks.initializers["w"] = [](const std::vector<Tensor>& t) {
              for (int k = 0; k < 3; ++k) t[0].data<float>()[k] = static_cast<float>(k + 1);
              t[2].data<float>()[0] = 0.1f;
              return absl::OkStatus();
            };
            options.callbacks.finalizers["w"] = [&out](const std::vector<Tensor>& t) {
              out.finals["w"].push_back(t[0].ToVector<float>());
              return absl::OkStatus();
            };
          }};
}
Case Accumulation(std::mt19937& rng) { return AccumulationOf(rng, false); }
Case WindowedAccumulation(std::mt19937& rng) { return AccumulationOf(rng, true); }

// The checker itself catches each kind of break, so a clean random run means
// something.
TEST(ProtocolChecker, CatchesEachBrokenInvariant) {
  PlanBuilder b(3);
  const uint64_t src = b.AddTask(ACTOR_KIND_SOURCE, "src");
  const uint64_t sink = b.AddTask(ACTOR_KIND_SINK, "sink");
  const int64_t d = b.AddRegisterDesc(src, {sink}, 2, {kVec});
  const proto::Plan plan = b.Build();
  const auto expect_broken = [](const absl::Status& status, const std::string& what) {
    EXPECT_NE(status.message().find(what), std::string::npos) << status;
  };
  {  // a register handed out again before its ack came back
    ProtocolChecker c(plan);
    ASSERT_TRUE(c.Sent(Message::Ready(src, sink, d, 0)).ok());
    expect_broken(c.Sent(Message::Ready(src, sink, d, 0)), "still holds");
  }
  {  // more registers out than the quota
    ProtocolChecker c(plan);
    expect_broken(c.Sent(Message::Ready(src, sink, d, 2)), "outside the quota 2");
  }
  {  // acks out of FIFO order, and an ack of nothing
    ProtocolChecker c(plan);
    for (int32_t i : {0, 1}) {
      ASSERT_TRUE(c.Sent(Message::Ready(src, sink, d, i)).ok());
      ASSERT_TRUE(c.Delivered(Message::Ready(src, sink, d, i)).ok());
    }
    expect_broken(c.Sent(Message::Ack(sink, src, d, 1)), "out of FIFO order");
    ASSERT_TRUE(c.Sent(Message::Ack(sink, src, d, 0)).ok());
    ASSERT_TRUE(c.Sent(Message::Ack(sink, src, d, 1)).ok());
    expect_broken(c.Sent(Message::Ack(sink, src, d, 1)), "an ack of nothing");
    // Registers never acked back and no Eord.
    expect_broken(c.Finished(), "never came back");
  }
  {  // a register after Eord; a message from a task that is not the producer
    ProtocolChecker c(plan);
    ASSERT_TRUE(c.Sent(Message::Eord(src, sink, d)).ok());
    expect_broken(c.Sent(Message::Ready(src, sink, d, 0)), "after Eord");
    expect_broken(c.Sent(Message::Ready(sink, src, d, 0)), "not the desc's producer");
  }
  {  // a source handing out micro-batch 1 before micro-batch 0's window register came
    PlanBuilder wb(1);
    const uint64_t x = wb.AddTask(ACTOR_KIND_SOURCE, "x");
    const uint64_t acc = wb.AddTask(ACTOR_KIND_ACC, "acc");
    const uint64_t out = wb.AddTask(ACTOR_KIND_SINK, "sum");
    const int64_t pieces = wb.AddRegisterDesc(x, {acc}, 2, {kVec});
    wb.AddRegisterDesc(acc, {out}, 1, {kVec});
    const int64_t window = wb.AddWindowDesc(acc, {x}, 1);
    wb.task(x).set_pieces_per_iteration(2);
    wb.task(acc).set_repeat_num(2);
    ProtocolChecker c(wb.Build());
    ASSERT_TRUE(c.Sent(Message::Ready(x, acc, pieces, 0)).ok());
    ASSERT_TRUE(c.Sent(Message::Ready(acc, x, window, 0)).ok());
    expect_broken(c.Sent(Message::Ready(x, acc, pieces, 1)), "0 window registers of desc");
    ASSERT_TRUE(c.Delivered(Message::Ready(acc, x, window, 0)).ok());
    ProtocolChecker later(wb.Build());
    ASSERT_TRUE(later.Sent(Message::Ready(x, acc, pieces, 0)).ok());
    ASSERT_TRUE(later.Sent(Message::Ready(acc, x, window, 0)).ok());
    ASSERT_TRUE(later.Delivered(Message::Ready(acc, x, window, 0)).ok());
    EXPECT_TRUE(later.Sent(Message::Ready(x, acc, pieces, 1)).ok());
  }
}

struct Run {
  Outcome outcome;
  int64_t steps = 0;
  size_t most_stream_items = 0;  // the most kernels and callbacks one stream held at once
  std::map<int64_t, int64_t> most_in_flight;  // per desc
};

// Runs `c` on the stepped executor, oldest message first (rng null) or in
// the random order `rng` draws, checking the protocol after every delivery.
absl::StatusOr<Run> RunStepped(const Case& c, std::mt19937* rng) {
  Run run;
  RuntimeOptions options;
  run.most_stream_items = 0;
  options.check_arena = true;  // a register taken while another sharing its bytes is in use fails Deliver
  options.check_memory_plan = true;
  c.bind(options, run.outcome);
  ASSIGN_OR_RETURN(std::unique_ptr<SteppedExecutor> exec, SteppedExecutor::Load(c.plan, std::move(options)));
  ProtocolChecker checker(c.plan);
  exec->Start();
  for (const Message& m : exec->pending()) RETURN_IF_ERROR(checker.Sent(m));
  std::vector<size_t> heads;  // positions of the oldest message of each (src, dst) channel
  while (!exec->pending().empty() || !exec->StreamsWithWork().empty()) {
    if (++run.steps > 100'000) return absl::DeadlineExceededError("still busy after 100000 messages");
    const std::deque<Message>& pending = exec->pending();
    const std::vector<size_t> streams = exec->StreamsWithWork();
    for (size_t stream : streams) run.most_stream_items = std::max(run.most_stream_items, exec->StreamItems(stream));
    // Scripted: messages first, then the first stream's oldest item.
    // Random: any channel's oldest message or any stream's oldest item.
    size_t position = 0;
    std::optional<size_t> stream;
    if (rng != nullptr) {
      heads.clear();
      std::set<std::pair<uint64_t, uint64_t>> seen;
      for (size_t i = 0; i < pending.size(); ++i) {
        if (seen.insert({pending[i].src, pending[i].dst}).second) heads.push_back(i);
      }
      const size_t pick = (*rng)() % (heads.size() + streams.size());
      if (pick < heads.size()) {
        position = heads[pick];
      } else {
        stream = streams[pick - heads.size()];
      }
    } else if (pending.empty()) {
      stream = streams.front();
    }
    if (stream.has_value()) {
      // A kernel, or a completion callback queuing its actor's resume.
      const size_t before = pending.size();
      RETURN_IF_ERROR(exec->RunStream(*stream));
      for (size_t i = before; i < exec->pending().size(); ++i) RETURN_IF_ERROR(checker.Sent(exec->pending()[i]));
      continue;
    }
    const Message message = pending[position];
    const size_t before = pending.size() - 1;
    RETURN_IF_ERROR(exec->Deliver(position));
    const std::string at = StrCat("step ", run.steps, ", delivering ", message.ToString(), ": ");
    absl::Status status = checker.Delivered(message);
    for (size_t i = before; status.ok() && i < exec->pending().size(); ++i) status = checker.Sent(exec->pending()[i]);
    if (!status.ok()) return absl::InternalError(StrCat(at, status.message()));
  }
  if (!exec->AllDone()) return absl::InternalError("nothing pending but not every actor is done");
  RETURN_IF_ERROR(checker.Finished());
  for (const auto& task : c.plan.tasks()) run.outcome.acts[task.actor_id()] = exec->actor(task.actor_id()).act_count();
  for (const auto& desc : c.plan.register_descs()) run.most_in_flight[desc.id()] = checker.most_in_flight(desc.id());
  return run;
}

// testing::AddTrainingLoop with quotas drawn: a plan whose arena shares
// bytes (d1 and d3), so the random orders also test the memory plan (the
// stepped executor checks the arena at every delivery).
Case Loop(std::mt19937& rng) {
  PlanBuilder b(4);
  const testing::TrainingLoop t =
      testing::AddTrainingLoop(b, kVec, {DrawQuota(rng), DrawQuota(rng), DrawQuota(rng), DrawQuota(rng)});
  auto ramps = Ramps({t.src}, {t.watch}, b);  // names the callbacks: before Build
  return {b.Build(), [ramps](RuntimeOptions& options, Outcome& out) {
            ramps(options, out);
            options.callbacks.initializers["w"] = [](const std::vector<Tensor>& t) {
              for (int k = 0; k < 3; ++k) t[0].data<float>()[k] = 0.1f * static_cast<float>(k + 1);
              t[2].data<float>()[0] = 0.01f;
              return absl::OkStatus();
            };
            options.callbacks.finalizers["w"] = [&out](const std::vector<Tensor>& t) {
              out.finals["w"].push_back(t[0].ToVector<float>());
              return absl::OkStatus();
            };
          }};
}

// `c` with its tasks that run kernels (computes and parameters with an op,
// accs) acting asynchronously, the memory planned anew for that.
Case WithAsyncActs(Case c) {
  for (auto& task : *c.plan.mutable_tasks()) {
    const bool with_op = (task.kind() == ACTOR_KIND_COMPUTE || task.kind() == ACTOR_KIND_PARAMETER) && !task.op().empty();
    if (with_op || task.kind() == ACTOR_KIND_ACC) task.set_async_acts(true);
  }
  const auto planned = comm::PlanMemory(c.plan);
  EXPECT_TRUE(planned.ok()) << planned.status();
  return c;
}

// A plan family: each seed draws its quotas (and sizes) with `make`; with
// `async`, its compute tasks act asynchronously. `serial`: one act at a time
// whatever the order (the training loop's parameter has one register, its
// chain of computes is a line), so no order differs from the scripted one.
struct PlanKind {
  const char* name;
  Case (*make)(std::mt19937&);
  bool async = false;
  bool serial = false;
};
void PrintTo(const PlanKind& kind, std::ostream* out) { *out << kind.name; }

class RandomDelivery : public ::testing::TestWithParam<PlanKind> {};

TEST_P(RandomDelivery, KeepsQuotasAndFifoAndGivesTheScriptedResults) {
  // Runs whose registers ran ahead differently from the scripted run's; descs
  // of quota >= 2 that had every register in flight at once.
  int64_t reordered = 0, filled = 0;
  size_t most_stream_items = 0;
  for (uint32_t seed = 1; seed <= kSeedsPerPlan; ++seed) {
    SCOPED_TRACE(StrCat("seed ", seed));
    std::mt19937 rng(seed);
    Case c = GetParam().make(rng);
    if (GetParam().async) {
      // The synchronous plan's results are the ones to give.
      auto synchronous = RunStepped(c, nullptr);
      ASSERT_TRUE(synchronous.ok()) << synchronous.status();
      c = WithAsyncActs(std::move(c));
      auto scripted = RunStepped(c, nullptr);
      ASSERT_TRUE(scripted.ok()) << scripted.status();
      EXPECT_EQ(scripted->outcome, synchronous->outcome);
      most_stream_items = std::max(most_stream_items, scripted->most_stream_items);
    }
    auto scripted = RunStepped(c, nullptr);
    ASSERT_TRUE(scripted.ok()) << scripted.status();
    ASSERT_FALSE(scripted->outcome.sinks.empty());
    auto shuffled = RunStepped(c, &rng);
    ASSERT_TRUE(shuffled.ok()) << shuffled.status();
    EXPECT_EQ(shuffled->outcome, scripted->outcome);
    most_stream_items = std::max(most_stream_items, shuffled->most_stream_items);
    reordered += shuffled->most_in_flight != scripted->most_in_flight ? 1 : 0;
    for (const auto& desc : c.plan.register_descs()) {
      filled += desc.register_num() >= 2 && shuffled->most_in_flight[desc.id()] == desc.register_num() ? 1 : 0;
    }
  }
  // The random orders reach interleavings the scripted one does not, and
  // quotas above 1 get used in full: the invariants were checked where they
  // can break.
  if (!GetParam().serial) {
    EXPECT_GT(reordered, 0);
  }
  EXPECT_GT(filled, 0);
  // Asynchronous: a stream held more than one act (a kernel and its
  // callback each) at some point, so acts were in flight together.
  if (GetParam().async && !GetParam().serial) {
    EXPECT_GT(most_stream_items, size_t{2});
  }
  std::printf("%lld of %d random runs changed how far registers ran ahead; %lld quota >= 2 filled\n",
              static_cast<long long>(reordered), kSeedsPerPlan, static_cast<long long>(filled));
}

INSTANTIATE_TEST_SUITE_P(Plans, RandomDelivery,
                         ::testing::Values(PlanKind{"Chain", &Chain}, PlanKind{"FanOutFanIn", &FanOutFanIn},
                                           PlanKind{"RepeatAcc", &RepeatAcc}, PlanKind{"Accumulation", &Accumulation},
                                           PlanKind{"WindowedAccumulation", &WindowedAccumulation},
                                           PlanKind{"TrainingLoop", &Loop}, PlanKind{"AsyncChain", &Chain, true},
                                           PlanKind{"AsyncFanOutFanIn", &FanOutFanIn, true},
                                           PlanKind{"AsyncRepeatAcc", &RepeatAcc, true},
                                           PlanKind{"AsyncAccumulation", &Accumulation, true},
                                           PlanKind{"AsyncWindowedAccumulation", &WindowedAccumulation, true},
                                           PlanKind{"AsyncTrainingLoop", &Loop, true, true}),
                         [](const ::testing::TestParamInfo<PlanKind>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tessera::actors
