#include "comm/collective/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "comm/collective/gloo_store.h"
#include "comm/collective/internal/reduce.h"
#include "core/status.h"
#include "core/text.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace tessera::comm {
namespace {

using internal::BytePtr;
using internal::Kind;
using internal::KindName;
using internal::Offsets;
using internal::Overlap;
using internal::ReduceFn;
using internal::ReduceFor;

using gloo::transport::UnboundBuffer;

bool IsReduction(Kind kind) { return kind == Kind::kAllReduce || kind == Kind::kReduceScatter; }
bool Reducible(DType dtype) { return dtype != DType::kBool && dtype != DType::kF64; }

// What must agree across ranks for one collective, as it travels in the
// descriptor exchange. `counts`: {n} for all-reduce and broadcast, the
// per-rank counts otherwise (send counts for all-to-all).
struct Signature {
  Kind kind = Kind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<int64_t> counts;
  std::vector<int64_t> recv_counts;
  std::string invalid;  // non-empty: the rank's own argument error
};

// A collective as issued by this rank.
struct CollectiveOp {
  Signature signature;
  Tensor input;
  Tensor output;
  DoneFn done;  // null when the caller was already told (invalid arguments)
};

// "AllReduce(f32 x 10, sum)", "AllGather(bf16, counts [1, 0, 2])", ...
std::string SignatureText(const Signature& s) {
  if (!s.invalid.empty()) return StrCat(KindName(s.kind), " with invalid arguments (", s.invalid, ")");
  const std::string_view dtype = DTypeName(s.dtype);
  switch (s.kind) {
    case Kind::kAllReduce:
      return StrCat("AllReduce(", dtype, " x ", s.counts[0], ", ", ReduceOpName(s.op), ")");
    case Kind::kAllGather:
      return StrCat("AllGather(", dtype, ", counts [", Join(s.counts, ", "), "])");
    case Kind::kReduceScatter:
      return StrCat("ReduceScatter(", dtype, ", counts [", Join(s.counts, ", "), "], ", ReduceOpName(s.op), ")");
    case Kind::kAllToAll:
      return StrCat("AllToAll(", dtype, ", send [", Join(s.counts, ", "), "], recv [", Join(s.recv_counts, ", "), "])");
    case Kind::kBroadcast:
      return StrCat("Broadcast(", dtype, " x ", s.counts[0], ", root ", s.root, ")");
  }
  return "?";
}

bool SameCall(const Signature& a, const Signature& b) {
  if (a.kind != b.kind || a.dtype != b.dtype) return false;
  if (IsReduction(a.kind) && a.op != b.op) return false;
  if (a.kind == Kind::kBroadcast && a.root != b.root) return false;
  if (a.kind == Kind::kAllToAll) return a.counts.size() == b.counts.size();  // counts checked pairwise
  return a.counts == b.counts;
}

// ---- Descriptor wire format -------------------------------------------------
// int64 words, little-endian hosts only (x86-64, aarch64): a header, then
// `p` counts and `p` receive counts (zero padded), then the invalid-call
// message (truncated). Every rank knows the size from p alone.
constexpr int64_t kMagic = 0x676c6f6f'00000001;  // "gloo", version 1
constexpr size_t kHeaderWords = 8;
constexpr size_t kMessageBytes = 120;

size_t DescriptorWords(int p) { return kHeaderWords + 2 * static_cast<size_t>(p) + kMessageBytes / 8; }

std::vector<int64_t> Encode(const Signature& s, int p) {
  std::vector<int64_t> words(DescriptorWords(p), 0);
  const bool valid = s.invalid.empty();
  words[0] = kMagic;
  words[1] = static_cast<int64_t>(s.kind);
  words[2] = static_cast<int64_t>(s.dtype);
  words[3] = static_cast<int64_t>(s.op);
  words[4] = s.root;
  words[5] = valid ? 0 : 1;
  // Invalid calls may carry counts of any length; only valid ones travel.
  const size_t counts = valid ? std::min(s.counts.size(), static_cast<size_t>(p)) : 0;
  const size_t recv_counts = valid ? std::min(s.recv_counts.size(), static_cast<size_t>(p)) : 0;
  words[6] = static_cast<int64_t>(counts);
  words[7] = static_cast<int64_t>(recv_counts);
  for (size_t i = 0; i < counts; ++i) words[kHeaderWords + i] = s.counts[i];
  for (size_t i = 0; i < recv_counts; ++i) words[kHeaderWords + static_cast<size_t>(p) + i] = s.recv_counts[i];
  const size_t n = std::min(s.invalid.size(), kMessageBytes - 1);
  std::memcpy(&words[kHeaderWords + 2 * static_cast<size_t>(p)], s.invalid.data(), n);
  return words;
}

// False for bytes that are no descriptor of ours (a peer of another version).
bool Decode(const int64_t* words, int p, Signature* s) {
  if (words[0] != kMagic || words[6] < 0 || words[6] > p || words[7] < 0 || words[7] > p) return false;
  s->kind = static_cast<Kind>(words[1]);
  s->dtype = static_cast<DType>(words[2]);
  s->op = static_cast<ReduceOp>(words[3]);
  s->root = static_cast<int>(words[4]);
  s->counts.assign(words + kHeaderWords, words + kHeaderWords + words[6]);
  s->recv_counts.assign(words + kHeaderWords + p, words + kHeaderWords + p + words[7]);
  s->invalid.clear();
  if (words[5] != 0) {
    const char* message = reinterpret_cast<const char*>(words + kHeaderWords + 2 * static_cast<size_t>(p));
    s->invalid.assign(message, strnlen(message, kMessageBytes - 1));
    if (s->invalid.empty()) s->invalid = "no message";
  }
  return true;
}

// Thrown inside an op when Abort woke one of its waits; caught at the op's
// boundary with gloo's own exceptions.
struct AbortedWait {};

// Point-to-point slots (on the p2p context): lane (sender, receiver), k-th
// transfer, and which of its three messages.
enum class P2pMessage : uint64_t { kSenderHeader = 0, kReceiverHeader = 1, kPayload = 2 };
uint64_t P2pSlot(int sender, int receiver, uint64_t k, P2pMessage message) {
  const uint64_t direction = sender < receiver ? 0 : 1;
  return ((k * 2 + direction) << 2) | static_cast<uint64_t>(message);
}

// Collective slots (on the collective context): k-th collective, phase.
enum class Phase : uint64_t { kDescriptor = 0, kScatter = 1, kGather = 2 };
uint64_t CollectiveSlot(uint64_t k, Phase phase) { return (k << 2) | static_cast<uint64_t>(phase); }

// Sender and receiver headers of one point-to-point transfer.
struct P2pHeader {
  int64_t magic = kMagic;
  int64_t dtype = 0;
  int64_t count = 0;
};

struct P2pOp {
  Tensor tensor;
  DoneFn done;
  uint64_t seq = 0;
};

class GlooCommunicator;

// One gloo unbound buffer over caller memory that Abort can wake. Counts what
// it posted so that WaitAll waits for exactly that.
class Transfer {
 public:
  Transfer(GlooCommunicator& comm, gloo::Context& context, void* ptr, size_t bytes);
  ~Transfer();
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  void Send(int peer, uint64_t slot, size_t offset, size_t bytes) {
    if (bytes == 0) return;
    buffer_->send(peer, slot, offset, bytes);
    ++sends_;
  }
  void Recv(int peer, uint64_t slot, size_t offset, size_t bytes) {
    if (bytes == 0) return;
    buffer_->recv(peer, slot, offset, bytes);
    ++recvs_;
  }
  // Waits for one posted receive. Throws AbortedWait or gloo's exceptions.
  void WaitRecv();
  void WaitSend();
  void WaitAll() {
    while (recvs_ > 0) WaitRecv();
    while (sends_ > 0) WaitSend();
  }
  UnboundBuffer& buffer() { return *buffer_; }

 private:
  GlooCommunicator& comm_;
  std::unique_ptr<UnboundBuffer> buffer_;
  int64_t sends_ = 0;
  int64_t recvs_ = 0;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(GlooOptions options, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> collective_context, std::shared_ptr<gloo::Context> p2p_context)
      : options_(std::move(options)),
        device_(std::move(device)),
        collective_context_(std::move(collective_context)),
        p2p_context_(std::move(p2p_context)),
        lanes_(2 * static_cast<size_t>(options_.size)) {
    collective_thread_ = std::thread([this] { CollectiveLoop(); });
  }

  ~GlooCommunicator() override {
    Fail(absl::CancelledError(StrCat(Describe(), ": the communicator was destroyed")), /*close=*/false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    collective_thread_.join();
    for (Lane& lane : lanes_) {
      if (lane.thread.joinable()) lane.thread.join();
    }
  }
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string Describe() const override {
    return StrCat("gloo group '", options_.group, "' rank ", options_.rank, "/", options_.size);
  }

  void AllReduce(const Tensor& input, Tensor output, ReduceOp op, DoneFn done) override {
    CollectiveOp c = Begin(Kind::kAllReduce, input, std::move(output), std::move(done));
    c.signature.op = op;
    c.signature.counts = {input.defined() ? input.NumElements() : 0};
    Issue(std::move(c));
  }

  void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts, DoneFn done) override {
    CollectiveOp c = Begin(Kind::kAllGather, input, std::move(output), std::move(done));
    c.signature.counts = std::move(counts);
    Issue(std::move(c));
  }

  void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts, ReduceOp op,
                     DoneFn done) override {
    CollectiveOp c = Begin(Kind::kReduceScatter, input, std::move(output), std::move(done));
    c.signature.counts = std::move(counts);
    c.signature.op = op;
    Issue(std::move(c));
  }

  void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output, std::vector<int64_t> recv_counts,
                DoneFn done) override {
    CollectiveOp c = Begin(Kind::kAllToAll, input, std::move(output), std::move(done));
    c.signature.counts = std::move(send_counts);
    c.signature.recv_counts = std::move(recv_counts);
    Issue(std::move(c));
  }

  void Broadcast(Tensor buffer, int root, DoneFn done) override {
    CollectiveOp c = Begin(Kind::kBroadcast, Tensor(), std::move(buffer), std::move(done));
    c.signature.root = root;
    c.signature.counts = {c.output.defined() ? c.output.NumElements() : 0};
    Issue(std::move(c));
  }

  void Send(const Tensor& input, int peer, DoneFn done) override { PointToPoint(true, input, peer, std::move(done)); }
  void Recv(Tensor output, int peer, DoneFn done) override { PointToPoint(false, output, peer, std::move(done)); }

  void Abort(absl::Status reason) override {
    if (reason.ok()) reason = absl::CancelledError(StrCat(Describe(), ": aborted"));
    Fail(std::move(reason), /*close=*/true);
  }

  // ---- For Transfer ----
  void Register(UnboundBuffer* buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    active_.insert(buffer);
    // A buffer made after the abort: its first wait returns at once.
    if (!aborted_.ok()) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }
  void Unregister(UnboundBuffer* buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    active_.erase(buffer);
  }
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.timeout)));
  }

 private:
  // Sends to peer (direction 0) and receives from peer (direction 1) of one
  // peer, served in order by the lane's thread.
  struct Lane {
    std::deque<P2pOp> queue;
    uint64_t issued = 0;
    std::thread thread;
  };

  CollectiveOp Begin(Kind kind, const Tensor& input, Tensor output, DoneFn done) const {
    CollectiveOp c;
    c.signature.kind = kind;
    c.input = input;
    c.output = std::move(output);
    c.signature.dtype = kind == Kind::kBroadcast ? c.output.dtype() : input.dtype();
    c.done = std::move(done);
    return c;
  }

  absl::Status Error(std::string_view op, const std::string& what) const {
    return absl::InvalidArgumentError(StrCat(op, " in ", Describe(), ": ", what));
  }

  absl::Status CheckTensor(std::string_view op, std::string_view name, const Tensor& t) const {
    if (!t.defined()) return Error(op, StrCat(name, " is undefined"));
    if (t.device().type != DeviceType::kCpu) {
      return Error(op,
                   StrCat(name, " is on ", t.device().ToString(), "; the gloo communicator moves CPU tensors only"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckPair(Kind kind, const Tensor& input, const Tensor& output) const {
    const char* op = KindName(kind);
    RETURN_IF_ERROR(CheckTensor(op, "input", input));
    RETURN_IF_ERROR(CheckTensor(op, "output", output));
    if (output.dtype() != input.dtype()) {
      return Error(op, StrCat("output dtype ", DTypeName(output.dtype()), " differs from input dtype ",
                              DTypeName(input.dtype())));
    }
    if (IsReduction(kind) && !Reducible(input.dtype())) {
      return Error(op, StrCat("input dtype ", DTypeName(input.dtype()), " cannot be reduced"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckCounts(std::string_view op, std::string_view name, const std::vector<int64_t>& counts,
                           int64_t* sum) const {
    if (static_cast<int>(counts.size()) != size()) {
      return Error(op, StrCat(name, " has ", counts.size(), " entries for a group of ", size()));
    }
    *sum = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] < 0) return Error(op, StrCat(name, "[", r, "] = ", counts[r], " is negative"));
      if (__builtin_add_overflow(*sum, counts[r], sum)) return Error(op, StrCat(name, " overflow int64"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckAllReduce(const Tensor& input, const Tensor& output) const {
    RETURN_IF_ERROR(CheckPair(Kind::kAllReduce, input, output));
    if (output.shape() != input.shape()) {
      return Error("AllReduce", StrCat("output shape ", output.shape().ToString(), " differs from input shape ",
                                       input.shape().ToString()));
    }
    if (Overlap(input, output) && input.raw_data() != output.raw_data()) {
      return Error("AllReduce", "output partially overlaps input (in place needs the same bytes)");
    }
    return absl::OkStatus();
  }

  absl::Status Check(const CollectiveOp& c) const {
    const Signature& s = c.signature;
    const char* op = KindName(s.kind);
    switch (s.kind) {
      case Kind::kAllReduce:
        return CheckAllReduce(c.input, c.output);
      case Kind::kAllGather:
      case Kind::kReduceScatter: {
        RETURN_IF_ERROR(CheckPair(s.kind, c.input, c.output));
        int64_t sum = 0;
        RETURN_IF_ERROR(CheckCounts(op, "counts", s.counts, &sum));
        const int64_t mine = s.counts[static_cast<size_t>(rank())];
        const bool gather = s.kind == Kind::kAllGather;
        const Tensor& local = gather ? c.input : c.output;
        const Tensor& whole = gather ? c.output : c.input;
        if (local.NumElements() != mine) {
          return Error(op, StrCat(gather ? "input" : "output", " has ", local.NumElements(), " elements but counts[",
                                  rank(), "] = ", mine));
        }
        if (whole.NumElements() != sum) {
          return Error(op, StrCat(gather ? "output" : "input", " has ", whole.NumElements(),
                                  " elements but counts sum to ", sum));
        }
        if (Overlap(c.input, c.output)) return Error(op, "output overlaps input");
        return absl::OkStatus();
      }
      case Kind::kAllToAll: {
        RETURN_IF_ERROR(CheckPair(s.kind, c.input, c.output));
        int64_t sent = 0;
        int64_t received = 0;
        RETURN_IF_ERROR(CheckCounts(op, "send_counts", s.counts, &sent));
        RETURN_IF_ERROR(CheckCounts(op, "recv_counts", s.recv_counts, &received));
        if (c.input.NumElements() != sent) {
          return Error(op, StrCat("input has ", c.input.NumElements(), " elements but send_counts sum to ", sent));
        }
        if (c.output.NumElements() != received) {
          return Error(op,
                       StrCat("output has ", c.output.NumElements(), " elements but recv_counts sum to ", received));
        }
        if (Overlap(c.input, c.output)) return Error(op, "output overlaps input");
        return absl::OkStatus();
      }
      case Kind::kBroadcast:
        RETURN_IF_ERROR(CheckTensor(op, "buffer", c.output));
        if (s.root < 0 || s.root >= size()) {
          return Error(op, StrCat("root ", s.root, " is outside [0, ", size(), ")"));
        }
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  // An invalid call is reported to the caller now and still takes its place
  // in the sequence, so the peers' matching op fails too.
  void Issue(CollectiveOp c) {
    absl::Status invalid = Check(c);
    if (!invalid.ok()) {
      c.signature.invalid = std::string(invalid.message());
      DoneFn done = std::exchange(c.done, nullptr);
      done(std::move(invalid));
    }
    DoneFn refused;
    absl::Status refusal;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) {
        refused = std::move(c.done);
        refusal = aborted_;
      } else {
        collectives_.push_back(std::move(c));
      }
    }
    if (refused) refused(std::move(refusal));
    work_.notify_all();
  }

  void CollectiveLoop() {
    uint64_t seq = 0;
    for (;;) {
      // The front op and, behind it, the queued ops it might be fused with.
      std::vector<CollectiveOp> held;
      absl::Status status;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !collectives_.empty(); });
        if (collectives_.empty()) return;
        held.push_back(std::move(collectives_.front()));
        collectives_.pop_front();
        status = aborted_;
        int64_t bytes = FusedBytes(held.front().signature);
        while (status.ok() && !collectives_.empty() && static_cast<int>(held.size()) <= MaxExtras() &&
               Fusable(held.front().signature, collectives_.front().signature)) {
          bytes += FusedBytes(collectives_.front().signature);
          if (bytes > options_.fuse_bytes) break;
          held.push_back(std::move(collectives_.front()));
          collectives_.pop_front();
        }
      }
      size_t fused = 1;
      if (status.ok()) status = RunCollective(held, seq, &fused);
      seq += fused;
      if (fused > 1 && options_.fused_ops) options_.fused_ops->fetch_add(static_cast<int64_t>(fused));
      // Ops held but not fused go back to the front, in order (after an abort
      // the next turn fails them).
      if (held.size() > fused) {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i = held.size(); i > fused; --i) collectives_.push_front(std::move(held[i - 1]));
      }
      for (size_t i = 0; i < fused; ++i) {
        if (held[i].done) held[i].done(status);
      }
    }
  }

  // ---- Fusion ----
  // Queued collectives of one kind go as one (many small gradient reductions
  // would cost a descriptor exchange and gloo's handshakes each): with the
  // front op's descriptor every rank sends the counts of the ops queued behind
  // it that it could be fused with, and all fuse the longest run every rank
  // has with the same counts. Fused ops are packed into one buffer, moved as
  // one op and unpacked; reductions stay element-wise in rank order, so
  // results do not change.

  // How many ops may be fused behind the front one: every rank knows it from
  // p alone (it sizes the descriptor message).
  int MaxExtras() const { return std::clamp(1024 / std::max(size(), 1), 0, 15); }

  static bool Fusable(const Signature& front, const Signature& next) {
    const bool kind_ok =
        front.kind == Kind::kAllReduce || front.kind == Kind::kReduceScatter || front.kind == Kind::kAllGather;
    return kind_ok && front.invalid.empty() && next.invalid.empty() && next.kind == front.kind &&
           next.dtype == front.dtype && (!IsReduction(front.kind) || next.op == front.op);
  }

  // The bytes of an op's whole logical tensor.
  static int64_t FusedBytes(const Signature& s) {
    int64_t elements = 0;
    for (int64_t c : s.counts) elements += c;
    return elements * static_cast<int64_t>(DTypeSize(s.dtype));
  }

  // The counts block of an op behind the front one: p words.
  static std::vector<int64_t> ExtraWords(const Signature& s, int p) {
    std::vector<int64_t> words(static_cast<size_t>(p), 0);
    for (size_t i = 0; i < s.counts.size() && i < words.size(); ++i) words[i] = s.counts[i];
    return words;
  }

  // The outcome of held[0] and of the *fused - 1 ops fused with it; a
  // transport failure also aborts the communicator.
  absl::Status RunCollective(std::vector<CollectiveOp>& held, uint64_t seq, size_t* fused) {
    const CollectiveOp& c = held.front();
    const std::string what = StrCat(KindName(c.signature.kind), " #", seq);
    int peer = -1;  // the rank waited on, when one is
    *fused = 1;
    try {
      std::vector<Signature> calls;
      if (size() > 1) {
        std::vector<std::vector<int64_t>> extras;
        for (size_t i = 1; i < held.size(); ++i) extras.push_back(ExtraWords(held[i].signature, size()));
        calls = ExchangeDescriptors(c.signature, extras, seq, &peer, fused);
      } else {
        calls = {c.signature};
      }
      const absl::Status matched = Match(what, calls);
      if (!matched.ok()) {
        *fused = 1;
        return matched;
      }
      if (!c.signature.invalid.empty()) return absl::OkStatus();  // unreachable: Match failed
      if (*fused == 1) {
        Execute(c, seq, &peer);
      } else {
        ExecuteFused(held, *fused, seq, &peer);
      }
      return absl::OkStatus();
    } catch (const AbortedWait&) {
      return CurrentAbort();
    } catch (const std::exception& e) {
      return TransportFailure(what, peer, e.what());
    } catch (...) {
      return TransportFailure(what, peer, "unknown exception");
    }
  }

  // A buffer of `elements` of `dtype` (a view of one kept between fused ops).
  Tensor FusionBuffer(int which, DType dtype, int64_t elements) {
    Tensor& b = fusion_buffers_[static_cast<size_t>(which)][static_cast<size_t>(dtype)];
    if (!b.defined() || b.NumElements() < elements) {
      b = Tensor();
      auto fresh = Tensor::Empty(Shape{std::max<int64_t>(elements, 1)}, dtype);
      if (!fresh.ok()) throw std::runtime_error(std::string(fresh.status().message()));
      b = *std::move(fresh);
    }
    auto view = b.SliceRows(0, elements);
    if (!view.ok()) throw std::runtime_error(std::string(view.status().message()));
    return *std::move(view);
  }

  // held[0 .. n)'s inputs back to back into `to`.
  static void PackInputs(const std::vector<CollectiveOp>& held, size_t n, char* to) {
    for (size_t j = 0; j < n; ++j) {
      std::memcpy(to, BytePtr(held[j].input), held[j].input.NumBytes());
      to += held[j].input.NumBytes();
    }
  }
  // `from`, back to back, into held[0 .. n)'s outputs.
  static void UnpackOutputs(const char* from, const std::vector<CollectiveOp>& held, size_t n) {
    for (size_t j = 0; j < n; ++j) {
      std::memcpy(BytePtr(held[j].output), from, held[j].output.NumBytes());
      from += held[j].output.NumBytes();
    }
  }

  // Packs held[0 .. n) into one op of their kind, runs it and unpacks it.
  void ExecuteFused(std::vector<CollectiveOp>& held, size_t n, uint64_t seq, int* peer) {
    const int p = size();
    const int me = rank();
    const Signature& front = held.front().signature;
    const size_t es = DTypeSize(front.dtype);
    const auto bytes = [es](int64_t elements) { return static_cast<size_t>(elements) * es; };
    CollectiveOp fused;
    fused.signature = front;
    if (front.kind == Kind::kAllReduce) {
      int64_t total = 0;
      for (size_t j = 0; j < n; ++j) total += held[j].signature.counts[0];
      fused.signature.counts = {total};
      fused.input = FusionBuffer(0, front.dtype, total);
      fused.output = fused.input;  // in place
      PackInputs(held, n, BytePtr(fused.input));
      Execute(fused, seq, peer);
      UnpackOutputs(BytePtr(fused.output), held, n);
      return;
    }
    if (front.kind == Kind::kReduceScatter) {
      // Input: for each destination d, every op's chunk d in op order;
      // output: every op's own chunk in op order.
      std::vector<int64_t> counts(static_cast<size_t>(p), 0);
      std::vector<std::vector<int64_t>> offsets(n);
      for (size_t j = 0; j < n; ++j) {
        offsets[j] = Offsets(held[j].signature.counts);
        for (int d = 0; d < p; ++d) counts[static_cast<size_t>(d)] += held[j].signature.counts[static_cast<size_t>(d)];
      }
      fused.signature.counts = counts;
      fused.input = FusionBuffer(0, front.dtype, Offsets(counts).back());
      fused.output = FusionBuffer(1, front.dtype, counts[static_cast<size_t>(me)]);
      char* at = BytePtr(fused.input);
      for (int d = 0; d < p; ++d) {
        for (size_t j = 0; j < n; ++j) {
          const size_t piece = bytes(held[j].signature.counts[static_cast<size_t>(d)]);
          std::memcpy(at, BytePtr(held[j].input) + bytes(offsets[j][static_cast<size_t>(d)]), piece);
          at += piece;
        }
      }
      Execute(fused, seq, peer);
      UnpackOutputs(BytePtr(fused.output), held, n);
      return;
    }
    // AllGather. Input: every op's piece in op order; output: for each rank
    // r, every op's piece r in op order.
    std::vector<int64_t> counts(static_cast<size_t>(p), 0);
    for (size_t j = 0; j < n; ++j) {
      for (int r = 0; r < p; ++r) counts[static_cast<size_t>(r)] += held[j].signature.counts[static_cast<size_t>(r)];
    }
    fused.signature.counts = counts;
    fused.input = FusionBuffer(0, front.dtype, counts[static_cast<size_t>(me)]);
    fused.output = FusionBuffer(1, front.dtype, Offsets(counts).back());
    PackInputs(held, n, BytePtr(fused.input));
    Execute(fused, seq, peer);
    const char* from = BytePtr(fused.output);
    for (int r = 0; r < p; ++r) {
      for (size_t j = 0; j < n; ++j) {
        const std::vector<int64_t> offsets = Offsets(held[j].signature.counts);
        const size_t piece = bytes(held[j].signature.counts[static_cast<size_t>(r)]);
        std::memcpy(BytePtr(held[j].output) + bytes(offsets[static_cast<size_t>(r)]), from, piece);
        from += piece;
      }
    }
  }

  absl::Status CurrentAbort() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_.ok() ? absl::InternalError(StrCat(Describe(), ": a wait was interrupted without abort")) : aborted_;
  }

  // Builds the op's error, aborts the group with it (the connections are no
  // longer usable: gloo closed them or a peer is gone) and returns it.
  absl::Status TransportFailure(const std::string& what, int peer, std::string_view cause) {
    const bool timed_out =
        cause.find("Timed out") != std::string_view::npos || cause.find("timeout") != std::string_view::npos;
    // A collective's failure does not say which peer's pair broke; in a
    // group of two there is only one.
    if (peer < 0 && options_.size == 2) peer = 1 - options_.rank;
    const std::string on = peer >= 0 ? StrCat(" waiting on rank ", peer) : std::string();
    absl::Status status =
        timed_out
            ? absl::DeadlineExceededError(StrCat(what, " in ", Describe(), on, ": no progress within ",
                                                 absl::FormatDuration(options_.timeout), " (", cause, ")"))
            : absl::UnavailableError(StrCat(what, " in ", Describe(), on,
                                            ": connection lost (a peer aborted, died or was destroyed): ", cause));
    Fail(status, /*close=*/true);
    // Another failure may have come first; the op reports the first reason.
    return CurrentAbort();
  }

  // Every rank's descriptor of this op. With it each rank sends the counts of
  // the ops queued behind it that it could fuse (`extras`); *fused = 1 + the
  // longest run of them every rank has, with the same counts: the same
  // number on every rank, since all see the same table.
  std::vector<Signature> ExchangeDescriptors(const Signature& mine, const std::vector<std::vector<int64_t>>& extras,
                                             uint64_t seq, int* peer, size_t* fused) {
    const int p = size();
    const size_t descriptor = DescriptorWords(p);
    const size_t max_extras = static_cast<size_t>(MaxExtras());
    const size_t words = descriptor + 1 + max_extras * static_cast<size_t>(p);
    std::vector<int64_t> table(words * static_cast<size_t>(p), 0);
    std::vector<int64_t> own = Encode(mine, p);
    own.resize(words, 0);
    const size_t sent_extras = std::min(extras.size(), max_extras);
    own[descriptor] = static_cast<int64_t>(sent_extras);
    for (size_t j = 0; j < sent_extras; ++j) {
      std::copy(extras[j].begin(), extras[j].end(),
                own.begin() + static_cast<ptrdiff_t>(descriptor + 1 + j * static_cast<size_t>(p)));
    }
    std::copy(own.begin(), own.end(), table.begin() + static_cast<ptrdiff_t>(words) * rank());
    Transfer out(*this, *collective_context_, own.data(), own.size() * 8);
    std::vector<std::unique_ptr<Transfer>> in;
    const uint64_t slot = CollectiveSlot(seq, Phase::kDescriptor);
    for (int k = 1; k < p; ++k) {
      const int q = (rank() + k) % p;
      in.push_back(
          std::make_unique<Transfer>(*this, *collective_context_, &table[words * static_cast<size_t>(q)], words * 8));
      in.back()->Recv(q, slot, 0, words * 8);
      out.Send(q, slot, 0, words * 8);
    }
    for (int k = 1; k < p; ++k) {
      *peer = (rank() + k) % p;
      in[static_cast<size_t>(k - 1)]->WaitAll();
    }
    *peer = -1;
    out.WaitAll();
    std::vector<Signature> calls(static_cast<size_t>(p));
    for (int q = 0; q < p; ++q) {
      if (q == rank()) {
        calls[static_cast<size_t>(q)] = mine;
      } else if (!Decode(&table[words * static_cast<size_t>(q)], p, &calls[static_cast<size_t>(q)])) {
        calls[static_cast<size_t>(q)].kind = mine.kind;
        calls[static_cast<size_t>(q)].invalid = "an unreadable descriptor (another Tessera version?)";
      }
    }
    // The run of extras every rank has, with the same counts on every rank.
    size_t agreed = max_extras;
    for (int q = 0; q < p; ++q) {
      const int64_t count = table[words * static_cast<size_t>(q) + descriptor];
      agreed = std::min(agreed, count < 0 ? size_t{0} : static_cast<size_t>(count));
    }
    const auto block = [&](int q, size_t j) {
      return &table[words * static_cast<size_t>(q) + descriptor + 1 + j * static_cast<size_t>(p)];
    };
    for (size_t j = 0; j < agreed; ++j) {
      bool same = true;
      for (int q = 1; q < p && same; ++q) same = std::equal(block(0, j), block(0, j) + p, block(q, j));
      if (!same) {
        agreed = j;
        break;
      }
    }
    *fused = 1 + agreed;
    return calls;
  }

  // The same verdict on every rank: they all see the same descriptors.
  absl::Status Match(const std::string& what, const std::vector<Signature>& calls) const {
    const int p = size();
    for (int r = 0; r < p; ++r) {
      const Signature& c = calls[static_cast<size_t>(r)];
      if (!c.invalid.empty()) {
        return absl::InvalidArgumentError(StrCat(what, " in gloo group '", options_.group, "' failed: rank ", r,
                                                 "'s call was invalid (", c.invalid, ")"));
      }
    }
    const Signature& first = calls[0];
    for (int r = 1; r < p; ++r) {
      const Signature& c = calls[static_cast<size_t>(r)];
      if (!SameCall(first, c)) {
        return absl::InvalidArgumentError(StrCat("mismatched collective ", what, " in gloo group '", options_.group,
                                                 "': rank 0 called ", SignatureText(first), " but rank ", r, " called ",
                                                 SignatureText(c)));
      }
    }
    if (first.kind == Kind::kAllToAll) {
      for (int s = 0; s < p; ++s) {
        for (int d = 0; d < p; ++d) {
          const int64_t sent = calls[static_cast<size_t>(s)].counts[static_cast<size_t>(d)];
          const int64_t expected = calls[static_cast<size_t>(d)].recv_counts[static_cast<size_t>(s)];
          if (sent != expected) {
            return absl::InvalidArgumentError(
                StrCat("mismatched collective ", what, " in gloo group '", options_.group, "': rank ", s, " called ",
                       SignatureText(calls[static_cast<size_t>(s)]), " sending ", sent, " elements to rank ", d,
                       " but rank ", d, " called ", SignatureText(calls[static_cast<size_t>(d)]), " expecting ",
                       expected, " from rank ", s));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  void Execute(const CollectiveOp& c, uint64_t seq, int* peer) {
    const Signature& s = c.signature;
    const size_t es = DTypeSize(s.dtype);
    const int p = size();
    const int me = rank();
    switch (s.kind) {
      case Kind::kAllReduce: {
        const int64_t n = s.counts[0];
        std::vector<int64_t> chunks(static_cast<size_t>(p));
        for (int r = 0; r < p; ++r) chunks[static_cast<size_t>(r)] = n / p + (r < n % p ? 1 : 0);
        const int64_t mine = Offsets(chunks)[static_cast<size_t>(me)];
        ReduceScatterAndGather(s, c.input, chunks, BytePtr(c.output) + static_cast<size_t>(mine) * es, &c.output, seq,
                               peer);
        return;
      }
      case Kind::kReduceScatter:
        ReduceScatterAndGather(s, c.input, s.counts, BytePtr(c.output), nullptr, seq, peer);
        return;
      case Kind::kAllGather: {
        const std::vector<int64_t> offsets = Offsets(s.counts);
        std::vector<int64_t> send_offsets(static_cast<size_t>(p), 0);
        std::vector<int64_t> send_counts(static_cast<size_t>(p), s.counts[static_cast<size_t>(me)]);
        Exchange(c.input, send_offsets, send_counts, c.output, offsets, s.counts, es, seq, peer);
        return;
      }
      case Kind::kAllToAll:
        Exchange(c.input, Offsets(s.counts), s.counts, c.output, Offsets(s.recv_counts), s.recv_counts, es, seq, peer);
        return;
      case Kind::kBroadcast: {
        const size_t bytes = c.output.NumBytes();
        if (p == 1 || bytes == 0) return;
        Transfer buffer(*this, *collective_context_, c.output.raw_data(), bytes);
        const uint64_t slot = CollectiveSlot(seq, Phase::kScatter);
        if (me == s.root) {
          for (int k = 1; k < p; ++k) buffer.Send((me + k) % p, slot, 0, bytes);
        } else {
          *peer = s.root;
          buffer.Recv(s.root, slot, 0, bytes);
        }
        buffer.WaitAll();
        return;
      }
    }
  }

  // Every rank sends input[send_offsets[q] .. + send_counts[q]) to q and
  // receives q's piece into output[recv_offsets[q] ..); its own piece is a copy.
  void Exchange(const Tensor& input, const std::vector<int64_t>& send_offsets, const std::vector<int64_t>& send_counts,
                const Tensor& output, const std::vector<int64_t>& recv_offsets, const std::vector<int64_t>& recv_counts,
                size_t es, uint64_t seq, int* peer) {
    const int p = size();
    const int me = rank();
    const auto at = [es](int64_t elements) { return static_cast<size_t>(elements) * es; };
    const size_t own = at(send_counts[static_cast<size_t>(me)]);
    if (own > 0) {
      std::memcpy(BytePtr(output) + at(recv_offsets[static_cast<size_t>(me)]),
                  BytePtr(input) + at(send_offsets[static_cast<size_t>(me)]), own);
    }
    if (p == 1) return;
    const uint64_t slot = CollectiveSlot(seq, Phase::kScatter);
    Transfer in(*this, *collective_context_, output.raw_data(), output.NumBytes());
    Transfer out(*this, *collective_context_, input.raw_data(), input.NumBytes());
    for (int k = 1; k < p; ++k) {
      const size_t q = static_cast<size_t>((me + k) % p);
      in.Recv(static_cast<int>(q), slot, at(recv_offsets[q]), at(recv_counts[q]));
    }
    for (int k = 1; k < p; ++k) {
      const size_t q = static_cast<size_t>((me + k) % p);
      out.Send(static_cast<int>(q), slot, at(send_offsets[q]), at(send_counts[q]));
    }
    *peer = -1;
    in.WaitAll();
    out.WaitAll();
  }

  // The direct reduce-scatter: chunk d of `input` (chunks[d] elements) goes to
  // rank d, which combines the p contributions in rank order into `mine`.
  // With `gather` (all-reduce), each reduced segment then goes to every peer,
  // into the same place of their `gather` tensor, while the next one is being
  // combined.
  void ReduceScatterAndGather(const Signature& s, const Tensor& input, const std::vector<int64_t>& chunks, char* mine,
                              const Tensor* gather, uint64_t seq, int* peer) {
    const int p = size();
    const int me = rank();
    const size_t es = DTypeSize(s.dtype);
    const std::vector<int64_t> offsets = Offsets(chunks);
    const int64_t my_count = chunks[static_cast<size_t>(me)];
    const ReduceFn reduce = ReduceFor(s.dtype, s.op);
    const char* own = BytePtr(input) + static_cast<size_t>(offsets[static_cast<size_t>(me)]) * es;
    if (p == 1) {
      if (my_count > 0) reduce({own}, {mine}, 0, my_count);
      return;
    }
    const int64_t segment = std::max<int64_t>(1, options_.segment_bytes / static_cast<int64_t>(es));
    const auto segments = [segment](int64_t count) { return (count + segment - 1) / segment; };
    const auto piece = [&](int64_t count, int64_t s_index) {
      return static_cast<size_t>(std::min(segment, count - s_index * segment)) * es;
    };
    const uint64_t scatter_slot = CollectiveSlot(seq, Phase::kScatter);
    const uint64_t gather_slot = CollectiveSlot(seq, Phase::kGather);

    // Scratch(q): rank q's contribution to my chunk (none for q == me).
    const size_t scratch_bytes = static_cast<size_t>(my_count) * es;
    std::vector<std::unique_ptr<Transfer>> from(static_cast<size_t>(p));
    for (int k = 1; k < p; ++k) {
      const size_t q = static_cast<size_t>((me + k) % p);
      from[q] = std::make_unique<Transfer>(*this, *collective_context_, Scratch(q, scratch_bytes), scratch_bytes);
      for (int64_t i = 0; i < segments(my_count); ++i) {
        from[q]->Recv(static_cast<int>(q), scatter_slot, static_cast<size_t>(i * segment) * es, piece(my_count, i));
      }
    }
    std::unique_ptr<Transfer> gathered;
    if (gather != nullptr) {
      gathered = std::make_unique<Transfer>(*this, *collective_context_, gather->raw_data(), gather->NumBytes());
      for (int k = 1; k < p; ++k) {
        const size_t d = static_cast<size_t>((me + k) % p);
        for (int64_t i = 0; i < segments(chunks[d]); ++i) {
          gathered->Recv(static_cast<int>(d), gather_slot, static_cast<size_t>(offsets[d] + i * segment) * es,
                         piece(chunks[d], i));
        }
      }
    }
    Transfer sent(*this, *collective_context_, input.raw_data(), input.NumBytes());
    // Segment-major across owners, so every owner can start combining early.
    int64_t most = 0;
    for (int64_t count : chunks) most = std::max(most, segments(count));
    for (int64_t i = 0; i < most; ++i) {
      for (int k = 1; k < p; ++k) {
        const size_t d = static_cast<size_t>((me + k) % p);
        if (i < segments(chunks[d])) {
          sent.Send(static_cast<int>(d), scatter_slot, static_cast<size_t>(offsets[d] + i * segment) * es,
                    piece(chunks[d], i));
        }
      }
    }
    // Combine my chunk segment by segment as contributions arrive (each lane
    // delivers its segments in order), then pass each result on.
    std::unique_ptr<Transfer> result;
    if (gather != nullptr)
      result = std::make_unique<Transfer>(*this, *collective_context_, mine, static_cast<size_t>(my_count) * es);
    std::vector<const void*> inputs(static_cast<size_t>(p));
    for (int64_t i = 0; i < segments(my_count); ++i) {
      const size_t begin = static_cast<size_t>(i * segment) * es;
      for (int k = 1; k < p; ++k) {
        const size_t q = static_cast<size_t>((me + k) % p);
        *peer = static_cast<int>(q);
        from[q]->WaitRecv();
      }
      *peer = -1;
      for (int q = 0; q < p; ++q) {
        inputs[static_cast<size_t>(q)] = q == me ? own + begin : scratch_[static_cast<size_t>(q)].data.get() + begin;
      }
      const size_t bytes = piece(my_count, i);
      reduce(inputs, {mine + begin}, 0, static_cast<int64_t>(bytes / es));
      if (result) {
        for (int k = 1; k < p; ++k) result->Send((me + k) % p, gather_slot, begin, bytes);
      }
    }
    if (gathered) gathered->WaitAll();
    sent.WaitAll();
    if (result) result->WaitAll();
  }

  // The receive buffer for rank q's contributions, at least `bytes` long. It
  // is kept between collectives: allocating (and faulting in) tens of MB per
  // all-reduce cost about a tenth of its time. Only the collective thread
  // uses it.
  char* Scratch(size_t q, size_t bytes) {
    if (scratch_.size() < static_cast<size_t>(size())) scratch_.resize(static_cast<size_t>(size()));
    ScratchBuffer& b = scratch_[q];
    if (b.bytes < bytes) {
      b.data.reset();  // release the old one before the larger allocation
      b.data.reset(new char[bytes]);
      b.bytes = bytes;
    }
    return b.data.get();
  }

  // ---- Point-to-point ----
  void PointToPoint(bool is_send, Tensor tensor, int peer, DoneFn done) {
    const char* op = is_send ? "Send" : "Recv";
    absl::Status status;
    if (peer < 0 || peer >= size()) status = Error(op, StrCat("peer ", peer, " is outside [0, ", size(), ")"));
    if (status.ok()) status = CheckTensor(op, is_send ? "input" : "output", tensor);
    if (!status.ok()) return done(std::move(status));
    if (peer == rank()) return SelfTransfer(is_send, std::move(tensor), std::move(done));
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.ok()) {
        status = aborted_;
      } else {
        Lane& lane = LaneFor(is_send, peer);
        lane.queue.push_back(P2pOp{std::move(tensor), std::move(done), lane.issued++});
        start = !lane.thread.joinable();
        if (start) lane.thread = std::thread([this, is_send, peer] { LaneLoop(is_send, peer); });
      }
    }
    if (!status.ok()) return done(std::move(status));
    work_.notify_all();
  }

  Lane& LaneFor(bool is_send, int peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return lanes_[2 * static_cast<size_t>(peer) + (is_send ? 0 : 1)];
  }

  void LaneLoop(bool is_send, int peer) {
    for (;;) {
      P2pOp op;
      absl::Status status;
      {
        std::unique_lock<std::mutex> lock(mu_);
        Lane& lane = LaneFor(is_send, peer);
        work_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !lane.queue.empty(); });
        if (lane.queue.empty()) return;
        op = std::move(lane.queue.front());
        lane.queue.pop_front();
        status = aborted_;
      }
      if (status.ok()) status = RunPointToPoint(is_send, peer, op);
      op.done(std::move(status));
    }
  }

  // Both sides send their header and read the other's, so both decide alike
  // whether the payload moves (gloo must never receive more than was posted).
  absl::Status RunPointToPoint(bool is_send, int peer, const P2pOp& op) {
    const int sender = is_send ? rank() : peer;
    const int receiver = is_send ? peer : rank();
    const std::string what =
        StrCat(is_send ? "Send" : "Recv", " #", op.seq, " from rank ", sender, " to rank ", receiver);
    try {
      P2pHeader mine{kMagic, static_cast<int64_t>(op.tensor.dtype()), op.tensor.NumElements()};
      P2pHeader theirs;
      const auto slot = [&](P2pMessage m) { return P2pSlot(sender, receiver, op.seq, m); };
      Transfer out(*this, *p2p_context_, &mine, sizeof(mine));
      Transfer in(*this, *p2p_context_, &theirs, sizeof(theirs));
      in.Recv(peer, slot(is_send ? P2pMessage::kReceiverHeader : P2pMessage::kSenderHeader), 0, sizeof(theirs));
      out.Send(peer, slot(is_send ? P2pMessage::kSenderHeader : P2pMessage::kReceiverHeader), 0, sizeof(mine));
      in.WaitAll();
      out.WaitAll();
      const P2pHeader& send_header = is_send ? mine : theirs;
      const P2pHeader& recv_header = is_send ? theirs : mine;
      if (theirs.magic != kMagic || send_header.dtype != recv_header.dtype || send_header.count != recv_header.count) {
        const auto name = [](const P2pHeader& h) {
          return h.magic != kMagic ? std::string("an unreadable header")
                                   : StrCat(DTypeName(static_cast<DType>(h.dtype)), " x ", h.count);
        };
        return absl::InvalidArgumentError(StrCat("mismatched Send/Recv #", op.seq, " from rank ", sender, " to rank ",
                                                 receiver, " in gloo group '", options_.group, "': rank ", sender,
                                                 " sends ", name(send_header), " but rank ", receiver, " receives ",
                                                 name(recv_header)));
      }
      const size_t bytes = op.tensor.NumBytes();
      if (bytes > 0) {
        Transfer payload(*this, *p2p_context_, op.tensor.raw_data(), bytes);
        if (is_send) {
          payload.Send(peer, slot(P2pMessage::kPayload), 0, bytes);
        } else {
          payload.Recv(peer, slot(P2pMessage::kPayload), 0, bytes);
        }
        payload.WaitAll();
      }
      return absl::OkStatus();
    } catch (const AbortedWait&) {
      return CurrentAbort();
    } catch (const std::exception& e) {
      return TransportFailure(what, peer, e.what());
    } catch (...) {
      return TransportFailure(what, peer, "unknown exception");
    }
  }

  // Send to self: matched in order with Recv from self, copied by the second.
  void SelfTransfer(bool is_send, Tensor tensor, DoneFn done) {
    P2pOp send;
    P2pOp recv;
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::deque<P2pOp>& other = is_send ? self_recvs_ : self_sends_;
      std::deque<P2pOp>& mine = is_send ? self_sends_ : self_recvs_;
      if (!aborted_.ok()) {
        status = aborted_;
      } else if (other.empty()) {
        mine.push_back(P2pOp{std::move(tensor), std::move(done), self_matched_ + mine.size()});
        return;
      } else {
        P2pOp me{std::move(tensor), std::move(done), self_matched_++};
        (is_send ? send : recv) = std::move(me);
        (is_send ? recv : send) = std::move(other.front());
        other.pop_front();
      }
    }
    if (!status.ok()) return done(std::move(status));
    if (send.tensor.dtype() != recv.tensor.dtype() || send.tensor.NumElements() != recv.tensor.NumElements()) {
      status = absl::InvalidArgumentError(
          StrCat("mismatched Send/Recv #", recv.seq, " from rank ", rank(), " to itself in gloo group '",
                 options_.group, "': sends ", DTypeName(send.tensor.dtype()), " x ", send.tensor.NumElements(),
                 " but receives ", DTypeName(recv.tensor.dtype()), " x ", recv.tensor.NumElements()));
    } else if (send.tensor.NumBytes() > 0 && send.tensor.raw_data() != recv.tensor.raw_data()) {
      std::memcpy(recv.tensor.raw_data(), send.tensor.raw_data(), send.tensor.NumBytes());
    }
    recv.done(status);
    send.done(status);
  }

  // Fails everything pending with `reason` (the first reason sticks), wakes
  // every wait, and with `close` resets the connections so peers fail too.
  void Fail(absl::Status reason, bool close) {
    std::vector<DoneFn> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.ok()) {
        aborted_ = reason;
        for (CollectiveOp& c : collectives_) {
          if (c.done) pending.push_back(std::move(c.done));
        }
        collectives_.clear();
        for (Lane& lane : lanes_) {
          for (P2pOp& op : lane.queue) pending.push_back(std::move(op.done));
          lane.queue.clear();
        }
        for (auto* queue : {&self_sends_, &self_recvs_}) {
          for (P2pOp& op : *queue) pending.push_back(std::move(op.done));
          queue->clear();
        }
        for (UnboundBuffer* buffer : active_) {
          buffer->abortWaitRecv();
          buffer->abortWaitSend();
        }
      }
      reason = aborted_;
      if (close && !closed_) {
        closed_ = true;
        // Hard close (reset): a peer blocked on us sees a read error at once.
        // Each pair takes its own lock, so this is safe next to running ops.
        try {
          if (collective_context_) collective_context_->closeConnections();
          if (p2p_context_) p2p_context_->closeConnections();
        } catch (...) {
          // A pair that cannot close is closed already; nothing else to do.
        }
      }
    }
    for (DoneFn& done : pending) done(reason);
  }

  const GlooOptions options_;
  // Destroyed after the contexts (members die in reverse order).
  const std::shared_ptr<gloo::transport::Device> device_;
  const std::shared_ptr<gloo::Context> collective_context_;  // null for a group of one
  const std::shared_ptr<gloo::Context> p2p_context_;         // null for a group of one

  std::mutex mu_;
  std::condition_variable work_;  // a queue grew, or stopping_
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<CollectiveOp> collectives_ ABSL_GUARDED_BY(mu_);
  std::vector<Lane> lanes_ ABSL_GUARDED_BY(mu_);  // [2 * peer + (send ? 0 : 1)]
  std::deque<P2pOp> self_sends_ ABSL_GUARDED_BY(mu_);
  std::deque<P2pOp> self_recvs_ ABSL_GUARDED_BY(mu_);
  uint64_t self_matched_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<UnboundBuffer*> active_ ABSL_GUARDED_BY(mu_);  // buffers an op may be waiting on
  std::thread collective_thread_;
  struct ScratchBuffer {
    std::unique_ptr<char[]> data;
    size_t bytes = 0;
  };
  std::vector<ScratchBuffer> scratch_;  // [peer]; the collective thread's own
  // Fused ops' input (0) and output (1) buffers per dtype; the collective
  // thread's own.
  std::array<std::array<Tensor, static_cast<size_t>(DType::kF64) + 1>, 2> fusion_buffers_;
};

Transfer::Transfer(GlooCommunicator& comm, gloo::Context& context, void* ptr, size_t bytes)
    : comm_(comm), buffer_(context.createUnboundBuffer(ptr, bytes)) {
  comm_.Register(buffer_.get());
}

Transfer::~Transfer() { comm_.Unregister(buffer_.get()); }

void Transfer::WaitRecv() {
  if (!buffer_->waitRecv(comm_.timeout())) throw AbortedWait{};
  --recvs_;
}

void Transfer::WaitSend() {
  if (!buffer_->waitSend(comm_.timeout())) throw AbortedWait{};
  --sends_;
}

std::string JoinKey(const GlooOptions& options, int rank) { return StrCat(options.group, "/join/", rank); }

}  // namespace

// gloo's TCP transport writes with writev, which raises SIGPIPE when the
// peer is gone; the default action would kill the process instead of
// failing the op with EPIPE. Ignored once per process, unless the program
// installed a handler of its own (gRPC's init ignores it too).
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KvStore& store, const GlooOptions& options) {
  IgnoreSigpipe();
  const std::string who =
      StrCat("ConnectGloo: gloo group '", options.group, "' rank ", options.rank, "/", options.size);
  if (options.group.empty()) return absl::InvalidArgumentError(StrCat(who, ": the group name is empty"));
  if (options.size < 1) return absl::InvalidArgumentError(StrCat(who, ": size must be at least 1"));
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(StrCat(who, ": rank is outside [0, ", options.size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError(StrCat(who, ": timeout must be positive"));
  if (options.segment_bytes <= 0) return absl::InvalidArgumentError(StrCat(who, ": segment_bytes must be positive"));

  // Our own barrier first, so a missing rank is named (gloo's rendezvous would
  // only say that some key never came) and ranks that disagree on the size
  // fail before any connection is made.
  RETURN_IF_ERROR(store.Set(JoinKey(options, options.rank), StrCat(options.size)));
  std::vector<std::string> keys;
  for (int r = 0; r < options.size; ++r) keys.push_back(JoinKey(options, r));
  absl::StatusOr<std::vector<std::string>> joined = store.Wait(keys, options.timeout);
  if (!joined.ok()) {
    if (!absl::IsDeadlineExceeded(joined.status())) {
      return absl::Status(joined.status().code(), StrCat(who, ": rendezvous failed: ", joined.status().message()));
    }
    std::vector<int> missing;
    for (int r = 0; r < options.size; ++r) {
      if (!store.Get(keys[static_cast<size_t>(r)]).ok()) missing.push_back(r);
    }
    return absl::DeadlineExceededError(StrCat(who, ": rank", missing.size() == 1 ? " " : "s ", Join(missing, ", "),
                                              " never joined within ", absl::FormatDuration(options.timeout)));
  }
  for (int r = 0; r < options.size; ++r) {
    if ((*joined)[static_cast<size_t>(r)] != StrCat(options.size)) {
      return absl::InvalidArgumentError(
          StrCat(who, ": rank ", r, " joined with size ", (*joined)[static_cast<size_t>(r)]));
    }
  }

  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> contexts[2];
  if (options.size > 1) {
    const char* names[2] = {"collective", "p2p"};
    for (int i = 0; i < 2; ++i) {
      GlooStore gloo_store(store, StrCat(options.group, "/", names[i]), options.timeout);
      try {
        if (!device) {
          gloo::transport::tcp::attr attr;
          attr.hostname = options.hostname;
          device = gloo::transport::tcp::CreateDevice(attr);
        }
        contexts[i] = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
        contexts[i]->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout)));
        contexts[i]->connectFullMesh(gloo_store, device);
      } catch (const std::exception& e) {
        absl::Status store_error = gloo_store.last_error();
        if (!store_error.ok()) {
          return absl::Status(store_error.code(), StrCat(who, ": rendezvous of the ", names[i],
                                                         " context failed: ", store_error.message()));
        }
        return absl::UnavailableError(
            StrCat(who, ": cannot connect the ", names[i], " context on '", options.hostname, "': ", e.what()));
      }
    }
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<GlooCommunicator>(options, std::move(device), contexts[0], contexts[1]));
}

}  // namespace tessera::comm
