// The CUDA emulator's NCCL (include/nccl.h): the ranks of one process, each
// on an emulated GPU, exchanging data through host memory.
//
// Model:
// - A unique id names a clique of nranks ranks; each ncclCommInitRank* joins
//   it. The id records its process's pid: ranks of other processes cannot
//   be reached, so their ids are refused (ncclInvalidUsage).
// - A call checks its arguments and posts its part of an op at once: the
//   k-th collective of a comm is op k of the clique on every rank, the k-th
//   send from a to b pairs with the k-th receive on b from a. The parts must
//   agree (kind, count, datatype, reduction, root); when they do not, the
//   clique fails with ncclInvalidUsage where real NCCL would hang or corrupt
//   memory. A call that fails its argument checks still takes its op's
//   place, so peers that called correctly fail instead of hanging (unless
//   every rank's call failed, as real NCCL would leave it).
// - The data moves in a task queued on the call's stream (one per stream for
//   a group): it marks its parts arrived, the last rank to arrive at an op
//   moves the data for every rank, and each task waits until all its ops
//   are done. Reductions run in rank order: floating-point types in double
//   (f16 / bf16 decoded exactly), rounded once to the type (to nearest,
//   ties to even); integer types in the type itself, wrapping; Avg is the
//   sum divided by nranks (integers: truncated toward zero); Max / Min
//   propagate NaN.
// - Failures fail the whole clique (first cause sticks): its waiting ops end
//   at once and every later call is refused with the comm's async error.
//   Causes: a mismatch (ncclInvalidUsage on every rank), ncclCommAbort
//   (ncclRemoteError on the other ranks), a task its stream never ran, e.g.
//   behind an earlier error (ncclUnhandledCudaError on that rank,
//   ncclRemoteError on the others), a peer destroyed while peers still wait
//   for its part (ncclInvalidUsage). Tasks of failed ops return
//   cudaErrorLaunchFailure (the stream's sticky error), except on the rank
//   that aborted: there they just end, as NCCL's kernels do on an abort.
// - Locks: one mutex per clique (its condition variable is what tasks wait
//   on) and a global one for the id registry and the live handles, never
//   held while waiting; order global, then clique. The emulator's streams
//   are never called with a clique lock held.

#include "nccl.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_emu/float16.h"
#include "cuda_emu/internal.h"

namespace {

using std::to_string;

// ---------------------------------------------------------------------------
// Data types and reductions.

bool ValidType(int type) { return type >= 0 && type < ncclNumTypes; }
bool ValidOp(int op) { return op >= 0 && op < ncclNumOps; }

size_t TypeSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

std::string TypeName(ncclDataType_t type) {
  static const char* const kNames[] = {"ncclInt8",   "ncclUint8",   "ncclInt32",   "ncclUint32",  "ncclInt64",
                                       "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16"};
  return ValidType(type) ? kNames[type] : "datatype " + to_string(static_cast<int>(type));
}

std::string OpName(ncclRedOp_t op) {
  static const char* const kNames[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
  return ValidOp(op) ? kNames[op] : "reduction " + to_string(static_cast<int>(op));
}

// Rounds x to `precision` significant bits, ties to even, with subnormals
// below 2^min_exp and infinity above the largest finite value of a format
// whose top exponent is max_exp. All steps are exact in double.
double RoundToFormat(double x, int precision, int min_exp, int max_exp) {
  if (!std::isfinite(x) || x == 0) return x;
  const double a = std::fabs(x);
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const double quantum = std::ldexp(1.0, std::max(e - 1, min_exp) - (precision - 1));
  const double scaled = a / quantum;
  double whole = std::floor(scaled);
  const double fraction = scaled - whole;
  if (fraction > 0.5 || (fraction == 0.5 && std::fmod(whole, 2.0) != 0)) whole += 1;
  double r = whole * quantum;
  if (r > std::ldexp(2.0 - std::ldexp(1.0, 1 - precision), max_exp)) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

struct HalfCodec {
  using Storage = uint16_t;
  static double Decode(uint16_t h) { return cuda_emu::HalfToFloat(h); }
  static uint16_t Encode(double x) {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (std::isnan(x)) return sign | 0x7e00;
    const double r = std::fabs(RoundToFormat(x, 11, -14, 15));
    if (std::isinf(r)) return sign | 0x7c00;
    if (r == 0) return sign;
    int e = 0;
    std::frexp(r, &e);
    if (e - 1 < -14) return sign | static_cast<uint16_t>(std::ldexp(r, 24));  // subnormal
    const auto mantissa = static_cast<uint16_t>(std::ldexp(r, -(e - 1)) * 1024 - 1024);
    return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | mantissa;
  }
};

struct Bfloat16Codec {
  using Storage = uint16_t;
  static double Decode(uint16_t b) { return cuda_emu::Bf16ToFloat(b); }
  static uint16_t Encode(double x) {
    if (std::isnan(x)) return std::signbit(x) ? 0xffc0 : 0x7fc0;
    // Rounded to bf16 first, the value is exact as a float.
    const auto f = static_cast<float>(RoundToFormat(x, 8, -126, 127));
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    return static_cast<uint16_t>(bits >> 16);
  }
};

struct FloatCodec {
  using Storage = float;
  static double Decode(float v) { return v; }
  // Rounded first: a double beyond float's range is no undefined cast.
  static float Encode(double x) { return static_cast<float>(RoundToFormat(x, 24, -126, 127)); }
};

struct DoubleCodec {
  using Storage = double;
  static double Decode(double v) { return v; }
  static double Encode(double x) { return x; }
};

template <class T>
T Load(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void Store(void* base, size_t i, T v) {
  std::memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
}

double Combine(ncclRedOp_t op, double a, double b) {
  switch (op) {
    case ncclProd:
      return a * b;
    case ncclMax:
      return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
    case ncclMin:
      return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::min(a, b);
    default:  // sum, avg
      return a + b;
  }
}

template <class Codec>
void ReduceFloats(const std::vector<const void*>& in, size_t count, ncclRedOp_t op, void* out) {
  using S = typename Codec::Storage;
  for (size_t i = 0; i < count; ++i) {
    double acc = Codec::Decode(Load<S>(in[0], i));
    for (size_t r = 1; r < in.size(); ++r) acc = Combine(op, acc, Codec::Decode(Load<S>(in[r], i)));
    if (op == ncclAvg) acc /= static_cast<double>(in.size());
    Store<S>(out, i, Codec::Encode(acc));
  }
}

template <class T>
void ReduceInts(const std::vector<const void*>& in, size_t count, ncclRedOp_t op, void* out) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < count; ++i) {
    T result = Load<T>(in[0], i);
    if (op == ncclMax || op == ncclMin) {
      for (size_t r = 1; r < in.size(); ++r) {
        const T x = Load<T>(in[r], i);
        result = op == ncclMax ? std::max(result, x) : std::min(result, x);
      }
    } else {
      // Modulo 2^64, then truncated: wrapping without signed overflow.
      uint64_t acc = static_cast<U>(result);
      for (size_t r = 1; r < in.size(); ++r) {
        const uint64_t x = static_cast<U>(Load<T>(in[r], i));
        acc = op == ncclProd ? acc * x : acc + x;
      }
      result = static_cast<T>(static_cast<U>(acc));
      if (op == ncclAvg) {
        if constexpr (std::is_signed_v<T>) {
          result = static_cast<T>(static_cast<int64_t>(result) / static_cast<int64_t>(in.size()));
        } else {
          result = static_cast<T>(static_cast<uint64_t>(result) / in.size());
        }
      }
    }
    Store<T>(out, i, result);
  }
}

void Reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const void*>& in, size_t count, void* out) {
  switch (type) {
    case ncclInt8:
      return ReduceInts<int8_t>(in, count, op, out);
    case ncclUint8:
      return ReduceInts<uint8_t>(in, count, op, out);
    case ncclInt32:
      return ReduceInts<int32_t>(in, count, op, out);
    case ncclUint32:
      return ReduceInts<uint32_t>(in, count, op, out);
    case ncclInt64:
      return ReduceInts<int64_t>(in, count, op, out);
    case ncclUint64:
      return ReduceInts<uint64_t>(in, count, op, out);
    case ncclFloat16:
      return ReduceFloats<HalfCodec>(in, count, op, out);
    case ncclFloat32:
      return ReduceFloats<FloatCodec>(in, count, op, out);
    case ncclFloat64:
      return ReduceFloats<DoubleCodec>(in, count, op, out);
    case ncclBfloat16:
      return ReduceFloats<Bfloat16Codec>(in, count, op, out);
    default:
      return;
  }
}

// ---------------------------------------------------------------------------
// Cliques, ops and communicators.

enum class Kind { kAllReduce, kBroadcast, kReduce, kSend, kRecv };

// One rank's call.
struct Call {
  Kind kind = Kind::kAllReduce;
  size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;  // the peer for a send or receive
  const void* send = nullptr;
  void* recv = nullptr;
};

std::string Describe(const Call& c) {
  static const char* const kNames[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclSend", "ncclRecv"};
  std::string s =
      std::string(kNames[static_cast<int>(c.kind)]) + "(count " + to_string(c.count) + ", " + TypeName(c.type);
  if (c.kind == Kind::kAllReduce || c.kind == Kind::kReduce) s += ", " + OpName(c.op);
  if (c.kind == Kind::kBroadcast || c.kind == Kind::kReduce) s += ", root " + to_string(c.root);
  if (c.kind == Kind::kSend || c.kind == Kind::kRecv) s += ", peer " + to_string(c.root);
  return s + ")";
}

// Whether two ranks' parts of one op agree.
bool Matches(const Call& a, const Call& b) {
  if (a.count != b.count || a.type != b.type) return false;
  if (a.kind == Kind::kSend || a.kind == Kind::kRecv) return true;  // the pair's kinds differ by construction
  if (a.kind != b.kind) return false;
  if (a.kind != Kind::kBroadcast && a.op != b.op) return false;
  return a.kind == Kind::kAllReduce || a.root == b.root;
}

// (-1, -1, k): collective k; (from, to, k): the k-th send from `from` to `to`.
using OpKey = std::tuple<int, int, uint64_t>;

// An op of a clique: one side per rank (collectives) or a sender's and a
// receiver's side (side 0 and 1).
struct Op {
  enum State { kWaiting, kMoving, kDone, kFailed };
  struct Side {
    int rank = 0;
    bool posted = false;
    bool bad = false;  // its call failed its checks: it will never arrive
    bool arrived = false;
    Call call;
    std::string bad_reason;
  };
  OpKey key;
  std::vector<Side> sides;
  int arrived = 0;
  State state = kWaiting;
};

std::string OpTitle(const Op& op) {
  const auto& [from, to, k] = op.key;
  if (from < 0) return "collective #" + to_string(k);
  return "point-to-point #" + to_string(k) + " from rank " + to_string(from) + " to rank " + to_string(to);
}

struct RankState {
  bool joined = false;
  bool aborted = false;
  bool destroyed = false;
  ncclResult_t error = ncclSuccess;  // the async error once formed
  std::string last_error;
  int pending = 0;  // tasks queued and not finished
  uint64_t collectives = 0;
  std::vector<uint64_t> sends, recvs;  // per peer
};

struct Clique {
  explicit Clique(int n) : nranks(n), ranks(static_cast<size_t>(n)) {
    for (RankState& r : ranks) r.sends.assign(static_cast<size_t>(n), 0), r.recvs.assign(static_cast<size_t>(n), 0);
  }
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  int joined = 0;
  bool formed = false;
  bool failed = false;
  std::vector<RankState> ranks;
  std::map<OpKey, std::shared_ptr<Op>> ops;  // posted and not finished
};

}  // namespace

// What an ncclComm_t points to. Handles are looked up in the live table
// before use, so a stale one is refused rather than dereferenced.
struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
};

namespace {

std::mutex g_mu;  // guards the two tables below
std::map<std::string, std::shared_ptr<Clique>>& Forming() {
  static auto* table = new std::map<std::string, std::shared_ptr<Clique>>;
  return *table;
}
std::unordered_map<const ncclComm*, std::shared_ptr<ncclComm>>& Live() {
  static auto* table = new std::unordered_map<const ncclComm*, std::shared_ptr<ncclComm>>;
  return *table;
}

std::shared_ptr<ncclComm> Resolve(const ncclComm* comm) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Live().find(comm);
  return it == Live().end() ? nullptr : it->second;
}

thread_local std::string t_last_error;

constexpr char kPrefix[] = "NCCL emulator: ";

// A message without kPrefix, to quote it in another.
std::string Unprefixed(const std::string& message) {
  return message.rfind(kPrefix, 0) == 0 ? message.substr(sizeof(kPrefix) - 1) : message;
}

// A call's error: the thread's last error and the comm's (lock held).
ncclResult_t CallErrorLocked(RankState* rank, ncclResult_t result, const std::string& message) {
  t_last_error = kPrefix + message;
  if (rank != nullptr) rank->last_error = t_last_error;
  return result;
}
ncclResult_t CallError(const ncclComm* comm, ncclResult_t result, const std::string& message) {
  if (comm == nullptr) return CallErrorLocked(nullptr, result, message);
  std::lock_guard<std::mutex> lock(comm->clique->mu);
  return CallErrorLocked(&comm->clique->ranks[static_cast<size_t>(comm->rank)], result, message);
}

std::string Who(const ncclComm& comm) { return "rank " + to_string(comm.rank) + "/" + to_string(comm.clique->nranks); }

// Fails the clique: every rank's async error (culprit_code for `culprit`,
// others_code for the rest), every op not moving data, every waiting task.
void FailCliqueLocked(Clique& q, int culprit, ncclResult_t culprit_code, ncclResult_t others_code,
                      const std::string& message) {
  if (q.failed) return;
  q.failed = true;
  for (int r = 0; r < q.nranks; ++r) {
    RankState& rank = q.ranks[static_cast<size_t>(r)];
    if (rank.error != ncclSuccess) continue;
    rank.error = r == culprit ? culprit_code : others_code;
    rank.last_error = kPrefix + message;
  }
  for (auto it = q.ops.begin(); it != q.ops.end();) {
    if (it->second->state == Op::kMoving) {
      ++it;  // finishes, then leaves the table
    } else {
      it->second->state = Op::kFailed;
      it = q.ops.erase(it);
    }
  }
  q.cv.notify_all();
}

// After a side was posted or marked bad: a mix of bad and good sides fails
// the clique; an op whose every side failed its checks is forgotten.
void CheckSidesLocked(Clique& q, Op& op) {
  const Op::Side* bad = nullptr;
  const Op::Side* good = nullptr;
  int posted = 0;
  for (const Op::Side& s : op.sides) {
    if (!s.posted) continue;
    ++posted;
    if (s.bad && bad == nullptr) bad = &s;
    if (!s.bad && good == nullptr) good = &s;
  }
  if (bad != nullptr && good != nullptr) {
    FailCliqueLocked(q, bad->rank, ncclInvalidUsage, ncclInvalidUsage,
                     OpTitle(op) + ": rank " + to_string(bad->rank) + "'s " + Describe(bad->call) + " failed (" +
                         bad->bad_reason + ") while rank " + to_string(good->rank) + " called " + Describe(good->call) +
                         "; real NCCL would hang");
  } else if (good == nullptr && posted == static_cast<int>(op.sides.size()) && op.state == Op::kWaiting) {
    q.ops.erase(op.key);
  }
}

// Posts `call` of `rank` as its part of the next matching op (lock held).
std::shared_ptr<Op> PostLocked(Clique& q, int rank, const Call& call, bool bad, const std::string& bad_reason,
                               int* side_index) {
  RankState& me = q.ranks[static_cast<size_t>(rank)];
  const auto peer = static_cast<size_t>(call.root);
  OpKey key;
  int side = 0;
  switch (call.kind) {
    case Kind::kSend:
      key = {rank, call.root, me.sends[peer]++};
      side = 0;
      break;
    case Kind::kRecv:
      key = {call.root, rank, me.recvs[peer]++};
      side = 1;
      break;
    default:
      key = {-1, -1, me.collectives++};
      side = rank;
      break;
  }
  std::shared_ptr<Op>& slot = q.ops[key];
  if (slot == nullptr) {
    slot = std::make_shared<Op>();
    slot->key = key;
    if (std::get<0>(key) < 0) {
      slot->sides.resize(static_cast<size_t>(q.nranks));
      for (int r = 0; r < q.nranks; ++r) slot->sides[static_cast<size_t>(r)].rank = r;
    } else {
      slot->sides.resize(2);
      slot->sides[0].rank = std::get<0>(key);
      slot->sides[1].rank = std::get<1>(key);
    }
  }
  std::shared_ptr<Op> op = slot;
  Op::Side& s = op->sides[static_cast<size_t>(side)];
  s.posted = true;
  s.bad = bad;
  s.bad_reason = bad_reason;
  s.call = call;
  *side_index = side;
  if (!bad) {
    for (const Op::Side& other : op->sides) {
      if (&other == &s || !other.posted || other.bad || Matches(other.call, call)) continue;
      FailCliqueLocked(q, -1, ncclInvalidUsage, ncclInvalidUsage,
                       OpTitle(*op) + " does not match across ranks: rank " + to_string(other.rank) + " called " +
                           Describe(other.call) + ", rank " + to_string(rank) + " called " + Describe(call) +
                           "; real NCCL would hang or corrupt memory");
      return op;
    }
  }
  CheckSidesLocked(q, *op);
  if (q.failed) return op;
  for (const Op::Side& other : op->sides) {
    if (other.posted || !q.ranks[static_cast<size_t>(other.rank)].destroyed) continue;
    FailCliqueLocked(q, -1, ncclInvalidUsage, ncclInvalidUsage,
                     OpTitle(*op) + ": rank " + to_string(rank) + " called " + Describe(call) + " but rank " +
                         to_string(other.rank) + " destroyed its communicator before posting its part");
    break;
  }
  return op;
}

// One rank's part of an op, as a task carries it.
struct Part {
  std::shared_ptr<Clique> clique;
  std::shared_ptr<Op> op;
  int side = 0;
  int rank = 0;
};

// The data movement of an op, once every side arrived (no lock: nothing
// changes the sides any more).
void Move(const Op& op) {
  const Call& c = op.sides[0].call;
  const size_t bytes = c.count * TypeSize(c.type);
  if (bytes == 0) return;
  if (std::get<0>(op.key) >= 0) {
    std::memmove(op.sides[1].call.recv, op.sides[0].call.send, bytes);
    return;
  }
  const size_t n = op.sides.size();
  if (c.kind == Kind::kBroadcast) {
    const auto root = static_cast<size_t>(c.root);
    const void* source = op.sides[root].call.send;
    for (size_t r = 0; r < n; ++r) {
      if (r != root && op.sides[r].call.recv != source) std::memcpy(op.sides[r].call.recv, source, bytes);
    }
    if (op.sides[root].call.recv != source) std::memmove(op.sides[root].call.recv, source, bytes);
    return;
  }
  // All inputs are read before any output is written: in place is safe.
  std::vector<const void*> inputs(n);
  for (size_t r = 0; r < n; ++r) inputs[r] = op.sides[r].call.send;
  std::vector<unsigned char> result(bytes);
  Reduce(c.type, c.op, inputs, c.count, result.data());
  for (size_t r = 0; r < n; ++r) {
    if (c.kind == Kind::kAllReduce || static_cast<int>(r) == c.root) {
      std::memcpy(op.sides[r].call.recv, result.data(), bytes);
    }
  }
}

void Arrive(const Part& part) {
  Clique& q = *part.clique;
  Op& op = *part.op;
  std::unique_lock<std::mutex> lock(q.mu);
  if (q.ranks[static_cast<size_t>(part.rank)].aborted || op.state != Op::kWaiting) return;
  op.sides[static_cast<size_t>(part.side)].arrived = true;
  if (++op.arrived < static_cast<int>(op.sides.size())) return;
  op.state = Op::kMoving;
  lock.unlock();
  Move(op);
  lock.lock();
  op.state = Op::kDone;
  q.ops.erase(op.key);
  q.cv.notify_all();
}

cudaError_t Wait(const Part& part) {
  Clique& q = *part.clique;
  const Op& op = *part.op;
  const RankState& me = q.ranks[static_cast<size_t>(part.rank)];
  std::unique_lock<std::mutex> lock(q.mu);
  q.cv.wait(lock, [&] {
    return op.state == Op::kDone || op.state == Op::kFailed || (me.aborted && op.state != Op::kMoving);
  });
  if (op.state == Op::kDone || me.aborted) return cudaSuccess;
  return cudaErrorLaunchFailure;
}

// A stream task's parts. Destroyed without running (its stream skipped it,
// e.g. behind an earlier error, or was destroyed), it fails the cliques its
// parts belong to, as their peers would otherwise wait forever.
struct TaskParts {
  std::vector<Part> parts;
  bool ran = false;

  ~TaskParts() {
    if (ran) return;
    for (const Part& p : parts) {
      Clique& q = *p.clique;
      std::lock_guard<std::mutex> lock(q.mu);
      --q.ranks[static_cast<size_t>(p.rank)].pending;
      q.cv.notify_all();  // ncclCommDestroy may wait for it
      FailCliqueLocked(q, p.rank, ncclUnhandledCudaError, ncclRemoteError,
                       "rank " + to_string(p.rank) + "'s stream never ran its part of " + OpTitle(*p.op) +
                           " (an earlier error on that stream, or the stream was destroyed)");
    }
  }

  cudaError_t Run() {
    ran = true;
    for (const Part& p : parts) Arrive(p);
    cudaError_t result = cudaSuccess;
    for (const Part& p : parts) {
      const cudaError_t waited = Wait(p);
      if (result == cudaSuccess) result = waited;
    }
    for (const Part& p : parts) {
      std::lock_guard<std::mutex> lock(p.clique->mu);
      --p.clique->ranks[static_cast<size_t>(p.rank)].pending;
      p.clique->cv.notify_all();
    }
    return result;
  }
};

// Queues one task on `stream` for `parts`.
ncclResult_t Submit(std::vector<Part> parts, cudaStream_t stream, const ncclComm* comm) {
  auto task = std::make_shared<TaskParts>();
  task->parts = std::move(parts);
  for (const Part& p : task->parts) {
    std::lock_guard<std::mutex> lock(p.clique->mu);
    ++p.clique->ranks[static_cast<size_t>(p.rank)].pending;
  }
  const cudaError_t err = cuda_emu::Enqueue(stream, [task] { return task->Run(); });
  if (err == cudaSuccess) return ncclSuccess;
  return CallError(comm, ncclUnhandledCudaError,
                   std::string("queueing on the stream: ") + cudaGetErrorName(err) + " (the ops fail on every rank)");
}

// ---------------------------------------------------------------------------
// Groups: the calling thread's ops between ncclGroupStart and the outermost
// ncclGroupEnd.

struct GroupOp {
  std::shared_ptr<ncclComm> comm;
  cudaStream_t stream;
  Part part;
};
struct Group {
  int depth = 0;
  std::vector<GroupOp> ops;
  std::vector<std::shared_ptr<ncclComm>> inits;  // blocking inits, waited for at the end
  ncclResult_t error = ncclSuccess;
  std::string message;
};
thread_local Group t_group;

// The async state of a comm's rank (lock held).
ncclResult_t StateLocked(const Clique& q, int rank) {
  const ncclResult_t error = q.ranks[static_cast<size_t>(rank)].error;
  if (error != ncclSuccess) return error;
  return q.formed ? ncclSuccess : ncclInProgress;
}

bool SpecialStream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

// Checks a call, posts it and queues it (or keeps it for the group).
ncclResult_t Issue(const Call& call, ncclComm_t handle, cudaStream_t stream) {
  const char* const name = call.kind == Kind::kAllReduce   ? "ncclAllReduce"
                           : call.kind == Kind::kBroadcast ? "ncclBroadcast"
                           : call.kind == Kind::kReduce    ? "ncclReduce"
                           : call.kind == Kind::kSend      ? "ncclSend"
                                                           : "ncclRecv";
  auto group_error = [](ncclResult_t r) {
    if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = r, t_group.message = t_last_error;
    return r;
  };
  if (handle == nullptr) return group_error(CallError(nullptr, ncclInvalidArgument, std::string(name) + ": null comm"));
  std::shared_ptr<ncclComm> comm = Resolve(handle);
  if (comm == nullptr) {
    return group_error(
        CallError(nullptr, ncclInvalidUsage, std::string(name) + ": not a live communicator (aborted or destroyed?)"));
  }
  Clique& q = *comm->clique;
  const std::string what = std::string(name) + " on " + Who(*comm);
  const bool p2p = call.kind == Kind::kSend || call.kind == Kind::kRecv;
  const bool rooted = call.kind == Kind::kBroadcast || call.kind == Kind::kReduce;

  // The checks that let the call still take its place in the op order.
  ncclResult_t bad = ncclSuccess;
  std::string reason;
  auto check = [&](bool ok, ncclResult_t r, const std::string& why) {
    if (!ok && bad == ncclSuccess) bad = r, reason = why;
  };
  check(ValidType(call.type), ncclInvalidArgument, "invalid " + TypeName(call.type));
  check(p2p || call.kind == Kind::kBroadcast || ValidOp(call.op), ncclInvalidArgument, "invalid " + OpName(call.op));
  check(!rooted || (call.root >= 0 && call.root < q.nranks), ncclInvalidArgument,
        "root " + to_string(call.root) + " outside [0, " + to_string(q.nranks) + ")");
  const bool is_root = !rooted || call.root == comm->rank;
  const bool needs_send = call.kind == Kind::kAllReduce || call.kind == Kind::kReduce || call.kind == Kind::kSend ||
                          (call.kind == Kind::kBroadcast && is_root);
  const bool needs_recv = call.kind == Kind::kAllReduce || call.kind == Kind::kBroadcast || call.kind == Kind::kRecv ||
                          (call.kind == Kind::kReduce && is_root);
  check(call.count == 0 || !needs_send || call.send != nullptr, ncclInvalidArgument,
        "null sendbuff with count " + to_string(call.count));
  check(call.count == 0 || !needs_recv || call.recv != nullptr, ncclInvalidArgument,
        "null recvbuff with count " + to_string(call.count));
  if (!SpecialStream(stream)) {
    const int device = cuda_emu::StreamDevice(stream);
    check(device >= 0, ncclUnhandledCudaError, "an unknown or destroyed stream");
    check(device < 0 || device == comm->device, ncclInvalidUsage,
          "a stream on cuda:" + to_string(device) + ", the communicator is on cuda:" + to_string(comm->device));
  }

  Part part{comm->clique, nullptr, 0, comm->rank};
  {
    std::lock_guard<std::mutex> lock(q.mu);
    RankState& me = q.ranks[static_cast<size_t>(comm->rank)];
    const ncclResult_t state = StateLocked(q, comm->rank);
    if (state == ncclInProgress) {
      return group_error(CallErrorLocked(
          &me, ncclInvalidUsage, what + ": the communicator is still initialising (poll ncclCommGetAsyncError)"));
    }
    if (state != ncclSuccess) {
      return group_error(
          CallErrorLocked(&me, state, what + ": the communicator failed earlier: " + Unprefixed(me.last_error)));
    }
    if (p2p && (call.root < 0 || call.root >= q.nranks)) {
      return group_error(
          CallErrorLocked(&me, ncclInvalidArgument,
                          what + ": peer " + to_string(call.root) + " outside [0, " + to_string(q.nranks) + ")"));
    }
    // Refused without taking a place: the emulator's own rule, not NCCL's.
    if (p2p && call.root == comm->rank && t_group.depth == 0) {
      return group_error(
          CallErrorLocked(&me, ncclInvalidUsage,
                          what + ": a send to or receive from its own rank outside a group would wait for itself"));
    }
    part.op = PostLocked(q, comm->rank, call, bad != ncclSuccess, reason, &part.side);
    if (bad != ncclSuccess) return group_error(CallErrorLocked(&me, bad, what + ": " + reason));
  }
  if (t_group.depth > 0) {
    t_group.ops.push_back({std::move(comm), stream, std::move(part)});
    return ncclSuccess;
  }
  return Submit({std::move(part)}, stream, comm.get());
}

// Tears a rank out of its clique: the other ranks fail with ncclRemoteError.
void AbortRank(const std::shared_ptr<ncclComm>& comm) {
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  q.ranks[static_cast<size_t>(comm->rank)].aborted = true;
  FailCliqueLocked(
      q, comm->rank, ncclInvalidUsage, ncclRemoteError,
      Who(*comm) + " aborted its communicator" + (q.formed ? std::string() : std::string(" before every rank joined")));
  q.cv.notify_all();
  // An op moving data may still write this rank's buffers: let it finish.
  q.cv.wait(lock, [&] {
    for (const auto& [key, op] : q.ops) {
      if (op->state != Op::kMoving) continue;
      for (const Op::Side& s : op->sides) {
        if (s.rank == comm->rank) return false;
      }
    }
    return true;
  });
}

std::shared_ptr<ncclComm> Unregister(ncclComm_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Live().find(handle);
  if (it == Live().end()) return nullptr;
  std::shared_ptr<ncclComm> comm = std::move(it->second);
  Live().erase(it);
  return comm;
}

struct IdLayout {
  char magic[32];
  int64_t pid;
  uint64_t nonce[2];
};
static_assert(sizeof(IdLayout) <= NCCL_UNIQUE_ID_BYTES);
constexpr char kIdMagic[] = "tessera cuda_emu nccl id";

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

ncclResult_t InitRank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, bool blocking) {
  if (out == nullptr) return CallError(nullptr, ncclInvalidArgument, "ncclCommInitRank: null comm pointer");
  *out = nullptr;
  if (nranks < 1) return CallError(nullptr, ncclInvalidArgument, "ncclCommInitRank: nranks " + to_string(nranks));
  if (rank < 0 || rank >= nranks) {
    return CallError(nullptr, ncclInvalidArgument,
                     "ncclCommInitRank: rank " + to_string(rank) + " outside [0, " + to_string(nranks) + ")");
  }
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof(layout));
  if (std::memcmp(layout.magic, kIdMagic, sizeof(kIdMagic)) != 0) {
    return CallError(nullptr, ncclInvalidArgument, "ncclCommInitRank: the id is not one from ncclGetUniqueId");
  }
  if (layout.pid != static_cast<int64_t>(getpid())) {
    return CallError(nullptr, ncclInvalidUsage,
                     "ncclCommInitRank: the unique id was made by process " + to_string(layout.pid) + ", this is " +
                         to_string(getpid()) + "; the CUDA emulator's NCCL joins the ranks of one process only");
  }
  const std::string key(id.internal, sizeof(id.internal));
  const std::string who = "ncclCommInitRank: rank " + to_string(rank) + "/" + to_string(nranks);
  std::shared_ptr<ncclComm> comm;
  {
    std::lock_guard<std::mutex> global(g_mu);
    std::shared_ptr<Clique>& slot = Forming()[key];
    if (slot == nullptr) slot = std::make_shared<Clique>(nranks);
    std::shared_ptr<Clique> q = slot;
    std::lock_guard<std::mutex> lock(q->mu);
    if (q->nranks != nranks) {
      return CallError(nullptr, ncclInvalidUsage,
                       who + ": the other ranks of this id said nranks " + to_string(q->nranks));
    }
    if (q->failed) {
      return CallError(nullptr, ncclRemoteError,
                       who + ": " + Unprefixed(q->ranks[static_cast<size_t>(rank)].last_error));
    }
    RankState& me = q->ranks[static_cast<size_t>(rank)];
    if (me.joined) return CallError(nullptr, ncclInvalidUsage, who + ": this rank already joined with this id");
    me.joined = true;
    comm = std::make_shared<ncclComm>();
    comm->clique = q;
    comm->rank = rank;
    comm->device = cuda_emu::CurrentDevice();
    Live()[comm.get()] = comm;
    if (++q->joined == nranks) {
      q->formed = true;
      Forming().erase(key);  // the id is spent
      q->cv.notify_all();
    }
  }
  *out = comm.get();
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  if (!blocking) return q.formed ? ncclSuccess : ncclInProgress;
  if (t_group.depth > 0) {  // one thread may init several ranks in a group: ncclGroupEnd waits
    t_group.inits.push_back(std::move(comm));
    return ncclSuccess;
  }
  q.cv.wait(lock, [&] { return q.formed || q.failed; });
  if (q.formed) return ncclSuccess;
  const std::string message = q.ranks[static_cast<size_t>(rank)].last_error;
  lock.unlock();
  Unregister(*out);
  *out = nullptr;
  t_last_error = message;
  return ncclRemoteError;
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return CallError(nullptr, ncclInvalidArgument, "ncclGetVersion: null pointer");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t handle) {
  thread_local std::string returned;
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle);
  if (comm == nullptr) {
    returned = t_last_error;
  } else {
    std::lock_guard<std::mutex> lock(comm->clique->mu);
    returned = comm->clique->ranks[static_cast<size_t>(comm->rank)].last_error;
  }
  return returned.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return CallError(nullptr, ncclInvalidArgument, "ncclGetUniqueId: null pointer");
  static const uint64_t seed = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  static std::atomic<uint64_t> counter{0};
  IdLayout layout{};
  std::memcpy(layout.magic, kIdMagic, sizeof(kIdMagic));
  layout.pid = getpid();
  const uint64_t n = counter.fetch_add(1);
  layout.nonce[0] = Mix(seed ^ Mix(n));
  layout.nonce[1] = Mix(layout.nonce[0] + n);
  std::memset(unique_id->internal, 0, sizeof(unique_id->internal));
  std::memcpy(unique_id->internal, &layout, sizeof(layout));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  bool blocking = true;
  if (config != nullptr) {
    if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
      if (comm != nullptr) *comm = nullptr;
      return CallError(nullptr, ncclInvalidArgument,
                       "ncclCommInitRankConfig: a config not made with NCCL_CONFIG_INITIALIZER");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1) {
      if (comm != nullptr) *comm = nullptr;
      return CallError(nullptr, ncclInvalidArgument,
                       "ncclCommInitRankConfig: blocking " + to_string(config->blocking) + " (0 or 1)");
    }
    blocking = config->blocking != 0;
  }
  return InitRank(comm, nranks, comm_id, rank, blocking);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return InitRank(comm, nranks, comm_id, rank, /*blocking=*/true);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t* async_error) {
  if (handle == nullptr || async_error == nullptr) {
    return CallError(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  }
  std::shared_ptr<ncclComm> comm = Resolve(handle);
  if (comm == nullptr) {
    return CallError(nullptr, ncclInvalidUsage,
                     "ncclCommGetAsyncError: not a live communicator (aborted or destroyed?)");
  }
  std::lock_guard<std::mutex> lock(comm->clique->mu);
  *async_error = StateLocked(*comm->clique, comm->rank);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t handle) {
  if (handle == nullptr) return ncclSuccess;
  std::shared_ptr<ncclComm> comm = Unregister(handle);
  if (comm == nullptr) {
    return CallError(nullptr, ncclInvalidUsage, "ncclCommAbort: not a live communicator (aborted or destroyed?)");
  }
  AbortRank(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t handle) {
  if (handle == nullptr) return ncclSuccess;
  std::shared_ptr<ncclComm> comm = Unregister(handle);
  if (comm == nullptr) {
    return CallError(nullptr, ncclInvalidUsage, "ncclCommDestroy: not a live communicator (aborted or destroyed?)");
  }
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  if (!q.formed) {  // nothing queued; the ranks waiting to form must not hang
    lock.unlock();
    AbortRank(comm);
    return ncclSuccess;
  }
  RankState& me = q.ranks[static_cast<size_t>(comm->rank)];
  q.cv.wait(lock, [&] { return me.pending == 0; });
  me.destroyed = true;
  // Peers waiting for a part this rank never posted would wait forever.
  for (const auto& [key, op] : q.ops) {
    for (const Op::Side& s : op->sides) {
      if (s.rank != comm->rank || s.posted) continue;
      FailCliqueLocked(q, -1, ncclInvalidUsage, ncclInvalidUsage,
                       OpTitle(*op) + ": " + Who(*comm) + " destroyed its communicator before posting its part");
      return ncclSuccess;
    }
  }
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t handle, int* count) {
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle);
  if (comm == nullptr || count == nullptr)
    return CallError(nullptr, ncclInvalidArgument, "ncclCommCount: bad argument");
  *count = comm->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t handle, int* device) {
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle);
  if (comm == nullptr || device == nullptr) {
    return CallError(nullptr, ncclInvalidArgument, "ncclCommCuDevice: bad argument");
  }
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t handle, int* rank) {
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle);
  if (comm == nullptr || rank == nullptr) {
    return CallError(nullptr, ncclInvalidArgument, "ncclCommUserRank: bad argument");
  }
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return Issue({Kind::kAllReduce, count, datatype, op, 0, sendbuff, recvbuff}, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return Issue({Kind::kBroadcast, count, datatype, ncclSum, root, sendbuff, recvbuff}, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return Issue({Kind::kReduce, count, datatype, op, root, sendbuff, recvbuff}, comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return Issue({Kind::kSend, count, datatype, ncclSum, peer, sendbuff, nullptr}, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return Issue({Kind::kRecv, count, datatype, ncclSum, peer, nullptr, recvbuff}, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group.depth == 0) return CallError(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  Group group = std::move(t_group);
  t_group = Group();
  ncclResult_t result = group.error;
  for (const std::shared_ptr<ncclComm>& comm : group.inits) {
    Clique& q = *comm->clique;
    std::unique_lock<std::mutex> lock(q.mu);
    q.cv.wait(lock, [&] { return q.formed || q.failed; });
    if (!q.formed && result == ncclSuccess) {
      result = ncclRemoteError;
      group.message = q.ranks[static_cast<size_t>(comm->rank)].last_error;
    }
  }
  if (result != ncclSuccess) {
    // Nothing of the group runs; peers that posted the same ops fail.
    for (GroupOp& g : group.ops) {
      Clique& q = *g.part.clique;
      std::lock_guard<std::mutex> lock(q.mu);
      Op::Side& s = g.part.op->sides[static_cast<size_t>(g.part.side)];
      s.bad = true;
      s.bad_reason = "its group failed: " + group.message;
      CheckSidesLocked(q, *g.part.op);
    }
    t_last_error = group.message;
    return result;
  }
  // One task per stream, its ops in issue order.
  std::vector<std::pair<cudaStream_t, std::vector<Part>>> tasks;
  std::vector<const ncclComm*> comms;
  for (GroupOp& g : group.ops) {
    auto it = std::find_if(tasks.begin(), tasks.end(), [&](const auto& t) { return t.first == g.stream; });
    if (it == tasks.end()) {
      tasks.emplace_back(g.stream, std::vector<Part>());
      comms.push_back(g.comm.get());
      it = tasks.end() - 1;
    }
    it->second.push_back(std::move(g.part));
  }
  for (size_t i = 0; i < tasks.size(); ++i) {
    const ncclResult_t r = Submit(std::move(tasks[i].second), tasks[i].first, comms[i]);
    if (result == ncclSuccess) result = r;
  }
  return result;
}
