// The CUDA emulator's NCCL (include/nccl.h): ranks on emulated GPUs,
// exchanging data through host memory within a process and over 127.0.0.1
// TCP between the processes of one machine.
//
// Model:
// - A unique id names a clique of nranks ranks; each ncclCommInitRank* joins
//   it. The clique lives in the process that made the id (its hub, below);
//   ranks of other processes of the machine join it from there.
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
//   The aborting rank's handle is gone, as real NCCL frees it: any call
//   with it afterwards stops the process with a message naming the call.
// - Non-blocking communicators (config.blocking = 0): initialisation is
//   ncclInProgress until every rank joined. With
//   TESSERA_CUDA_EMU_NCCL_ENQUEUE_POLLS=N (read once per process; 0, the
//   default, for none) every op call outside a group, and every
//   ncclGroupEnd holding ops, on such a communicator also returns
//   ncclInProgress, as real NCCL may while it connects to peers: the op is
//   queued on its stream, and the communicator stays ncclInProgress for the
//   next N ncclCommGetAsyncError polls; an op call before then is
//   ncclInvalidUsage. This runs the callers' polling loops.
// - Across processes (one machine, 127.0.0.1 only), as real NCCL's bootstrap
//   root: ncclGetUniqueId starts the process's hub once, a listener on an
//   ephemeral port of 127.0.0.1 with detached threads and state never
//   destroyed. The id holds a magic string (bytes 0-31), the maker's pid
//   (int64 at byte 32), a nonce (16 bytes at 40) and the hub's port (uint16
//   at 56, 0: no hub). A rank given an id of another process connects to
//   that hub, one connection per rank, and joins: the hub makes it a member
//   of the clique, which may mix its own ranks and remote ones. The remote
//   rank's ncclComm is a stand-in whose clique is a cache of its state
//   (formed; failed, with code and message) that the hub pushes on every
//   change, so ncclCommGetAsyncError, ncclGetLastError and the calls' checks
//   answer locally and see every failure cause above. Its calls check their
//   arguments where they are made (the stream and device are there) and post
//   in call order, failed checks too; the hub takes the posts in arrival
//   order, in the op order as a local rank's. Its task sends its parts' send
//   bytes; a hub thread arrives and waits for them as a local rank's task
//   would and sends back the outcome and the receive bytes, which the task
//   copies into its buffers before it ends with a local rank's result.
//   ncclCommAbort on a remote rank ends its waiting tasks at once (hub
//   reachable or not), tells the hub (the clique fails as for a local abort)
//   and closes the connection; ncclCommDestroy waits for its tasks, then the
//   hub destroys the rank. A forked child cannot use its parent's
//   communicators (refused as not live) and does not hold their sockets
//   (closed at the fork); it gets a hub of its own.
// - A process that goes away, its connection ending without an abort or a
//   destroy (a remote rank's process, or the hub's): by default nothing
//   fails, the peers' ops wait until ncclCommAbort ends them, as NCCL over
//   NVLink or shared memory hangs when a peer process dies. With
//   TESSERA_CUDA_EMU_NCCL_PEER_LOSS=error (read once per process; hang is
//   the default) the loss fails the clique: a remote rank's process gone
//   fails it on the hub with ncclRemoteError on every rank, naming that
//   rank; the hub's process gone sets ncclRemoteError in the remote rank's
//   cache and ends its waiting tasks with cudaErrorLaunchFailure. Any other
//   value aborts the process with a one-line message saying what is allowed.
// - The hub survives whatever reaches its port: a wrong magic, an unknown
//   frame or id, a length over its bound (16 MiB for a control frame, 1 GiB
//   for a data frame; a call's buffer 1 TiB) or a frame out of order ends
//   that connection only.
// - Locks: one mutex per clique (its condition variable is what tasks wait
//   on; a remote rank's cache has one too, which also guards its tasks'
//   results) and a global one for the id registry and the live handles,
//   never held while waiting; order global, then clique, then a hub link's
//   outbox lock (a leaf: a clique's lock holder queues frames for the link's
//   writer thread and never touches a socket). A connection's write lock
//   (frames never interleave) and the per-process locks (the hub's start)
//   are taken with no other lock held. The emulator's streams are never
//   called with a clique lock held.

#include "nccl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
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

// Whether `rank`'s part of `c` reads its send buffer, and writes its receive
// buffer once the op is done.
bool NeedsSend(const Call& c, int rank) {
  if (c.kind == Kind::kBroadcast) return c.root == rank;
  return c.kind != Kind::kRecv;
}
bool WritesRecv(const Call& c, int rank) {
  if (c.kind == Kind::kReduce) return c.root == rank;
  return c.kind != Kind::kSend;
}
size_t Bytes(const Call& c) { return c.count * TypeSize(c.type); }

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
  int enqueuing = 0;  // ncclCommGetAsyncError polls left that answer ncclInProgress (ENQUEUE_POLLS)
  uint64_t collectives = 0;
  std::vector<uint64_t> sends, recvs;  // per peer
};

struct HubLink;

struct Clique {
  explicit Clique(int n) : nranks(n), ranks(static_cast<size_t>(n)), links(static_cast<size_t>(n)) {
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
  // The connections of its ranks in other processes (null: a rank of this
  // process, or one whose connection ended).
  std::vector<std::shared_ptr<HubLink>> links;
};

struct Proxy;

}  // namespace

// What an ncclComm_t points to. Handles are looked up in the live table
// before use: one this process aborted or destroyed stops it (Freed(), a use
// after free on real NCCL), any other unknown one is refused.
struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
  bool blocking = true;  // config.blocking
  pid_t pid = 0;  // the process that made it: a forked child's copy is no live one
  // A rank of another process's clique: its stand-in there; `clique` is
  // then the cache of its state.
  std::shared_ptr<Proxy> proxy;
  int64_t remote_pid = 0;  // on a hub, a remote rank's member: the process it lives in
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

// Handles this process aborted or destroyed. Real NCCL frees the
// communicator then, so a later call with its handle reads freed memory (and
// may crash or hang far from the cause); the emulator keeps the object, so
// its address is never handed out again, and stops the process with a
// message naming the call.
std::unordered_map<const ncclComm*, std::shared_ptr<ncclComm>>& Freed() {
  static auto* table = new std::unordered_map<const ncclComm*, std::shared_ptr<ncclComm>>;
  return *table;
}

[[noreturn]] void UseAfterFree(const char* call) {
  std::fprintf(stderr,
               "NCCL emulator: %s with a communicator this process already aborted or destroyed (real NCCL has "
               "freed it: a use after free)\n",
               call);
  std::fflush(stderr);
  std::abort();
}

// `call` names the NCCL function for the use-after-free message.
std::shared_ptr<ncclComm> Resolve(const ncclComm* comm, const char* call) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (Freed().count(comm) != 0) UseAfterFree(call);
  auto it = Live().find(comm);
  return it == Live().end() || it->second->pid != getpid() ? nullptr : it->second;
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

// ---------------------------------------------------------------------------
// Across processes: the wire. Frames of a 16-byte header (magic, type,
// payload length) and a payload of fixed-size fields in host order (both
// ends are on one machine) and strings (uint32 length, bytes).

constexpr uint32_t kWireMagic = 0x554d4554;            // "TEMU"
constexpr uint64_t kMaxControl = uint64_t{16} << 20;   // a frame's payload, but data's
constexpr uint64_t kMaxData = uint64_t{1} << 30;       // a data frame's
constexpr uint64_t kChunk = uint64_t{64} << 20;        // data frames as sent
constexpr uint64_t kMaxCallBytes = uint64_t{1} << 40;  // one call's buffer
constexpr uint64_t kMaxTaskBytes = uint64_t{1} << 46;  // one task's receive bytes
constexpr uint32_t kMaxString = 64 * 1024;

enum Msg : uint32_t {
  // A remote rank to its hub.
  kJoin = 1,  // id, nranks, rank, device, pid
  kPost,      // seq, call, bad, reason: the rank's next call, in call order
  kBad,       // seq, reason: a posted call's group failed
  kRun,       // task, seqs, bytes: a stream task's parts start; their send bytes follow
  kSkip,      // seqs: a task its stream never ran
  kAbort,
  kDestroy,
  // A hub to a remote rank.
  kJoinReply = 16,  // result, formed, message
  kState,           // error, formed, message: the rank's async state changed
  kResult,          // task, result, per part whether it has data, bytes; the receive bytes follow
  // Both ways: the bytes after kRun and kResult.
  kData = 32,
};

struct Header {
  uint32_t magic;
  uint32_t type;
  uint64_t length;
};
static_assert(sizeof(Header) == 16);

std::string FrameHeader(uint32_t type, uint64_t length) {
  const Header h{kWireMagic, type, length};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

class Writer {
 public:
  template <class T>
  Writer& Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Writer& PutString(const std::string& s) {
    const size_t n = std::min<size_t>(s.size(), kMaxString);
    Put(static_cast<uint32_t>(n));
    bytes_.append(s, 0, n);
    return *this;
  }
  // The frame of `type` carrying what was put.
  std::string Frame(uint32_t type) const { return FrameHeader(type, bytes_.size()) + bytes_; }

 private:
  std::string bytes_;
};

// Reads a payload; a field beyond its end reads as zero and fails Done().
class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  template <class T>
  T Get() {
    T v{};
    if (!ok_ || bytes_.size() - at_ < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string GetString() {
    const auto n = Get<uint32_t>();
    if (!ok_ || n > kMaxString || bytes_.size() - at_ < n) {
      ok_ = false;
      return {};
    }
    std::string s = bytes_.substr(at_, n);
    at_ += n;
    return s;
  }
  // Whether a count of 8-byte fields can be there at all.
  bool Fits(uint64_t n) const { return n <= (bytes_.size() - at_) / 8; }
  // Every field read, nothing left over.
  bool Done() const { return ok_ && at_ == bytes_.size(); }

 private:
  const std::string& bytes_;
  size_t at_ = 0;
  bool ok_ = true;
};

// Sends every byte. MSG_NOSIGNAL: a peer gone is an error here, never a
// SIGPIPE.
bool SendAll(int fd, const void* data, size_t n, int flags = 0) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = send(fd, p, n, MSG_NOSIGNAL | flags);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}
bool SendAll(int fd, const std::string& bytes, int flags = 0) { return SendAll(fd, bytes.data(), bytes.size(), flags); }

// Receives exactly n bytes: false at the stream's end, on an error or a
// timeout.
bool RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// A frame's header, refused for a wrong magic or a length beyond its bound.
bool ReadHeader(int fd, Header* h) {
  if (!RecvAll(fd, h, sizeof(*h)) || h->magic != kWireMagic) return false;
  return h->length <= (h->type == kData ? kMaxData : kMaxControl);
}

// The next frame, which must not be data.
bool ReadControl(int fd, uint32_t* type, std::string* payload) {
  Header h;
  if (!ReadHeader(fd, &h) || h.type == kData) return false;
  *type = h.type;
  payload->assign(h.length, '\0');
  return RecvAll(fd, payload->data(), payload->size());
}

// The n bytes of data frames after a kRun or kResult.
bool ReadData(int fd, char* out, uint64_t n) {
  while (n > 0) {
    Header h;
    if (!ReadHeader(fd, &h) || h.type != kData || h.length == 0 || h.length > n) return false;
    if (!RecvAll(fd, out, h.length)) return false;
    out += h.length;
    n -= h.length;
  }
  return true;
}

bool SendData(int fd, const void* data, uint64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const uint64_t chunk = std::min(n, kChunk);
    if (!SendAll(fd, FrameHeader(kData, chunk)) || !SendAll(fd, p, chunk)) return false;
    p += chunk;
    n -= chunk;
  }
  return true;
}
void AppendData(std::string* frames, const char* data, uint64_t n) {
  while (n > 0) {
    const uint64_t chunk = std::min(n, kChunk);
    *frames += FrameHeader(kData, chunk);
    frames->append(data, chunk);
    data += chunk;
    n -= chunk;
  }
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}
// 0: none.
void SetRecvTimeout(int fd, int seconds) {
  timeval tv{};
  tv.tv_sec = seconds;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

// The emulator's sockets (fd + 1; 0: a free slot). A forked child closes
// its copies (pthread_atfork): holding them, it would keep its parent's
// connections open after the parent died, and the peers could not see it go.
std::atomic<int> g_fds[1024];
void RememberFd(int fd) {
  for (std::atomic<int>& slot : g_fds) {
    int free = 0;
    if (slot.compare_exchange_strong(free, fd + 1)) return;
  }
}
void ForgetFd(int fd) {
  for (std::atomic<int>& slot : g_fds) {
    int mine = fd + 1;
    if (slot.compare_exchange_strong(mine, 0)) return;
  }
}
void CloseInheritedFds() {
  for (std::atomic<int>& slot : g_fds) {
    const int v = slot.exchange(0);
    if (v > 0) close(v - 1);
  }
}

// A connection between a remote rank and its hub. Its fd is closed only
// when the last user lets go, so no thread writes to a reused fd; shutdown()
// ends the connection before.
struct Conn {
  explicit Conn(int f) : fd(f) { RememberFd(fd); }
  ~Conn() {
    if (owner != getpid()) return;  // a forked child's copy: closed at the fork
    ForgetFd(fd);
    close(fd);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  const int fd;
  const pid_t owner = getpid();
  std::mutex write_mu;  // one writer at a time: frames never interleave
};

// On a hub, a remote rank's connection. What goes to it is queued in its
// outbox and written by the link's own thread: a clique's lock holder never
// waits on a socket.
struct HubLink {
  explicit HubLink(std::shared_ptr<Conn> c) : conn(std::move(c)) {}
  void Push(std::string frames) {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    outbox.push_back(std::move(frames));
    cv.notify_all();
  }
  // The writer ends once the outbox is drained.
  void Close() {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    cv.notify_all();
  }
  const std::shared_ptr<Conn> conn;
  std::mutex mu;  // guards the two below
  std::condition_variable cv;
  std::deque<std::string> outbox;
  bool closed = false;
};

std::string StateFrame(ncclResult_t error, bool formed, const std::string& message) {
  return Writer().Put<int32_t>(error).Put<uint8_t>(formed ? 1 : 0).PutString(message).Frame(kState);
}

enum class PeerLoss { kHang, kError };

PeerLoss ReadPeerLoss() {
  const char* value = std::getenv("TESSERA_CUDA_EMU_NCCL_PEER_LOSS");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "hang") == 0) return PeerLoss::kHang;
  if (std::strcmp(value, "error") == 0) return PeerLoss::kError;
  std::fprintf(stderr,
               "NCCL emulator: TESSERA_CUDA_EMU_NCCL_PEER_LOSS=%s: not a choice; hang (the default: a peer process "
               "gone leaves the ops waiting) or error (they fail with ncclRemoteError)\n",
               value);
  std::abort();
}

// This process's part of the cross-process machinery, made anew in a forked
// child (its parent's threads do not run there) and never destroyed:
// detached threads may outlive static destruction.
struct Process {
  pid_t pid = 0;
  PeerLoss peer_loss = PeerLoss::kHang;
  std::mutex mu;  // guards the two below
  bool hub_tried = false;
  uint16_t port = 0;  // the hub's, 0: none
};
Process& Proc() {
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { pthread_atfork(nullptr, nullptr, CloseInheritedFds); });
  static std::mutex mu;
  static Process* current = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (current == nullptr || current->pid != getpid()) {
    auto* p = new Process;
    p->pid = getpid();
    p->peer_loss = ReadPeerLoss();
    current = p;
  }
  return *current;
}

// ---------------------------------------------------------------------------
// Ops of a clique.

// Fails the clique: every rank's async error (culprit_code for `culprit`,
// others_code for the rest), every op not moving data, every waiting task.
// Remote ranks learn their state at once.
void FailCliqueLocked(Clique& q, int culprit, ncclResult_t culprit_code, ncclResult_t others_code,
                      const std::string& message) {
  if (q.failed) return;
  q.failed = true;
  for (int r = 0; r < q.nranks; ++r) {
    RankState& rank = q.ranks[static_cast<size_t>(r)];
    if (rank.error != ncclSuccess) continue;
    rank.error = r == culprit ? culprit_code : others_code;
    rank.last_error = kPrefix + message;
    const std::shared_ptr<HubLink>& link = q.links[static_cast<size_t>(r)];
    if (link != nullptr) link->Push(StateFrame(rank.error, q.formed, rank.last_error));
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

// Every rank joined (lock held): remote ranks learn it, but `joiner`, whose
// join's reply says so.
void FormedLocked(Clique& q, int joiner) {
  q.formed = true;
  q.cv.notify_all();
  for (int r = 0; r < q.nranks; ++r) {
    const std::shared_ptr<HubLink>& link = q.links[static_cast<size_t>(r)];
    if (r != joiner && link != nullptr) link->Push(StateFrame(ncclSuccess, true, ""));
  }
}

std::string NeverRan(int rank, const std::string& title) {
  return "rank " + to_string(rank) + "'s stream never ran its part of " + title +
         " (an earlier error on that stream, or the stream was destroyed)";
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

// A rank destroyed once its tasks finished (lock held): peers waiting for a
// part it never posted would wait forever, so the clique fails.
void DestroyedLocked(Clique& q, const ncclComm& comm) {
  q.ranks[static_cast<size_t>(comm.rank)].destroyed = true;
  for (const auto& [key, op] : q.ops) {
    for (const Op::Side& s : op->sides) {
      if (s.rank != comm.rank || s.posted) continue;
      FailCliqueLocked(q, -1, ncclInvalidUsage, ncclInvalidUsage,
                       OpTitle(*op) + ": " + Who(comm) + " destroyed its communicator before posting its part");
      return;
    }
  }
}

// ---------------------------------------------------------------------------
// Remote ranks: a rank whose clique lives in another process's hub. Its
// ncclComm's clique is a cache: its own state (formed, failed, the async
// error and last error, as the hub pushes them), its pending tasks and
// whether it aborted.

struct Proxy {
  std::shared_ptr<Conn> conn;
  std::shared_ptr<Clique> cache;
  int rank = 0;
  int64_t hub_pid = 0;
  PeerLoss peer_loss = PeerLoss::kHang;
  uint64_t next_seq = 0;  // guarded by conn->write_mu
  std::atomic<uint64_t> next_task{0};
  std::atomic<bool> closing{false};  // an abort or destroy ends the connection: its end is no loss
  // Guarded by cache->mu.
  struct Result {
    bool ready = false;
    cudaError_t code = cudaSuccess;
    std::vector<uint8_t> has_data;  // per part
    std::vector<char> bytes;        // the receive bytes of the parts with data, in part order
  };
  std::map<uint64_t, Result> results;  // per task, while it waits
  bool lost = false;                   // the hub's process went away, with PEER_LOSS=error
};

// One rank's part of an op, as a task carries it. A remote rank's part has
// no op here (its hub has it) but its proxy, its post's number and the call,
// whose buffers its task reads and writes.
struct Part {
  std::shared_ptr<Clique> clique;
  std::shared_ptr<Op> op;
  int side = 0;
  int rank = 0;
  std::shared_ptr<Proxy> proxy;
  uint64_t seq = 0;
  Call call;
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

// Waits for a part's op: whether it is done (its data moved); `*result` its
// task's result (a failed op's cudaErrorLaunchFailure, unless the rank
// aborted).
bool WaitDone(const Part& part, cudaError_t* result) {
  Clique& q = *part.clique;
  const Op& op = *part.op;
  const RankState& me = q.ranks[static_cast<size_t>(part.rank)];
  std::unique_lock<std::mutex> lock(q.mu);
  q.cv.wait(lock, [&] {
    return op.state == Op::kDone || op.state == Op::kFailed || (me.aborted && op.state != Op::kMoving);
  });
  const bool done = op.state == Op::kDone;
  *result = done || me.aborted ? cudaSuccess : cudaErrorLaunchFailure;
  return done;
}

cudaError_t Wait(const Part& part) {
  cudaError_t result = cudaSuccess;
  WaitDone(part, &result);
  return result;
}

// A remote rank's post: its call's place in the op order. Frames go out in
// call order on the rank's one connection; a hub gone leaves it an op that
// never completes, as a dead peer's would.
uint64_t ProxyPost(Proxy& p, const Call& c, bool bad, const std::string& reason) {
  std::lock_guard<std::mutex> lock(p.conn->write_mu);
  const uint64_t seq = p.next_seq++;
  SendAll(p.conn->fd, Writer()
                          .Put(seq)
                          .Put(static_cast<int32_t>(c.kind))
                          .Put(static_cast<uint64_t>(c.count))
                          .Put(static_cast<int32_t>(c.type))
                          .Put(static_cast<int32_t>(c.op))
                          .Put(static_cast<int32_t>(c.root))
                          .Put(static_cast<uint8_t>(bad ? 1 : 0))
                          .PutString(reason)
                          .Frame(kPost));
  return seq;
}

void ProxySend(Proxy& p, const std::string& frame) {
  std::lock_guard<std::mutex> lock(p.conn->write_mu);
  SendAll(p.conn->fd, frame);
}

// A remote task starts its parts of `p`: their posts' numbers and send bytes
// go to the hub, which arrives for them. Returns the task's number.
uint64_t ProxyRun(Proxy& p, const std::vector<const Part*>& parts) {
  const uint64_t task = p.next_task++;
  {
    std::lock_guard<std::mutex> lock(p.cache->mu);
    if (p.cache->ranks[static_cast<size_t>(p.rank)].aborted) return task;  // it just ends
    p.results[task];                                                       // where its result lands
  }
  Writer w;
  w.Put(task).Put(static_cast<uint32_t>(parts.size()));
  uint64_t bytes = 0;
  for (const Part* part : parts) {
    w.Put(part->seq);
    if (NeedsSend(part->call, part->rank)) bytes += Bytes(part->call);
  }
  w.Put(bytes);
  std::lock_guard<std::mutex> lock(p.conn->write_mu);
  if (!SendAll(p.conn->fd, w.Frame(kRun))) return task;
  for (const Part* part : parts) {
    if (NeedsSend(part->call, part->rank) && !SendData(p.conn->fd, part->call.send, Bytes(part->call))) break;
  }
  return task;
}

// Waits for a remote task's result and copies its receive bytes in (under
// the cache's lock: once an abort returned, nothing writes the buffers).
cudaError_t ProxyWait(Proxy& p, uint64_t task, const std::vector<const Part*>& parts) {
  Clique& q = *p.cache;
  const RankState& me = q.ranks[static_cast<size_t>(p.rank)];
  std::unique_lock<std::mutex> lock(q.mu);
  const auto it = p.results.find(task);
  q.cv.wait(lock, [&] { return me.aborted || p.lost || (it != p.results.end() && it->second.ready); });
  cudaError_t result = cudaErrorLaunchFailure;  // the hub's process went away
  if (me.aborted) {
    result = cudaSuccess;
  } else if (it != p.results.end() && it->second.ready) {
    // The parts whose ops are done have data, whatever became of the
    // task's other ops (as a local rank's buffers are written).
    const Proxy::Result& r = it->second;
    bool garbled = r.has_data.size() != parts.size();
    size_t offset = 0;
    for (size_t i = 0; i < parts.size() && !garbled; ++i) {
      if (r.has_data[i] == 0) continue;
      const size_t bytes = Bytes(parts[i]->call);
      garbled = r.bytes.size() - offset < bytes;
      if (garbled) break;
      std::memcpy(parts[i]->call.recv, r.bytes.data() + offset, bytes);
      offset += bytes;
    }
    result = garbled ? cudaErrorLaunchFailure : r.code;
  }
  if (it != p.results.end()) p.results.erase(it);
  return result;
}

// Ends a remote rank's connection after telling the hub `why` (kAbort or
// kDestroy). An abort waits neither for a hub that does not read nor for a
// writer stuck on it.
void ProxyClose(Proxy& p, Msg why) {
  p.closing = true;
  std::unique_lock<std::mutex> lock(p.conn->write_mu, std::defer_lock);
  if (why == kAbort) {  // a second at most
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!lock.try_lock() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else {
    lock.lock();
  }
  if (lock.owns_lock()) {
    const bool told = SendAll(p.conn->fd, Writer().Frame(why), why == kAbort ? MSG_DONTWAIT : 0);
    // Half-closed: the hub reads the frame, then the end, and closes its
    // side, which ends the reader.
    shutdown(p.conn->fd, told ? SHUT_WR : SHUT_RDWR);
  } else {
    shutdown(p.conn->fd, SHUT_RDWR);  // the stuck writer fails
  }
}

// A stream task's parts. Destroyed without running (its stream skipped it,
// e.g. behind an earlier error, or was destroyed), it fails the cliques its
// parts belong to, as their peers would otherwise wait forever.
struct TaskParts {
  std::vector<Part> parts;
  bool ran = false;

  using RemoteParts = std::vector<std::pair<Proxy*, std::vector<const Part*>>>;
  // The remote parts, by proxy (a task may hold parts of several).
  RemoteParts Remote() const {
    RemoteParts out;
    for (const Part& p : parts) {
      if (p.proxy == nullptr) continue;
      auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == p.proxy.get(); });
      if (it == out.end()) it = out.insert(out.end(), {p.proxy.get(), {}});
      it->second.push_back(&p);
    }
    return out;
  }

  ~TaskParts() {
    if (ran) return;
    for (const Part& p : parts) {
      Clique& q = *p.clique;
      std::lock_guard<std::mutex> lock(q.mu);
      --q.ranks[static_cast<size_t>(p.rank)].pending;
      q.cv.notify_all();                 // ncclCommDestroy may wait for it
      if (p.proxy != nullptr) continue;  // its hub fails the clique (below)
      FailCliqueLocked(q, p.rank, ncclUnhandledCudaError, ncclRemoteError, NeverRan(p.rank, OpTitle(*p.op)));
    }
    for (const auto& [proxy, remote] : Remote()) {
      Writer w;
      w.Put(static_cast<uint32_t>(remote.size()));
      for (const Part* p : remote) w.Put(p->seq);
      ProxySend(*proxy, w.Frame(kSkip));
    }
  }

  cudaError_t Run() {
    ran = true;
    const RemoteParts remote = Remote();
    for (const Part& p : parts) {
      if (p.proxy == nullptr) Arrive(p);
    }
    std::vector<uint64_t> tasks;
    for (const auto& [proxy, mine] : remote) tasks.push_back(ProxyRun(*proxy, mine));
    cudaError_t result = cudaSuccess;
    for (const Part& p : parts) {
      if (p.proxy != nullptr) continue;
      const cudaError_t waited = Wait(p);
      if (result == cudaSuccess) result = waited;
    }
    for (size_t i = 0; i < remote.size(); ++i) {
      const cudaError_t waited = ProxyWait(*remote[i].first, tasks[i], remote[i].second);
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

// The count in environment variable `name` (0 when unset or empty); a
// value that is not a count in [0, max] stops the process with a message.
int CountFromEnv(const char* name, long max) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (*end != '\0' || n < 0 || n > max) {
    std::fprintf(stderr, "NCCL emulator: %s=%s: not a count in [0, %ld]\n", name, value, max);
    std::abort();
  }
  return static_cast<int>(n);
}

// TESSERA_CUDA_EMU_NCCL_CONCURRENT, read once: how many NCCL ops may run on
// one device at a time (0, the default: any number). A real GPU runs a
// collective's kernel only where it finds free SMs, so NCCL asks that ops
// on several communicators of a GPU be issued in one order on every rank;
// 1 holds every device to that: an op that waits for its peers keeps the
// device's other NCCL ops from starting.
int ConcurrentOps() {
  static const int limit = CountFromEnv("TESSERA_CUDA_EMU_NCCL_CONCURRENT", 1024);
  return limit;
}

// A device's running NCCL ops, under ConcurrentOps.
class DeviceSlots {
 public:
  static DeviceSlots& Of(int device) {
    static DeviceSlots* slots = new DeviceSlots[64];
    return slots[static_cast<size_t>(device) % 64];
  }
  void Take() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return running_ < ConcurrentOps(); });
    ++running_;
  }
  void Give() {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    cv_.notify_all();
  }
  int running() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;
};

}  // namespace

int cuda_emu::RunningNcclOps(int device) {
  return ConcurrentOps() == 0 || device < 0 ? 0 : DeviceSlots::Of(device).running();
}

namespace {

// Queues one task on `stream` for `parts`.
ncclResult_t Submit(std::vector<Part> parts, cudaStream_t stream, const ncclComm* comm) {
  auto task = std::make_shared<TaskParts>();
  task->parts = std::move(parts);
  for (const Part& p : task->parts) {
    std::lock_guard<std::mutex> lock(p.clique->mu);
    ++p.clique->ranks[static_cast<size_t>(p.rank)].pending;
  }
  const int device = cuda_emu::StreamDevice(stream);
  const cudaError_t err = cuda_emu::Enqueue(stream, [task, device] {
    if (ConcurrentOps() == 0 || device < 0) return task->Run();
    DeviceSlots& slots = DeviceSlots::Of(device);
    slots.Take();
    const cudaError_t result = task->Run();
    slots.Give();
    return result;
  });
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
  const RankState& me = q.ranks[static_cast<size_t>(rank)];
  if (me.error != ncclSuccess) return me.error;
  return q.formed && me.enqueuing == 0 ? ncclSuccess : ncclInProgress;
}

// TESSERA_CUDA_EMU_NCCL_ENQUEUE_POLLS, read once.
int EnqueuePolls() {
  static const int polls = CountFromEnv("TESSERA_CUDA_EMU_NCCL_ENQUEUE_POLLS", 1000000);
  return polls;
}

// An op call (or a group of them) was queued on a non-blocking communicator:
// with ENQUEUE_POLLS, it is still "enqueuing" for that many polls.
ncclResult_t Enqueued(const ncclComm& comm) {
  if (comm.blocking || EnqueuePolls() == 0) return ncclSuccess;
  std::lock_guard<std::mutex> lock(comm.clique->mu);
  comm.clique->ranks[static_cast<size_t>(comm.rank)].enqueuing = EnqueuePolls();
  return ncclInProgress;
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
  std::shared_ptr<ncclComm> comm = Resolve(handle, name);
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
  check(call.count == 0 || !NeedsSend(call, comm->rank) || call.send != nullptr, ncclInvalidArgument,
        "null sendbuff with count " + to_string(call.count));
  check(call.count == 0 || !WritesRecv(call, comm->rank) || call.recv != nullptr, ncclInvalidArgument,
        "null recvbuff with count " + to_string(call.count));
  if (!SpecialStream(stream)) {
    const int device = cuda_emu::StreamDevice(stream);
    check(device >= 0, ncclUnhandledCudaError, "an unknown or destroyed stream");
    check(device < 0 || device == comm->device, ncclInvalidUsage,
          "a stream on cuda:" + to_string(device) + ", the communicator is on cuda:" + to_string(comm->device));
  }

  Part part;
  part.clique = comm->clique;
  part.rank = comm->rank;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    RankState& me = q.ranks[static_cast<size_t>(comm->rank)];
    const ncclResult_t state = StateLocked(q, comm->rank);
    if (state == ncclInProgress) {
      return group_error(CallErrorLocked(
          &me, ncclInvalidUsage,
          what + (q.formed ? ": an earlier call is still in progress (poll ncclCommGetAsyncError until ncclSuccess)"
                           : ": the communicator is still initialising (poll ncclCommGetAsyncError)")));
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
    if (comm->proxy == nullptr) {
      part.op = PostLocked(q, comm->rank, call, bad != ncclSuccess, reason, &part.side);
      if (bad != ncclSuccess) return group_error(CallErrorLocked(&me, bad, what + ": " + reason));
    }
  }
  if (comm->proxy != nullptr) {  // posted with no lock held; its hub takes it in call order
    part.proxy = comm->proxy;
    part.call = call;
    part.seq = ProxyPost(*comm->proxy, call, bad != ncclSuccess, reason);
    if (bad != ncclSuccess) return group_error(CallError(comm.get(), bad, what + ": " + reason));
  }
  if (t_group.depth > 0) {
    t_group.ops.push_back({std::move(comm), stream, std::move(part)});
    return ncclSuccess;
  }
  const ncclResult_t submitted = Submit({std::move(part)}, stream, comm.get());
  return submitted == ncclSuccess ? Enqueued(*comm) : submitted;
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

// A remote rank's abort: its waiting tasks end at once, whatever its hub
// does; the hub aborts it in the clique.
void ProxyAbort(const ncclComm& comm) {
  Clique& q = *comm.clique;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.ranks[static_cast<size_t>(comm.rank)].aborted = true;
    q.cv.notify_all();
  }
  ProxyClose(*comm.proxy, kAbort);
}

// A remote rank's destroy: once its tasks finished, the hub destroys it.
void ProxyDestroy(const ncclComm& comm) {
  Clique& q = *comm.clique;
  {
    std::unique_lock<std::mutex> lock(q.mu);
    RankState& me = q.ranks[static_cast<size_t>(comm.rank)];
    q.cv.wait(lock, [&] { return me.pending == 0; });
    me.destroyed = true;
  }
  ProxyClose(*comm.proxy, kDestroy);
}

// Takes a handle out of the live table; `call` (ncclCommAbort,
// ncclCommDestroy) frees it as real NCCL does, null: a failed init whose
// handle the caller never sees.
std::shared_ptr<ncclComm> Unregister(ncclComm_t handle, const char* call) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (call != nullptr && Freed().count(handle) != 0) UseAfterFree(call);
  auto it = Live().find(handle);
  if (it == Live().end() || it->second->pid != getpid()) return nullptr;
  std::shared_ptr<ncclComm> comm = std::move(it->second);
  Live().erase(it);
  if (call != nullptr) Freed()[handle] = comm;
  return comm;
}

struct IdLayout {
  char magic[32];
  int64_t pid;
  uint64_t nonce[2];
  uint16_t port;  // the maker's hub on 127.0.0.1; 0: none
};
static_assert(sizeof(IdLayout) <= NCCL_UNIQUE_ID_BYTES);
static_assert(offsetof(IdLayout, pid) == 32 && offsetof(IdLayout, nonce) == 40 && offsetof(IdLayout, port) == 56,
              "the layout the header comment documents");
constexpr char kIdMagic[] = "tessera cuda_emu nccl id";

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Marks `rank` joined to the clique of `key` (g_mu held; the clique is made
// at its first rank's join): the clique, locked through `lock`, or why the
// rank cannot join.
ncclResult_t JoinLocked(const std::string& key, int nranks, int rank, const std::string& who,
                        std::shared_ptr<Clique>* out, std::unique_lock<std::mutex>* lock, std::string* message) {
  std::shared_ptr<Clique>& slot = Forming()[key];
  if (slot == nullptr) slot = std::make_shared<Clique>(nranks);
  std::shared_ptr<Clique> q = slot;
  std::unique_lock<std::mutex> held(q->mu);
  if (q->nranks != nranks) {
    *message = who + ": the other ranks of this id said nranks " + to_string(q->nranks);
    return ncclInvalidUsage;
  }
  if (q->failed) {
    *message = who + ": " + Unprefixed(q->ranks[static_cast<size_t>(rank)].last_error);
    return ncclRemoteError;
  }
  RankState& me = q->ranks[static_cast<size_t>(rank)];
  if (me.joined) {
    *message = who + ": this rank already joined with this id";
    return ncclInvalidUsage;
  }
  me.joined = true;
  *out = std::move(q);
  *lock = std::move(held);
  return ncclSuccess;
}

// ---------------------------------------------------------------------------
// The hub: this process's listener; a reader thread per connection takes a
// remote rank's frames in order, a writer thread per connection sends what
// the rank's link queued, and a thread per remote task arrives and waits for
// its parts.

// What a hub connection's reader knows of its remote rank.
struct HubSession {
  std::shared_ptr<HubLink> link;
  uint16_t port = 0;
  PeerLoss peer_loss = PeerLoss::kHang;
  std::shared_ptr<ncclComm> comm;  // the rank's member of the clique once joined (no live handle)
  uint64_t next_seq = 0;
  struct Posted {
    std::shared_ptr<Op> op;  // null: posted after the clique failed
    int side = 0;
    Call call;
  };
  std::map<uint64_t, Posted> posted;  // good posts whose task has not started
  bool ended = false;                 // aborted or destroyed: the connection's end is no loss
};

// A remote rank's task on the hub: stand-ins for its buffers, its parts.
struct HubTask {
  std::shared_ptr<HubLink> link;
  std::shared_ptr<Clique> clique;
  int rank = 0;
  uint64_t task = 0;
  std::vector<HubSession::Posted> parts;
  std::vector<char> send, recv;  // the parts' bytes, in part order
};

// Arrives and waits for a remote task's parts as the rank's own task would,
// then sends back the outcome and the receive bytes.
void HubRunTask(const std::shared_ptr<HubTask>& t) {
  Clique& q = *t->clique;
  std::vector<Part> parts(t->parts.size());
  {
    std::lock_guard<std::mutex> lock(q.mu);
    size_t sent = 0, received = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const HubSession::Posted& posted = t->parts[i];
      const size_t bytes = Bytes(posted.call);
      Part& part = parts[i];
      part.clique = t->clique;
      part.op = posted.op;
      part.side = posted.side;
      part.rank = t->rank;
      Call* call = posted.op == nullptr ? nullptr : &posted.op->sides[static_cast<size_t>(posted.side)].call;
      if (NeedsSend(posted.call, t->rank)) {
        if (call != nullptr) call->send = t->send.data() + sent;
        sent += bytes;
      }
      if (WritesRecv(posted.call, t->rank)) {
        if (call != nullptr) call->recv = t->recv.data() + received;
        received += bytes;
      }
    }
  }
  for (const Part& part : parts) {
    if (part.op != nullptr) Arrive(part);
  }
  cudaError_t result = cudaSuccess;
  std::vector<uint8_t> has_data(parts.size(), 0);
  uint64_t bytes = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    cudaError_t waited = cudaErrorLaunchFailure;  // no op: posted after the clique failed
    if (parts[i].op != nullptr && WaitDone(parts[i], &waited) && WritesRecv(t->parts[i].call, t->rank) &&
        Bytes(t->parts[i].call) > 0) {
      has_data[i] = 1;
      bytes += Bytes(t->parts[i].call);
    }
    if (result == cudaSuccess) result = waited;
  }
  Writer w;
  w.Put(t->task).Put(static_cast<int32_t>(result)).Put(static_cast<uint32_t>(parts.size()));
  for (uint8_t h : has_data) w.Put(h);
  w.Put(bytes);
  std::string frames = w.Frame(kResult);
  size_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!WritesRecv(t->parts[i].call, t->rank)) continue;
    const size_t n = Bytes(t->parts[i].call);
    if (has_data[i] != 0) AppendData(&frames, t->recv.data() + offset, n);
    offset += n;
  }
  t->link->Push(std::move(frames));
}

bool HubJoin(HubSession& s, const std::string& payload) {
  Reader in(payload);
  ncclUniqueId id;
  for (char& c : id.internal) c = in.Get<char>();
  const auto nranks = in.Get<int32_t>();
  const auto rank = in.Get<int32_t>();
  const auto device = in.Get<int32_t>();
  const auto pid = in.Get<int64_t>();
  if (!in.Done()) return false;
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof(layout));
  if (std::memcmp(layout.magic, kIdMagic, sizeof(kIdMagic)) != 0) return false;  // not an emulator's rank
  const std::string who = "ncclCommInitRank: rank " + to_string(rank) + "/" + to_string(nranks);
  auto refuse = [&](ncclResult_t r, const std::string& message) {
    s.link->Push(Writer().Put<int32_t>(r).Put<uint8_t>(0).PutString(kPrefix + message).Frame(kJoinReply));
    return false;
  };
  if (layout.pid != static_cast<int64_t>(getpid()) || layout.port != s.port) {
    return refuse(ncclInvalidUsage, who + ": the unique id names process " + to_string(layout.pid) + " (port " +
                                        to_string(layout.port) + "), this is process " + to_string(getpid()) +
                                        " (port " + to_string(s.port) + ")");
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) return refuse(ncclInvalidArgument, who + ": no such rank");
  auto comm = std::make_shared<ncclComm>();
  comm->rank = rank;
  comm->device = device;
  comm->pid = getpid();
  comm->remote_pid = pid;
  const std::string key(id.internal, sizeof(id.internal));
  std::lock_guard<std::mutex> global(g_mu);
  std::shared_ptr<Clique> q;
  std::unique_lock<std::mutex> lock;
  std::string message;
  if (const ncclResult_t r = JoinLocked(key, nranks, rank, who, &q, &lock, &message); r != ncclSuccess) {
    return refuse(r, message);
  }
  comm->clique = q;
  s.comm = comm;
  // Under the clique's lock: the reply goes out before any state push.
  s.link->Push(
      Writer().Put<int32_t>(ncclSuccess).Put<uint8_t>(q->joined + 1 == nranks).PutString("").Frame(kJoinReply));
  q->links[static_cast<size_t>(rank)] = s.link;
  if (++q->joined == nranks) {
    FormedLocked(*q, rank);
    Forming().erase(key);  // the id is spent
  }
  return true;
}

bool HubPost(HubSession& s, const std::string& payload) {
  Reader in(payload);
  const auto seq = in.Get<uint64_t>();
  const auto kind = in.Get<int32_t>();
  Call call;
  call.count = in.Get<uint64_t>();
  call.type = static_cast<ncclDataType_t>(in.Get<int32_t>());
  call.op = static_cast<ncclRedOp_t>(in.Get<int32_t>());
  call.root = in.Get<int32_t>();
  const bool bad = in.Get<uint8_t>() != 0;
  const std::string reason = in.GetString();
  if (!in.Done() || seq != s.next_seq++ || kind < 0 || kind > static_cast<int>(Kind::kRecv)) return false;
  call.kind = static_cast<Kind>(kind);
  Clique& q = *s.comm->clique;
  const bool p2p = call.kind == Kind::kSend || call.kind == Kind::kRecv;
  const bool rooted = call.kind == Kind::kBroadcast || call.kind == Kind::kReduce;
  const bool root_ok = call.root >= 0 && call.root < q.nranks;
  if (p2p && !root_ok) return false;  // refused where it was called, never posted
  if (!bad && (!ValidType(call.type) || call.count > kMaxCallBytes / TypeSize(call.type) || (rooted && !root_ok) ||
               (!p2p && call.kind != Kind::kBroadcast && !ValidOp(call.op)))) {
    return false;  // its checks passed where it was called: not an emulator's post
  }
  HubSession::Posted posted{nullptr, 0, call};
  {
    std::lock_guard<std::mutex> lock(q.mu);
    // A post racing the clique's failure (the rank's cache did not know
    // yet): its task fails.
    if (q.formed && !q.failed) posted.op = PostLocked(q, s.comm->rank, call, bad, reason, &posted.side);
  }
  if (!bad) s.posted[seq] = std::move(posted);
  return true;
}

// A posted call's group failed: its side is bad after all.
bool HubBad(HubSession& s, const std::string& payload) {
  Reader in(payload);
  const auto seq = in.Get<uint64_t>();
  const std::string reason = in.GetString();
  auto it = s.posted.find(seq);
  if (!in.Done() || it == s.posted.end()) return false;
  const std::shared_ptr<Op> op = it->second.op;
  const int side = it->second.side;
  s.posted.erase(it);
  if (op == nullptr) return true;
  Clique& q = *s.comm->clique;
  std::lock_guard<std::mutex> lock(q.mu);
  Op::Side& bad = op->sides[static_cast<size_t>(side)];
  bad.bad = true;
  bad.bad_reason = reason;
  CheckSidesLocked(q, *op);
  return true;
}

// A remote task its stream never ran.
bool HubSkip(HubSession& s, const std::string& payload) {
  Reader in(payload);
  const auto n = in.Get<uint32_t>();
  if (!in.Fits(n)) return false;
  std::vector<uint64_t> seqs(n);
  for (uint64_t& seq : seqs) seq = in.Get<uint64_t>();
  if (!in.Done()) return false;
  Clique& q = *s.comm->clique;
  for (uint64_t seq : seqs) {
    auto it = s.posted.find(seq);
    if (it == s.posted.end()) return false;
    const std::shared_ptr<Op> op = it->second.op;
    s.posted.erase(it);
    std::lock_guard<std::mutex> lock(q.mu);
    FailCliqueLocked(q, s.comm->rank, ncclUnhandledCudaError, ncclRemoteError,
                     NeverRan(s.comm->rank, op == nullptr ? std::string("an op") : OpTitle(*op)));
  }
  return true;
}

// A remote task starts: its parts' send bytes staged, a thread of its own
// arrives and waits for them, never blocking the reader.
bool HubRun(HubSession& s, const std::string& payload) {
  Reader in(payload);
  auto t = std::make_shared<HubTask>();
  t->task = in.Get<uint64_t>();
  const auto n = in.Get<uint32_t>();
  if (!in.Fits(n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    auto it = s.posted.find(in.Get<uint64_t>());
    if (it == s.posted.end()) return false;
    t->parts.push_back(std::move(it->second));
    s.posted.erase(it);
  }
  const auto bytes = in.Get<uint64_t>();
  if (!in.Done()) return false;
  uint64_t sent = 0, received = 0;
  for (const HubSession::Posted& p : t->parts) {
    if (NeedsSend(p.call, s.comm->rank)) sent += Bytes(p.call);
    if (WritesRecv(p.call, s.comm->rank)) received += Bytes(p.call);
  }
  if (bytes != sent) return false;
  t->send.resize(sent);
  t->recv.resize(received);
  if (!ReadData(s.link->conn->fd, t->send.data(), sent)) return false;
  t->link = s.link;
  t->clique = s.comm->clique;
  t->rank = s.comm->rank;
  std::thread([t] { HubRunTask(t); }).detach();
  return true;
}

void HubDestroy(const std::shared_ptr<ncclComm>& comm) {
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  if (!q.formed) {  // the ranks waiting to form must not hang
    lock.unlock();
    AbortRank(comm);
    return;
  }
  DestroyedLocked(q, *comm);
}

// Takes a connection's frames in order until it ends or breaks the rules.
void HubLoop(HubSession& s) {
  const int fd = s.link->conn->fd;
  SetRecvTimeout(fd, 30);  // until it joined: a silent connection ends
  while (true) {
    uint32_t type = 0;
    std::string payload;
    if (!ReadControl(fd, &type, &payload)) return;
    if (s.comm == nullptr) {
      if (type != kJoin || !HubJoin(s, payload)) return;
      SetRecvTimeout(fd, 0);
      continue;
    }
    if (s.ended) return;  // nothing follows an abort or a destroy
    bool ok = false;
    switch (type) {
      case kPost:
        ok = HubPost(s, payload);
        break;
      case kBad:
        ok = HubBad(s, payload);
        break;
      case kRun:
        ok = HubRun(s, payload);
        break;
      case kSkip:
        ok = HubSkip(s, payload);
        break;
      case kAbort:
      case kDestroy:
        ok = payload.empty();
        if (!ok) break;
        s.ended = true;
        if (type == kAbort) {
          AbortRank(s.comm);
        } else {
          HubDestroy(s.comm);
        }
        break;
      default:
        break;
    }
    if (!ok) return;
  }
}

// Writes a link's outbox until it is closed and drained, then ends the
// connection.
void HubWrite(const std::shared_ptr<HubLink>& link) {
  while (true) {
    std::string frames;
    {
      std::unique_lock<std::mutex> lock(link->mu);
      link->cv.wait(lock, [&] { return !link->outbox.empty() || link->closed; });
      if (link->outbox.empty()) break;
      frames = std::move(link->outbox.front());
      link->outbox.pop_front();
    }
    if (!SendAll(link->conn->fd, frames)) break;
  }
  {
    std::lock_guard<std::mutex> lock(link->mu);
    link->closed = true;
    link->outbox.clear();
  }
  shutdown(link->conn->fd, SHUT_RDWR);
}

// One connection to the hub. Bad bytes (not an emulator's rank) end it,
// never the hub.
void HubServe(const std::shared_ptr<Conn>& conn, uint16_t port, PeerLoss peer_loss) {
  HubSession s;
  s.link = std::make_shared<HubLink>(conn);
  s.port = port;
  s.peer_loss = peer_loss;
  try {
    std::thread([link = s.link] { HubWrite(link); }).detach();
    HubLoop(s);
  } catch (...) {  // absurd sizes (bad_alloc), no thread to be had
  }
  if (s.comm != nullptr) {
    Clique& q = *s.comm->clique;
    const int rank = s.comm->rank;
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.links[static_cast<size_t>(rank)] == s.link) q.links[static_cast<size_t>(rank)] = nullptr;
    if (!s.ended && peer_loss == PeerLoss::kError) {
      FailCliqueLocked(q, rank, ncclRemoteError, ncclRemoteError,
                       Who(*s.comm) + "'s process (pid " + to_string(s.comm->remote_pid) +
                           ") went away: its connection to the hub ended without ncclCommAbort or ncclCommDestroy "
                           "(TESSERA_CUDA_EMU_NCCL_PEER_LOSS=error)");
    }
  }
  s.link->Close();
}

void HubAccept(int listener, uint16_t port, PeerLoss peer_loss) {
  while (true) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      return;  // the listener is gone
    }
    auto conn = std::make_shared<Conn>(fd);
    SetNoDelay(fd);
    try {
      std::thread([conn, port, peer_loss] { HubServe(conn, port, peer_loss); }).detach();
    } catch (...) {  // no thread: the connection closes
    }
  }
}

// This process's hub: a listener on an ephemeral port of 127.0.0.1 and its
// thread, started once; its port, 0 when it cannot listen.
uint16_t HubPort() {
  Process& p = Proc();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.hub_tried) return p.port;
  p.hub_tried = true;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    close(fd);
    return 0;
  }
  const uint16_t port = ntohs(addr.sin_port);
  RememberFd(fd);
  try {
    std::thread([fd, port, peer_loss = p.peer_loss] { HubAccept(fd, port, peer_loss); }).detach();
  } catch (...) {
    ForgetFd(fd);
    close(fd);
    return 0;
  }
  p.port = port;
  return port;
}

// ---------------------------------------------------------------------------
// A remote rank's side.

// Takes the hub's pushes into the cache and results to the tasks waiting for
// them; then, unless an abort or destroy ended it, the connection's end is
// the hub's process gone.
void ProxyRead(const std::shared_ptr<Proxy>& p) {
  Clique& q = *p->cache;
  RankState& me = q.ranks[static_cast<size_t>(p->rank)];
  const int fd = p->conn->fd;
  try {
    while (true) {
      uint32_t type = 0;
      std::string payload;
      if (!ReadControl(fd, &type, &payload)) break;
      Reader in(payload);
      if (type == kState) {
        const auto error = static_cast<ncclResult_t>(in.Get<int32_t>());
        const bool formed = in.Get<uint8_t>() != 0;
        const std::string message = in.GetString();
        if (!in.Done()) break;
        std::lock_guard<std::mutex> lock(q.mu);
        if (formed) q.formed = true;
        if (error != ncclSuccess && me.error == ncclSuccess) {
          me.error = error;
          me.last_error = message;
          q.failed = true;
        }
        q.cv.notify_all();
      } else if (type == kResult) {
        Proxy::Result r;
        const auto task = in.Get<uint64_t>();
        r.code = static_cast<cudaError_t>(in.Get<int32_t>());
        const auto n = in.Get<uint32_t>();
        if (n > payload.size()) break;
        r.has_data.resize(n);
        for (uint8_t& h : r.has_data) h = in.Get<uint8_t>();
        const auto bytes = in.Get<uint64_t>();
        if (!in.Done() || bytes > kMaxTaskBytes) break;
        r.bytes.resize(bytes);
        if (!ReadData(fd, r.bytes.data(), bytes)) break;
        r.ready = true;
        std::lock_guard<std::mutex> lock(q.mu);
        auto it = p->results.find(task);
        if (it != p->results.end()) it->second = std::move(r);
        q.cv.notify_all();
      } else {
        break;
      }
    }
  } catch (...) {  // absurd sizes (bad_alloc)
  }
  if (!p->closing && p->peer_loss == PeerLoss::kError) {
    std::lock_guard<std::mutex> lock(q.mu);
    p->lost = true;
    if (me.error == ncclSuccess) {
      me.error = ncclRemoteError;
      me.last_error = kPrefix + std::string("rank ") + to_string(p->rank) + "/" + to_string(q.nranks) +
                      ": the process holding its clique (pid " + to_string(p->hub_pid) +
                      ", the unique id's maker) went away: its connection ended without ncclCommAbort or "
                      "ncclCommDestroy (TESSERA_CUDA_EMU_NCCL_PEER_LOSS=error)";
    }
    q.failed = true;
    q.cv.notify_all();
  }
  shutdown(fd, SHUT_RDWR);
}

// Joins a clique of another process through its hub: the rank's stand-in.
ncclResult_t JoinRemote(const IdLayout& layout, const ncclUniqueId& id, int nranks, int rank, const std::string& who,
                        std::shared_ptr<ncclComm>* out) {
  const PeerLoss peer_loss = Proc().peer_loss;
  const std::string hub = "process " + to_string(layout.pid) + "'s hub at 127.0.0.1:" + to_string(layout.port);
  if (layout.port == 0) {
    return CallError(nullptr, ncclSystemError,
                     who + ": the unique id was made by process " + to_string(layout.pid) +
                         ", which has no hub to join (it could not listen on 127.0.0.1)");
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return CallError(nullptr, ncclSystemError, who + ": socket: " + std::strerror(errno));
  auto conn = std::make_shared<Conn>(fd);
  SetNoDelay(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(layout.port);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return CallError(nullptr, ncclSystemError,
                     who + ": cannot reach " + hub + " (" + std::strerror(errno) + "): has that process exited?");
  }
  SetRecvTimeout(fd, 60);
  Writer join;
  for (char c : id.internal) join.Put(c);
  join.Put<int32_t>(nranks).Put<int32_t>(rank).Put<int32_t>(cuda_emu::CurrentDevice()).Put<int64_t>(getpid());
  uint32_t type = 0;
  std::string payload;
  if (!SendAll(fd, join.Frame(kJoin)) || !ReadControl(fd, &type, &payload) || type != kJoinReply) {
    return CallError(nullptr, ncclSystemError, who + ": no answer from " + hub);
  }
  Reader in(payload);
  const auto result = static_cast<ncclResult_t>(in.Get<int32_t>());
  const bool formed = in.Get<uint8_t>() != 0;
  const std::string message = in.GetString();
  if (!in.Done()) return CallError(nullptr, ncclSystemError, who + ": a garbled answer from " + hub);
  if (result != ncclSuccess) return CallError(nullptr, result, Unprefixed(message));
  SetRecvTimeout(fd, 0);
  auto cache = std::make_shared<Clique>(nranks);
  cache->ranks[static_cast<size_t>(rank)].joined = true;
  cache->formed = formed;
  auto proxy = std::make_shared<Proxy>();
  proxy->conn = conn;
  proxy->cache = cache;
  proxy->rank = rank;
  proxy->hub_pid = layout.pid;
  proxy->peer_loss = peer_loss;
  auto comm = std::make_shared<ncclComm>();
  comm->clique = cache;
  comm->rank = rank;
  comm->device = cuda_emu::CurrentDevice();
  comm->pid = getpid();
  comm->proxy = proxy;
  try {
    std::thread([proxy] { ProxyRead(proxy); }).detach();
  } catch (...) {
    shutdown(fd, SHUT_RDWR);
    return CallError(nullptr, ncclSystemError, who + ": no thread to read " + hub);
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Live()[comm.get()] = comm;
  }
  *out = std::move(comm);
  return ncclSuccess;
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
  const std::string key(id.internal, sizeof(id.internal));
  const std::string who = "ncclCommInitRank: rank " + to_string(rank) + "/" + to_string(nranks);
  std::shared_ptr<ncclComm> comm;
  if (layout.pid != static_cast<int64_t>(getpid())) {
    if (const ncclResult_t r = JoinRemote(layout, id, nranks, rank, who, &comm); r != ncclSuccess) return r;
  } else {
    std::lock_guard<std::mutex> global(g_mu);
    std::shared_ptr<Clique> q;
    std::unique_lock<std::mutex> lock;
    std::string message;
    if (const ncclResult_t r = JoinLocked(key, nranks, rank, who, &q, &lock, &message); r != ncclSuccess) {
      return CallError(nullptr, r, message);
    }
    comm = std::make_shared<ncclComm>();
    comm->clique = q;
    comm->rank = rank;
    comm->device = cuda_emu::CurrentDevice();
    comm->pid = getpid();
    Live()[comm.get()] = comm;
    if (++q->joined == nranks) {
      FormedLocked(*q, -1);
      Forming().erase(key);  // the id is spent
    }
  }
  comm->blocking = blocking;
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
  Unregister(*out, nullptr);
  if (comm->proxy != nullptr) ProxyClose(*comm->proxy, kAbort);
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
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle, "ncclGetLastError");
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
  layout.port = HubPort();
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
  std::shared_ptr<ncclComm> comm = Resolve(handle, "ncclCommGetAsyncError");
  if (comm == nullptr) {
    return CallError(nullptr, ncclInvalidUsage,
                     "ncclCommGetAsyncError: not a live communicator (aborted or destroyed?)");
  }
  std::lock_guard<std::mutex> lock(comm->clique->mu);
  *async_error = StateLocked(*comm->clique, comm->rank);
  RankState& me = comm->clique->ranks[static_cast<size_t>(comm->rank)];
  if (*async_error == ncclInProgress && me.enqueuing > 0) --me.enqueuing;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t handle) {
  if (handle == nullptr) return ncclSuccess;
  std::shared_ptr<ncclComm> comm = Unregister(handle, "ncclCommAbort");
  if (comm == nullptr) {
    return CallError(nullptr, ncclInvalidUsage, "ncclCommAbort: not a live communicator (aborted or destroyed?)");
  }
  if (comm->proxy != nullptr) {
    ProxyAbort(*comm);
  } else {
    AbortRank(comm);
  }
  return ncclSuccess;
}

// Waits for the rank's queued tasks (what real NCCL's finalisation flushes;
// a non-blocking communicator's may answer ncclInProgress instead, which the
// callers poll): ncclSuccess, or the clique's failure. A remote rank's
// stand-in answers at once (its destroy waits for its tasks).
ncclResult_t ncclCommFinalize(ncclComm_t handle) {
  if (handle == nullptr) return CallError(nullptr, ncclInvalidArgument, "ncclCommFinalize: null communicator");
  std::shared_ptr<ncclComm> comm = Resolve(handle, "ncclCommFinalize");
  if (comm == nullptr) {
    return CallError(nullptr, ncclInvalidUsage, "ncclCommFinalize: not a live communicator (aborted or destroyed?)");
  }
  if (comm->proxy != nullptr) return ncclSuccess;
  Clique& q = *comm->clique;
  std::unique_lock<std::mutex> lock(q.mu);
  if (!q.formed) return ncclSuccess;
  RankState& me = q.ranks[static_cast<size_t>(comm->rank)];
  q.cv.wait(lock, [&] { return me.pending == 0; });
  const ncclResult_t state = StateLocked(q, comm->rank);
  return state == ncclInProgress ? ncclSuccess : state;
}

ncclResult_t ncclCommDestroy(ncclComm_t handle) {
  if (handle == nullptr) return ncclSuccess;
  std::shared_ptr<ncclComm> comm = Unregister(handle, "ncclCommDestroy");
  if (comm == nullptr) {
    return CallError(nullptr, ncclInvalidUsage, "ncclCommDestroy: not a live communicator (aborted or destroyed?)");
  }
  if (comm->proxy != nullptr) {
    ProxyDestroy(*comm);
    return ncclSuccess;
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
  DestroyedLocked(q, *comm);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t handle, int* count) {
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle, "ncclCommCount");
  if (comm == nullptr || count == nullptr)
    return CallError(nullptr, ncclInvalidArgument, "ncclCommCount: bad argument");
  *count = comm->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t handle, int* device) {
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle, "ncclCommCuDevice");
  if (comm == nullptr || device == nullptr) {
    return CallError(nullptr, ncclInvalidArgument, "ncclCommCuDevice: bad argument");
  }
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t handle, int* rank) {
  std::shared_ptr<ncclComm> comm = handle == nullptr ? nullptr : Resolve(handle, "ncclCommUserRank");
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
      if (g.part.proxy != nullptr) {  // its hub marks it
        ProxySend(*g.part.proxy, Writer().Put(g.part.seq).PutString("its group failed: " + group.message).Frame(kBad));
        continue;
      }
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
  if (result != ncclSuccess) return result;
  // Each non-blocking communicator of the group is enqueuing (ENQUEUE_POLLS).
  std::vector<const ncclComm*> enqueued;
  for (const GroupOp& g : group.ops) {
    if (std::find(enqueued.begin(), enqueued.end(), g.comm.get()) != enqueued.end()) continue;
    enqueued.push_back(g.comm.get());
    if (Enqueued(*g.comm) == ncclInProgress) result = ncclInProgress;
  }
  return result;
}
