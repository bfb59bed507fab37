#include "comm/collective/shm_communicator.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/collective/internal/reduce.h"
#include "core/text.h"

namespace tessera::comm {
namespace internal {
namespace {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast };

const char* KindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "AllReduce";
    case CollectiveKind::kAllGather: return "AllGather";
    case CollectiveKind::kReduceScatter: return "ReduceScatter";
    case CollectiveKind::kAllToAll: return "AllToAll";
    case CollectiveKind::kBroadcast: return "Broadcast";
  }
  return "?";
}

bool IsReduction(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter;
}

}  // namespace

// One rank's k-th collective as issued. `counts` is what must agree across
// ranks: {n} for all-reduce and broadcast, the per-rank counts for gathers and
// reduce-scatter, send counts for all-to-all (whose recv_counts are checked
// against the peers' send counts instead).
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<int64_t> counts;
  std::vector<int64_t> recv_counts;
  Tensor input;
  Tensor output;
  DoneFn done;            // null once this rank has been told the outcome
  absl::Status invalid;   // an argument error, already reported to this rank
};

namespace {

// "AllReduce(f32 x 10, sum)", "AllGather(bf16, counts [1, 0, 2])", ...
std::string Signature(const CollectiveCall& c) {
  if (!c.invalid.ok()) return StrCat(KindName(c.kind), " with invalid arguments (", c.invalid.message(), ")");
  const std::string_view dtype = DTypeName(c.dtype);
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      return StrCat("AllReduce(", dtype, " x ", c.counts[0], ", ", ReduceOpName(c.op), ")");
    case CollectiveKind::kAllGather:
      return StrCat("AllGather(", dtype, ", counts [", Join(c.counts, ", "), "])");
    case CollectiveKind::kReduceScatter:
      return StrCat("ReduceScatter(", dtype, ", counts [", Join(c.counts, ", "), "], ",
                    ReduceOpName(c.op), ")");
    case CollectiveKind::kAllToAll:
      return StrCat("AllToAll(", dtype, ", send [", Join(c.counts, ", "), "], recv [",
                    Join(c.recv_counts, ", "), "])");
    case CollectiveKind::kBroadcast:
      return StrCat("Broadcast(", dtype, " x ", c.counts[0], ", root ", c.root, ")");
  }
  return "?";
}

bool SameCall(const CollectiveCall& a, const CollectiveCall& b) {
  if (a.kind != b.kind || a.dtype != b.dtype) return false;
  if (IsReduction(a.kind) && a.op != b.op) return false;
  if (a.kind == CollectiveKind::kBroadcast && a.root != b.root) return false;
  if (a.kind == CollectiveKind::kAllToAll) return true;  // counts checked pairwise
  return a.counts == b.counts;
}

struct Notice {
  DoneFn done;
  absl::Status status;
};

void Deliver(std::vector<Notice>& notices) {
  for (Notice& n : notices) n.done(std::move(n.status));
}

struct Copy {
  char* dst;
  const char* src;
  size_t bytes;
};

}  // namespace

// The shared state of one group. Locking: mu_ guards the matching state only;
// ops execute and callbacks run with no lock held.
class ShmGroup {
 public:
  ShmGroup(std::string key, int size, ShmHub::Options options)
      : key_(std::move(key)),
        size_(size),
        options_(options),
        issued_(static_cast<size_t>(size), 0),
        joined_(static_cast<size_t>(size), false),
        left_(static_cast<size_t>(size), false),
        pairs_(static_cast<size_t>(size) * static_cast<size_t>(size)) {}

  const std::string& key() const { return key_; }
  int size() const { return size_; }

  absl::Status Claim(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    if (joined_[static_cast<size_t>(rank)]) {
      return absl::AlreadyExistsError(
          StrCat("ShmHub::Join: rank ", rank, " already joined shm group '", key_, "'"));
    }
    joined_[static_cast<size_t>(rank)] = true;
    return absl::OkStatus();
  }

  void Collective(int rank, CollectiveCall call);
  void Send(int src, int dst, Tensor input, DoneFn done) { PointToPoint(src, dst, true, std::move(input), std::move(done)); }
  void Recv(int dst, int src, Tensor output, DoneFn done) { PointToPoint(src, dst, false, std::move(output), std::move(done)); }
  void Abort(absl::Status reason);
  void Leave(int rank);

 private:
  struct Slot {
    std::vector<std::optional<CollectiveCall>> calls;
    int arrived = 0;
  };
  struct PointToPointCall {
    Tensor tensor;
    DoneFn done;
  };
  // Queued calls of one (sender, receiver) pair; at most one side is non-empty.
  struct PairQueue {
    std::deque<PointToPointCall> sends;
    std::deque<PointToPointCall> recvs;
    uint64_t matched = 0;  // pairs matched so far: the sequence number of the next
  };

  void PointToPoint(int src, int dst, bool is_send, Tensor tensor, DoneFn done);
  absl::Status CheckMatch(uint64_t seq, const std::vector<CollectiveCall>& calls) const;
  void Execute(const std::vector<CollectiveCall>& calls);
  void Reduce(DType dtype, ReduceOp op, const std::vector<const void*>& inputs,
              const std::vector<void*>& outputs, int64_t n);
  void CopyAll(const std::vector<Copy>& copies);
  void Transfer(uint64_t seq, int src, int dst, PointToPointCall send, PointToPointCall recv);
  absl::Status DepartedError(const char* what, uint64_t seq, int departed) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PairQueue& Pair(int src, int dst) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pairs_[static_cast<size_t>(src) * static_cast<size_t>(size_) + static_cast<size_t>(dst)];
  }

  const std::string key_;
  const int size_;
  const ShmHub::Options options_;

  std::mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> issued_ ABSL_GUARDED_BY(mu_);  // collectives issued per rank
  std::vector<bool> joined_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> left_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);  // pending, by sequence number
  std::vector<PairQueue> pairs_ ABSL_GUARDED_BY(mu_);    // [src * size + dst]
};

absl::Status ShmGroup::DepartedError(const char* what, uint64_t seq, int departed) const {
  return absl::FailedPreconditionError(
      StrCat(what, " #", seq, " in shm group '", key_, "': rank ", departed,
             " left the group (its communicator was destroyed) after ",
             issued_[static_cast<size_t>(departed)], " collectives, so it never issued this one"));
}

void ShmGroup::Collective(int rank, CollectiveCall call) {
  std::vector<Notice> notices;
  std::optional<Slot> ready;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!call.invalid.ok()) notices.push_back({std::exchange(call.done, nullptr), call.invalid});
    if (!aborted_.ok()) {
      if (call.done) notices.push_back({std::move(call.done), aborted_});
    } else {
      seq = issued_[static_cast<size_t>(rank)]++;
      std::optional<int> departed;
      for (int q = 0; q < size_; ++q) {
        if (left_[static_cast<size_t>(q)] && issued_[static_cast<size_t>(q)] <= seq) departed = q;
      }
      if (departed) {
        if (call.done) notices.push_back({std::move(call.done), DepartedError(KindName(call.kind), seq, *departed)});
      } else {
        Slot& slot = slots_[seq];
        if (slot.calls.empty()) slot.calls.resize(static_cast<size_t>(size_));
        slot.calls[static_cast<size_t>(rank)] = std::move(call);
        if (++slot.arrived == size_) {
          ready = std::move(slot);
          slots_.erase(seq);
        }
      }
    }
  }
  Deliver(notices);
  if (!ready) return;

  std::vector<CollectiveCall> calls;
  calls.reserve(static_cast<size_t>(size_));
  for (auto& c : ready->calls) calls.push_back(std::move(*c));
  const absl::Status status = CheckMatch(seq, calls);
  if (status.ok()) Execute(calls);
  for (CollectiveCall& c : calls) {
    if (c.done) c.done(status);
  }
}

absl::Status ShmGroup::CheckMatch(uint64_t seq, const std::vector<CollectiveCall>& calls) const {
  for (int r = 0; r < size_; ++r) {
    const CollectiveCall& c = calls[static_cast<size_t>(r)];
    if (!c.invalid.ok()) {
      return absl::InvalidArgumentError(StrCat(KindName(c.kind), " #", seq, " in shm group '", key_,
                                               "' failed: rank ", r, "'s call was invalid (",
                                               c.invalid.message(), ")"));
    }
  }
  const CollectiveCall& first = calls[0];
  for (int r = 1; r < size_; ++r) {
    const CollectiveCall& c = calls[static_cast<size_t>(r)];
    if (!SameCall(first, c)) {
      return absl::InvalidArgumentError(StrCat("mismatched collective #", seq, " in shm group '", key_,
                                               "': rank 0 called ", Signature(first), " but rank ",
                                               r, " called ", Signature(c)));
    }
  }
  if (first.kind == CollectiveKind::kAllToAll) {
    for (int s = 0; s < size_; ++s) {
      for (int d = 0; d < size_; ++d) {
        const CollectiveCall& sender = calls[static_cast<size_t>(s)];
        const CollectiveCall& receiver = calls[static_cast<size_t>(d)];
        const int64_t sent = sender.counts[static_cast<size_t>(d)];
        const int64_t expected = receiver.recv_counts[static_cast<size_t>(s)];
        if (sent != expected) {
          return absl::InvalidArgumentError(StrCat(
              "mismatched collective #", seq, " in shm group '", key_, "': rank ", s, " called ",
              Signature(sender), " sending ", sent, " elements to rank ", d, " but rank ", d,
              " called ", Signature(receiver), " expecting ", expected, " from rank ", s));
        }
      }
    }
  }
  return absl::OkStatus();
}

void ShmGroup::Reduce(DType dtype, ReduceOp op, const std::vector<const void*>& inputs,
                      const std::vector<void*>& outputs, int64_t n) {
  if (n == 0) return;
  const ReduceFn fn = ReduceFor(dtype, op);
  // Chunks are disjoint element ranges and each element is combined in rank
  // order whatever the split, so the pool changes speed, never bits.
  ThreadPool* pool = n >= options_.min_parallel_elements ? options_.pool : nullptr;
  const int64_t min_chunk = std::max<int64_t>(4096, options_.min_parallel_elements / 4);
  ParallelFor(pool, n, min_chunk, [&](int64_t begin, int64_t end) { fn(inputs, outputs, begin, end); });
}

void ShmGroup::CopyAll(const std::vector<Copy>& copies) {
  size_t total = 0;
  for (const Copy& c : copies) total += c.bytes;
  const bool parallel = total >= static_cast<size_t>(options_.min_parallel_elements) * 4;
  ParallelFor(parallel ? options_.pool : nullptr, static_cast<int64_t>(copies.size()), 1,
              [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) {
                  const Copy& c = copies[static_cast<size_t>(i)];
                  if (c.bytes > 0 && c.dst != c.src) std::memcpy(c.dst, c.src, c.bytes);
                }
              });
}

void ShmGroup::Execute(const std::vector<CollectiveCall>& calls) {
  const CollectiveCall& first = calls[0];
  const size_t element_size = DTypeSize(first.dtype);
  const size_t p = calls.size();
  switch (first.kind) {
    case CollectiveKind::kAllReduce: {
      std::vector<const void*> inputs;
      std::vector<void*> outputs;
      for (const CollectiveCall& c : calls) {
        inputs.push_back(c.input.raw_data());
        outputs.push_back(c.output.raw_data());
      }
      Reduce(first.dtype, first.op, inputs, outputs, first.counts[0]);
      return;
    }
    case CollectiveKind::kReduceScatter: {
      const std::vector<int64_t> offsets = Offsets(first.counts);
      for (size_t r = 0; r < p; ++r) {
        std::vector<const void*> inputs;
        for (const CollectiveCall& c : calls) {
          inputs.push_back(BytePtr(c.input) + static_cast<size_t>(offsets[r]) * element_size);
        }
        Reduce(first.dtype, first.op, inputs, {calls[r].output.raw_data()}, first.counts[r]);
      }
      return;
    }
    case CollectiveKind::kAllGather: {
      const std::vector<int64_t> offsets = Offsets(first.counts);
      std::vector<Copy> copies;
      for (size_t d = 0; d < p; ++d) {
        for (size_t s = 0; s < p; ++s) {
          copies.push_back({BytePtr(calls[d].output) + static_cast<size_t>(offsets[s]) * element_size,
                            BytePtr(calls[s].input), static_cast<size_t>(first.counts[s]) * element_size});
        }
      }
      CopyAll(copies);
      return;
    }
    case CollectiveKind::kAllToAll: {
      std::vector<Copy> copies;
      for (size_t d = 0; d < p; ++d) {
        const std::vector<int64_t> recv_offsets = Offsets(calls[d].recv_counts);
        for (size_t s = 0; s < p; ++s) {
          const std::vector<int64_t> send_offsets = Offsets(calls[s].counts);
          copies.push_back({BytePtr(calls[d].output) + static_cast<size_t>(recv_offsets[s]) * element_size,
                            BytePtr(calls[s].input) + static_cast<size_t>(send_offsets[d]) * element_size,
                            static_cast<size_t>(calls[s].counts[d]) * element_size});
        }
      }
      CopyAll(copies);
      return;
    }
    case CollectiveKind::kBroadcast: {
      const Tensor& source = calls[static_cast<size_t>(first.root)].output;
      std::vector<Copy> copies;
      for (size_t r = 0; r < p; ++r) {
        if (static_cast<int>(r) == first.root) continue;
        copies.push_back({BytePtr(calls[r].output), BytePtr(source), source.NumBytes()});
      }
      CopyAll(copies);
      return;
    }
  }
}

void ShmGroup::PointToPoint(int src, int dst, bool is_send, Tensor tensor, DoneFn done) {
  std::vector<Notice> notices;
  std::optional<std::pair<PointToPointCall, PointToPointCall>> match;  // (send, recv)
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PairQueue& pair = Pair(src, dst);
    std::deque<PointToPointCall>& other = is_send ? pair.recvs : pair.sends;
    std::deque<PointToPointCall>& mine = is_send ? pair.sends : pair.recvs;
    const int peer = is_send ? dst : src;
    if (!aborted_.ok()) {
      notices.push_back({std::move(done), aborted_});
    } else if (!other.empty()) {
      seq = pair.matched++;
      PointToPointCall mine_call{std::move(tensor), std::move(done)};
      if (is_send) {
        match.emplace(std::move(mine_call), std::move(other.front()));
      } else {
        match.emplace(std::move(other.front()), std::move(mine_call));
      }
      other.pop_front();
    } else if (left_[static_cast<size_t>(peer)]) {
      notices.push_back(
          {std::move(done),
           absl::FailedPreconditionError(StrCat(
               is_send ? "Send" : "Recv", " #", pair.matched + mine.size(), " from rank ", src,
               " to rank ", dst, " in shm group '", key_, "': rank ", peer,
               " left the group (its communicator was destroyed)"))});
    } else {
      mine.push_back({std::move(tensor), std::move(done)});
    }
  }
  Deliver(notices);
  if (match) Transfer(seq, src, dst, std::move(match->first), std::move(match->second));
}

void ShmGroup::Transfer(uint64_t seq, int src, int dst, PointToPointCall send, PointToPointCall recv) {
  absl::Status status;
  if (send.tensor.dtype() != recv.tensor.dtype() ||
      send.tensor.NumElements() != recv.tensor.NumElements()) {
    status = absl::InvalidArgumentError(StrCat(
        "mismatched Send/Recv #", seq, " from rank ", src, " to rank ", dst, " in shm group '", key_,
        "': rank ", src, " sends ", DTypeName(send.tensor.dtype()), " x ", send.tensor.NumElements(),
        " but rank ", dst, " receives ", DTypeName(recv.tensor.dtype()), " x ",
        recv.tensor.NumElements()));
  } else {
    CopyAll(std::vector<Copy>{Copy{BytePtr(recv.tensor), BytePtr(send.tensor), send.tensor.NumBytes()}});
  }
  recv.done(status);
  send.done(status);
}

void ShmGroup::Abort(absl::Status reason) {
  if (reason.ok()) reason = absl::CancelledError(StrCat("shm group '", key_, "' aborted"));
  std::vector<Notice> notices;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.ok()) return;  // the first reason sticks; everything pending already failed
    aborted_ = reason;
    for (auto& [seq, slot] : slots_) {
      for (auto& call : slot.calls) {
        if (call && call->done) notices.push_back({std::move(call->done), reason});
      }
    }
    slots_.clear();
    for (PairQueue& pair : pairs_) {
      for (auto* queue : {&pair.sends, &pair.recvs}) {
        for (PointToPointCall& c : *queue) notices.push_back({std::move(c.done), reason});
        queue->clear();
      }
    }
  }
  Deliver(notices);
}

void ShmGroup::Leave(int rank) {
  std::vector<Notice> notices;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left_[static_cast<size_t>(rank)] = true;
    // Slots from the departed rank's next collective on can never fill.
    const uint64_t first_missing = issued_[static_cast<size_t>(rank)];
    for (auto it = slots_.lower_bound(first_missing); it != slots_.end();) {
      for (auto& call : it->second.calls) {
        if (call && call->done) {
          notices.push_back({std::move(call->done), DepartedError(KindName(call->kind), it->first, rank)});
        }
      }
      it = slots_.erase(it);
    }
    // Sends to it and receives from it wait for calls it will never make; its
    // own queued sends and receives can still be matched by the others.
    for (int peer = 0; peer < size_; ++peer) {
      PairQueue& to_departed = Pair(peer, rank);
      for (PointToPointCall& c : to_departed.sends) {
        notices.push_back({std::move(c.done),
                           absl::FailedPreconditionError(StrCat(
                               "Send from rank ", peer, " to rank ", rank, " in shm group '", key_,
                               "': rank ", rank, " left the group (its communicator was destroyed)"))});
      }
      to_departed.sends.clear();
      PairQueue& from_departed = Pair(rank, peer);
      for (PointToPointCall& c : from_departed.recvs) {
        notices.push_back({std::move(c.done),
                           absl::FailedPreconditionError(StrCat(
                               "Recv from rank ", rank, " on rank ", peer, " in shm group '", key_,
                               "': rank ", rank, " left the group (its communicator was destroyed)"))});
      }
      from_departed.recvs.clear();
    }
  }
  Deliver(notices);
}

namespace {

// One rank's handle. Checks arguments locally (so the message can name the
// rank's own argument), then hands the call to the group.
class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::shared_ptr<ShmGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  ~ShmCommunicator() override { group_->Leave(rank_); }
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string Describe() const override {
    return StrCat("shm group '", group_->key(), "' rank ", rank_, "/", group_->size());
  }

  void AllReduce(const Tensor& input, Tensor output, ReduceOp op, DoneFn done) override {
    CollectiveCall call = Begin(CollectiveKind::kAllReduce, input, std::move(output), std::move(done));
    call.op = op;
    call.invalid = CheckAllReduce(call);
    call.counts = {input.defined() ? input.NumElements() : 0};
    group_->Collective(rank_, std::move(call));
  }

  void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts, DoneFn done) override {
    CollectiveCall call = Begin(CollectiveKind::kAllGather, input, std::move(output), std::move(done));
    call.counts = std::move(counts);
    call.invalid = CheckGatherLike(call);
    group_->Collective(rank_, std::move(call));
  }

  void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts, ReduceOp op,
                     DoneFn done) override {
    CollectiveCall call = Begin(CollectiveKind::kReduceScatter, input, std::move(output), std::move(done));
    call.counts = std::move(counts);
    call.op = op;
    call.invalid = CheckGatherLike(call);
    group_->Collective(rank_, std::move(call));
  }

  void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output,
                std::vector<int64_t> recv_counts, DoneFn done) override {
    CollectiveCall call = Begin(CollectiveKind::kAllToAll, input, std::move(output), std::move(done));
    call.counts = std::move(send_counts);
    call.recv_counts = std::move(recv_counts);
    call.invalid = CheckAllToAll(call);
    group_->Collective(rank_, std::move(call));
  }

  void Broadcast(Tensor buffer, int root, DoneFn done) override {
    CollectiveCall call = Begin(CollectiveKind::kBroadcast, Tensor(), std::move(buffer), std::move(done));
    call.root = root;
    call.invalid = CheckBroadcast(call);
    call.counts = {call.output.defined() ? call.output.NumElements() : 0};
    group_->Collective(rank_, std::move(call));
  }

  void Send(const Tensor& input, int peer, DoneFn done) override {
    absl::Status status = CheckPeer("Send", peer);
    if (status.ok()) status = CheckTensor("Send", "input", input);
    if (!status.ok()) return done(std::move(status));
    group_->Send(rank_, peer, input, std::move(done));
  }

  void Recv(Tensor output, int peer, DoneFn done) override {
    absl::Status status = CheckPeer("Recv", peer);
    if (status.ok()) status = CheckTensor("Recv", "output", output);
    if (!status.ok()) return done(std::move(status));
    group_->Recv(rank_, peer, std::move(output), std::move(done));
  }

  void Abort(absl::Status reason) override { group_->Abort(std::move(reason)); }

 private:
  CollectiveCall Begin(CollectiveKind kind, const Tensor& input, Tensor output, DoneFn done) const {
    CollectiveCall call;
    call.kind = kind;
    call.input = input;
    call.output = std::move(output);
    call.dtype = kind == CollectiveKind::kBroadcast ? call.output.dtype() : input.dtype();
    call.done = std::move(done);
    return call;
  }

  absl::Status Error(std::string_view op, const std::string& what) const {
    return absl::InvalidArgumentError(StrCat(op, " in shm group '", group_->key(), "' rank ", rank_,
                                             "/", group_->size(), ": ", what));
  }

  absl::Status CheckTensor(std::string_view op, std::string_view name, const Tensor& t) const {
    if (!t.defined()) return Error(op, StrCat(name, " is undefined"));
    if (t.device().type != DeviceType::kCpu) {
      return Error(op, StrCat(name, " is on ", t.device().ToString(),
                              "; the shm communicator moves CPU tensors only"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckPeer(std::string_view op, int peer) const {
    if (peer < 0 || peer >= group_->size()) {
      return Error(op, StrCat("peer ", peer, " is outside [0, ", group_->size(), ")"));
    }
    return absl::OkStatus();
  }

  // Both tensors defined on the CPU, same dtype, reducible when the op reduces.
  absl::Status CheckPair(const CollectiveCall& c) const {
    const char* op = KindName(c.kind);
    RETURN_IF_ERROR(CheckTensor(op, "input", c.input));
    RETURN_IF_ERROR(CheckTensor(op, "output", c.output));
    if (c.output.dtype() != c.input.dtype()) {
      return Error(op, StrCat("output dtype ", DTypeName(c.output.dtype()), " differs from input dtype ",
                              DTypeName(c.input.dtype())));
    }
    if (IsReduction(c.kind) && !Reducible(c.input.dtype())) {
      return Error(op, StrCat("input dtype ", DTypeName(c.input.dtype()), " cannot be reduced"));
    }
    return absl::OkStatus();
  }

  // Checks `counts` (one non-negative entry per rank); sets *sum.
  absl::Status CheckCounts(std::string_view op, std::string_view name, const std::vector<int64_t>& counts,
                           int64_t* sum) const {
    if (static_cast<int>(counts.size()) != group_->size()) {
      return Error(op, StrCat(name, " has ", counts.size(), " entries for a group of ", group_->size()));
    }
    *sum = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] < 0) return Error(op, StrCat(name, "[", r, "] = ", counts[r], " is negative"));
      if (__builtin_add_overflow(*sum, counts[r], sum)) return Error(op, StrCat(name, " overflow int64"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckAllReduce(const CollectiveCall& c) const {
    RETURN_IF_ERROR(CheckPair(c));
    if (c.output.shape() != c.input.shape()) {
      return Error("AllReduce", StrCat("output shape ", c.output.shape().ToString(),
                                       " differs from input shape ", c.input.shape().ToString()));
    }
    if (Overlap(c.input, c.output) && c.input.raw_data() != c.output.raw_data()) {
      return Error("AllReduce", "output partially overlaps input (in place needs the same bytes)");
    }
    return absl::OkStatus();
  }

  // AllGather: input = counts[rank], output = sum. ReduceScatter: the reverse.
  absl::Status CheckGatherLike(const CollectiveCall& c) const {
    const char* op = KindName(c.kind);
    RETURN_IF_ERROR(CheckPair(c));
    int64_t sum = 0;
    RETURN_IF_ERROR(CheckCounts(op, "counts", c.counts, &sum));
    const int64_t mine = c.counts[static_cast<size_t>(rank_)];
    const bool gather = c.kind == CollectiveKind::kAllGather;
    const Tensor& local = gather ? c.input : c.output;
    const Tensor& whole = gather ? c.output : c.input;
    const char* local_name = gather ? "input" : "output";
    const char* whole_name = gather ? "output" : "input";
    if (local.NumElements() != mine) {
      return Error(op, StrCat(local_name, " has ", local.NumElements(), " elements but counts[", rank_,
                              "] = ", mine));
    }
    if (whole.NumElements() != sum) {
      return Error(op, StrCat(whole_name, " has ", whole.NumElements(), " elements but counts sum to ", sum));
    }
    if (Overlap(c.input, c.output)) return Error(op, "output overlaps input");
    return absl::OkStatus();
  }

  absl::Status CheckAllToAll(const CollectiveCall& c) const {
    RETURN_IF_ERROR(CheckPair(c));
    int64_t sent = 0;
    int64_t received = 0;
    RETURN_IF_ERROR(CheckCounts("AllToAll", "send_counts", c.counts, &sent));
    RETURN_IF_ERROR(CheckCounts("AllToAll", "recv_counts", c.recv_counts, &received));
    if (c.input.NumElements() != sent) {
      return Error("AllToAll", StrCat("input has ", c.input.NumElements(),
                                      " elements but send_counts sum to ", sent));
    }
    if (c.output.NumElements() != received) {
      return Error("AllToAll", StrCat("output has ", c.output.NumElements(),
                                      " elements but recv_counts sum to ", received));
    }
    if (Overlap(c.input, c.output)) return Error("AllToAll", "output overlaps input");
    return absl::OkStatus();
  }

  absl::Status CheckBroadcast(const CollectiveCall& c) const {
    RETURN_IF_ERROR(CheckTensor("Broadcast", "buffer", c.output));
    if (c.root < 0 || c.root >= group_->size()) {
      return Error("Broadcast", StrCat("root ", c.root, " is outside [0, ", group_->size(), ")"));
    }
    return absl::OkStatus();
  }

  const std::shared_ptr<ShmGroup> group_;
  const int rank_;
};

}  // namespace
}  // namespace internal

absl::StatusOr<std::shared_ptr<Communicator>> ShmHub::Join(std::string group_key, int group_size,
                                                           int rank) {
  if (group_size < 1) {
    return absl::InvalidArgumentError(
        StrCat("ShmHub::Join: group '", group_key, "' size ", group_size, " must be at least 1"));
  }
  if (rank < 0 || rank >= group_size) {
    return absl::InvalidArgumentError(StrCat("ShmHub::Join: rank ", rank, " is outside [0, ", group_size,
                                             ") for group '", group_key, "'"));
  }
  std::shared_ptr<internal::ShmGroup> group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(groups_, [](const auto& entry) { return entry.second.expired(); });
    std::weak_ptr<internal::ShmGroup>& entry = groups_[group_key];
    group = entry.lock();
    if (!group) {
      group = std::make_shared<internal::ShmGroup>(group_key, group_size, options_);
      entry = group;
    } else if (group->size() != group_size) {
      return absl::InvalidArgumentError(StrCat("ShmHub::Join: shm group '", group_key, "' has ",
                                               group->size(), " ranks but rank ", rank,
                                               " joined with size ", group_size));
    }
  }
  RETURN_IF_ERROR(group->Claim(rank));
  return std::shared_ptr<Communicator>(std::make_shared<internal::ShmCommunicator>(std::move(group), rank));
}

}  // namespace tessera::comm
