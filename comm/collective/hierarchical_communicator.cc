#include "comm/collective/hierarchical_communicator.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "comm/collective/internal/reduce.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::comm {
namespace {

using internal::BytePtr;
using internal::Kind;
using internal::KindName;
using internal::Offsets;
using internal::Overlap;
using internal::ReduceFn;
using internal::ReduceFor;
using internal::Reducible;

// One member's call as issued.
struct Call {
  Kind kind = Kind::kAllReduce;
  Tensor input;
  Tensor output;  // Broadcast: the buffer
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<int64_t> counts;
  std::vector<int64_t> recv_counts;
  DoneFn done;
  std::string invalid;  // the member's own argument error, "" when valid
  std::chrono::steady_clock::time_point issued;
};

// A call as every node sees it after the exchange: one record per member,
// kRecordHeader words then counts[p] and recv_counts[p].
struct Record {
  bool valid = false;
  Kind kind = Kind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int64_t root = 0;
  int64_t elements = 0;  // AllReduce, Broadcast
  std::vector<int64_t> counts;
  std::vector<int64_t> recv_counts;
};
constexpr size_t kRecordHeader = 6;
size_t RecordWords(int p) { return kRecordHeader + 2 * static_cast<size_t>(p); }

void EncodeRecord(const Call& c, int p, int64_t* words) {
  const bool valid = c.invalid.empty();
  words[0] = valid ? 1 : 0;
  words[1] = static_cast<int64_t>(c.kind);
  words[2] = static_cast<int64_t>(c.kind == Kind::kBroadcast ? c.output.dtype() : c.input.dtype());
  words[3] = c.op == ReduceOp::kMax ? 1 : 0;
  words[4] = c.root;
  words[5] = c.kind == Kind::kBroadcast ? c.output.NumElements() : c.input.NumElements();
  for (int i = 0; i < p; ++i) {
    const size_t u = static_cast<size_t>(i);
    words[kRecordHeader + u] = valid && u < c.counts.size() ? c.counts[u] : 0;
    words[kRecordHeader + static_cast<size_t>(p) + u] = valid && u < c.recv_counts.size() ? c.recv_counts[u] : 0;
  }
}

Record DecodeRecord(const int64_t* words, int p) {
  Record r;
  r.valid =
      words[0] == 1 && words[1] >= 1 && words[1] <= 5 && words[2] >= 0 && words[2] <= static_cast<int64_t>(DType::kF64);
  if (!r.valid) return r;
  r.kind = static_cast<Kind>(words[1]);
  r.dtype = static_cast<DType>(words[2]);
  r.op = words[3] == 1 ? ReduceOp::kMax : ReduceOp::kSum;
  r.root = words[4];
  r.elements = words[5];
  r.counts.assign(words + kRecordHeader, words + kRecordHeader + p);
  r.recv_counts.assign(words + kRecordHeader + p, words + kRecordHeader + 2 * p);
  return r;
}

std::string RecordText(const Record& r) {
  const std::string_view dtype = DTypeName(r.dtype);
  switch (r.kind) {
    case Kind::kAllReduce:
      return StrCat("AllReduce(", dtype, " x ", r.elements, ", ", ReduceOpName(r.op), ")");
    case Kind::kAllGather:
      return StrCat("AllGather(", dtype, ", counts [", Join(r.counts, ", "), "])");
    case Kind::kReduceScatter:
      return StrCat("ReduceScatter(", dtype, ", counts [", Join(r.counts, ", "), "], ", ReduceOpName(r.op), ")");
    case Kind::kAllToAll:
      return StrCat("AllToAll(", dtype, ", send [", Join(r.counts, ", "), "], recv [", Join(r.recv_counts, ", "), "])");
    case Kind::kBroadcast:
      return StrCat("Broadcast(", dtype, " x ", r.elements, ", root ", r.root, ")");
  }
  return "?";
}

bool SameCall(const Record& a, const Record& b) {
  if (a.kind != b.kind || a.dtype != b.dtype) return false;
  switch (a.kind) {
    case Kind::kAllReduce:
      return a.op == b.op && a.elements == b.elements;
    case Kind::kReduceScatter:
      return a.op == b.op && a.counts == b.counts;
    case Kind::kAllGather:
      return a.counts == b.counts;
    case Kind::kBroadcast:
      return a.root == b.root && a.elements == b.elements;
    case Kind::kAllToAll:
      return true;  // checked pairwise
  }
  return false;
}

// Every buffer below is written in full before it is read (no zeroing).
absl::StatusOr<Tensor> Buffer(DType dtype, int64_t elements) { return Tensor::Empty(Shape{elements}, dtype); }

// Runs one op of the leaders communicator and waits for it (every op
// completes: by its transport's timeout or an abort at the latest).
absl::Status Wait(const std::function<void(DoneFn)>& issue) {
  auto promise = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = promise->get_future();
  issue([promise](absl::Status status) { promise->set_value(std::move(status)); });
  return result.get();
}

}  // namespace

class HierarchicalGroup {
 public:
  HierarchicalGroup(std::string name, HierarchicalLayout layout, std::shared_ptr<Communicator> leaders)
      : name_(std::move(name)), layout_(std::move(layout)), leaders_(std::move(leaders)) {
    const int p = size();
    int nodes = 0;
    for (int n : layout_.node_of) nodes = std::max(nodes, n + 1);
    members_of_.resize(static_cast<size_t>(nodes));
    position_.resize(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) {
      auto& list = members_of_[static_cast<size_t>(layout_.node_of[static_cast<size_t>(r)])];
      position_[static_cast<size_t>(r)] = static_cast<int>(list.size());
      list.push_back(r);
    }
    pending_.resize(local().size());
    thread_ = std::thread([this] { Loop(); });
  }

  ~HierarchicalGroup() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (aborted_.ok()) aborted_ = absl::CancelledError(StrCat(name_, ": destroyed"));
    }
    work_.notify_all();
    thread_.join();  // callbacks must not release the last member (header)
    // Calls whose fellow members never came.
    std::vector<DoneFn> left;
    absl::Status reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reason = aborted_;
      for (auto& queue : pending_) {
        for (Call& c : queue) left.push_back(std::move(c.done));
        queue.clear();
      }
    }
    for (DoneFn& done : left) done(reason);
  }

  int size() const { return static_cast<int>(layout_.node_of.size()); }
  int nodes() const { return static_cast<int>(members_of_.size()); }
  const std::vector<int>& local() const { return members_of_[static_cast<size_t>(layout_.this_node)]; }
  const std::string& name() const { return name_; }
  std::string Describe(int rank) const {
    return StrCat("hierarchical group '", name_, "' rank ", rank, "/", size(), " (node ", layout_.this_node, " of ",
                  nodes(), ", ", local().size(), " members here)");
  }

  void Issue(int local_index, Call call) {
    absl::Status refusal;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) {
        refusal = aborted_;
      } else {
        call.issued = std::chrono::steady_clock::now();
        pending_[static_cast<size_t>(local_index)].push_back(std::move(call));
      }
    }
    if (!refusal.ok()) return call.done(std::move(refusal));
    work_.notify_all();
  }

  void Abort(absl::Status reason) {
    if (reason.ok()) reason = absl::CancelledError("aborted");
    std::vector<DoneFn> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.ok()) aborted_ = reason;
      for (auto& queue : pending_) {
        for (Call& c : queue) failed.push_back(std::move(c.done));
        queue.clear();
      }
    }
    leaders_->Abort(reason);
    for (DoneFn& done : failed) done(reason);
    work_.notify_all();
  }

  // Argument errors of member `rank`'s call, "" when valid.
  std::string Check(int rank, const Call& c) const {
    const int p = size();
    const auto tensor = [](const char* what, const Tensor& t) -> std::string {
      if (!t.defined()) return StrCat(what, " is undefined");
      if (t.device().type != DeviceType::kCpu) return StrCat(what, " is on ", t.device().ToString(), " (CPU only)");
      return "";
    };
    const auto counts = [p](const char* what, const std::vector<int64_t>& v, int64_t* sum) -> std::string {
      if (static_cast<int>(v.size()) != p) return StrCat(what, " has ", v.size(), " entries for ", p, " ranks");
      *sum = 0;
      for (int64_t x : v) {
        if (x < 0) return StrCat(what, " has a negative entry ", x);
        *sum += x;
      }
      return "";
    };
    std::string error;
    if (c.kind == Kind::kBroadcast) {
      error = tensor("buffer", c.output);
      if (error.empty() && (c.root < 0 || c.root >= p)) error = StrCat("root ", c.root, " is outside [0, ", p, ")");
      return error;
    }
    error = tensor("input", c.input);
    if (error.empty()) error = tensor("output", c.output);
    if (!error.empty()) return error;
    if (c.input.dtype() != c.output.dtype()) {
      return StrCat("input is ", DTypeName(c.input.dtype()), " but output ", DTypeName(c.output.dtype()));
    }
    const bool reduces = c.kind == Kind::kAllReduce || c.kind == Kind::kReduceScatter;
    if (reduces && !Reducible(c.input.dtype())) return StrCat("no reduction of ", DTypeName(c.input.dtype()));
    int64_t sum = 0;
    int64_t received = 0;
    switch (c.kind) {
      case Kind::kAllReduce:
        if (c.output.NumElements() != c.input.NumElements()) {
          return StrCat("output has ", c.output.NumElements(), " elements but input ", c.input.NumElements());
        }
        if (Overlap(c.input, c.output) && BytePtr(c.input) != BytePtr(c.output)) {
          return "output partially overlaps input";
        }
        return "";
      case Kind::kAllGather:
      case Kind::kReduceScatter: {
        error = counts("counts", c.counts, &sum);
        if (!error.empty()) return error;
        const bool gather = c.kind == Kind::kAllGather;
        const Tensor& mine = gather ? c.input : c.output;
        const Tensor& whole = gather ? c.output : c.input;
        if (mine.NumElements() != c.counts[static_cast<size_t>(rank)]) {
          return StrCat(gather ? "input" : "output", " has ", mine.NumElements(), " elements but counts[", rank,
                        "] is ", c.counts[static_cast<size_t>(rank)]);
        }
        if (whole.NumElements() != sum) {
          return StrCat(gather ? "output" : "input", " has ", whole.NumElements(), " elements but counts sum to ", sum);
        }
        return Overlap(c.input, c.output) ? "output overlaps input" : "";
      }
      case Kind::kAllToAll:
        error = counts("send_counts", c.counts, &sum);
        if (error.empty()) error = counts("recv_counts", c.recv_counts, &received);
        if (!error.empty()) return error;
        if (c.input.NumElements() != sum) {
          return StrCat("input has ", c.input.NumElements(), " elements but send_counts sum to ", sum);
        }
        if (c.output.NumElements() != received) {
          return StrCat("output has ", c.output.NumElements(), " elements but recv_counts sum to ", received);
        }
        return Overlap(c.input, c.output) ? "output overlaps input" : "";
      case Kind::kBroadcast:
        break;
    }
    return "";
  }

 private:
  void Loop() {
    for (;;) {
      std::vector<Call> calls;
      absl::Status aborted;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const auto waiting = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || Ready(); };
        while (!waiting()) {
          // A member that never issues its call must not hold the others
          // forever: after the timeout the group fails, as gloo's ops do.
          const auto deadline = OldestDeadline();
          if (deadline == std::chrono::steady_clock::time_point::max()) {
            work_.wait(lock);
          } else if (work_.wait_until(lock, deadline) == std::cv_status::timeout && !waiting() &&
                     std::chrono::steady_clock::now() >= OldestDeadline()) {
            lock.unlock();
            Abort(absl::DeadlineExceededError(StrCat(name_, ": a member on this node did not issue its collective #",
                                                     seq_, " within ", absl::FormatDuration(layout_.timeout),
                                                     " of the others")));
            lock.lock();
          }
        }
        if (!Ready()) return;  // stopping; the destructor fails what is left
        for (auto& queue : pending_) {
          calls.push_back(std::move(queue.front()));
          queue.pop_front();
        }
        aborted = aborted_;
      }
      absl::Status status = aborted.ok() ? Run(calls) : aborted;
      ++seq_;
      for (Call& c : calls) {
        if (!c.invalid.empty()) {
          c.done(absl::InvalidArgumentError(StrCat(KindName(c.kind), " in ", name_, ": ", c.invalid)));
        } else {
          c.done(status);
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      free_since_ = std::chrono::steady_clock::now();
    }
  }

  // When the longest-waiting call times out (far future when none waits),
  // counted from when the group could take it: a call issued while the
  // group still ran the previous collective (the leaders' exchanges may
  // take a timeout's worth each) does not wait for a late member meanwhile.
  std::chrono::steady_clock::time_point OldestDeadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto oldest = std::chrono::steady_clock::time_point::max();
    for (const auto& queue : pending_) {
      if (!queue.empty()) oldest = std::min(oldest, queue.front().issued);
    }
    if (oldest == std::chrono::steady_clock::time_point::max()) return oldest;
    oldest = std::max(oldest, free_since_);
    const auto limit = std::chrono::steady_clock::time_point::max() - oldest;
    const auto timeout = absl::ToChronoNanoseconds(layout_.timeout);  // saturates when infinite
    if (timeout >= limit) return std::chrono::steady_clock::time_point::max();
    return oldest + timeout;
  }

  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& queue : pending_) {
      if (queue.empty()) return false;
    }
    return true;
  }

  absl::Status Failure(const std::string& what, const std::string& cause) const {
    return absl::InvalidArgumentError(StrCat(what, " in ", name_, " failed: ", cause));
  }

  // One collective: every local member's call (in rank order of `local()`).
  absl::Status Run(std::vector<Call>& calls) {
    const int p = size();
    const std::vector<int>& here = local();
    // The calls of every member, node-major, through the leaders.
    const size_t words = RecordWords(p);
    ASSIGN_OR_RETURN(Tensor mine, Buffer(DType::kI64, static_cast<int64_t>(words * here.size())));
    for (size_t i = 0; i < calls.size(); ++i) EncodeRecord(calls[i], p, mine.data<int64_t>() + i * words);
    ASSIGN_OR_RETURN(Tensor all, Buffer(DType::kI64, static_cast<int64_t>(words) * p));
    std::vector<int64_t> record_counts(static_cast<size_t>(nodes()));
    for (int n = 0; n < nodes(); ++n) {
      record_counts[static_cast<size_t>(n)] = static_cast<int64_t>(words * members_of_[static_cast<size_t>(n)].size());
    }
    RETURN_IF_ERROR(Wait([&](DoneFn done) { leaders_->AllGather(mine, all, record_counts, std::move(done)); }));
    const std::vector<int64_t> record_offsets = Offsets(record_counts);
    std::vector<Record> records(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) {
      const size_t node = static_cast<size_t>(layout_.node_of[static_cast<size_t>(r)]);
      records[static_cast<size_t>(r)] = DecodeRecord(
          all.data<int64_t>() + record_offsets[node] + position_[static_cast<size_t>(r)] * static_cast<int64_t>(words),
          p);
    }
    const std::string what = StrCat(KindName(records[0].valid ? records[0].kind : calls[0].kind), " #", seq_);
    for (int r = 0; r < p; ++r) {
      if (!records[static_cast<size_t>(r)].valid) {
        return Failure(what, StrCat("rank ", r, "'s call was invalid (its own error says why)"));
      }
    }
    const Record& first = records[0];
    for (int r = 1; r < p; ++r) {
      if (!SameCall(first, records[static_cast<size_t>(r)])) {
        return absl::InvalidArgumentError(StrCat("mismatched collective ", what, " in ", name_, ": rank 0 called ",
                                                 RecordText(first), " but rank ", r, " called ",
                                                 RecordText(records[static_cast<size_t>(r)])));
      }
    }
    if (first.kind == Kind::kAllToAll) {
      for (int s = 0; s < p; ++s) {
        for (int d = 0; d < p; ++d) {
          const int64_t sent = records[static_cast<size_t>(s)].counts[static_cast<size_t>(d)];
          const int64_t expected = records[static_cast<size_t>(d)].recv_counts[static_cast<size_t>(s)];
          if (sent != expected) {
            return absl::InvalidArgumentError(StrCat("mismatched collective ", what, " in ", name_, ": rank ", s,
                                                     " sends ", sent, " elements to rank ", d, " but rank ", d,
                                                     " expects ", expected));
          }
        }
      }
    }
    switch (first.kind) {
      case Kind::kAllReduce:
        return AllReduce(first, calls);
      case Kind::kReduceScatter:
        return ReduceScatter(first, calls);
      case Kind::kAllGather:
        return AllGather(first, calls);
      case Kind::kAllToAll:
        return AllToAll(records, calls);
      case Kind::kBroadcast:
        return Broadcast(first, calls);
    }
    return absl::OkStatus();
  }

  // Leaders' AllToAll of `send` (send_counts[m] to node m) into `recv`.
  absl::Status Exchange(const Tensor& send, const std::vector<int64_t>& send_counts, const Tensor& recv,
                        const std::vector<int64_t>& recv_counts) {
    return Wait([&](DoneFn done) { leaders_->AllToAll(send, send_counts, recv, recv_counts, std::move(done)); });
  }

  size_t MembersOn(int node) const { return members_of_[static_cast<size_t>(node)].size(); }

  absl::Status AllReduce(const Record& call, std::vector<Call>& calls) {
    const int64_t n = call.elements;
    if (n == 0) return absl::OkStatus();
    const int nn = nodes(), me = layout_.this_node;
    const size_t es = DTypeSize(call.dtype);
    const size_t here = calls.size();
    std::vector<int64_t> chunk(static_cast<size_t>(nn));
    for (int m = 0; m < nn; ++m) chunk[static_cast<size_t>(m)] = n / nn + (m < n % nn ? 1 : 0);
    const std::vector<int64_t> chunk_at = Offsets(chunk);
    const int64_t my_chunk = chunk[static_cast<size_t>(me)];
    // To node m: each local member's slice of chunk m; from node m: each of
    // its members' slice of my chunk.
    std::vector<int64_t> send_counts(static_cast<size_t>(nn)), recv_counts(static_cast<size_t>(nn));
    for (int m = 0; m < nn; ++m) {
      send_counts[static_cast<size_t>(m)] = static_cast<int64_t>(here) * chunk[static_cast<size_t>(m)];
      recv_counts[static_cast<size_t>(m)] = static_cast<int64_t>(MembersOn(m)) * my_chunk;
    }
    ASSIGN_OR_RETURN(Tensor send, Buffer(call.dtype, static_cast<int64_t>(here) * n));
    char* out = BytePtr(send);
    for (int m = 0; m < nn; ++m) {
      for (const Call& c : calls) {
        const size_t bytes = static_cast<size_t>(chunk[static_cast<size_t>(m)]) * es;
        std::memcpy(out, BytePtr(c.input) + static_cast<size_t>(chunk_at[static_cast<size_t>(m)]) * es, bytes);
        out += bytes;
      }
    }
    ASSIGN_OR_RETURN(Tensor recv, Buffer(call.dtype, static_cast<int64_t>(size()) * my_chunk));
    RETURN_IF_ERROR(Exchange(send, send_counts, recv, recv_counts));
    // Reduce my chunk over every member in rank order.
    const std::vector<int64_t> from = Offsets(recv_counts);
    std::vector<const void*> inputs(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      const size_t node = static_cast<size_t>(layout_.node_of[static_cast<size_t>(r)]);
      inputs[static_cast<size_t>(r)] =
          BytePtr(recv) + static_cast<size_t>(from[node] + position_[static_cast<size_t>(r)] * my_chunk) * es;
    }
    ASSIGN_OR_RETURN(Tensor reduced, Buffer(call.dtype, my_chunk));
    if (my_chunk > 0) ReduceFor(call.dtype, call.op)(inputs, {BytePtr(reduced)}, 0, my_chunk);
    // Every node's reduced chunk to every node, into the first member's
    // output; the other members copy it.
    Tensor& result = calls[0].output;
    RETURN_IF_ERROR(Wait([&](DoneFn done) { leaders_->AllGather(reduced, result, chunk, std::move(done)); }));
    for (size_t i = 1; i < here; ++i) std::memcpy(BytePtr(calls[i].output), BytePtr(result), result.NumBytes());
    return absl::OkStatus();
  }

  absl::Status ReduceScatter(const Record& call, std::vector<Call>& calls) {
    const int nn = nodes(), me = layout_.this_node;
    const size_t es = DTypeSize(call.dtype);
    const size_t here = calls.size();
    const std::vector<int64_t>& counts = call.counts;
    const std::vector<int64_t> at = Offsets(counts);
    std::vector<int64_t> node_total(static_cast<size_t>(nn), 0);
    for (int r = 0; r < size(); ++r) {
      node_total[static_cast<size_t>(layout_.node_of[static_cast<size_t>(r)])] += counts[static_cast<size_t>(r)];
    }
    // To node m: for each of its members d, each local member's chunk d.
    std::vector<int64_t> send_counts(static_cast<size_t>(nn)), recv_counts(static_cast<size_t>(nn));
    for (int m = 0; m < nn; ++m) {
      send_counts[static_cast<size_t>(m)] = static_cast<int64_t>(here) * node_total[static_cast<size_t>(m)];
      recv_counts[static_cast<size_t>(m)] = static_cast<int64_t>(MembersOn(m)) * node_total[static_cast<size_t>(me)];
    }
    ASSIGN_OR_RETURN(Tensor send, Buffer(call.dtype, Offsets(send_counts).back()));
    char* out = BytePtr(send);
    for (int m = 0; m < nn; ++m) {
      for (int d : members_of_[static_cast<size_t>(m)]) {
        const size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(d)]) * es;
        for (const Call& c : calls) {
          std::memcpy(out, BytePtr(c.input) + static_cast<size_t>(at[static_cast<size_t>(d)]) * es, bytes);
          out += bytes;
        }
      }
    }
    ASSIGN_OR_RETURN(Tensor recv, Buffer(call.dtype, Offsets(recv_counts).back()));
    RETURN_IF_ERROR(Exchange(send, send_counts, recv, recv_counts));
    // From node m: for each local member d (in order), each of m's members'
    // chunk d. Reduce each d's chunk over every member in rank order.
    const std::vector<int64_t> from = Offsets(recv_counts);
    std::vector<const void*> inputs(static_cast<size_t>(size()));
    int64_t before = 0;  // elements of the local members' chunks before d's
    for (size_t i = 0; i < here; ++i) {
      const int d = local()[i];
      const int64_t count = counts[static_cast<size_t>(d)];
      for (int r = 0; r < size(); ++r) {
        const int node = layout_.node_of[static_cast<size_t>(r)];
        const int64_t offset = from[static_cast<size_t>(node)] + before * static_cast<int64_t>(MembersOn(node)) +
                               position_[static_cast<size_t>(r)] * count;
        inputs[static_cast<size_t>(r)] = BytePtr(recv) + static_cast<size_t>(offset) * es;
      }
      if (count > 0) ReduceFor(call.dtype, call.op)(inputs, {BytePtr(calls[i].output)}, 0, count);
      before += count;
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const Record& call, std::vector<Call>& calls) {
    const int nn = nodes();
    const size_t es = DTypeSize(call.dtype);
    const std::vector<int64_t>& counts = call.counts;
    const std::vector<int64_t> at = Offsets(counts);
    std::vector<int64_t> node_total(static_cast<size_t>(nn), 0);
    for (int r = 0; r < size(); ++r) {
      node_total[static_cast<size_t>(layout_.node_of[static_cast<size_t>(r)])] += counts[static_cast<size_t>(r)];
    }
    ASSIGN_OR_RETURN(Tensor mine, Buffer(call.dtype, node_total[static_cast<size_t>(layout_.this_node)]));
    char* out = BytePtr(mine);
    for (const Call& c : calls) {
      std::memcpy(out, BytePtr(c.input), c.input.NumBytes());
      out += c.input.NumBytes();
    }
    ASSIGN_OR_RETURN(Tensor gathered, Buffer(call.dtype, at.back()));
    RETURN_IF_ERROR(Wait([&](DoneFn done) { leaders_->AllGather(mine, gathered, node_total, std::move(done)); }));
    // Node-major to rank order.
    const std::vector<int64_t> node_at = Offsets(node_total);
    std::vector<int64_t> within(static_cast<size_t>(nn), 0);
    for (int r = 0; r < size(); ++r) {
      const size_t node = static_cast<size_t>(layout_.node_of[static_cast<size_t>(r)]);
      const size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(r)]) * es;
      const char* piece = BytePtr(gathered) + static_cast<size_t>(node_at[node] + within[node]) * es;
      for (const Call& c : calls)
        std::memcpy(BytePtr(c.output) + static_cast<size_t>(at[static_cast<size_t>(r)]) * es, piece, bytes);
      within[node] += counts[static_cast<size_t>(r)];
    }
    return absl::OkStatus();
  }

  absl::Status AllToAll(const std::vector<Record>& records, std::vector<Call>& calls) {
    const int nn = nodes(), me = layout_.this_node;
    const DType dtype = records[0].dtype;
    const size_t es = DTypeSize(dtype);
    // Pieces s -> d: records[s].counts[d] elements at send offset s_at[s][d]
    // of s's input and receive offset d_at[d][s] of d's output.
    const auto piece = [&](int s, int d) { return records[static_cast<size_t>(s)].counts[static_cast<size_t>(d)]; };
    std::vector<int64_t> send_counts(static_cast<size_t>(nn), 0), recv_counts(static_cast<size_t>(nn), 0);
    for (int m = 0; m < nn; ++m) {
      for (int s : local()) {
        for (int d : members_of_[static_cast<size_t>(m)]) send_counts[static_cast<size_t>(m)] += piece(s, d);
      }
      for (int s : members_of_[static_cast<size_t>(m)]) {
        for (int d : local()) recv_counts[static_cast<size_t>(m)] += piece(s, d);
      }
    }
    ASSIGN_OR_RETURN(Tensor send, Buffer(dtype, Offsets(send_counts).back()));
    char* out = BytePtr(send);
    for (int m = 0; m < nn; ++m) {
      for (size_t i = 0; i < calls.size(); ++i) {
        const std::vector<int64_t> s_at = Offsets(calls[i].counts);
        for (int d : members_of_[static_cast<size_t>(m)]) {
          const size_t bytes = static_cast<size_t>(piece(local()[i], d)) * es;
          std::memcpy(out, BytePtr(calls[i].input) + static_cast<size_t>(s_at[static_cast<size_t>(d)]) * es, bytes);
          out += bytes;
        }
      }
    }
    ASSIGN_OR_RETURN(Tensor recv, Buffer(dtype, Offsets(recv_counts).back()));
    RETURN_IF_ERROR(Exchange(send, send_counts, recv, recv_counts));
    const char* in = BytePtr(recv);
    for (int m = 0; m < nn; ++m) {
      for (int s : members_of_[static_cast<size_t>(m)]) {
        for (size_t i = 0; i < calls.size(); ++i) {
          const std::vector<int64_t> d_at = Offsets(calls[i].recv_counts);
          const size_t bytes = static_cast<size_t>(piece(s, local()[i])) * es;
          std::memcpy(BytePtr(calls[i].output) + static_cast<size_t>(d_at[static_cast<size_t>(s)]) * es, in, bytes);
          in += bytes;
        }
      }
    }
    (void)me;
    return absl::OkStatus();
  }

  absl::Status Broadcast(const Record& call, std::vector<Call>& calls) {
    if (call.elements == 0) return absl::OkStatus();
    const int root = static_cast<int>(call.root);
    const int root_node = layout_.node_of[static_cast<size_t>(root)];
    // The buffer the leaders send from (the root's) or receive into (the
    // first local member's).
    size_t source = 0;
    if (root_node == layout_.this_node) source = static_cast<size_t>(position_[static_cast<size_t>(root)]);
    Tensor& buffer = calls[source].output;
    if (nodes() > 1) {
      RETURN_IF_ERROR(Wait([&](DoneFn done) { leaders_->Broadcast(buffer, root_node, std::move(done)); }));
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      if (i != source) std::memcpy(BytePtr(calls[i].output), BytePtr(buffer), buffer.NumBytes());
    }
    return absl::OkStatus();
  }

  const std::string name_;
  const HierarchicalLayout layout_;
  const std::shared_ptr<Communicator> leaders_;
  std::vector<std::vector<int>> members_of_;  // [node] -> members, rank order
  std::vector<int> position_;                 // [member] -> index in its node's list
  uint64_t seq_ = 0;                          // the loop thread's own

  std::mutex mu_;
  std::condition_variable work_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<Call>> pending_ ABSL_GUARDED_BY(mu_);  // [local index]
  // When the last collective's callbacks had run (the group free again).
  std::chrono::steady_clock::time_point free_since_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

namespace {

class HierarchicalMember final : public Communicator {
 public:
  HierarchicalMember(std::shared_ptr<HierarchicalGroup> group, int rank, int local_index)
      : group_(std::move(group)), rank_(rank), local_index_(local_index) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string Describe() const override { return group_->Describe(rank_); }

  void AllReduce(const Tensor& input, Tensor output, ReduceOp op, DoneFn done) override {
    Call c = Begin(Kind::kAllReduce, input, std::move(output));
    c.op = op;
    Issue(std::move(c), std::move(done));
  }
  void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts, DoneFn done) override {
    Call c = Begin(Kind::kAllGather, input, std::move(output));
    c.counts = std::move(counts);
    Issue(std::move(c), std::move(done));
  }
  void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts, ReduceOp op,
                     DoneFn done) override {
    Call c = Begin(Kind::kReduceScatter, input, std::move(output));
    c.counts = std::move(counts);
    c.op = op;
    Issue(std::move(c), std::move(done));
  }
  void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output, std::vector<int64_t> recv_counts,
                DoneFn done) override {
    Call c = Begin(Kind::kAllToAll, input, std::move(output));
    c.counts = std::move(send_counts);
    c.recv_counts = std::move(recv_counts);
    Issue(std::move(c), std::move(done));
  }
  void Broadcast(Tensor buffer, int root, DoneFn done) override {
    Call c = Begin(Kind::kBroadcast, Tensor(), std::move(buffer));
    c.root = root;
    Issue(std::move(c), std::move(done));
  }
  void Send(const Tensor& input, int peer, DoneFn done) override { PointToPoint("Send", std::move(done)); }
  void Recv(Tensor output, int peer, DoneFn done) override { PointToPoint("Recv", std::move(done)); }
  void Abort(absl::Status reason) override { group_->Abort(std::move(reason)); }

 private:
  static Call Begin(Kind kind, const Tensor& input, Tensor output) {
    Call c;
    c.kind = kind;
    c.input = input;
    c.output = std::move(output);
    return c;
  }
  void Issue(Call c, DoneFn done) {
    c.done = std::move(done);
    c.invalid = group_->Check(rank_, c);
    group_->Issue(local_index_, std::move(c));
  }
  void PointToPoint(const char* op, DoneFn done) {
    done(absl::UnimplementedError(StrCat(op, " in ", Describe(),
                                         ": point-to-point is not offered by hierarchical groups (pipeline edges "
                                         "use groups of two members of their own)")));
  }

  const std::shared_ptr<HierarchicalGroup> group_;
  const int rank_;
  const int local_index_;
};

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> MakeHierarchical(std::string name, HierarchicalLayout layout,
                                                                            std::shared_ptr<Communicator> leaders) {
  if (layout.node_of.empty()) return absl::InvalidArgumentError(StrCat("hierarchical group '", name, "': no members"));
  int nodes = 0;
  for (int n : layout.node_of) {
    if (n < 0) return absl::InvalidArgumentError(StrCat("hierarchical group '", name, "': negative node index ", n));
    nodes = std::max(nodes, n + 1);
  }
  std::set<int> used(layout.node_of.begin(), layout.node_of.end());
  if (static_cast<int>(used.size()) != nodes) {
    return absl::InvalidArgumentError(
        StrCat("hierarchical group '", name, "': node indices must be 0 .. ", nodes - 1, ", each holding a member"));
  }
  if (layout.this_node < 0 || layout.this_node >= nodes) {
    return absl::InvalidArgumentError(
        StrCat("hierarchical group '", name, "': this node ", layout.this_node, " holds no member"));
  }
  if (layout.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(StrCat("hierarchical group '", name, "': the timeout must be positive, got ",
                                             absl::FormatDuration(layout.timeout)));
  }
  if (leaders == nullptr || leaders->size() != nodes || leaders->rank() != layout.this_node) {
    return absl::InvalidArgumentError(StrCat("hierarchical group '", name, "': the leaders communicator must have ",
                                             nodes, " ranks and be rank ", layout.this_node));
  }
  auto group = std::make_shared<HierarchicalGroup>(name, layout, std::move(leaders));
  std::vector<std::shared_ptr<Communicator>> members;
  for (size_t i = 0; i < group->local().size(); ++i) {
    members.push_back(std::make_shared<HierarchicalMember>(group, group->local()[i], static_cast<int>(i)));
  }
  return members;
}

bool NeedsHierarchy(const std::vector<uint32_t>& node_of_member) {
  std::set<uint32_t> nodes(node_of_member.begin(), node_of_member.end());
  return nodes.size() > 1 && nodes.size() < node_of_member.size();
}

}  // namespace tessera::comm
