#pragma once
// Executing a plan (DESIGN §8).
//
// Runtime: the threaded executor. Load() serialises the plan and parses it
// back (DESIGN §2), validates it (actors/plan.h: any bytes give a plan or an
// error), checks its memory against the limit, allocates every register up front
// (register_num registers of each desc, each holding its tensors; views
// produced by Repeat are not allocated) and constructs the actors. Run()
// starts one thread per stream (the upper 40 bits of actor ids), sends
// Cmd(start) to every actor and returns when every actor finished, or with
// the first error: a failing kernel or callback stops every thread and Run
// returns that error, naming the actor, its op and device.
//
// Tasks that act asynchronously (Task.async_acts) get one stream per device
// stream they run on (core/stream.h): a CUDA stream on a GPU, a worker
// thread on a CPU. The watchdog counts a stream running a kernel as a
// running actor; a failing job waits for each stream's running kernel at
// most hung_kernel_timeout_s and skips the rest of its work.
//
// SteppedExecutor: the same actors and registers driven one message at a
// time by the caller on the caller's thread, for protocol tests (DESIGN §12).
// Its streams run nothing on their own: the caller runs their work (and the
// completion callbacks behind it) one item at a time, in stream order.
//
// Neither class is thread-safe; Run uses its own threads internally. Host
// callbacks run on actor threads. Abort may be called from any thread.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "actors/actor.h"
#include "actors/message.h"
#include "actors/op_profile.h"
#include "comm/collective/kv_store.h"
#include "comm/collective/shm_communicator.h"
#include "comm/proto/plan.pb.h"
#include "core/thread_pool.h"
#include "ops/registry.h"

namespace tessera::actors {

struct RuntimeOptions {
  const ops::OpRegistry* registry = nullptr;  // null = ops::BuiltinOps()
  HostCallbacks callbacks;
  ThreadPool* pool = nullptr;  // intra-op threads shared by kernels; borrowed
  // A device's own intra-op threads (device index -> pool, borrowed); the
  // actors of a device not listed use `pool`.
  std::map<uint32_t, ThreadPool*> device_pools;
  // Communicators of the Collective / Send / Recv actors over devices in this
  // process; null = one hub of the job's own. Borrowed.
  comm::ShmHub* hub = nullptr;
  // The node this runtime runs (every task of the plan must be on it: load a
  // NodePlan's part, actors/plan.h SplitPlan). Groups that span nodes get
  // gloo communicators meeting through `kv` (borrowed; null: a plan with such
  // groups is refused) under keys "<kv_prefix>/..." (unique per job), on
  // this node's `hostname`, with `connect_timeout_s` for the rendezvous and
  // each op (actors/node_communicators.h).
  uint32_t node = 0;
  comm::KvStore* kv = nullptr;
  std::string kv_prefix = "job";
  std::string hostname = "127.0.0.1";
  double connect_timeout_s = 30;
  // Once set (borrowed; null: never), a Load still waiting for peers gives
  // up: its communicators' rendezvous and its actor bus's wait for the peer
  // nodes' addresses end, and Load returns Cancelled. For a host that stops
  // a job while it loads (Abort needs the Runtime Load returns).
  const std::atomic<bool>* load_cancel = nullptr;
  // A NodePlan with peer nodes also links to them over the actor bus
  // (comm/bus, on `hostname`, meeting under "<kv_prefix>/bus/<node>"), with
  // this token in the handshake (the cluster's; empty: none). The job's stop
  // travels over it: a node that fails or is aborted tells its peers why
  // before it aborts its communicators, so they stop with the cause ("node 0
  // stopped the job: ...") instead of a lost connection.
  std::string bus_token;
  // Runtime::Run's watchdog tells a slow job from a stuck one by each
  // actor's progress (messages handled) and each thread's "inside Handle
  // since". An actor inside Handle (a long kernel, a slow host callback) is
  // running, not stuck, and a thread with messages waiting is waiting for a
  // CPU. When stall_timeout_s > 0, no thread is inside a Handle or has
  // messages waiting, and no unfinished actor made progress for that long
  // (a plan whose quotas deadlock, a peer that never answers), the job is
  // stopped and Run returns DeadlineExceeded naming the unfinished actors
  // and what each waits for: a consumed desc without a ready register, a
  // produced desc without a free one, its collective or transfer in
  // flight, its turn in the launch order. 0 = wait forever.
  double stall_timeout_s = 0;
  // When > 0 and an actor stays inside one Handle for this long (a kernel
  // or callback that never returns), Run stops the job and, once every
  // other thread stopped, returns DeadlineExceeded naming it, without
  // waiting for it: its thread is left running (detached) and keeps the
  // job's state alive until it returns, so what it borrows (the pools, the
  // registry, the hub, what the callbacks capture) must outlive it too. A
  // failing job waits at most this long for kernels still running. 0 = wait
  // forever.
  double hung_kernel_timeout_s = 600;
  // Collectives and transfers launch in the plan's static order
  // (actors/launch_order.h): on GPUs in one lane per device, on CPUs in one
  // per communicator. false: each launches as soon as it is ready,
  // which mismatches ops over a shared communicator; only for tests that
  // show what the order prevents.
  bool ordered_launches = true;
  // Load: the most host memory the plan's CPU registers and Parameter state
  // may take (each tensor counted at least one allocator block); a plan
  // asking more is refused with ResourceExhausted before anything is
  // allocated. 0 = the machine's physical memory.
  int64_t memory_limit_bytes = 0;
  // Checks the arena's registers as they are taken and handed back
  // (actors/arena.h): a register taken while another sharing its bytes is in
  // use stops and fails the run, and registers handed back are filled with
  // 0xFF bytes.
  // For tests: ctest sets TESSERA_CHECK_ARENA=1 for every test.
  bool check_arena = ArenaCheckFromEnvironment();
  // Load checks the memory plan against the register protocol
  // (comm::CheckMemoryPlan) when the plan holds every node's tasks; always
  // the offsets' bounds.
  bool check_memory_plan = ArenaCheckFromEnvironment();
  // Lets the host end the run early at an iteration boundary (Ctrl-C, a
  // graceful cancel), every actor agreeing where (actors/iteration_gate.h;
  // with peer nodes the host agrees the limit with theirs); borrowed. An
  // abort releases it. null: the plan's iterations.
  IterationGate* gate = nullptr;
  // When set, Run times each act's kernel (actors/op_profile.h)
  // and, once it ends well, appends the per-op table to this file. For
  // finding where a step's time goes; from TESSERA_PROFILE_OPS by default.
  std::string profile_path = ProfilePathFromEnvironment();
};

namespace internal {
// A loaded plan: the parsed plan, its registers and its actors, bound to a bus.
class LoadedJob;
}  // namespace internal

class Runtime {
 public:
  struct Stats {
    int threads = 0;
    int64_t messages = 0;        // messages handled, all threads
    double seconds = 0;          // wall time of Run
    std::vector<int64_t> messages_per_thread;
    // Per device of this node: its arena's size and the most bytes of it in
    // use at once (actors/arena.h).
    std::vector<ArenaMonitor::Use> arenas;
  };

  static absl::StatusOr<std::unique_ptr<Runtime>> Load(const proto::Plan& plan, RuntimeOptions options = {});
  // From serialised bytes of a Plan.
  static absl::StatusOr<std::unique_ptr<Runtime>> LoadSerialized(std::string_view plan_bytes,
                                                                  RuntimeOptions options = {});
  // From serialised bytes of a NodePlan (what a worker receives); runs that
  // node's part (options.node is set from it).
  static absl::StatusOr<std::unique_ptr<Runtime>> LoadNodePlan(std::string_view node_plan_bytes,
                                                                RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Runs the plan's iterations to the end. Callable once.
  [[nodiscard]] absl::Status Run();
  // Stops a Run in progress (or the next one) from any thread: every actor
  // thread stops, the peer nodes are told over the actor bus, every
  // communicator is aborted (peers on other nodes fail their ops instead of
  // waiting), and Run returns `reason` (Cancelled when OK) unless it had
  // already failed.
  void Abort(absl::Status reason);
  const Stats& stats() const { return stats_; }
  const proto::Plan& plan() const;

 private:
  class Bus;
  struct Core;
  explicit Runtime(RuntimeOptions options);
  // Run's watchdog; returns the actors left inside a hung Handle.
  std::vector<std::string> Watch();

  // The options, bus, job and run state, shared with Run's threads (one
  // inside a Handle that never returns outlives Run, and the Runtime).
  std::shared_ptr<Core> core_;
  // Abort and Run share these.
  std::mutex abort_mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(abort_mu_);
  std::function<void(absl::Status)> stop_all_ ABSL_GUARDED_BY(abort_mu_);  // set while Run runs
  Stats stats_;
  bool ran_ = false;
};

class SteppedExecutor {
 public:
  static absl::StatusOr<std::unique_ptr<SteppedExecutor>> Load(const proto::Plan& plan, RuntimeOptions options = {});
  ~SteppedExecutor();
  SteppedExecutor(const SteppedExecutor&) = delete;
  SteppedExecutor& operator=(const SteppedExecutor&) = delete;

  // Queues Cmd(start) for every actor, in plan order.
  void Start();
  // Messages sent and not yet delivered, oldest first.
  const std::deque<Message>& pending() const;
  // Delivers the oldest pending message; false when none is pending. With
  // check_arena, a register taken while another sharing its bytes is in use
  // is an error.
  [[nodiscard]] absl::StatusOr<bool> Step();
  // Delivers pending()[position] (tests may reorder messages of different
  // senders; per-sender order is theirs to keep).
  [[nodiscard]] absl::Status Deliver(size_t position);
  // Per device, the arena's bytes and the most of them in use at once.
  std::vector<ArenaMonitor::Use> ArenaUses() const;
  // Steps until nothing is pending (error after max_steps).
  [[nodiscard]] absl::Status RunUntilIdle(int64_t max_steps = 1'000'000);

  // Asynchronous acts: the streams holding work not yet run (indices for
  // RunStream), and running the oldest item of one of them (a kernel, or a
  // completion callback, which queues its actor's resume). Step runs the
  // oldest item of the first such stream when no message is pending.
  std::vector<size_t> StreamsWithWork() const;
  [[nodiscard]] absl::Status RunStream(size_t stream);
  // Items (kernels and callbacks) queued on a stream and not yet run.
  size_t StreamItems(size_t stream) const;

  const Actor& actor(uint64_t actor_id) const;
  bool AllDone() const;

 private:
  class Queue;
  class ManualStream;
  SteppedExecutor() = default;

  std::vector<ManualStream*> streams_;  // owned by job_, in creation order

  std::unique_ptr<Queue> queue_;
  std::unique_ptr<internal::LoadedJob> job_;
  RuntimeOptions options_;
};

}  // namespace tessera::actors
