#include "actors/runtime.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "actors/actor_id.h"
#include "actors/node_communicators.h"
#include "actors/plan.h"
#include "comm/bus/bus.h"
#include "comm/collective/shm_communicator.h"
#include "comm/proto/memory_plan.h"
#include "core/checked.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/storage.h"
#include "core/stream.h"
#include "core/text.h"
#include "fmt/format.h"
#ifdef TESSERA_WITH_CUDA
#include "ops/cuda/launch.h"
#endif

namespace tessera::actors {
namespace {

// Marks the runtime's own DEADLINE_EXCEEDED (the stall and hung-kernel
// watchdog), which Run completes with what each actor waits for.
constexpr char kWatchdogPayload[] = "tessera.actors/watchdog";

absl::Status WatchdogError(const std::string& message) {
  absl::Status status = absl::DeadlineExceededError(message);
  status.SetPayload(kWatchdogPayload, absl::Cord("1"));
  return status;
}

}  // namespace

namespace internal {
namespace {

// What loading `plan` allocates on the host: the arenas of CPU devices,
// register_num registers of each desc outside them whose producer is a CPU
// actor (views excepted), each CPU Parameter's state and the feed buffers
// of the plan's estimate, every tensor counted at least one allocator
// block (an empty tensor still takes one).
// A GPU's arena, registers and state are device memory: not counted (its
// arena too large for the GPU fails its allocation, naming the device).
// ValidatePlan bounded each number, so the sums are checked only against
// overflow.
absl::Status CheckHostMemory(const proto::Plan& plan, const std::map<uint64_t, const proto::Task*>& tasks,
                             int64_t limit) {
  std::string source = "the limit given";
  if (limit <= 0) {
    const HostMemoryLimit host = HostMemoryLimitNow();
    limit = static_cast<int64_t>(std::min<size_t>(host.bytes, kMaxTensorBytes));
    source = host.source;
  }
  static constexpr auto kBlock = static_cast<int64_t>(Allocator::kAlignment);
  int64_t total = 0;
  const auto add = [&total](int64_t tensor_bytes, int64_t copies) -> absl::Status {
    ASSIGN_OR_RETURN(const int64_t bytes, CheckedMul(std::max(tensor_bytes, kBlock), copies, "plan memory"));
    ASSIGN_OR_RETURN(total, CheckedAdd(total, bytes, "plan memory"));
    return absl::OkStatus();
  };
  for (const auto& desc : plan.register_descs()) {
    const bool cpu = DecodeActorId(desc.producer()).device_type == DeviceType::kCpu;
    if (!cpu || desc.has_arena_offset() || tasks.at(desc.producer())->kind() == proto::ACTOR_KIND_REPEAT) continue;
    for (const auto& tensor : desc.tensors()) {
      ASSIGN_OR_RETURN(const TensorMeta meta, TensorMetaFromProto(tensor));
      RETURN_IF_ERROR(add(*CheckedByteSize(meta), desc.register_num()));
    }
  }
  // An arena is on the device of the descs placed in it (ArenaMonitor).
  std::set<std::pair<uint32_t, uint32_t>> host_arenas;  // (node, device index)
  for (const auto& desc : plan.register_descs()) {
    const ActorId producer = DecodeActorId(desc.producer());
    if (desc.has_arena_offset() && producer.device_type == DeviceType::kCpu) {
      host_arenas.insert({producer.node, producer.device_index});
    }
  }
  for (const auto& arena : plan.arenas()) {
    if (host_arenas.contains({arena.node(), arena.device_index()})) RETURN_IF_ERROR(add(arena.bytes(), 1));
  }
  for (const auto& task : plan.tasks()) {
    if (DecodeActorId(task.actor_id()).device_type != DeviceType::kCpu) continue;
    for (const auto& state : task.state()) {
      ASSIGN_OR_RETURN(const TensorMeta meta, TensorMetaFromProto(state));
      RETURN_IF_ERROR(add(*CheckedByteSize(meta), 1));
    }
  }
  // The feeds' host buffers (the plan's estimate: the batches of inputs
  // read in shards, the whole batch of an input fed in micro-batches),
  // whatever device reads them.
  for (const auto& m : plan.memory_estimate()) {
    if (m.feed_buffers() > 0) RETURN_IF_ERROR(add(m.feed_buffers(), 1));
  }
  if (total > limit) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return absl::ResourceExhaustedError(StrCat(
        "the plan's registers, state and feed buffers take ", total, " bytes of host memory, more than the limit of ",
        limit, " bytes (", source, fmt::format("; {:.3g} GiB against {:.3g} GiB", total / kGiB, limit / kGiB),
        "; `tessera plan --format memory` shows it per device)"));
  }
  return absl::OkStatus();
}

// A plan with tasks on GPUs needs them here: one line naming the device and
// why it is missing.
absl::Status CheckGpus(const proto::Plan& plan) {
  int highest = -1;
  for (const auto& task : plan.tasks()) {
    const ActorId id = DecodeActorId(task.actor_id());
    if (id.device_type == DeviceType::kCuda) highest = std::max(highest, static_cast<int>(id.device_index));
  }
  if (highest < 0) return absl::OkStatus();
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(StrCat("the plan runs on cuda:", highest, ", but ", count.status().message()));
  }
  if (highest >= *count) {
    return absl::FailedPreconditionError(
        StrCat("the plan runs on cuda:", highest, ", but this process sees ", *count, " GPU(s)"));
  }
#ifdef TESSERA_WITH_CUDA
  // cuBLAS and cuBLASLt start on each GPU now, before any collective is
  // queued there (ops/cuda/launch.h PrepareLibraries).
  std::set<int> gpus;
  for (const auto& task : plan.tasks()) {
    const ActorId id = DecodeActorId(task.actor_id());
    if (id.device_type == DeviceType::kCuda) gpus.insert(static_cast<int>(id.device_index));
  }
  for (const int gpu : gpus) {
    if (const int err = ops::cuda::PrepareLibraries(gpu); err != 0) {
      return absl::FailedPreconditionError(
          StrCat("the plan runs on cuda:", gpu, ", but cuBLAS did not start there: ", ops::cuda::ErrorString(err)));
    }
  }
#endif
  return absl::OkStatus();
}

// Whether `plan` holds every task of its job: every rank is on `node` (a
// NodePlan of a job spanning nodes lacks the others' tasks).
bool WholePlan(const proto::Plan& plan, uint32_t node) {
  for (const auto& rank : plan.ranks()) {
    if (rank.node() != node) return false;
  }
  return true;
}

}  // namespace

// Makes the stream of a device stream (`name`: "cpu:0 stream 0") for its
// asynchronous tasks.
using StreamFactory = std::function<absl::StatusOr<std::unique_ptr<Stream>>(const Device& device, std::string name)>;

class LoadedJob {
 public:
  static absl::StatusOr<std::unique_ptr<LoadedJob>> Load(std::string_view plan_bytes, const RuntimeOptions& options,
                                                         MessageBus* bus, const StreamFactory& make_stream) {
    std::unique_ptr<LoadedJob> job(new LoadedJob);
    ASSIGN_OR_RETURN(job->plan, ParsePlan(plan_bytes));
    const ops::OpRegistry* registry = options.registry ? options.registry : &ops::BuiltinOps();
    RETURN_IF_ERROR(ValidatePlan(job->plan, *registry));
    std::map<uint64_t, const proto::Task*> tasks;
    for (const auto& task : job->plan.tasks()) tasks[task.actor_id()] = &task;
    RETURN_IF_ERROR(CheckGpus(job->plan));
    RETURN_IF_ERROR(CheckHostMemory(job->plan, tasks, options.memory_limit_bytes));
    // Registers first: actors bind to them when constructed. Planned ones
    // lie in their device's arena (allocated once, here); the rest (a
    // Parameter's variable, which lives across iterations) on their own.
    if (options.check_memory_plan && WholePlan(job->plan, options.node)) {
      RETURN_IF_ERROR(comm::CheckMemoryPlan(job->plan));
    }
    job->arena = std::make_unique<ArenaMonitor>(options.check_arena);
    ASSIGN_OR_RETURN(auto in_arena, job->arena->Allocate(job->plan, options.node));
    for (const auto& desc : job->plan.register_descs()) {
      RegisterSet& set = job->registers[desc.id()];
      set.desc = &desc;
      if (auto planned = in_arena.find(desc.id()); planned != in_arena.end()) {
        set.registers = std::move(planned->second);
        continue;
      }
      const bool view = tasks.at(desc.producer())->kind() == proto::ACTOR_KIND_REPEAT;
      const Device device = DecodeActorId(desc.producer()).device();
      for (int r = 0; r < desc.register_num(); ++r) {
        std::vector<Tensor> tensors(static_cast<size_t>(desc.tensors_size()));
        for (int t = 0; !view && t < desc.tensors_size(); ++t) {
          ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc.tensors(t)));
          auto tensor = device.type == DeviceType::kCpu ? Tensor::Zeros(meta.shape, meta.dtype, device)
                                                        : Tensor::Empty(meta.shape, meta.dtype, device);
          if (!tensor.ok()) {
            return absl::Status(tensor.status().code(), StrCat("allocating register desc ", desc.id(), " on ",
                                                               device.ToString(), ": ", tensor.status().message()));
          }
          tensors[static_cast<size_t>(t)] = *std::move(tensor);
        }
        set.registers.push_back(std::move(tensors));
      }
    }
    job->env.bus = bus;
    job->env.registers = &job->registers;
    job->env.registry = registry;
    job->env.callbacks = &options.callbacks;
    job->env.pool = options.pool;
    job->env.iterations = job->plan.iterations();
    job->env.start_iteration = job->plan.start_iteration();
    job->env.gate = options.gate;
    job->env.arena = job->arena.get();
    if (!options.profile_path.empty()) {
      // The file must take the table: refused now, not after the run.
      if (!std::ofstream(options.profile_path, std::ios::app)) {
        return absl::InvalidArgumentError(
            StrCat("TESSERA_PROFILE_OPS: cannot write the op profile to '", options.profile_path, "'"));
      }
      job->profile = std::make_unique<OpProfile>();
      job->env.profile = job->profile.get();
    }
    comm::ShmHub* hub = options.hub;
    if (hub == nullptr) {
      job->own_hub = std::make_unique<comm::ShmHub>();
      hub = job->own_hub.get();
    }
    // Every task runs on this node; its global rank comes from Plan.ranks.
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> rank_of;  // (node, device index) -> global rank
    for (int r = 0; r < job->plan.ranks_size(); ++r) {
      rank_of[{job->plan.ranks(r).node(), job->plan.ranks(r).device_index()}] = static_cast<uint32_t>(r);
    }
    for (const auto& task : job->plan.tasks()) {
      const ActorId id = DecodeActorId(task.actor_id());
      if (id.node != options.node) {
        return absl::InvalidArgumentError(StrCat("task '", task.name(), "' is on node ", id.node, ", but this runtime runs node ",
                                                 options.node, " (split the plan per node)"));
      }
      if (job->plan.ranks_size() > 0 && !rank_of.contains({id.node, id.device_index})) {
        return absl::InvalidArgumentError(StrCat("task '", task.name(), "' is on ", ActorIdToString(task.actor_id()),
                                                 ", which is no rank of the plan"));
      }
    }
    NodeCommunicatorOptions node_options;
    node_options.node = options.node;
    node_options.hub = hub;
    node_options.kv = options.kv;
    node_options.kv_prefix = options.kv_prefix;
    node_options.hostname = options.hostname;
    node_options.timeout_s = options.connect_timeout_s;
    node_options.cancel = options.load_cancel;
    node_options.gpus = std::any_of(job->plan.tasks().begin(), job->plan.tasks().end(), [](const proto::Task& task) {
      return DecodeActorId(task.actor_id()).device_type == DeviceType::kCuda;
    });
    job->node_communicators = std::make_unique<NodeCommunicators>(job->plan, node_options);
    LoadedJob* raw = job.get();
    // One communicator per (group, rank) in the job: the collectives of a
    // device over the same ranks share it, in the coordinator's order.
    job->env.join = [raw](const std::string& group, const std::vector<uint32_t>& members, int rank)
        -> absl::StatusOr<std::shared_ptr<comm::Communicator>> {
      auto& joined = raw->joined[{group, rank}];
      if (joined.communicator == nullptr) {
        ASSIGN_OR_RETURN(joined.communicator, raw->node_communicators->Join(group, members, rank));
        joined.members = members;
        raw->communicators.push_back(joined.communicator);
      } else if (joined.members != members) {
        return absl::InvalidArgumentError(StrCat("communicator group '", group, "' joined over ranks [",
                                                 Join(members, ","), "] and [", Join(joined.members, ","), "]"));
      }
      return joined.communicator;
    };
    // A GPU issues all its NCCL operations in one order (launch_order.h).
    ASSIGN_OR_RETURN(
        job->coordinator,
        CollectiveCoordinator::Build(job->plan, node_options.gpus ? LaneScope::kDevice : LaneScope::kCommunicator));
    if (options.ordered_launches) job->env.coordinator = job->coordinator.get();
    for (const auto& task : job->plan.tasks()) {
      ActorEnvironment env = job->env;
      const ActorId id = DecodeActorId(task.actor_id());
      if (auto it = options.device_pools.find(id.device_index); it != options.device_pools.end()) {
        env.pool = it->second;
      }
      env.rank = job->plan.ranks_size() > 0 ? rank_of.at({id.node, id.device_index}) : id.device_index;
      if (task.async_acts()) {
        std::unique_ptr<Stream>& stream = job->streams[StreamOf(task.actor_id())];
        if (stream == nullptr) {
          ASSIGN_OR_RETURN(stream, make_stream(id.device(), StrCat(id.device().ToString(), " stream ", id.stream)));
        }
        env.stream = stream.get();
      }
      ASSIGN_OR_RETURN(std::unique_ptr<Actor> actor, Actor::Create(task, env));
      job->by_id[actor->id()] = actor.get();
      job->actors.push_back(std::move(actor));
    }
    // Groups that span nodes meet their peers now, before anything runs.
    RETURN_IF_ERROR(job->node_communicators->ConnectAll());
    return job;
  }

  // Fails every collective or transfer still in flight (its callback runs
  // now, while the bus is alive), so nothing waits on a job that is gone.
  void AbortCommunicators(const absl::Status& reason) {
    for (const auto& communicator : communicators) communicator->Abort(reason);
  }
  // Stops every stream: work not started is skipped; what runs is waited
  // for at most `timeout_s` (< 0: as long as it takes). Returns the streams
  // still running a kernel after that.
  std::vector<std::string> ShutdownStreams(double timeout_s) {
    std::vector<std::string> left;
    for (auto& [key, stream] : streams) {
      if (!stream->Shutdown(timeout_s)) left.push_back(StrCat(stream->name(), " (a kernel still running)"));
    }
    return left;
  }
  ~LoadedJob() {
    ShutdownStreams(-1);
    AbortCommunicators(absl::CancelledError("the job ended"));
  }

  proto::Plan plan;
  RegisterTable registers;
  std::unique_ptr<comm::ShmHub> own_hub;  // when the options bring none
  std::unique_ptr<NodeCommunicators> node_communicators;
  std::vector<std::shared_ptr<comm::Communicator>> communicators;
  struct Joined {
    std::shared_ptr<comm::Communicator> communicator;
    std::vector<uint32_t> members;
  };
  std::map<std::pair<std::string, int>, Joined> joined;  // (group, rank)
  std::unique_ptr<CollectiveCoordinator> coordinator;
  std::unique_ptr<ArenaMonitor> arena;
  std::unique_ptr<OpProfile> profile;  // RuntimeOptions::profile_path set
  // Per device stream (StreamOf an actor id) with asynchronous tasks.
  std::map<uint64_t, std::unique_ptr<Stream>> streams;
  ActorEnvironment env;
  std::vector<std::unique_ptr<Actor>> actors;  // plan order
  std::unordered_map<uint64_t, Actor*> by_id;
};

}  // namespace internal

namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
// Seconds, to the millisecond (for messages).
double Seconds(int64_t ns) { return std::round(static_cast<double>(ns) / 1e6) / 1e3; }

// What the watchdog reads of one actor while its thread runs.
struct WatchedActor {
  Actor* actor = nullptr;
  std::atomic<int64_t> last_progress_ns{0};  // when its last Handle ended (or the run began)
  std::atomic<bool> done{false};
};

// One stream's thread: a mutex+condvar queue for messages from other
// threads, and a lock-free local queue for messages its own actors send to
// each other (the same-thread fast path). The watchdog reads its progress
// (busy_since_ns, each actor's last progress) from another thread.
class ActorThread {
 public:
  void Add(Actor* actor) {
    auto& watched = actors_[actor->id()];
    watched = std::make_unique<WatchedActor>();
    watched->actor = actor;
    ++live_;
  }

  // From any thread.
  void Post(const Message& message) {
    posted_.fetch_add(1, std::memory_order_relaxed);  // before it can be handled
    {
      std::lock_guard<std::mutex> lock(mu_);
      remote_.push_back(message);
    }
    cv_.notify_one();
  }
  // From this thread only.
  void PostLocal(const Message& message) {
    posted_.fetch_add(1, std::memory_order_relaxed);
    local_.push_back(message);
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
  }

  // Before the thread starts: every actor's clock begins at `now_ns`.
  void StartClocks(int64_t now_ns) {
    for (auto& [id, watched] : actors_) watched->last_progress_ns.store(now_ns, std::memory_order_relaxed);
  }

  // Runs until every actor of the thread is done, Stop() is called, or an
  // actor fails (returned). Handles are stamped with `clock` (ns, kept
  // current by the watchdog).
  absl::Status Loop(const std::atomic<bool>& aborted, const std::atomic<int64_t>& clock);

  // Read by the watchdog from another thread.
  int64_t handled() const { return handled_.load(std::memory_order_relaxed); }
  // Messages posted to the thread and not yet taken up: a thread with some
  // is waiting for a CPU, not stuck.
  bool has_pending() const {
    return posted_.load(std::memory_order_relaxed) > handled_.load(std::memory_order_relaxed);
  }
  // When the Handle running now began; 0 when the thread is not in one.
  int64_t busy_since_ns() const { return busy_since_ns_.load(std::memory_order_acquire); }
  // The actor of that Handle (valid while busy_since_ns() != 0).
  uint64_t busy_actor() const { return busy_actor_.load(std::memory_order_relaxed); }
  // The actors (the map is fixed before the thread starts).
  const std::unordered_map<uint64_t, std::unique_ptr<WatchedActor>>& actors() const { return actors_; }
  // Loop has returned (set by the worker, read by Run).
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  void MarkFinished() { finished_.store(true, std::memory_order_release); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> remote_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Message> batch_;   // this thread only
  std::deque<Message> local_;    // this thread only
  std::unordered_map<uint64_t, std::unique_ptr<WatchedActor>> actors_;
  int live_ = 0;
  // Written by this thread only (a plain load + store, no locked add).
  std::atomic<int64_t> handled_{0};
  std::atomic<int64_t> posted_{0};
  std::atomic<int64_t> busy_since_ns_{0};
  std::atomic<uint64_t> busy_actor_{0};
  std::atomic<bool> finished_{false};
};

thread_local ActorThread* current_thread = nullptr;

absl::Status ActorThread::Loop(const std::atomic<bool>& aborted, const std::atomic<int64_t>& clock) {
  current_thread = this;
  absl::Status status;
  while (live_ > 0) {
    if (local_.empty()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !remote_.empty(); });
      if (stop_) break;
      batch_.swap(remote_);
      lock.unlock();
      local_.insert(local_.end(), batch_.begin(), batch_.end());
      batch_.clear();
    }
    const Message message = local_.front();
    local_.pop_front();
    handled_.store(handled_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (message.type == MessageType::kCommand && message.command == Command::kStop) break;
    auto it = actors_.find(message.dst);
    if (it == actors_.end()) {
      status = absl::InternalError(StrCat("message to an actor not on this thread: ", message.ToString()));
      break;
    }
    WatchedActor& watched = *it->second;
    Actor* actor = watched.actor;
    const bool was_done = actor->done();
    busy_actor_.store(actor->id(), std::memory_order_relaxed);
    busy_since_ns_.store(clock.load(std::memory_order_relaxed), std::memory_order_release);
    // A kernel or a host callback that throws (std::bad_alloc on an
    // allocation sized by the job, a library's exception) fails the job like
    // any error instead of terminating the process.
    try {
      status = actor->Handle(message);
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError(StrCat("out of memory while ", actor->Describe(), " handled ",
                                                   message.ToString()));
    } catch (const std::exception& e) {
      status = absl::InternalError(StrCat(actor->Describe(), " threw while handling ", message.ToString(),
                                          ": ", e.what()));
    }
    watched.last_progress_ns.store(clock.load(std::memory_order_relaxed), std::memory_order_relaxed);
    busy_since_ns_.store(0, std::memory_order_release);
    if (!status.ok()) break;
    if (!was_done && actor->done()) {
      --live_;
      watched.done.store(true, std::memory_order_relaxed);
    }
    if (aborted.load(std::memory_order_relaxed)) break;
  }
  current_thread = nullptr;
  return status;
}

}  // namespace

// Routes by the stream part of the destination id. A message to an actor
// that is not in this runtime fails the job (it would otherwise be lost and
// the job hang).
class Runtime::Bus final : public MessageBus {
 public:
  void Send(const Message& message) override {
    auto it = routes_.find(StreamOf(message.dst));
    if (it == routes_.end()) {
      if (on_error) on_error(absl::InternalError(StrCat("no actor ", ActorIdToString(message.dst), " in this runtime for ",
                                                        message.ToString())));
      return;
    }
    ActorThread* thread = it->second.get();
    if (thread == current_thread) {
      thread->PostLocal(message);
    } else {
      thread->Post(message);
    }
  }

  std::unordered_map<uint64_t, std::unique_ptr<ActorThread>> routes_;  // stream -> thread
  std::function<void(absl::Status)> on_error;  // set before Run starts its threads, then kept
};

// Everything the actor threads touch. Shared between the Runtime and Run's
// threads: a thread inside a kernel that never returns is left running
// (Run gives up on it after hung_kernel_timeout_s) and keeps this alive
// until it returns, even after the Runtime is gone.
struct Runtime::Core {
  explicit Core(RuntimeOptions o) : options(std::move(o)) {}

  // The first error wins; every thread stops. A stop that starts here is
  // told to the peer nodes over the actor bus (`tell_peers`) and written out
  // before this returns, so it reaches them before the aborted
  // communicators do.
  void StopAll(absl::Status status, bool tell_peers = true) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) {
        first_error = status;
        first = true;
      }
    }
    aborted.store(true);
    if (options.gate != nullptr) options.gate->Release();  // wakes an actor waiting on a paused gate
    for (ActorThread* thread : threads) thread->Stop();
    if (first && tell_peers && node_bus != nullptr) TellPeers(status);
  }

  // Frame payload: kind u8 (kStopFrame) | status code u32 LE | message.
  static constexpr uint8_t kStopFrame = 1;
  static constexpr uint64_t kBusSession = 1;  // one job per bus

  void TellPeers(const absl::Status& status) {
    std::string payload(1, static_cast<char>(kStopFrame));
    const uint32_t code = static_cast<uint32_t>(status.code());
    for (int i = 0; i < 4; ++i) payload.push_back(static_cast<char>((code >> (8 * i)) & 0xff));
    payload.append(std::string(status.message().substr(0, 64 << 10)));
    for (uint32_t peer : peers) {
      if (absl::Status sent = node_bus->Send(peer, kBusSession, 0, payload); !sent.ok()) {
        TLOG_DEBUG("node {}: the stop did not go to node {}: {}", options.node, peer, std::string(sent.message()));
      }
    }
    if (absl::Status flushed = node_bus->Flush(1.0); !flushed.ok()) {
      TLOG_DEBUG("node {}: {}", options.node, std::string(flushed.message()));
    }
  }

  // A frame from a peer node (on the bus's I/O thread).
  void OnPeerFrame(uint32_t from, std::string_view payload) {
    if (payload.size() < 5 || static_cast<uint8_t>(payload[0]) != kStopFrame) {
      // Not told to the peers from here: this is the bus's thread, which
      // must not wait for its own writes.
      StopAll(absl::InternalError(StrCat("node ", options.node, ": a malformed actor-bus frame from node ", from, " (",
                                         payload.size(), " bytes)")),
              /*tell_peers=*/false);
      return;
    }
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) code |= static_cast<uint32_t>(static_cast<uint8_t>(payload[1 + i])) << (8 * i);
    if (code == 0 || code > 16) code = static_cast<uint32_t>(absl::StatusCode::kUnknown);
    StopAll(absl::Status(static_cast<absl::StatusCode>(code),
                         StrCat("node ", from, " stopped the job: ", payload.substr(5))),
            /*tell_peers=*/false);
  }

  RuntimeOptions options;
  Bus bus;  // before job: destroying the job aborts its communicators, whose callbacks post here
  std::unique_ptr<internal::LoadedJob> job;
  std::vector<ActorThread*> threads;  // fixed before Run starts them
  std::atomic<bool> aborted{false};
  // NowNs(), refreshed by the watchdog at each poll: the threads stamp
  // their Handles with it (two clock reads per message were 40% of a
  // message's cost; the watchdog's limits are seconds, its poll 50 ms).
  std::atomic<int64_t> clock_ns{0};
  std::mutex mu;
  std::condition_variable finished_cv;
  absl::Status first_error ABSL_GUARDED_BY(mu);
  size_t finished ABSL_GUARDED_BY(mu) = 0;  // threads whose Loop returned
  // The actor bus to the peer nodes (LoadNodePlan of a plan with peers).
  // Last: destroyed first, so its handlers never see the rest gone.
  std::vector<uint32_t> peers;
  std::unique_ptr<comm::bus::Bus> node_bus;
};

Runtime::Runtime(RuntimeOptions options) : core_(std::make_shared<Core>(std::move(options))) {}
Runtime::~Runtime() = default;

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Load(const proto::Plan& plan, RuntimeOptions options) {
  // Always through bytes, even in one process (DESIGN §2).
  RETURN_IF_ERROR(CheckPlanSize(plan));
  return LoadSerialized(SerializePlan(plan), std::move(options));
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::LoadSerialized(std::string_view plan_bytes, RuntimeOptions options) {
  std::unique_ptr<Runtime> runtime(new Runtime(std::move(options)));
  Core& core = *runtime->core_;
  const auto make_stream = [](const Device& device, std::string name) -> absl::StatusOr<std::unique_ptr<Stream>> {
    if (device.type == DeviceType::kCuda) return MakeCudaStream(device.index, std::move(name));
    try {
      return MakeCpuStream(name);
    } catch (const std::exception& e) {  // its thread refused (EAGAIN)
      return absl::ResourceExhaustedError(StrCat("cannot start the thread of stream '", name, "': ", e.what()));
    }
  };
  ASSIGN_OR_RETURN(core.job, internal::LoadedJob::Load(plan_bytes, core.options, &core.bus, make_stream));
  for (const auto& actor : core.job->actors) {
    auto& thread = core.bus.routes_[StreamOf(actor->id())];
    if (!thread) thread = std::make_unique<ActorThread>();
    thread->Add(actor.get());
  }
  for (auto& [stream, thread] : core.bus.routes_) core.threads.push_back(thread.get());
  return runtime;
}

namespace {

// `host` as an IPv4 literal (the bus binds literals only).
absl::StatusOr<std::string> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0 || found == nullptr) {
    return absl::InvalidArgumentError(StrCat("cannot resolve the data-plane host '", host, "': ", gai_strerror(error)));
  }
  char ip[NI_MAXHOST] = {};
  const int error = ::getnameinfo(found->ai_addr, found->ai_addrlen, ip, sizeof(ip), nullptr, 0, NI_NUMERICHOST);
  ::freeaddrinfo(found);
  if (error != 0) return absl::InvalidArgumentError(StrCat("cannot resolve '", host, "': ", gai_strerror(error)));
  return std::string(ip);
}

// Starts this node's actor bus and links it to every peer, meeting them
// under "<kv_prefix>/bus/<node>".
absl::StatusOr<std::unique_ptr<comm::bus::Bus>> LinkPeers(uint32_t node, const std::vector<uint32_t>& peers,
                                                          const RuntimeOptions& options) {
  if (options.kv == nullptr) {
    return absl::FailedPreconditionError(StrCat("node ", node, "'s plan has peer nodes, but no KvStore was given "
                                                "to meet them over the actor bus (RuntimeOptions.kv)"));
  }
  ASSIGN_OR_RETURN(const std::string ip, ResolveHost(options.hostname));
  comm::bus::BusOptions bus_options;
  bus_options.node = node;
  bus_options.listen = StrCat(ip, ":0");
  bus_options.token = options.bus_token;
  bus_options.connect_timeout_s = options.connect_timeout_s;
  ASSIGN_OR_RETURN(std::unique_ptr<comm::bus::Bus> bus, comm::bus::Bus::Start(bus_options));
  const auto key = [&options](uint32_t n) { return StrCat(options.kv_prefix, "/bus/", n); };
  RETURN_IF_ERROR(options.kv->Set(key(node), bus->address()));
  std::vector<std::string> keys;
  for (uint32_t peer : peers) keys.push_back(key(peer));
  std::optional<comm::CancellableKvStore> cancellable;
  if (options.load_cancel != nullptr) cancellable.emplace(*options.kv, *options.load_cancel);
  comm::KvStore& kv = cancellable ? static_cast<comm::KvStore&>(*cancellable) : *options.kv;
  auto addresses = kv.Wait(keys, absl::Seconds(options.connect_timeout_s));
  if (!addresses.ok()) {
    return absl::Status(addresses.status().code(), StrCat("node ", node, ": the actor bus addresses of its peers: ",
                                                          addresses.status().message()));
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    if (absl::Status linked = bus->Connect(peers[i], (*addresses)[i]); !linked.ok()) {
      return absl::Status(linked.code(), StrCat("node ", node, ": actor bus link to node ", peers[i], " at ",
                                                (*addresses)[i], ": ", linked.message()));
    }
  }
  return bus;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::LoadNodePlan(std::string_view node_plan_bytes, RuntimeOptions options) {
  ASSIGN_OR_RETURN(const proto::NodePlan node_plan, ParseNodePlan(node_plan_bytes));
  options.node = node_plan.node();
  ASSIGN_OR_RETURN(std::unique_ptr<Runtime> runtime, LoadSerialized(SerializePlan(node_plan.plan()), std::move(options)));
  Core& core = *runtime->core_;
  if (node_plan.peers_size() > 0) {
    core.peers.assign(node_plan.peers().begin(), node_plan.peers().end());
    ASSIGN_OR_RETURN(core.node_bus, LinkPeers(node_plan.node(), core.peers, core.options));
  }
  return runtime;
}

void Runtime::Abort(absl::Status reason) {
  if (reason.ok()) reason = absl::CancelledError("the job was cancelled");
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (abort_reason_.ok()) abort_reason_ = reason;
  if (stop_all_) stop_all_(reason);
}

const proto::Plan& Runtime::plan() const { return core_->job->plan; }

absl::Status Runtime::Run() {
  if (ran_) return absl::FailedPreconditionError("Runtime::Run called twice");
  ran_ = true;
  Core& core = *core_;
  const auto start = Clock::now();
  // Start commands go in before any thread runs, so each actor sees its
  // start before any register message.
  for (const auto& actor : core.job->actors) core.bus.Send(Message::Cmd(actor->id(), Command::kStart));
  core.bus.on_error = [&core](absl::Status status) { core.StopAll(std::move(status)); };
  // A register taken while another sharing its bytes is in use stops the
  // job there (checking on: tests).
  core.job->arena->OnViolation([&core](const absl::Status& status) { core.StopAll(status); });
  if (core.node_bus != nullptr) {
    // Link losses are not stops: gloo's broken connections and the master's
    // heartbeats tell a dead peer; what comes over the bus is a peer's stop.
    RETURN_IF_ERROR(core.node_bus->Subscribe(
        Core::kBusSession, [&core](uint32_t from, uint64_t, std::string_view payload) { core.OnPeerFrame(from, payload); },
        [&core](uint32_t node, const absl::Status& error) {
          TLOG_DEBUG("node {}: actor bus link to node {}: {}", core.options.node, node, std::string(error.message()));
        }));
  }
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!abort_reason_.ok()) return abort_reason_;
    stop_all_ = [&core](absl::Status status) {
      core.StopAll(status);
      core.job->AbortCommunicators(status);
    };
  }
  const int64_t start_ns = NowNs();
  core.clock_ns.store(start_ns);
  for (ActorThread* thread : core.threads) thread->StartClocks(start_ns);
  std::vector<std::thread> workers;
  workers.reserve(core.threads.size());
  try {
    for (ActorThread* thread : core.threads) {
      workers.emplace_back([shared = core_, thread]() {
        absl::Status status = thread->Loop(shared->aborted, shared->clock_ns);
        if (!status.ok()) shared->StopAll(std::move(status));
        std::lock_guard<std::mutex> lock(shared->mu);
        thread->MarkFinished();
        ++shared->finished;
        shared->finished_cv.notify_all();
      });
    }
  } catch (const std::exception& e) {
    // No thread for the rest (EAGAIN: the process's or the machine's
    // limit): the run fails as a whole, its started threads stopped, the
    // others counted as finished (std::terminate ended the process).
    const absl::Status status = absl::ResourceExhaustedError(
        StrCat("cannot start actor thread ", workers.size() + 1, " of ", core.threads.size(), ": ", e.what()));
    {
      std::lock_guard<std::mutex> lock(core.mu);
      for (size_t i = workers.size(); i < core.threads.size(); ++i) {
        core.threads[i]->MarkFinished();
        ++core.finished;
      }
      core.finished_cv.notify_all();
    }
    core.StopAll(status);
  }
  std::vector<std::string> hung = Watch();
  // Threads that returned are joined; a thread still inside a hung Handle is
  // left to finish on its own (it holds the Core).
  for (size_t i = 0; i < workers.size(); ++i) {
    if (core.threads[i]->finished()) {
      workers[i].join();
    } else {
      workers[i].detach();
    }
  }
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    stop_all_ = {};
  }
  if (core.node_bus != nullptr) core.node_bus->Unsubscribe(Core::kBusSession);
  // Streams: idle after a run that ended well; after a failure, their
  // queued kernels are skipped and a running one waited for (within the
  // hung-kernel limit), so nothing writes the registers once Run returns.
  for (std::string& left : core.job->ShutdownStreams(
           core.options.hung_kernel_timeout_s > 0 ? core.options.hung_kernel_timeout_s : -1)) {
    hung.push_back(std::move(left));
  }
  absl::Status first_error;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    first_error = core.first_error;
  }
  if (!first_error.ok()) core.job->AbortCommunicators(first_error);
  stats_.arenas = core.job->arena->Uses();
  // A register taken while another sharing its bytes was in use explains
  // whatever else went wrong.
  if (absl::Status arena = core.job->arena->status(); !arena.ok()) return arena;

  stats_.threads = static_cast<int>(core.threads.size());
  for (ActorThread* thread : core.threads) {
    stats_.messages_per_thread.push_back(thread->handled());
    stats_.messages += thread->handled();
  }
  stats_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Only the watchdog's own stops (a stall, a hung kernel) gain the
  // actors' states: a DEADLINE_EXCEEDED of a callback or an Abort (a
  // service's request deadline) is returned as it came.
  if (!first_error.ok() && !first_error.GetPayload(kWatchdogPayload).has_value()) return first_error;
  // The actors of joined threads can be read safely now; those of a thread
  // left inside a hung Handle are only named.
  const int64_t now = NowNs();
  const auto name_of = [&core](uint64_t id) {
    auto it = core.job->by_id.find(id);
    return it == core.job->by_id.end() ? ActorIdToString(id) : StrCat("'", it->second->name(), "'");
  };
  std::vector<std::string> unfinished;
  for (ActorThread* thread : core.threads) {
    if (!thread->finished()) continue;
    for (const auto& [id, watched] : thread->actors()) {
      const Actor& actor = *watched->actor;
      if (actor.done()) continue;
      const std::string waits = actor.DescribeWait(name_of);
      unfinished.push_back(StrCat(actor.Describe(), ", idle ",
                                  Seconds(now - watched->last_progress_ns.load(std::memory_order_relaxed)), " s",
                                  waits.empty() ? "" : StrCat(", waits for ", waits)));
    }
  }
  if (first_error.ok()) {
    if (!unfinished.empty()) return absl::InternalError(StrCat(unfinished[0], " did not finish"));
    if (core.job->profile != nullptr) {
      const proto::Plan& plan = core.job->plan;
      const std::string title =
          StrCat("node ", core.options.node, ", iterations ", plan.start_iteration(), " to ",
                 plan.start_iteration() + plan.iterations(), plan.iterations() > 1 ? " (the first not timed)" : "",
                 ", run ", stats_.seconds, " s");
      RETURN_IF_ERROR(core.job->profile->AppendTo(core.options.profile_path, title));
    }
    return absl::OkStatus();
  }
  std::sort(unfinished.begin(), unfinished.end());
  constexpr size_t kMostNamed = 8;
  const size_t more = unfinished.size() > kMostNamed ? unfinished.size() - kMostNamed : 0;
  unfinished.resize(std::min(unfinished.size(), kMostNamed));
  const std::string launches = core.job->coordinator->Describe();
  std::string message(first_error.message());
  if (!hung.empty()) message += StrCat("; left running: ", Join(hung, "; "));
  if (!unfinished.empty()) {
    message += StrCat(hung.empty() ? "; stuck: " : "; not finished: ", Join(unfinished, "; "),
                      more > 0 ? StrCat(" (and ", more, " more)") : "");
  }
  if (!launches.empty()) message += StrCat("; launch order: ", launches);
  return absl::DeadlineExceededError(message);
}

// The watchdog, on Run's thread until every worker returned or only hung
// ones are left. An actor inside Handle (a kernel, a host callback) is
// running, however long it takes; the job is stuck when no thread is inside
// a Handle or has messages waiting, and no unfinished actor made progress
// (handled a message) for stall_timeout_s. An actor whose kernel or callback never returns is what
// hung_kernel_timeout_s is for: after that long in one Handle it fails the
// job, and once every other thread stopped Run gives up on it. Returns the
// actors given up on.
std::vector<std::string> Runtime::Watch() {
  Core& core = *core_;
  const double stall_s = core.options.stall_timeout_s;
  const double hung_s = core.options.hung_kernel_timeout_s;
  const auto poll = std::chrono::milliseconds(50);
  bool reported = false;  // a stall or hung kernel already failed the job
  int stalled_polls = 0;  // polls in a row that saw no progress for stall_s
  // Each thread's messages handled at the last poll: one that handled some
  // since made progress now (its stamps are of the clock as this thread
  // last set it, which a starved watchdog let grow old).
  std::vector<int64_t> handled_seen(core.threads.size(), 0);
  // The Handle each thread is inside (its count of messages handled, which
  // holds still meanwhile) and the poll before it was first seen: it began
  // after that (its own stamp may be older).
  std::vector<int64_t> busy_handled(core.threads.size(), -1);
  std::vector<int64_t> busy_after(core.threads.size(), 0);
  int64_t previous_poll = core.clock_ns.load();
  std::unique_lock<std::mutex> lock(core.mu);
  while (core.finished < core.threads.size()) {
    core.finished_cv.wait_for(lock, poll);
    if (core.finished == core.threads.size()) break;
    lock.unlock();
    const int64_t now = NowNs();
    core.clock_ns.store(now, std::memory_order_relaxed);
    bool any_busy = false;
    bool only_hung_left = true;  // every thread still running is inside a Handle past hung_s
    int64_t last_progress = 0;   // the latest of any unfinished actor
    std::vector<std::string> hung;
    for (size_t t = 0; t < core.threads.size(); ++t) {
      ActorThread* thread = core.threads[t];
      if (thread->finished()) continue;
      const int64_t handled = thread->handled();
      if (handled != handled_seen[t]) {
        handled_seen[t] = handled;
        last_progress = now;
      }
      int64_t since = thread->busy_since_ns();
      const uint64_t busy = thread->busy_actor();
      if (since != 0) {
        any_busy = true;
        if (busy_handled[t] != handled) {
          busy_handled[t] = handled;
          busy_after[t] = previous_poll;
        }
        since = std::max(since, busy_after[t]);
        if (hung_s > 0 && Seconds(now - since) >= hung_s) {
          hung.push_back(StrCat(core.job->by_id.at(busy)->Describe(), " inside one Handle for ", Seconds(now - since), " s"));
          continue;
        }
      }
      only_hung_left = false;
      // Messages waiting for the thread (it was not scheduled yet: a loaded
      // machine) are progress to come, not a stall.
      if (thread->has_pending()) any_busy = true;
      for (const auto& [id, watched] : thread->actors()) {
        if (!watched->done.load(std::memory_order_relaxed)) {
          last_progress = std::max(last_progress, watched->last_progress_ns.load(std::memory_order_relaxed));
        }
      }
    }
    // A stream running a kernel is an actor running one.
    for (const auto& [key, stream] : core.job->streams) {
      const int64_t since = stream->busy_since_ns();
      if (since == 0) continue;
      any_busy = true;
      if (hung_s > 0 && Seconds(now - since) >= hung_s) {
        hung.push_back(StrCat("a kernel on ", stream->name(), " for ", Seconds(now - since), " s"));
      }
    }
    const bool stalled = stall_s > 0 && !any_busy && last_progress > 0 && Seconds(now - last_progress) >= stall_s;
    stalled_polls = stalled ? stalled_polls + 1 : 0;
    if (core.aborted.load()) {
      // Stopping: wait for every thread, but not for a hung one.
      if (!hung.empty() && only_hung_left) {
        lock.lock();
        return hung;
      }
    } else if (!hung.empty() && !reported) {
      reported = true;
      core.StopAll(WatchdogError(StrCat(
          Join(hung, "; "), ": a kernel or callback that does not return (hung_kernel_timeout_s ", hung_s, ")")));
      core.job->AbortCommunicators(absl::CancelledError("a kernel hung"));
    } else if (stalled_polls >= 2 && !reported) {
      // Seen on two polls in a row: one sample taken as a long Handle ends
      // can miss both its busy mark and its progress.
      reported = true;
      core.StopAll(WatchdogError(
          StrCat("no actor made progress for ", stall_s, " s and none is running a kernel (stall_timeout_s)")));
    }
    previous_poll = now;
    lock.lock();
  }
  return {};
}

// The stepped executor's bus: one FIFO, delivered by the caller.
class SteppedExecutor::Queue final : public MessageBus {
 public:
  void Send(const Message& message) override { messages.push_back(message); }
  std::deque<Message> messages;
};

// A stream the caller runs, item by item, on its own thread.
class SteppedExecutor::ManualStream final : public Stream {
 public:
  explicit ManualStream(std::string name) : name_(std::move(name)) {}
  void Enqueue(Work work) override { items_.emplace_back(std::move(work)); }
  void OnComplete(Callback done) override { items_.emplace_back(std::move(done)); }
  const std::string& name() const override { return name_; }
  int64_t busy_since_ns() const override { return 0; }
  absl::StatusOr<std::unique_ptr<Timer>> StartTimer() override {
    return absl::UnimplementedError("the stepped executor's streams time nothing (RuntimeOptions::profile)");
  }
  bool Shutdown(double) override {
    items_.clear();
    return true;
  }
  bool has_work() const { return !items_.empty(); }
  size_t items() const { return items_.size(); }
  // Runs the oldest item (a work's error is sticky, as on every stream).
  void RunOne() {
    Item item = std::move(items_.front());
    items_.pop_front();
    if (auto* work = std::get_if<Work>(&item)) {
      if (error_.ok()) error_ = (*work)();
    } else {
      std::get<Callback>(item)(error_);
    }
  }

 private:
  using Item = std::variant<Work, Callback>;
  std::string name_;
  std::deque<Item> items_;
  absl::Status error_;
};

SteppedExecutor::~SteppedExecutor() = default;

absl::StatusOr<std::unique_ptr<SteppedExecutor>> SteppedExecutor::Load(const proto::Plan& plan,
                                                                        RuntimeOptions options) {
  std::unique_ptr<SteppedExecutor> executor(new SteppedExecutor);
  executor->options_ = std::move(options);
  executor->queue_ = std::make_unique<Queue>();
  RETURN_IF_ERROR(CheckPlanSize(plan));
  SteppedExecutor* raw = executor.get();
  const auto make_stream = [raw](const Device&, std::string name) -> absl::StatusOr<std::unique_ptr<Stream>> {
    auto stream = std::make_unique<ManualStream>(std::move(name));
    raw->streams_.push_back(stream.get());
    return std::unique_ptr<Stream>(std::move(stream));
  };
  ASSIGN_OR_RETURN(executor->job_, internal::LoadedJob::Load(SerializePlan(plan), executor->options_,
                                                             executor->queue_.get(), make_stream));
  return executor;
}

void SteppedExecutor::Start() {
  for (const auto& actor : job_->actors) queue_->Send(Message::Cmd(actor->id(), Command::kStart));
}

const std::deque<Message>& SteppedExecutor::pending() const { return queue_->messages; }

absl::Status SteppedExecutor::Deliver(size_t position) {
  if (position >= queue_->messages.size()) {
    return absl::OutOfRangeError(StrCat("no pending message ", position, " of ", queue_->messages.size()));
  }
  const Message message = queue_->messages[position];
  queue_->messages.erase(queue_->messages.begin() + static_cast<std::ptrdiff_t>(position));
  auto it = job_->by_id.find(message.dst);
  if (it == job_->by_id.end()) return absl::InternalError(StrCat("message to unknown actor: ", message.ToString()));
  RETURN_IF_ERROR(it->second->Handle(message));
  return job_->arena->status();
}

std::vector<ArenaMonitor::Use> SteppedExecutor::ArenaUses() const { return job_->arena->Uses(); }

absl::StatusOr<bool> SteppedExecutor::Step() {
  if (queue_->messages.empty()) {
    const std::vector<size_t> busy = StreamsWithWork();
    if (busy.empty()) return false;
    RETURN_IF_ERROR(RunStream(busy.front()));
    return true;
  }
  RETURN_IF_ERROR(Deliver(0));
  return true;
}

std::vector<size_t> SteppedExecutor::StreamsWithWork() const {
  std::vector<size_t> busy;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i]->has_work()) busy.push_back(i);
  }
  return busy;
}

size_t SteppedExecutor::StreamItems(size_t stream) const {
  return stream < streams_.size() ? streams_[stream]->items() : 0;
}

absl::Status SteppedExecutor::RunStream(size_t stream) {
  if (stream >= streams_.size() || !streams_[stream]->has_work()) {
    return absl::OutOfRangeError(StrCat("stream ", stream, " has no work to run"));
  }
  streams_[stream]->RunOne();
  return job_->arena->status();
}

absl::Status SteppedExecutor::RunUntilIdle(int64_t max_steps) {
  for (int64_t i = 0; i < max_steps; ++i) {
    ASSIGN_OR_RETURN(bool stepped, Step());
    if (!stepped) return absl::OkStatus();
  }
  return absl::DeadlineExceededError(StrCat("still busy after ", max_steps, " messages"));
}

const Actor& SteppedExecutor::actor(uint64_t actor_id) const {
  auto it = job_->by_id.find(actor_id);
  TESSERA_CHECK(it != job_->by_id.end(), "no actor ", ActorIdToString(actor_id));
  return *it->second;
}

bool SteppedExecutor::AllDone() const {
  for (const auto& actor : job_->actors) {
    if (!actor->done()) return false;
  }
  return true;
}

}  // namespace tessera::actors
