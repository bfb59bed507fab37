// gloo communicator tests. Multi-process cases re-exec this binary as
// `gloo_test --gloo-child=CASE,RANK,SIZE,DIR` (posix_spawn, so no fork of a
// process that already runs gtest's or gloo's threads); the test process is
// rank 0 and the children rendezvous with it through a FileKvStore in a
// temporary directory. Cases that need no second process use threads and an
// InProcessKvStore. Every result is compared bit for bit with a reference
// computed here in rank order, and reductions also with ShmHub's result.
// Every wait has a deadline, so a hang fails instead of blocking ctest.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm/collective/gloo_communicator.h"
#include "comm/collective/gloo_store.h"
#include "comm/collective/internal/reduce.h"
#include "comm/collective/kv_store.h"
#include "comm/collective/shm_communicator.h"
#include "core/text.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/completion.h"
#include "tests/comm/gloo_file_kv_store.h"
#include "tests/deadline.h"

extern char** environ;

namespace tessera::comm {
namespace {

using internal::Kind;
using testing::Completion;
using testing::FileKvStore;
using ::testing::HasSubstr;

// Generous for sanitizer builds on two shared cores; Release takes a few seconds.
constexpr auto kProcessDeadline = std::chrono::seconds(100);

// ---- Data ------------------------------------------------------------------

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Tensor Zeros(DType dtype, int64_t n) {
  auto t = Tensor::Zeros(Shape{n}, dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  return *t;
}

// Rank `rank`'s input for case `salt`: floats in [-1, 1) whose sums depend on
// the order, integers over the whole range (sums wrap).
template <typename T>
void Fill(T* out, int64_t n, int rank, uint64_t salt) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = Mix(salt * 0x100000001b3ull + static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(i));
    const float f = static_cast<float>(static_cast<double>(h >> 40) / static_cast<double>(1 << 23) - 1.0);
    if constexpr (std::is_same_v<T, float>) {
      out[i] = f;
    } else if constexpr (std::is_same_v<T, Half>) {
      out[i] = Half{FloatToHalf(f)};
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      out[i] = BFloat16{FloatToBFloat16(f)};
    } else {
      out[i] = static_cast<T>(h);
    }
  }
}

Tensor Input(DType dtype, int64_t n, int rank, uint64_t salt) {
  Tensor t = Zeros(dtype, n);
  switch (dtype) {
    case DType::kF32:
      Fill(t.data<float>(), n, rank, salt);
      break;
    case DType::kF16:
      Fill(t.data<Half>(), n, rank, salt);
      break;
    case DType::kBF16:
      Fill(t.data<BFloat16>(), n, rank, salt);
      break;
    case DType::kI32:
      Fill(t.data<int32_t>(), n, rank, salt);
      break;
    case DType::kI64:
      Fill(t.data<int64_t>(), n, rank, salt);
      break;
    default:
      TESSERA_CHECK(false, "no inputs of ", DTypeName(dtype));
  }
  return t;
}

// out[i] = in[0][i] (+) ... (+) in[p-1][i] in rank order; 16-bit floats are
// summed in f32 and rounded once, integers wrap, max lets NaN win.
template <typename T, typename A, typename Load, typename Store>
void ReduceTyped(ReduceOp op, const std::vector<const char*>& in, char* out_bytes, int64_t n, Load load, Store store) {
  T* out = reinterpret_cast<T*>(out_bytes);
  for (int64_t i = 0; i < n; ++i) {
    A acc = load(reinterpret_cast<const T*>(in[0])[i]);
    for (size_t r = 1; r < in.size(); ++r) {
      const A x = load(reinterpret_cast<const T*>(in[r])[i]);
      if (op == ReduceOp::kMax) {
        acc = (x > acc || x != x) ? x : acc;
      } else if constexpr (std::is_integral_v<A>) {
        acc = static_cast<A>(static_cast<std::make_unsigned_t<A>>(acc) + static_cast<std::make_unsigned_t<A>>(x));
      } else {
        acc = acc + x;
      }
    }
    out[i] = store(acc);
  }
}

void ReferenceReduce(DType dtype, ReduceOp op, const std::vector<const char*>& in, char* out, int64_t n) {
  const auto same = [](auto v) { return v; };
  switch (dtype) {
    case DType::kF32:
      return ReduceTyped<float, float>(op, in, out, n, same, same);
    case DType::kF16:
      return ReduceTyped<Half, float>(
          op, in, out, n, [](Half h) { return HalfToFloat(h.bits); }, [](float f) { return Half{FloatToHalf(f)}; });
    case DType::kBF16:
      return ReduceTyped<BFloat16, float>(
          op, in, out, n, [](BFloat16 h) { return BFloat16ToFloat(h.bits); },
          [](float f) { return BFloat16{FloatToBFloat16(f)}; });
    case DType::kI32:
      return ReduceTyped<int32_t, int32_t>(op, in, out, n, same, same);
    case DType::kI64:
      return ReduceTyped<int64_t, int64_t>(op, in, out, n, same, same);
    default:
      TESSERA_CHECK(false, "no reduction of ", DTypeName(dtype));
  }
}

const char* Bytes(const Tensor& t) { return static_cast<const char*>(t.raw_data()); }

// "" when equal, else where the first difference is.
std::string Compare(const std::string& what, const Tensor& got, const char* want, size_t bytes) {
  if (got.NumBytes() != bytes) return StrCat(what, ": ", got.NumBytes(), " bytes, want ", bytes, "\n");
  if (bytes == 0 || std::memcmp(Bytes(got), want, bytes) == 0) return "";
  size_t i = 0;
  while (Bytes(got)[i] == want[i]) ++i;
  return StrCat(what, ": first differing byte ", i, " of ", bytes, "\n");
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

absl::Status RunOp(const std::function<void(DoneFn)>& issue) {
  Completion done;
  issue(done.Fn());
  return done.Wait();
}

// ShmHub's result of one reduction over the same inputs, every rank issued
// from this thread (the last arriving rank executes it).
std::vector<Tensor> ShmReduce(bool all_reduce, const std::vector<Tensor>& inputs, const std::vector<int64_t>& counts,
                              ReduceOp op) {
  ShmHub hub;
  const int p = static_cast<int>(inputs.size());
  std::vector<std::shared_ptr<Communicator>> comms;
  std::vector<Tensor> outputs;
  std::vector<Completion> done(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto comm = hub.Join("reference", p, r);
    TESSERA_CHECK(comm.ok(), comm.status().ToString());
    comms.push_back(*comm);
    outputs.push_back(Zeros(inputs[0].dtype(), all_reduce ? inputs[0].NumElements() : counts[static_cast<size_t>(r)]));
  }
  for (int r = 0; r < p; ++r) {
    const auto ru = static_cast<size_t>(r);
    if (all_reduce) {
      comms[ru]->AllReduce(inputs[ru], outputs[ru], op, done[ru].Fn());
    } else {
      comms[ru]->ReduceScatter(inputs[ru], outputs[ru], counts, op, done[ru].Fn());
    }
  }
  for (auto& d : done) TESSERA_CHECK(d.Wait().ok(), "shm reference failed");
  return outputs;
}

// ---- The op matrix, run by every rank of a group ---------------------------

// Every op x dtype x size on `comm`; "" when every result matched.
std::string RunOpMatrix(Communicator& comm) {
  const int p = comm.size();
  const int me = comm.rank();
  std::string errors;
  uint64_t salt = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    const size_t es = DTypeSize(dtype);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1} << 20}) {
      const std::string at = StrCat(DTypeName(dtype), " n=", n, " rank ", me, "/", p);
      // AllReduce, sum and max; in place for max.
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        ++salt;
        std::vector<Tensor> inputs;
        for (int r = 0; r < p; ++r) inputs.push_back(Input(dtype, n, r, salt));
        const bool in_place = op == ReduceOp::kMax;
        Tensor input = inputs[static_cast<size_t>(me)].Clone();
        Tensor output = in_place ? input : Zeros(dtype, n);
        absl::Status status = RunOp([&](DoneFn done) { comm.AllReduce(input, output, op, std::move(done)); });
        if (!status.ok()) {
          errors += StrCat("AllReduce ", at, ": ", status.ToString(), "\n");
          continue;
        }
        std::vector<const char*> in;
        for (const Tensor& t : inputs) in.push_back(Bytes(t));
        std::vector<char> want(static_cast<size_t>(n) * es);
        ReferenceReduce(dtype, op, in, want.data(), n);
        errors +=
            Compare(StrCat("AllReduce ", ReduceOpName(op), " ", at, " vs reference"), output, want.data(), want.size());
        const std::vector<Tensor> shm = ShmReduce(true, inputs, {}, op);
        errors += Compare(StrCat("AllReduce ", ReduceOpName(op), " ", at, " vs ShmHub"), output,
                          Bytes(shm[static_cast<size_t>(me)]), want.size());
      }
      // Uneven counts with zeros: n, n/2, 0, 3 ...
      std::vector<int64_t> counts(static_cast<size_t>(p));
      for (int r = 0; r < p; ++r) counts[static_cast<size_t>(r)] = r == 0 ? n : r == 1 ? n / 2 : r == 2 ? 0 : 3;
      const std::vector<int64_t> offsets = Offsets(counts);
      const int64_t total = offsets.back();
      {  // ReduceScatter
        ++salt;
        std::vector<Tensor> inputs;
        for (int r = 0; r < p; ++r) inputs.push_back(Input(dtype, total, r, salt));
        Tensor output = Zeros(dtype, counts[static_cast<size_t>(me)]);
        absl::Status status = RunOp([&](DoneFn done) {
          comm.ReduceScatter(inputs[static_cast<size_t>(me)], output, counts, ReduceOp::kSum, std::move(done));
        });
        if (!status.ok()) {
          errors += StrCat("ReduceScatter ", at, ": ", status.ToString(), "\n");
        } else {
          std::vector<const char*> in;
          const size_t begin = static_cast<size_t>(offsets[static_cast<size_t>(me)]) * es;
          for (const Tensor& t : inputs) in.push_back(Bytes(t) + begin);
          std::vector<char> want(output.NumBytes());
          ReferenceReduce(dtype, ReduceOp::kSum, in, want.data(), output.NumElements());
          errors += Compare(StrCat("ReduceScatter ", at, " vs reference"), output, want.data(), want.size());
          const std::vector<Tensor> shm = ShmReduce(false, inputs, counts, ReduceOp::kSum);
          errors += Compare(StrCat("ReduceScatter ", at, " vs ShmHub"), output, Bytes(shm[static_cast<size_t>(me)]),
                            want.size());
        }
      }
      {  // AllGather
        ++salt;
        std::vector<char> want;
        for (int r = 0; r < p; ++r) {
          const Tensor t = Input(dtype, counts[static_cast<size_t>(r)], r, salt);
          want.insert(want.end(), Bytes(t), Bytes(t) + t.NumBytes());
        }
        const Tensor input = Input(dtype, counts[static_cast<size_t>(me)], me, salt);
        Tensor output = Zeros(dtype, total);
        absl::Status status = RunOp([&](DoneFn done) { comm.AllGather(input, output, counts, std::move(done)); });
        errors += status.ok() ? Compare(StrCat("AllGather ", at), output, want.data(), want.size())
                              : StrCat("AllGather ", at, ": ", status.ToString(), "\n");
      }
      {  // AllToAll: rank s sends (n + 3s + d) % 5 elements to d, more for big n
        ++salt;
        const auto count = [&](int s, int d) { return (n + 3 * s + d) % 5 + (n > 1000 ? n / 4 + s * 11 + d : 0); };
        std::vector<int64_t> send(static_cast<size_t>(p));
        std::vector<int64_t> recv(static_cast<size_t>(p));
        for (int q = 0; q < p; ++q) {
          send[static_cast<size_t>(q)] = count(me, q);
          recv[static_cast<size_t>(q)] = count(q, me);
        }
        std::vector<char> want;
        for (int s = 0; s < p; ++s) {
          int64_t sent = 0;
          for (int d = 0; d < me; ++d) sent += count(s, d);
          int64_t all = 0;
          for (int d = 0; d < p; ++d) all += count(s, d);
          const Tensor t = Input(dtype, all, s, salt);
          want.insert(want.end(), Bytes(t) + static_cast<size_t>(sent) * es,
                      Bytes(t) + static_cast<size_t>(sent + count(s, me)) * es);
        }
        const Tensor input = Input(dtype, Offsets(send).back(), me, salt);
        Tensor output = Zeros(dtype, Offsets(recv).back());
        absl::Status status = RunOp([&](DoneFn done) { comm.AllToAll(input, send, output, recv, std::move(done)); });
        errors += status.ok() ? Compare(StrCat("AllToAll ", at), output, want.data(), want.size())
                              : StrCat("AllToAll ", at, ": ", status.ToString(), "\n");
      }
      {  // Broadcast from the last rank
        ++salt;
        const Tensor source = Input(dtype, n, p - 1, salt);
        Tensor buffer = me == p - 1 ? source.Clone() : Zeros(dtype, n);
        absl::Status status = RunOp([&](DoneFn done) { comm.Broadcast(buffer, p - 1, std::move(done)); });
        errors += status.ok() ? Compare(StrCat("Broadcast ", at), buffer, Bytes(source), source.NumBytes())
                              : StrCat("Broadcast ", at, ": ", status.ToString(), "\n");
      }
    }
  }
  return errors;
}

GlooOptions Options(std::string group, int rank, int size, absl::Duration timeout = absl::Seconds(20)) {
  GlooOptions options;
  options.group = std::move(group);
  options.rank = rank;
  options.size = size;
  options.timeout = timeout;
  options.segment_bytes = 64 << 10;  // several segments per chunk at 1 Mi elements
  return options;
}

// ---- Child processes ---------------------------------------------------------

std::string SelfExe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

class Children {
 public:
  ~Children() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  pid_t Spawn(const std::string& name, int rank, int size, const std::string& dir) {
    const std::string exe = SelfExe();
    const std::string flag = StrCat("--gloo-child=", name, ",", rank, ",", size, ",", dir);
    char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>(flag.c_str()), nullptr};
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, environ);
    TESSERA_CHECK(rc == 0, "posix_spawn: ", std::strerror(rc));
    pids_.push_back(pid);
    return pid;
  }
  // Exit code of each child, in spawn order (-signal when killed).
  std::vector<int> WaitAll() {
    std::vector<int> codes;
    tessera::testing::Deadline deadline(kProcessDeadline, "waiting for the child processes");
    for (pid_t pid : pids_) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
    }
    pids_.clear();
    return codes;
  }

 private:
  std::vector<pid_t> pids_;
};

std::filesystem::path FreshDir(const std::string& name) {
  std::string pattern = (std::filesystem::temp_directory_path() / StrCat("gloo_test_", name, "_XXXXXX")).string();
  TESSERA_CHECK(::mkdtemp(pattern.data()) != nullptr, "mkdtemp: ", std::strerror(errno));
  return pattern;
}

// What a child does, by name; returns its exit code.
int RunChild(const std::string& name, int rank, int size, const std::string& dir) {
  FileKvStore store(dir);
  auto comm = ConnectGloo(store, Options(name, rank, size));
  if (!comm.ok()) {
    std::fprintf(stderr, "child %d: %s\n", rank, comm.status().ToString().c_str());
    return 2;
  }
  if (name.rfind("ops", 0) == 0) {
    const std::string errors = RunOpMatrix(**comm);
    if (!errors.empty()) std::fprintf(stderr, "child %d:\n%s", rank, errors.c_str());
    return errors.empty() ? 0 : 1;
  }
  if (name == "killed") {
    // One AllReduce proves the connection, then the parent kills us while it
    // waits in the next one.
    Tensor t = Zeros(DType::kF32, 16);
    if (!RunOp([&](DoneFn done) { (*comm)->AllReduce(t, t, ReduceOp::kSum, std::move(done)); }).ok()) return 3;
    for (;;) ::pause();
  }
  std::fprintf(stderr, "unknown child case %s\n", name.c_str());
  return 4;
}

void RunOpsAcrossProcesses(int size) {
  const std::filesystem::path dir = FreshDir(StrCat("ops", size));
  const std::string group = StrCat("ops", size);
  Children children;
  for (int r = 1; r < size; ++r) children.Spawn(group, r, size, dir.string());
  FileKvStore store(dir);
  std::string errors;
  {
    tessera::testing::Deadline deadline(kProcessDeadline, "rank 0 of the op matrix");
    auto comm = ConnectGloo(store, Options(group, 0, size));
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->Describe(), StrCat("gloo group '", group, "' rank 0/", size));
    errors = RunOpMatrix(**comm);
  }
  EXPECT_EQ(errors, "");
  for (int code : children.WaitAll()) EXPECT_EQ(code, 0) << "a child rank failed (its errors are on stderr)";
  std::filesystem::remove_all(dir);
}

TEST(GlooCommunicator, EveryOpAcrossTwoProcesses) { RunOpsAcrossProcesses(2); }
TEST(GlooCommunicator, EveryOpAcrossThreeProcesses) { RunOpsAcrossProcesses(3); }

TEST(GlooCommunicator, KilledPeerFailsTheSurvivorsOp) {
  const std::filesystem::path dir = FreshDir("killed");
  Children children;
  const pid_t child = children.Spawn("killed", 1, 2, dir.string());
  FileKvStore store(dir);
  tessera::testing::Deadline deadline(kProcessDeadline, "the survivor's AllReduce");
  auto comm = ConnectGloo(store, Options("killed", 0, 2));
  ASSERT_TRUE(comm.ok()) << comm.status();
  Tensor t = Zeros(DType::kF32, 16);
  ASSERT_TRUE(RunOp([&](DoneFn done) { (*comm)->AllReduce(t, t, ReduceOp::kSum, std::move(done)); }).ok());
  Completion second;
  Tensor big = Zeros(DType::kF32, 1 << 16);
  (*comm)->AllReduce(big, big, ReduceOp::kSum, second.Fn());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  const absl::Status status = second.Wait();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("connection lost"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 1"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The group is broken for good: later ops fail at once too.
  EXPECT_FALSE(RunOp([&](DoneFn done) { (*comm)->Broadcast(t, 0, std::move(done)); }).ok());
  std::filesystem::remove_all(dir);
}

// ---- In-process groups ---------------------------------------------------------

// Connects ranks 0 .. size-1 of `group` from one thread each.
std::vector<std::unique_ptr<Communicator>> ConnectAll(KvStore& store, const std::string& group, int size,
                                                      absl::Duration timeout = absl::Seconds(20)) {
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(size));
  std::vector<absl::Status> statuses(static_cast<size_t>(size));
  {
    tessera::testing::Deadline deadline(std::chrono::seconds(20), "ConnectGloo of every rank");
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        auto comm = ConnectGloo(store, Options(group, r, size, timeout));
        statuses[static_cast<size_t>(r)] = comm.status();
        if (comm.ok()) comms[static_cast<size_t>(r)] = *std::move(comm);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (const absl::Status& s : statuses) TESSERA_CHECK(s.ok(), s.ToString());
  return comms;
}

std::vector<float> Values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.NumElements()}; }

TEST(GlooCommunicator, PointToPointInterleavedWithCollectivesBothWays) {
  InProcessKvStore store;
  auto comms = ConnectAll(store, "p2p", 2);
  Communicator& a = *comms[0];
  Communicator& b = *comms[1];
  tessera::testing::Deadline deadline(std::chrono::seconds(20), "the interleaved sequence");
  // a: Recv(b), Send(b); waits for its Send before its AllReduce. b: Recv(a),
  // AllReduce, and only then Send(a). A design that served a's point-to-point
  // ops in one sequence (Recv before Send) would deadlock here.
  Tensor from_b = Zeros(DType::kF32, 3);
  Tensor to_b = Tensor::FromVector<float>(Shape{2}, {1, 2});
  Tensor from_a = Zeros(DType::kF32, 2);
  Tensor to_a = Tensor::FromVector<float>(Shape{3}, {7, 8, 9});
  Tensor ra = Tensor::FromVector<float>(Shape{2}, {1, 10});
  Tensor rb = Tensor::FromVector<float>(Shape{2}, {2, 20});
  Completion a_recv, a_send, a_reduce, b_recv, b_reduce, b_send;
  a.Recv(from_b, 1, a_recv.Fn());
  a.Send(to_b, 1, a_send.Fn());
  b.Recv(from_a, 0, b_recv.Fn());
  b.AllReduce(rb, rb, ReduceOp::kSum, [&, fn = b_reduce.Fn()](absl::Status s) {
    fn(s);
    b.Send(to_a, 0, b_send.Fn());
  });
  ASSERT_TRUE(a_send.Wait().ok());
  a.AllReduce(ra, ra, ReduceOp::kSum, a_reduce.Fn());
  for (Completion* c : {&a_recv, &a_reduce, &b_recv, &b_reduce, &b_send}) EXPECT_TRUE(c->Wait().ok()) << c->Wait();
  EXPECT_EQ(Values(from_b), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(Values(from_a), (std::vector<float>{1, 2}));
  EXPECT_EQ(Values(ra), (std::vector<float>{3, 30}));
  EXPECT_EQ(Values(rb), (std::vector<float>{3, 30}));

  // Many transfers both ways and to self, matched in order per pair.
  std::vector<Tensor> sent, received;
  std::vector<Completion> done;
  done.reserve(64);
  for (int k = 0; k < 8; ++k) {
    for (int s = 0; s < 2; ++s) {
      Communicator& from = *comms[static_cast<size_t>(s)];
      Communicator& to = *comms[static_cast<size_t>(1 - s)];
      sent.push_back(Input(DType::kF32, 100 * k + 1, s, static_cast<uint64_t>(k)));
      received.push_back(Zeros(DType::kF32, 100 * k + 1));
      done.emplace_back();
      to.Recv(received.back(), s, done.back().Fn());
      done.emplace_back();
      from.Send(sent.back(), 1 - s, done.back().Fn());
    }
    sent.push_back(Input(DType::kI64, k, 0, 99));
    received.push_back(Zeros(DType::kI64, k));
    done.emplace_back();
    a.Send(sent.back(), 0, done.back().Fn());
    done.emplace_back();
    a.Recv(received.back(), 0, done.back().Fn());
  }
  for (Completion& c : done) EXPECT_TRUE(c.Wait().ok()) << c.Wait();
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(Compare(StrCat("transfer ", i), received[i], Bytes(sent[i]), sent[i].NumBytes()), "");
  }
}

TEST(GlooCommunicator, MismatchedCallsFailOnEveryRankAndLaterOpsStayAligned) {
  InProcessKvStore store;
  auto comms = ConnectAll(store, "mismatch", 2);
  tessera::testing::Deadline deadline(std::chrono::seconds(20), "the mismatched sequence");
  Tensor x8 = Zeros(DType::kF32, 8);
  Tensor x9 = Zeros(DType::kF32, 9);
  Tensor bad_output = Zeros(DType::kI32, 8);
  Completion c0, c1;
  comms[0]->AllReduce(x8, x8, ReduceOp::kSum, c0.Fn());
  comms[1]->AllReduce(x9, x9, ReduceOp::kSum, c1.Fn());
  for (Completion* c : {&c0, &c1}) {
    const absl::Status s = c->Wait();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("rank 0 called AllReduce(f32 x 8, sum) but rank 1 called AllReduce(f32 x 9, sum)"));
  }
  // An invalid call on rank 1 fails there at once and on rank 0 by the exchange.
  Completion d0, d1;
  comms[0]->AllReduce(x8, x8, ReduceOp::kSum, d0.Fn());
  comms[1]->AllReduce(x8, bad_output, ReduceOp::kSum, d1.Fn());
  EXPECT_THAT(std::string(d1.Wait().message()), HasSubstr("output dtype i32 differs"));
  EXPECT_THAT(std::string(d0.Wait().message()), HasSubstr("rank 1's call was invalid"));
  // Send/Recv of different sizes: both sides fail, the next pair works.
  Completion s0, r1;
  comms[0]->Send(x8, 1, s0.Fn());
  comms[1]->Recv(x9, 0, r1.Fn());
  EXPECT_THAT(std::string(s0.Wait().message()), HasSubstr("rank 0 sends f32 x 8 but rank 1 receives f32 x 9"));
  EXPECT_TRUE(absl::IsInvalidArgument(r1.Wait()));
  Tensor y8 = Tensor::FromVector<float>(Shape{8}, {1, 2, 3, 4, 5, 6, 7, 8});
  Completion s2, r2, e0, e1;
  comms[0]->Send(y8, 1, s2.Fn());
  comms[1]->Recv(x8, 0, r2.Fn());
  EXPECT_TRUE(s2.Wait().ok());
  EXPECT_TRUE(r2.Wait().ok());
  EXPECT_EQ(Values(x8), Values(y8));
  // The collective sequence is still aligned.
  Tensor z0 = Tensor::FromVector<float>(Shape{1}, {1});
  Tensor z1 = Tensor::FromVector<float>(Shape{1}, {2});
  comms[0]->AllReduce(z0, z0, ReduceOp::kMax, e0.Fn());
  comms[1]->AllReduce(z1, z1, ReduceOp::kMax, e1.Fn());
  EXPECT_TRUE(e0.Wait().ok());
  EXPECT_TRUE(e1.Wait().ok());
  EXPECT_EQ(Values(z0), std::vector<float>{2});
}

TEST(GlooCommunicator, RankThatNeverJoinsIsNamed) {
  InProcessKvStore store;
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "ConnectGloo without peers");
  auto comm = ConnectGloo(store, Options("lonely", 0, 3, absl::Milliseconds(300)));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("gloo group 'lonely' rank 0/3: ranks 1, 2 never joined"));
}

TEST(GlooCommunicator, BadOptionsAndArgumentsFailCleanly) {
  InProcessKvStore store;
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectGloo(store, Options("", 0, 1)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectGloo(store, Options("g", 2, 2)).status()));
  auto comm = ConnectGloo(store, Options("single", 0, 1));
  ASSERT_TRUE(comm.ok()) << comm.status();
  Tensor x = Tensor::FromVector<float>(Shape{2}, {1, 2});
  Tensor y = Zeros(DType::kF32, 2);
  EXPECT_TRUE(RunOp([&](DoneFn done) { (*comm)->AllReduce(x, y, ReduceOp::kSum, std::move(done)); }).ok());
  EXPECT_EQ(Values(y), Values(x));
  EXPECT_TRUE(absl::IsInvalidArgument(RunOp([&](DoneFn done) { (*comm)->Send(x, 1, std::move(done)); })));
  EXPECT_TRUE(absl::IsInvalidArgument(RunOp([&](DoneFn done) { (*comm)->Broadcast(x, 3, std::move(done)); })));
}

TEST(GlooCommunicator, AbortFailsPendingOpsOnBothRanksPromptly) {
  InProcessKvStore store;
  auto comms = ConnectAll(store, "abort", 2);
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "the aborted ops");
  Tensor x = Zeros(DType::kF32, 1 << 16);
  Tensor y = Zeros(DType::kF32, 4);
  Completion waiting, recv;
  // Rank 1 waits in an AllReduce (and a Recv) that rank 0 never issues.
  comms[1]->AllReduce(x, x, ReduceOp::kSum, waiting.Fn());
  comms[1]->Recv(y, 0, recv.Fn());
  Completion own;
  comms[0]->Recv(y, 1, own.Fn());  // pending on the aborting rank itself
  const auto start = std::chrono::steady_clock::now();
  comms[0]->Abort(absl::AbortedError("job 7 cancelled"));
  EXPECT_EQ(own.Wait(), absl::AbortedError("job 7 cancelled"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  for (Completion* c : {&waiting, &recv}) {
    const absl::Status s = c->Wait(std::chrono::seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("gloo group 'abort' rank 1/2"));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // Future ops fail at once, with the first reason.
  EXPECT_EQ(RunOp([&](DoneFn done) { comms[0]->AllReduce(y, y, ReduceOp::kSum, std::move(done)); }),
            absl::AbortedError("job 7 cancelled"));
  EXPECT_FALSE(RunOp([&](DoneFn done) { comms[1]->Send(y, 0, std::move(done)); }).ok());
  comms[1]->Abort(absl::OkStatus());  // a second abort is harmless
}

TEST(GlooCommunicator, OpThatNeverMatchesTimesOut) {
  InProcessKvStore store;
  auto comms = ConnectAll(store, "timeout", 2, absl::Milliseconds(500));
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "the op that times out");
  Tensor x = Zeros(DType::kF32, 4);
  const absl::Status s = RunOp([&](DoneFn done) { comms[0]->AllReduce(x, x, ReduceOp::kSum, std::move(done)); });
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("waiting on rank 1"));
}

// ---- Fusion of queued collectives ------------------------------------------

// One op of a burst: what every rank issues, and its inputs from (rank, salt).
struct BurstOp {
  Kind kind;
  DType dtype;
  ReduceOp op;
  int64_t n;  // elements (AllReduce, Broadcast) or the counts' scale
};

// Uneven counts with a zero for p ranks: n, 0, n/2 + 1, ...
std::vector<int64_t> BurstCounts(int64_t n, int p) {
  std::vector<int64_t> counts(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) counts[static_cast<size_t>(r)] = r == 1 ? 0 : n / (r + 1) + r;
  return counts;
}

// Issues every op of `burst` on each rank at once (no waiting in between, so
// the collective thread finds them queued), then checks every result against
// the rank-order reference. Returns "" when all matched.
std::string RunBurst(std::vector<std::unique_ptr<Communicator>>& comms, const std::vector<BurstOp>& burst) {
  const int p = static_cast<int>(comms.size());
  std::vector<std::string> errors(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int me = 0; me < p; ++me) {
    threads.emplace_back([&, me] {
      Communicator& comm = *comms[static_cast<size_t>(me)];
      std::vector<Tensor> inputs, outputs;
      std::vector<Completion> done(burst.size());
      for (size_t i = 0; i < burst.size(); ++i) {
        const BurstOp& b = burst[i];
        const std::vector<int64_t> counts = BurstCounts(b.n, p);
        const int64_t total = Offsets(counts).back();
        switch (b.kind) {
          case Kind::kAllReduce:
            inputs.push_back(Input(b.dtype, b.n, me, i));
            outputs.push_back(Zeros(b.dtype, b.n));
            comm.AllReduce(inputs.back(), outputs.back(), b.op, done[i].Fn());
            break;
          case Kind::kReduceScatter:
            inputs.push_back(Input(b.dtype, total, me, i));
            outputs.push_back(Zeros(b.dtype, counts[static_cast<size_t>(me)]));
            comm.ReduceScatter(inputs.back(), outputs.back(), counts, b.op, done[i].Fn());
            break;
          case Kind::kAllGather:
            inputs.push_back(Input(b.dtype, counts[static_cast<size_t>(me)], me, i));
            outputs.push_back(Zeros(b.dtype, total));
            comm.AllGather(inputs.back(), outputs.back(), counts, done[i].Fn());
            break;
          default:  // Broadcast from the last rank
            inputs.push_back(Input(b.dtype, b.n, p - 1, i));
            outputs.push_back(me == p - 1 ? inputs.back().Clone() : Zeros(b.dtype, b.n));
            comm.Broadcast(outputs.back(), p - 1, done[i].Fn());
            break;
        }
      }
      std::string& out = errors[static_cast<size_t>(me)];
      for (size_t i = 0; i < burst.size(); ++i) {
        const BurstOp& b = burst[i];
        const absl::Status status = done[i].Wait();
        const std::string what = StrCat("burst op ", i, " (", DTypeName(b.dtype), ") rank ", me);
        if (!status.ok()) {
          out += StrCat(what, ": ", status.ToString(), "\n");
          continue;
        }
        const std::vector<int64_t> counts = BurstCounts(b.n, p);
        const std::vector<int64_t> offsets = Offsets(counts);
        const size_t es = DTypeSize(b.dtype);
        std::vector<Tensor> all;  // every rank's input of this op
        for (int r = 0; r < p; ++r) {
          const int64_t n = b.kind == Kind::kAllReduce       ? b.n
                            : b.kind == Kind::kReduceScatter ? offsets.back()
                            : b.kind == Kind::kAllGather     ? counts[static_cast<size_t>(r)]
                                                             : b.n;
          all.push_back(Input(b.dtype, n, b.kind == Kind::kBroadcast ? p - 1 : r, i));
        }
        std::vector<char> want;
        if (b.kind == Kind::kAllReduce || b.kind == Kind::kReduceScatter) {
          const bool scatter = b.kind == Kind::kReduceScatter;
          const int64_t n = scatter ? counts[static_cast<size_t>(me)] : b.n;
          const size_t begin = scatter ? static_cast<size_t>(offsets[static_cast<size_t>(me)]) * es : 0;
          std::vector<const char*> in;
          for (const Tensor& t : all) in.push_back(Bytes(t) + begin);
          want.resize(static_cast<size_t>(n) * es);
          ReferenceReduce(b.dtype, b.op, in, want.data(), n);
        } else if (b.kind == Kind::kAllGather) {
          for (const Tensor& t : all) want.insert(want.end(), Bytes(t), Bytes(t) + t.NumBytes());
        } else {
          want.assign(Bytes(all[0]), Bytes(all[0]) + all[0].NumBytes());
        }
        out += Compare(what, outputs[i], want.data(), want.size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::string joined;
  for (const std::string& e : errors) joined += e;
  return joined;
}

std::vector<std::unique_ptr<Communicator>> ConnectFusing(KvStore& store, const std::string& group, int size,
                                                         const std::shared_ptr<std::atomic<int64_t>>& fused,
                                                         int64_t fuse_bytes = int64_t{16} << 20) {
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(size));
  tessera::testing::Deadline deadline(std::chrono::seconds(20), "ConnectGloo of every rank");
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options = Options(group, r, size);
      options.fused_ops = fused;
      options.fuse_bytes = fuse_bytes;
      auto comm = ConnectGloo(store, options);
      TESSERA_CHECK(comm.ok(), comm.status().ToString());
      comms[static_cast<size_t>(r)] = *std::move(comm);
    });
  }
  for (std::thread& t : threads) t.join();
  return comms;
}

// A large op first (the others queue behind it), then runs of fusable ops of
// several kinds, dtypes, reduce ops and sizes (zeros included), broken by
// ops that never fuse.
std::vector<BurstOp> Burst() {
  std::vector<BurstOp> burst = {{Kind::kAllReduce, DType::kF32, ReduceOp::kSum, 1 << 20}};
  for (int64_t n : {5, 0, 1000, 7, 3000, 1}) burst.push_back({Kind::kReduceScatter, DType::kF32, ReduceOp::kSum, n});
  for (int64_t n : {9, 2000, 0, 33}) burst.push_back({Kind::kAllGather, DType::kF32, ReduceOp::kSum, n});
  for (int64_t n : {100, 7, 4096}) burst.push_back({Kind::kAllReduce, DType::kBF16, ReduceOp::kSum, n});
  burst.push_back({Kind::kBroadcast, DType::kF32, ReduceOp::kSum, 77});
  for (int64_t n : {64, 65}) burst.push_back({Kind::kReduceScatter, DType::kF32, ReduceOp::kMax, n});
  for (int64_t n : {10, 11, 12}) burst.push_back({Kind::kAllReduce, DType::kI64, ReduceOp::kSum, n});
  for (int64_t n : {800, 801}) burst.push_back({Kind::kReduceScatter, DType::kF32, ReduceOp::kSum, n});
  return burst;
}

TEST(GlooCommunicator, QueuedCollectivesAreFusedWithTheSameResults) {
  for (int p : {2, 3}) {
    InProcessKvStore store;
    auto fused = std::make_shared<std::atomic<int64_t>>(0);
    auto comms = ConnectFusing(store, StrCat("fusion", p), p, fused);
    tessera::testing::Deadline deadline(std::chrono::seconds(60), "the burst");
    EXPECT_EQ(RunBurst(comms, Burst()), "") << "p = " << p;
    EXPECT_GT(fused->load(), 0) << "p = " << p << ": nothing was fused";
  }
}

TEST(GlooCommunicator, FusionOffAndSmallCapsGiveTheSameResults) {
  for (int64_t cap : {int64_t{0}, int64_t{4096}}) {
    InProcessKvStore store;
    auto fused = std::make_shared<std::atomic<int64_t>>(0);
    auto comms = ConnectFusing(store, StrCat("cap", cap), 2, fused, cap);
    tessera::testing::Deadline deadline(std::chrono::seconds(60), "the burst");
    EXPECT_EQ(RunBurst(comms, Burst()), "") << "fuse_bytes = " << cap;
    if (cap == 0) {
      EXPECT_EQ(fused->load(), 0);
    }
  }
}

TEST(GlooCommunicator, FusionStopsAtAMismatchWhichFailsAlone) {
  InProcessKvStore store;
  auto fused = std::make_shared<std::atomic<int64_t>>(0);
  auto comms = ConnectFusing(store, "fusion_mismatch", 2, fused);
  tessera::testing::Deadline deadline(std::chrono::seconds(30), "the mismatched burst");
  std::vector<absl::Status> second(2), others(2);
  std::vector<std::thread> threads;
  for (int me = 0; me < 2; ++me) {
    threads.emplace_back([&, me] {
      Communicator& comm = *comms[static_cast<size_t>(me)];
      Tensor big = Zeros(DType::kF32, 1 << 20);
      Tensor a = Zeros(DType::kF32, 8), a_out = Zeros(DType::kF32, 4);
      Tensor b = Zeros(DType::kF32, 8), b_out = Zeros(DType::kF32, me == 0 ? 4 : 6);
      Tensor c = Input(DType::kF32, 8, me, 5), c_out = Zeros(DType::kF32, 4);
      Completion d0, d1, d2, d3;
      comm.AllReduce(big, big, ReduceOp::kSum, d0.Fn());
      comm.ReduceScatter(a, a_out, {4, 4}, ReduceOp::kSum, d1.Fn());
      // Rank 1 calls this one with other counts: it must not be fused with
      // the first, and fails on both ranks.
      comm.ReduceScatter(b, b_out, me == 0 ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{2, 6}, ReduceOp::kSum,
                         d2.Fn());
      comm.ReduceScatter(c, c_out, {4, 4}, ReduceOp::kSum, d3.Fn());
      others[static_cast<size_t>(me)] = d0.Wait();
      if (others[static_cast<size_t>(me)].ok()) others[static_cast<size_t>(me)] = d1.Wait();
      second[static_cast<size_t>(me)] = d2.Wait();
      const absl::Status last = d3.Wait();
      if (others[static_cast<size_t>(me)].ok()) others[static_cast<size_t>(me)] = last;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int me = 0; me < 2; ++me) {
    EXPECT_TRUE(others[static_cast<size_t>(me)].ok()) << others[static_cast<size_t>(me)];
    EXPECT_TRUE(absl::IsInvalidArgument(second[static_cast<size_t>(me)])) << second[static_cast<size_t>(me)];
    EXPECT_THAT(std::string(second[static_cast<size_t>(me)].message()), HasSubstr("mismatched collective"));
  }
}

TEST(GlooStore, MapsGlooCallsOntoKvStoreWithPrefixAndTimeout) {
  InProcessKvStore kv;
  GlooStore store(kv, "job/g", absl::Milliseconds(100));
  store.set("a", {'x', 'y'});
  EXPECT_EQ(*kv.Get("job/g/a"), "xy");
  EXPECT_EQ(store.get("a"), (std::vector<char>{'x', 'y'}));
  store.wait({"a"});
  EXPECT_THROW(store.wait({"a", "b"}, std::chrono::milliseconds(50)), gloo::IoException);
  EXPECT_TRUE(absl::IsDeadlineExceeded(store.last_error())) << store.last_error();
  EXPECT_THAT(std::string(store.last_error().message()), HasSubstr("job/g/b"));
  EXPECT_THROW(store.get("missing"), gloo::IoException);
}

// A cancellable view waits like its store, and gives up within about 100 ms
// of the cancel; a rank whose rendezvous runs through it stops waiting for
// a peer that will not come once the load failed elsewhere.
TEST(CancellableKvStore, WaitsLikeItsStoreAndGivesUpOnCancel) {
  InProcessKvStore kv;
  std::atomic<bool> cancel{false};
  CancellableKvStore view(kv, cancel);
  ASSERT_TRUE(view.Set("a", "1").ok());
  EXPECT_EQ(*kv.Get("a"), "1");
  EXPECT_EQ(*view.Wait({"a"}, absl::Seconds(1)), std::vector<std::string>{"1"});
  std::thread late([&kv] {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    ASSERT_TRUE(kv.Set("b", "2").ok());
  });
  EXPECT_EQ(*view.Wait({"a", "b"}, absl::Seconds(5)), (std::vector<std::string>{"1", "2"}));  // across slices
  late.join();
  const auto timed_out = view.Wait({"a", "c"}, absl::Milliseconds(350));
  EXPECT_TRUE(absl::IsDeadlineExceeded(timed_out.status())) << timed_out.status();
  EXPECT_THAT(std::string(timed_out.status().message()), HasSubstr("waited 350ms for c"));
  // Cancelled mid-wait: a gloo rank whose peer never comes.
  std::thread canceller([&cancel] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  GlooOptions options;
  options.group = "lonely";
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Seconds(20);
  const auto started = std::chrono::steady_clock::now();
  const auto connected = ConnectGloo(view, options);
  canceller.join();
  EXPECT_TRUE(absl::IsCancelled(connected.status())) << connected.status();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(3));
}

}  // namespace
}  // namespace tessera::comm

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (!tessera::ConsumePrefix(&arg, "--gloo-child=")) continue;
    // CASE,RANK,SIZE,DIR
    std::vector<std::string> parts;
    std::string part;
    for (char c : arg) {
      if (c == ',' && parts.size() < 3) {
        parts.push_back(part);
        part.clear();
      } else {
        part += c;
      }
    }
    parts.push_back(part);
    int rank = 0;
    int size = 0;
    if (parts.size() != 4 || !tessera::ParseInteger(parts[1], &rank) || !tessera::ParseInteger(parts[2], &size)) {
      std::fprintf(stderr, "bad --gloo-child=%s\n", std::string(arg).c_str());
      return 2;
    }
    return tessera::comm::RunChild(parts[0], rank, size, parts[3]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
