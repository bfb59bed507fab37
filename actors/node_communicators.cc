#include "actors/node_communicators.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "comm/collective/gloo_communicator.h"
#include "comm/collective/hierarchical_communicator.h"
#include "comm/collective/nccl_communicator.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::actors {
namespace {

// Connects a gloo communicator of `options` through the KV store it is given,
// its rendezvous giving up once `cancel` is set.
std::function<absl::StatusOr<std::shared_ptr<comm::Communicator>>(comm::KvStore&, const std::atomic<bool>&)>
GlooConnect(comm::GlooOptions options) {
  return
      [options = std::move(options)](
          comm::KvStore& kv, const std::atomic<bool>& cancel) -> absl::StatusOr<std::shared_ptr<comm::Communicator>> {
        comm::CancellableKvStore view(kv, cancel);  // used by the rendezvous only, inside ConnectGloo
        ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> connected, comm::ConnectGloo(view, options));
        return std::shared_ptr<comm::Communicator>(std::move(connected));
      };
}

}  // namespace

// A communicator handed out before it connected (a gloo rendezvous, an NCCL
// group's creation): forwards every call once Connect succeeded; fails them
// before (which the runtime never does).
class NodeCommunicators::Deferred final : public comm::Communicator {
 public:
  // Connects through the KV store; may give up once `cancel` is set.
  using ConnectFn =
      std::function<absl::StatusOr<std::shared_ptr<comm::Communicator>>(comm::KvStore&, const std::atomic<bool>&)>;
  Deferred(ConnectFn connect, int rank, int size, std::string describe)
      : connect_(std::move(connect)), rank_(rank), size_(size), describe_(std::move(describe)) {}

  absl::Status Connect(comm::KvStore& kv, const std::atomic<bool>& cancel) {
    auto connected = connect_(kv, cancel);
    std::lock_guard<std::mutex> lock(mu_);
    if (!connected.ok()) return connected.status();
    real_ = *std::move(connected);
    if (!abort_reason_.ok()) real_->Abort(abort_reason_);
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Describe() const override { return describe_; }
  void AllReduce(const Tensor& input, Tensor output, comm::ReduceOp op, comm::DoneFn done) override {
    if (comm::Communicator* c = Get(done)) c->AllReduce(input, std::move(output), op, std::move(done));
  }
  void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts, comm::DoneFn done) override {
    if (comm::Communicator* c = Get(done)) c->AllGather(input, std::move(output), std::move(counts), std::move(done));
  }
  void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts, comm::ReduceOp op,
                     comm::DoneFn done) override {
    if (comm::Communicator* c = Get(done))
      c->ReduceScatter(input, std::move(output), std::move(counts), op, std::move(done));
  }
  void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output, std::vector<int64_t> recv_counts,
                comm::DoneFn done) override {
    if (comm::Communicator* c = Get(done)) {
      c->AllToAll(input, std::move(send_counts), std::move(output), std::move(recv_counts), std::move(done));
    }
  }
  void Broadcast(Tensor buffer, int root, comm::DoneFn done) override {
    if (comm::Communicator* c = Get(done)) c->Broadcast(std::move(buffer), root, std::move(done));
  }
  void Send(const Tensor& input, int peer, comm::DoneFn done) override {
    if (comm::Communicator* c = Get(done)) c->Send(input, peer, std::move(done));
  }
  void Recv(Tensor output, int peer, comm::DoneFn done) override {
    if (comm::Communicator* c = Get(done)) c->Recv(std::move(output), peer, std::move(done));
  }
  void Abort(absl::Status reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_reason_.ok()) abort_reason_ = reason.ok() ? absl::CancelledError("aborted") : reason;
    if (real_) real_->Abort(abort_reason_);
  }

 private:
  // The connected communicator, or null after failing `done`.
  comm::Communicator* Get(comm::DoneFn& done) {
    std::unique_lock<std::mutex> lock(mu_);
    if (real_) return real_.get();
    const absl::Status reason = abort_reason_.ok()
                                    ? absl::FailedPreconditionError(StrCat(describe_, ": used before it connected"))
                                    : abort_reason_;
    lock.unlock();
    done(reason);
    return nullptr;
  }

  const ConnectFn connect_;
  const int rank_, size_;
  const std::string describe_;
  std::mutex mu_;
  // Set once by Connect (before any op), then only read.
  std::shared_ptr<comm::Communicator> real_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
};

NodeCommunicators::NodeCommunicators(const proto::Plan& plan, NodeCommunicatorOptions options)
    : plan_(plan), options_(std::move(options)) {}

NodeCommunicators::~NodeCommunicators() = default;

absl::StatusOr<std::shared_ptr<comm::Communicator>> NodeCommunicators::Join(const std::string& group,
                                                                            const std::vector<uint32_t>& members,
                                                                            int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= members.size()) {
    return absl::InvalidArgumentError(StrCat("communicator '", group, "': member ", rank, " of ", members.size()));
  }
  bool spans = false;
  for (uint32_t member : members) {
    if (plan_.ranks_size() == 0) break;  // a one-node plan
    if (member >= static_cast<uint32_t>(plan_.ranks_size())) {
      return absl::InvalidArgumentError(StrCat("communicator '", group, "': rank ", member,
                                               " is not one of the plan's ", plan_.ranks_size(), " ranks"));
    }
    spans |= plan_.ranks(static_cast<int>(member)).node() != options_.node;
  }
  if (options_.gpus) return JoinNccl(group, members, rank);
  const int size = static_cast<int>(members.size());
  if (!spans) return options_.hub->Join(group, size, rank);
  if (options_.kv == nullptr) {
    return absl::FailedPreconditionError(StrCat("communicator '", group, "' spans nodes, but this runtime has no KV ",
                                                "store to meet its peers (a one-process run of a multi-node plan?)"));
  }
  std::vector<uint32_t> node_of(members.size());
  for (size_t i = 0; i < members.size(); ++i) node_of[i] = plan_.ranks(static_cast<int>(members[i])).node();
  if (comm::NeedsHierarchy(node_of)) return JoinHierarchical(group, node_of, rank);
  comm::GlooOptions gloo;
  gloo.group = StrCat(options_.kv_prefix, "/", group);
  gloo.rank = rank;
  gloo.size = size;
  gloo.hostname = options_.hostname;
  gloo.timeout = absl::Seconds(options_.timeout_s);
  auto deferred = std::make_shared<Deferred>(
      GlooConnect(gloo), rank, size,
      StrCat("gloo group '", group, "' rank ", rank, "/", size, " (node ", options_.node, ")"));
  pending_.push_back(deferred);
  return deferred;
}

absl::StatusOr<std::shared_ptr<comm::Communicator>> NodeCommunicators::JoinNccl(const std::string& group,
                                                                                const std::vector<uint32_t>& members,
                                                                                int rank) {
  const uint32_t global = members[static_cast<size_t>(rank)];
  uint32_t device = global;
  if (plan_.ranks_size() > 0) {
    const proto::RankLocation& where = plan_.ranks(static_cast<int>(global));
    if (where.node() != options_.node) {
      return absl::InvalidArgumentError(StrCat("communicator '", group, "': member ", rank, " (rank ", global,
                                               ") runs on node ", where.node(), ", not on this node ", options_.node));
    }
    device = where.device_index();
  }
  std::shared_ptr<GpuSequence>& sequence = sequences_[device];
  if (sequence == nullptr) sequence = std::make_shared<GpuSequence>();
  comm::NcclOptions nccl;
  nccl.group = group;
  nccl.rank = rank;
  nccl.size = static_cast<int>(members.size());
  nccl.device = static_cast<int>(device);
  nccl.kv_prefix = options_.kv_prefix;
  nccl.timeout_s = options_.timeout_s;
  auto connect = [nccl, sequence](
                     comm::KvStore& kv,
                     const std::atomic<bool>& cancel) mutable -> absl::StatusOr<std::shared_ptr<comm::Communicator>> {
    nccl.kv = &kv;
    nccl.cancel = &cancel;
    {
      // Made by the GPU's first member to connect (ConnectAll connects in
      // parallel).
      std::lock_guard<std::mutex> lock(sequence->mu);
      if (sequence->sequence == nullptr) {
        absl::StatusOr<std::shared_ptr<comm::NcclSequence>> made = comm::MakeNcclSequence(nccl.device);
        if (!made.ok()) {
          return absl::Status(made.status().code(), StrCat("nccl group '", nccl.group, "' rank ", nccl.rank, "/",
                                                           nccl.size, ": ", made.status().message()));
        }
        sequence->sequence = *std::move(made);
      }
      nccl.sequence = sequence->sequence;
    }
    return comm::MakeNcclCommunicator(nccl);
  };
  auto deferred = std::make_shared<Deferred>(std::move(connect), rank, nccl.size,
                                             StrCat("nccl group '", group, "' rank ", rank, "/", nccl.size,
                                                    " on cuda:", device, " (node ", options_.node, ")"));
  pending_.push_back(deferred);
  return deferred;
}

absl::StatusOr<std::shared_ptr<comm::Communicator>> NodeCommunicators::JoinHierarchical(
    const std::string& group, const std::vector<uint32_t>& node_of, int rank) {
  if (node_of[static_cast<size_t>(rank)] != options_.node) {
    return absl::InvalidArgumentError(StrCat("communicator '", group, "': member ", rank, " runs on node ",
                                             node_of[static_cast<size_t>(rank)], ", not on this node ", options_.node));
  }
  auto it = hierarchical_.find(group);
  if (it == hierarchical_.end()) {
    // Nodes by id -> their index among the group's nodes; the leaders are a
    // gloo group of one rank per node.
    std::set<uint32_t> ids(node_of.begin(), node_of.end());
    const std::vector<uint32_t> sorted(ids.begin(), ids.end());
    const auto index = [&](uint32_t id) {
      return static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), id) - sorted.begin());
    };
    comm::HierarchicalLayout layout;
    for (uint32_t id : node_of) layout.node_of.push_back(index(id));
    layout.this_node = index(options_.node);
    layout.timeout = absl::Seconds(options_.timeout_s);
    comm::GlooOptions gloo;
    gloo.group = StrCat(options_.kv_prefix, "/", group, "/nodes");
    gloo.rank = layout.this_node;
    gloo.size = static_cast<int>(sorted.size());
    gloo.hostname = options_.hostname;
    gloo.timeout = absl::Seconds(options_.timeout_s);
    auto leaders = std::make_shared<Deferred>(
        GlooConnect(gloo), gloo.rank, gloo.size,
        StrCat("gloo group '", group, "/nodes' rank ", gloo.rank, "/", gloo.size, " (node ", options_.node, ")"));
    pending_.push_back(leaders);
    ASSIGN_OR_RETURN(std::vector<std::shared_ptr<comm::Communicator>> local,
                     comm::MakeHierarchical(group, std::move(layout), leaders));
    it = hierarchical_.emplace(group, std::move(local)).first;
  }
  for (const std::shared_ptr<comm::Communicator>& member : it->second) {
    if (member->rank() == rank) return member;
  }
  return absl::InternalError(StrCat("communicator '", group, "': no local member ", rank));
}

namespace {

// The KV store as the connecting threads see it: once abandoned (ConnectAll
// gave up on a member stuck in gloo's TCP connect to a peer that died), every
// call fails without touching the store, which the job's end frees.
class AbandonableKvStore final : public comm::KvStore {
 public:
  explicit AbandonableKvStore(comm::KvStore& inner) : inner_(&inner) {}
  absl::Status Set(const std::string& key, std::string value) override {
    std::shared_lock lock(mu_);
    if (inner_ == nullptr) return Abandoned();
    return inner_->Set(key, std::move(value));
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    std::shared_lock lock(mu_);
    if (inner_ == nullptr) return Abandoned();
    return inner_->Get(key);
  }
  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::shared_lock lock(mu_);
    if (inner_ == nullptr) return Abandoned();
    return inner_->Wait(keys, timeout);
  }
  // Waits for the calls in flight (the connecting threads' waits end once
  // `failed` is set: CancellableKvStore), then fails every later one.
  void Abandon() {
    std::unique_lock lock(mu_);
    inner_ = nullptr;
  }

 private:
  static absl::Status Abandoned() { return absl::CancelledError("kv: the connection was given up"); }
  std::shared_mutex mu_;
  comm::KvStore* inner_;  // under mu_; null once abandoned
};

// What the connecting threads share with ConnectAll, and keep alive when it
// no longer waits for them.
struct ConnectState {
  explicit ConnectState(comm::KvStore& store) : kv(store) {}
  AbandonableKvStore kv;
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable changed;
  int running = 0;                    // under mu
  std::vector<absl::Status> results;  // under mu
};

// How long the members still connecting get, once one failed or the job was
// stopped, before ConnectAll returns without them: their rendezvous waits
// end within 100 ms of `failed`; a TCP connect to a peer that died does not
// (gloo retries it until its timeout).
constexpr auto kGiveUpGrace = std::chrono::seconds(1);

}  // namespace

absl::Status NodeCommunicators::ConnectAll() {
  if (pending_.empty()) return absl::OkStatus();
  // NCCL groups of a one-process runtime meet in a store of their own
  // (gloo ones were refused by Join without a KV store).
  if (options_.kv == nullptr && own_kv_ == nullptr) own_kv_ = std::make_unique<comm::InProcessKvStore>();
  comm::KvStore& kv = options_.kv != nullptr ? *options_.kv : *own_kv_;
  auto state = std::make_shared<ConnectState>(kv);
  state->running = static_cast<int>(pending_.size());
  state->results.assign(pending_.size(), absl::OkStatus());
  // The first failure makes the others give up waiting for their peers:
  // the load fails anyway. So does the job's stop (options_.cancel).
  std::vector<std::thread> threads;
  threads.reserve(pending_.size());
  absl::Status started;
  for (size_t i = 0; i < pending_.size(); ++i) {
    try {
      threads.emplace_back([state, member = pending_[i], i]() {
        const absl::Status result = member->Connect(state->kv, state->failed);
        if (!result.ok()) state->failed = true;
        std::lock_guard<std::mutex> lock(state->mu);
        state->results[i] = result;
        --state->running;
        state->changed.notify_all();
      });
    } catch (const std::exception& e) {
      // (A thread the system refuses: the load fails, the started members
      // give up as after a failure; std::terminate ended the process.)
      started = absl::ResourceExhaustedError(
          StrCat("cannot start a thread to connect communicator ", i + 1, " of ", pending_.size(), ": ", e.what()));
      state->failed = true;
      std::lock_guard<std::mutex> lock(state->mu);
      state->running -= static_cast<int>(pending_.size() - i);
      break;
    }
  }
  pending_.clear();
  bool stopped = false;
  std::unique_lock<std::mutex> lock(state->mu);
  while (state->running > 0 && !state->failed.load()) {
    if (options_.cancel != nullptr && options_.cancel->load()) {
      stopped = true;
      state->failed = true;
      break;
    }
    state->changed.wait_for(lock, std::chrono::milliseconds(10));
  }
  // A member that failed or a stop: the others get kGiveUpGrace to notice;
  // one stuck connecting to a dead peer is left behind (its thread ends at
  // gloo's timeout, touching only `state`), so a stop is not held up by it.
  const bool all_done = state->changed.wait_for(lock, kGiveUpGrace, [&state] { return state->running == 0; });
  const std::vector<absl::Status> results = state->results;
  const int left = state->running;
  lock.unlock();
  if (all_done) {
    for (std::thread& t : threads) t.join();
  } else {
    state->kv.Abandon();
    for (std::thread& t : threads) t.detach();
  }
  if (stopped) return absl::CancelledError("the job was stopped while its communicators met their peers");
  RETURN_IF_ERROR(started);
  // The cause, not the members that gave up because of it.
  for (const absl::Status& status : results) {
    if (!status.ok() && status.code() != absl::StatusCode::kCancelled) return status;
  }
  for (const absl::Status& status : results) RETURN_IF_ERROR(status);
  if (left > 0) return absl::CancelledError("communicators gave up connecting");
  return absl::OkStatus();
}

}  // namespace tessera::actors
