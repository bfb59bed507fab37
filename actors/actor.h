#pragma once
// Actors (DESIGN §8): each owns its side of the register protocol and acts
// whenever every consumed desc has a ready register and every produced desc
// has a free one. An actor lives on one thread (or in the stepped executor)
// and is not thread-safe: only its thread calls Handle.
//
// Life cycle:  running --(ShouldEnd: inputs all Eord'ed and drained, or a
// source's last iteration)--> sends Eord on every produced desc --> zombie
// (waits for its registers to come back) --> done.
//
// Registers are owned by the RegisterTable (allocated up front by the
// runtime); actors borrow it. Tensors in a register are written only by its
// producer while no consumer holds it, which the protocol guarantees.
//
// The kinds (Source, Compute, Parameter, Repeat, Acc, Sink, Collective,
// Send / Recv) live in actors/kinds/, one file each, which opens with the
// kind's act condition and states.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/arena.h"
#include "actors/iteration_gate.h"
#include "actors/launch_order.h"
#include "actors/message.h"
#include "comm/collective/communicator.h"
#include "comm/proto/plan.pb.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "ops/registry.h"

namespace tessera::actors {

class OpProfile;

// Host functions named by tasks' `callback`. They run on actor threads, one
// call at a time per actor (different actors may call concurrently).
struct HostCallbacks {
  // Source: fills the tensors of the produced registers for `piece` =
  // iteration * pieces_per_iteration + micro-batch (= the iteration when the
  // task runs once per iteration), iterations counting from the plan's
  // start_iteration.
  using SourceFn = std::function<absl::Status(int64_t piece, const std::vector<Tensor>& outputs)>;
  // Sink: reads the tensors of the consumed registers (valid during the call).
  using SinkFn = std::function<absl::Status(int64_t iteration, const std::vector<Tensor>& inputs)>;
  // Parameter: initialises the variable's tensors followed by the state tensors.
  using InitFn = std::function<absl::Status(const std::vector<Tensor>& variable_and_state)>;

  std::map<std::string, SourceFn, std::less<>> sources;
  std::map<std::string, SinkFn, std::less<>> sinks;
  std::map<std::string, InitFn, std::less<>> initializers;
  // Parameter: called with the variable and its state after the last update
  // (keyed like `initializers`, by the task's callback), so the host can keep
  // the trained values (a later run, a checkpoint). The runtime writes those
  // tensors no more: the host may keep them without copying.
  std::map<std::string, InitFn, std::less<>> finalizers;
};

// The registers of one desc: registers[index][tensor].
struct RegisterSet {
  const proto::RegisterDesc* desc = nullptr;
  std::vector<std::vector<Tensor>> registers;
};

// desc id -> registers; built once by the runtime, then only tensors change.
using RegisterTable = std::map<int64_t, RegisterSet>;

// Joins the communicator group `group` as member `rank`; `members` are the
// group's global ranks (Plan.ranks) in member order, so the executor can tell
// a group inside this process from one that spans nodes. The executor keeps
// every communicator it hands out, to abort them when the job fails or ends.
// Called only while actors are created (one thread).
using JoinFn = std::function<absl::StatusOr<std::shared_ptr<comm::Communicator>>(
    const std::string& group, const std::vector<uint32_t>& members, int rank)>;

// What every actor borrows from the executor that runs it.
struct ActorEnvironment {
  MessageBus* bus = nullptr;
  RegisterTable* registers = nullptr;
  const ops::OpRegistry* registry = nullptr;
  const HostCallbacks* callbacks = nullptr;
  ThreadPool* pool = nullptr;  // intra-op threads for kernels; null = inline
  int64_t iterations = 0;
  int64_t start_iteration = 0;  // Plan.start_iteration
  JoinFn join;  // for Collective / Send / Recv actors
  uint32_t rank = 0;  // the global rank of the actor's device (Plan.ranks)
  // Launches every device's collectives and transfers in the plan's static
  // order (null: each launches as soon as it can; only for plans whose
  // collectives and transfers never share a communicator).
  CollectiveCoordinator* coordinator = nullptr;
  // Ends the run early at an iteration boundary (actors/iteration_gate.h);
  // null: the plan's iterations.
  IterationGate* gate = nullptr;
  // Told when a register is taken and when every reader handed it back
  // (actors/arena.h); null: nobody is.
  ArenaMonitor* arena = nullptr;
  // The stream of the actor's device and stream (core/stream.h) for a task
  // that acts asynchronously (Task.async_acts); null for the others.
  Stream* stream = nullptr;
  // Gets each act's kernel time (actors/op_profile.h); null: none.
  OpProfile* profile = nullptr;
};

class Actor {
 public:
  // Builds the actor of `task`'s kind. `task` and `env` must outlive it.
  static absl::StatusOr<std::unique_ptr<Actor>> Create(const proto::Task& task, const ActorEnvironment& env);
  virtual ~Actor() = default;
  // Use Create. Public only so the kinds (internal) can be constructed.
  Actor(const proto::Task& task, const ActorEnvironment& env);
  // Binds the task's register descs; called by Create.
  absl::Status Init();
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  // Applies one message, then acts as long as it can. An error (a failing
  // kernel or callback, a protocol violation) names the actor, its op and
  // device; the actor must not be used after one.
  [[nodiscard]] absl::Status Handle(const Message& message);

  uint64_t id() const { return task_.actor_id(); }
  const std::string& name() const { return task_.name(); }
  // Acts so far (kernel runs, registers emitted, pieces consumed: per kind).
  int64_t act_count() const { return act_count_; }
  bool eord_sent() const { return eord_sent_; }
  bool done() const { return done_; }
  // "actor 'mul' (node 0 cpu:0 stream 0 task 2)"
  std::string Describe() const;
  // Prefixes `status` with Describe() (and keeps its code), unless its
  // message names its source already (IsSelfDescribed).
  absl::Status Annotate(const absl::Status& status) const;
  // What the actor waits for, for the watchdog's report: "a ready register
  // of desc 3 from 'mul', a free register of desc 5 (2 of 2 held by 'add')",
  // and per kind its collective or transfer in flight or its turn in the
  // launch order; "" when it waits for nothing. Call only while no thread
  // runs the actor. `name_of` names an actor by id.
  std::string DescribeWait(const std::function<std::string(uint64_t)>& name_of) const;

 protected:
  struct Consumed {
    int64_t desc_id = 0;
    uint64_t producer = 0;
    RegisterSet* registers = nullptr;
    std::deque<int32_t> ready;  // FIFO of ready register indices
    bool eord = false;
    bool exhausted() const { return eord && ready.empty(); }
  };
  struct Produced {
    int64_t desc_id = 0;
    RegisterSet* registers = nullptr;
    std::vector<uint64_t> consumers;
    std::vector<int32_t> reading_count;  // per register: consumers yet to ack
    std::deque<int32_t> free;            // FIFO of writable register indices
    bool all_free() const { return free.size() == reading_count.size(); }
  };

  // One step of work if possible: true when something changed.
  virtual absl::StatusOr<bool> ActOnce() = 0;
  // Whether the actor has produced its last register (then Eord goes out).
  virtual bool ShouldEnd() const;
  // Kind-specific checks when the actor ends (e.g. Acc mid-accumulation).
  virtual absl::Status CheckEnd() const { return absl::OkStatus(); }
  // Whether an asynchronous operation (a collective, a transfer, an act on
  // the stream) is in flight: the actor holds its registers until it
  // completes.
  virtual bool Busy() const { return !deferred_.empty(); }
  // The kind's own waits (an asynchronous op, the coordinator's turn), for
  // DescribeWait.
  virtual std::string DescribeKindWait() const { return ""; }

  bool AllConsumedReady() const;
  bool AllProducedFree() const;  // every produced desc has a free register
  bool AllConsumedExhausted() const;
  // Takes the next free register of `p` (must exist).
  int32_t TakeFree(Produced& p);
  // Hands register `index` of `p` to every consumer.
  void SendReady(Produced& p, int32_t index);
  // Returns the front ready register of `c` to its producer.
  void AckFront(Consumed& c);
  // Returns the front ready register of every consumed desc (an act's end):
  // the arena monitor sees all of them handed back before any ack leaves,
  // as the memory plan assumes of an act.
  void AckAll();
  std::vector<Tensor>& FrontTensors(Consumed& c) {
    return c.registers->registers[static_cast<size_t>(c.ready.front())];
  }

  // Asynchronous acts (Task.async_acts, core/stream.h): once an act enqueued
  // its kernels on env_.stream, Defer asks the stream to call back when they
  // completed; `handoff` (the act's acks and readies) then runs from Retire,
  // on the actor's thread, after the hand-offs of every earlier act.
  void Defer(std::function<void()> handoff);
  // Runs the hand-offs of the acts the stream completed, oldest first: true
  // when any ran; a failed kernel's error.
  absl::StatusOr<bool> Retire();
  size_t acts_in_flight() const { return deferred_.size(); }
  // Hands register `index` of consumed desc `c` back (arena first, then
  // the ack): a deferred AckFront of a register no longer at the front.
  void AckRegister(const Consumed& c, int32_t index);

  const proto::Task& task_;
  ActorEnvironment env_;
  std::vector<Consumed> consumed_;
  std::vector<Produced> produced_;
  int64_t act_count_ = 0;

 private:
  absl::Status Apply(const Message& message);
  absl::Status MaybeEnd();

  // Completions counted by the stream's callbacks (any thread).
  struct Completions {
    std::mutex mu;
    int64_t completed = 0;
    absl::Status error;
  };
  std::deque<std::function<void()>> deferred_;  // launched acts' hand-offs, oldest first
  std::shared_ptr<Completions> completions_ = std::make_shared<Completions>();
  int64_t retired_ = 0;

  bool started_ = false;
  bool eord_sent_ = false;
  bool done_ = false;
};

}  // namespace tessera::actors
