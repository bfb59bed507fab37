// Shared-memory communicator tests: every op over 2, 3 and 4 ranks (one
// thread each) with uneven counts, against references computed serially in
// rank order, compared bit for bit; a long random sequence of queued ops;
// mismatches, argument errors, abort and departed ranks. Every wait has a
// deadline, so a hang fails instead of blocking ctest.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective/shm_communicator.h"
#include "tests/comm/completion.h"
#include "core/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::comm {
namespace {

using ::testing::HasSubstr;

using testing::Completion;
using testing::kDeadline;


// ---- Data and references ---------------------------------------------------

Tensor Make(DType dtype, int64_t n) {
  auto t = Tensor::Zeros(Shape{n}, dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  return *t;
}

// Random values whose magnitudes vary over six decades, so that f32 sums
// depend on the order of the ranks.
Tensor Random(DType dtype, int64_t n, uint64_t seed) {
  Tensor t = Make(dtype, n);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> decade(-3, 3);
  std::uniform_int_distribution<int64_t> integer(-100000, 100000);
  for (int64_t i = 0; i < n; ++i) {
    const float f = unit(rng) * std::pow(10.0f, static_cast<float>(decade(rng)));
    switch (dtype) {
      case DType::kF32: t.data<float>()[i] = f; break;
      case DType::kF16: t.data<Half>()[i] = Half{FloatToHalf(f)}; break;
      case DType::kBF16: t.data<BFloat16>()[i] = BFloat16{FloatToBFloat16(f)}; break;
      case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(integer(rng)); break;
      case DType::kI64: t.data<int64_t>()[i] = integer(rng) * 1000003; break;
      case DType::kBool: t.data<bool>()[i] = (integer(rng) & 1) != 0; break;
      case DType::kF64: t.data<double>()[i] = f; break;
    }
  }
  return t;
}

using Bytes = std::vector<uint8_t>;

Bytes BytesOf(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return Bytes(p, p + t.NumBytes());
}

float LoadFloat(DType dtype, const uint8_t* p, int64_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, p + i * 4, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, p + i * 2, 2);
  return dtype == DType::kF16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
}

void StoreFloat(DType dtype, uint8_t* p, int64_t i, float v) {
  if (dtype == DType::kF32) {
    std::memcpy(p + i * 4, &v, 4);
    return;
  }
  const uint16_t bits = dtype == DType::kF16 ? FloatToHalf(v) : FloatToBFloat16(v);
  std::memcpy(p + i * 2, &bits, 2);
}

template <typename Int>
Bytes ReduceIntegers(ReduceOp op, const std::vector<const uint8_t*>& inputs, int64_t n) {
  Bytes out(static_cast<size_t>(n) * sizeof(Int));
  for (int64_t i = 0; i < n; ++i) {
    Int acc;
    std::memcpy(&acc, inputs[0] + i * sizeof(Int), sizeof(Int));
    for (size_t r = 1; r < inputs.size(); ++r) {
      Int x;
      std::memcpy(&x, inputs[r] + i * sizeof(Int), sizeof(Int));
      using U = std::make_unsigned_t<Int>;
      acc = op == ReduceOp::kSum ? static_cast<Int>(static_cast<U>(acc) + static_cast<U>(x)) : std::max(acc, x);
    }
    std::memcpy(out.data() + i * sizeof(Int), &acc, sizeof(Int));
  }
  return out;
}

// The reduction of n elements from each input, ranks in order 0..p-1,
// floating-point types accumulated in f32 and rounded once.
Bytes ReferenceReduce(DType dtype, ReduceOp op, const std::vector<const uint8_t*>& inputs, int64_t n) {
  if (dtype == DType::kI32) return ReduceIntegers<int32_t>(op, inputs, n);
  if (dtype == DType::kI64) return ReduceIntegers<int64_t>(op, inputs, n);
  Bytes out(static_cast<size_t>(n) * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    float acc = LoadFloat(dtype, inputs[0], i);
    for (size_t r = 1; r < inputs.size(); ++r) {
      const float x = LoadFloat(dtype, inputs[r], i);
      acc = op == ReduceOp::kSum ? acc + x : std::max(acc, x);
    }
    StoreFloat(dtype, out.data(), i, acc);
  }
  return out;
}

// ---- One op over all ranks --------------------------------------------------

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kSendRecvRing };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "AllReduce";
    case Kind::kAllGather: return "AllGather";
    case Kind::kReduceScatter: return "ReduceScatter";
    case Kind::kAllToAll: return "AllToAll";
    case Kind::kBroadcast: return "Broadcast";
    case Kind::kSendRecvRing: return "SendRecvRing";
  }
  return "?";
}

// An op as every rank issues it. counts: per-rank counts (all-gather,
// reduce-scatter, ring: rank r sends counts[r] to r+1); n: all-reduce and
// broadcast size; matrix[s][d]: all-to-all elements from s to d.
struct OpSpec {
  Kind kind = Kind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int64_t n = 0;
  std::vector<int64_t> counts = {};
  std::vector<std::vector<int64_t>> matrix = {};
  bool in_place = false;  // all-reduce with output = input on odd ranks

  std::string ToString() const {
    return StrCat(KindName(kind), "(", DTypeName(dtype), ", n ", n, ", counts [", Join(counts, ", "), "], ",
                  ReduceOpName(op), ", root ", root, in_place ? ", in place" : "", ")");
  }
};

// One rank's tensors for one op; `pristine` is a copy of the input taken
// before the op (the in-place and broadcast buffers are overwritten).
struct RankBuffers {
  Tensor input;
  Tensor output;
  Tensor pristine;
};

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

std::vector<int64_t> Column(const std::vector<std::vector<int64_t>>& matrix, int d) {
  std::vector<int64_t> column;
  for (const auto& row : matrix) column.push_back(row[static_cast<size_t>(d)]);
  return column;
}

std::vector<RankBuffers> Prepare(const OpSpec& spec, int p, uint64_t seed) {
  std::vector<RankBuffers> buffers(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    RankBuffers& b = buffers[static_cast<size_t>(r)];
    const uint64_t s = seed * 1000 + static_cast<uint64_t>(r);
    const auto ri = static_cast<size_t>(r);
    switch (spec.kind) {
      case Kind::kAllReduce:
        b.input = Random(spec.dtype, spec.n, s);
        b.output = spec.in_place && r % 2 == 1 ? b.input : Make(spec.dtype, spec.n);
        break;
      case Kind::kAllGather:
        b.input = Random(spec.dtype, spec.counts[ri], s);
        b.output = Make(spec.dtype, Sum(spec.counts));
        break;
      case Kind::kReduceScatter:
        b.input = Random(spec.dtype, Sum(spec.counts), s);
        b.output = Make(spec.dtype, spec.counts[ri]);
        break;
      case Kind::kAllToAll:
        b.input = Random(spec.dtype, Sum(spec.matrix[ri]), s);
        b.output = Make(spec.dtype, Sum(Column(spec.matrix, r)));
        break;
      case Kind::kBroadcast:
        b.input = Random(spec.dtype, spec.n, s);
        b.output = b.input;
        break;
      case Kind::kSendRecvRing:
        b.input = Random(spec.dtype, spec.counts[ri], s);
        b.output = Make(spec.dtype, spec.counts[static_cast<size_t>((r + p - 1) % p)]);
        break;
    }
    b.pristine = b.input.Clone();
  }
  return buffers;
}

// Launches rank r's part of `spec`; one Completion per callback.
std::vector<Completion> Issue(Communicator& comm, const OpSpec& spec, const RankBuffers& b) {
  const int r = comm.rank();
  const int p = comm.size();
  std::vector<Completion> done(spec.kind == Kind::kSendRecvRing ? 2 : 1);
  switch (spec.kind) {
    case Kind::kAllReduce: comm.AllReduce(b.input, b.output, spec.op, done[0].Fn()); break;
    case Kind::kAllGather: comm.AllGather(b.input, b.output, spec.counts, done[0].Fn()); break;
    case Kind::kReduceScatter: comm.ReduceScatter(b.input, b.output, spec.counts, spec.op, done[0].Fn()); break;
    case Kind::kAllToAll:
      comm.AllToAll(b.input, spec.matrix[static_cast<size_t>(r)], b.output, Column(spec.matrix, r), done[0].Fn());
      break;
    case Kind::kBroadcast: comm.Broadcast(b.output, spec.root, done[0].Fn()); break;
    case Kind::kSendRecvRing:
      comm.Send(b.input, (r + 1) % p, done[0].Fn());
      comm.Recv(b.output, (r + p - 1) % p, done[1].Fn());
      break;
  }
  return done;
}

// What rank r's output must hold, from every rank's pristine input.
Bytes Expected(const OpSpec& spec, const std::vector<RankBuffers>& buffers, int r) {
  const int p = static_cast<int>(buffers.size());
  const size_t es = DTypeSize(spec.dtype);
  auto in = [&](int s) { return static_cast<const uint8_t*>(buffers[static_cast<size_t>(s)].pristine.raw_data()); };
  Bytes out;
  switch (spec.kind) {
    case Kind::kAllReduce: {
      std::vector<const uint8_t*> inputs;
      for (int s = 0; s < p; ++s) inputs.push_back(in(s));
      return ReferenceReduce(spec.dtype, spec.op, inputs, spec.n);
    }
    case Kind::kAllGather:
      for (int s = 0; s < p; ++s) out.insert(out.end(), in(s), in(s) + spec.counts[static_cast<size_t>(s)] * es);
      return out;
    case Kind::kReduceScatter: {
      int64_t offset = 0;
      for (int s = 0; s < r; ++s) offset += spec.counts[static_cast<size_t>(s)];
      std::vector<const uint8_t*> inputs;
      for (int s = 0; s < p; ++s) inputs.push_back(in(s) + offset * static_cast<int64_t>(es));
      return ReferenceReduce(spec.dtype, spec.op, inputs, spec.counts[static_cast<size_t>(r)]);
    }
    case Kind::kAllToAll:
      for (int s = 0; s < p; ++s) {
        const auto& row = spec.matrix[static_cast<size_t>(s)];
        int64_t offset = 0;
        for (int d = 0; d < r; ++d) offset += row[static_cast<size_t>(d)];
        const uint8_t* begin = in(s) + offset * static_cast<int64_t>(es);
        out.insert(out.end(), begin, begin + row[static_cast<size_t>(r)] * static_cast<int64_t>(es));
      }
      return out;
    case Kind::kBroadcast: return BytesOf(buffers[static_cast<size_t>(spec.root)].pristine);
    case Kind::kSendRecvRing: return BytesOf(buffers[static_cast<size_t>((r + p - 1) % p)].pristine);
  }
  return out;
}

// Runs body(comm) for ranks 0..p-1 of group `key`, each on its own thread
// that joins the group itself.
void RunRanks(ShmHub& hub, const std::string& key, int p, const std::function<void(Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&hub, &key, &body, p, r] {
      auto comm = hub.Join(key, p, r);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

// Runs `specs` in order on p threads and checks every output against the
// reference. With `queued`, each rank launches every op before waiting for
// any (exercising many pending ops at once); otherwise it waits after each.
// Returns every rank's output bytes, per op.
std::vector<std::vector<Bytes>> RunAndCheck(ShmHub& hub, const std::string& key, int p,
                                            const std::vector<OpSpec>& specs, bool queued, uint64_t seed) {
  std::vector<std::vector<RankBuffers>> buffers;
  for (size_t i = 0; i < specs.size(); ++i) buffers.push_back(Prepare(specs[i], p, seed + i));
  RunRanks(hub, key, p, [&](Communicator& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    std::vector<std::vector<Completion>> pending;
    for (size_t i = 0; i < specs.size(); ++i) {
      pending.push_back(Issue(comm, specs[i], buffers[i][r]));
      if (queued) continue;
      for (const Completion& c : pending.back()) ASSERT_TRUE(c.Wait().ok()) << c.Wait() << " in " << specs[i].ToString();
    }
    for (size_t i = 0; i < pending.size(); ++i) {
      for (const Completion& c : pending[i]) {
        EXPECT_TRUE(c.Wait().ok()) << c.Wait() << " in op " << i << " " << specs[i].ToString();
        EXPECT_EQ(c.calls(), 1);
      }
    }
  });
  std::vector<std::vector<Bytes>> outputs;
  for (size_t i = 0; i < specs.size(); ++i) {
    outputs.emplace_back();
    for (int r = 0; r < p; ++r) {
      const Bytes actual = BytesOf(buffers[i][static_cast<size_t>(r)].output);
      const Bytes expected = Expected(specs[i], buffers[i], r);
      EXPECT_TRUE(actual == expected) << "rank " << r << " of " << p << ", op " << i << " "
                                      << specs[i].ToString() << ": output differs from the reference";
      outputs.back().push_back(actual);
    }
  }
  return outputs;
}

// Uneven per-rank counts with zeros, for p ranks.
std::vector<std::vector<int64_t>> UnevenCounts(int p) {
  const std::vector<std::vector<int64_t>> all = {
      {5, 0, 3, 7}, {0, 0, 0, 0}, {1000, 1, 0, 333}, {0, 17, 1, 0}, {4096, 4095, 1, 2}};
  std::vector<std::vector<int64_t>> out;
  for (const auto& c : all) out.emplace_back(c.begin(), c.begin() + p);
  return out;
}

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kI32};

TEST(ShmCommunicatorTest, AllReduceMatchesReferenceOnEveryRank) {
  for (int p : {2, 3, 4}) {
    std::vector<OpSpec> specs;
    for (DType dtype : kDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        for (int64_t n : {0, 1, 7, 1000, 5001}) {
          for (bool in_place : {false, true}) {
            specs.push_back({.kind = Kind::kAllReduce, .dtype = dtype, .op = op, .n = n, .in_place = in_place});
          }
        }
      }
    }
    ShmHub hub;
    const auto outputs = RunAndCheck(hub, StrCat("allreduce", p), p, specs, /*queued=*/false, 100 + p);
    for (size_t i = 0; i < specs.size(); ++i) {
      for (int r = 1; r < p; ++r) EXPECT_TRUE(outputs[i][static_cast<size_t>(r)] == outputs[i][0]) << "rank " << r;
    }
  }
}

TEST(ShmCommunicatorTest, AllReduceIsBitIdenticalAcrossRunsAndWithThreadPool) {
  constexpr int p = 4;
  std::vector<OpSpec> specs;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    specs.push_back({.kind = Kind::kAllReduce, .dtype = dtype, .n = 100003});
    specs.push_back({.kind = Kind::kReduceScatter, .dtype = dtype, .counts = {30000, 0, 27777, 43457}});
  }
  ShmHub serial_hub;
  const auto first = RunAndCheck(serial_hub, "deterministic", p, specs, false, 7);
  const auto second = RunAndCheck(serial_hub, "deterministic", p, specs, false, 7);
  ThreadPool pool(4);
  ShmHub pooled_hub(ShmHub::Options{.pool = &pool, .min_parallel_elements = 1 << 12});
  const auto pooled = RunAndCheck(pooled_hub, "deterministic", p, specs, true, 7);
  EXPECT_TRUE(first == second);
  EXPECT_TRUE(first == pooled);
  for (int r = 1; r < p; ++r) EXPECT_TRUE(first[0][static_cast<size_t>(r)] == first[0][0]);
}

TEST(ShmCommunicatorTest, AllGatherUnevenCounts) {
  for (int p : {2, 3, 4}) {
    std::vector<OpSpec> specs;
    for (DType dtype : kDTypes) {
      for (const auto& counts : UnevenCounts(p)) specs.push_back({.kind = Kind::kAllGather, .dtype = dtype, .counts = counts});
    }
    specs.push_back({.kind = Kind::kAllGather, .dtype = DType::kBool, .counts = UnevenCounts(p)[0]});
    ShmHub hub;
    RunAndCheck(hub, "allgather", p, specs, false, 200 + p);
  }
}

TEST(ShmCommunicatorTest, ReduceScatterUnevenCounts) {
  for (int p : {2, 3, 4}) {
    std::vector<OpSpec> specs;
    for (DType dtype : kDTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        for (const auto& counts : UnevenCounts(p)) {
          specs.push_back({.kind = Kind::kReduceScatter, .dtype = dtype, .op = op, .counts = counts});
        }
      }
    }
    ShmHub hub;
    RunAndCheck(hub, "reducescatter", p, specs, false, 300 + p);
  }
}

TEST(ShmCommunicatorTest, AllToAllUnevenCounts) {
  std::mt19937_64 rng(42);
  for (int p : {2, 3, 4}) {
    std::vector<OpSpec> specs;
    for (DType dtype : kDTypes) {
      for (int variant = 0; variant < 4; ++variant) {
        std::vector<std::vector<int64_t>> matrix(static_cast<size_t>(p), std::vector<int64_t>(static_cast<size_t>(p)));
        for (auto& row : matrix) {
          for (auto& x : row) x = variant == 0 ? 0 : static_cast<int64_t>(rng() % 4 == 0 ? 0 : rng() % 300);
        }
        specs.push_back({.kind = Kind::kAllToAll, .dtype = dtype, .matrix = matrix});
      }
    }
    ShmHub hub;
    RunAndCheck(hub, "alltoall", p, specs, false, 400 + p);
  }
}

TEST(ShmCommunicatorTest, BroadcastFromEveryRoot) {
  for (int p : {2, 3, 4}) {
    std::vector<OpSpec> specs;
    for (DType dtype : kDTypes) {
      for (int root = 0; root < p; ++root) {
        for (int64_t n : {0, 1, 999}) specs.push_back({.kind = Kind::kBroadcast, .dtype = dtype, .root = root, .n = n});
      }
    }
    ShmHub hub;
    RunAndCheck(hub, "broadcast", p, specs, false, 500 + p);
  }
}

TEST(ShmCommunicatorTest, SendRecvRingUnevenCounts) {
  for (int p : {2, 3, 4}) {
    std::vector<OpSpec> specs;
    for (DType dtype : kDTypes) {
      for (const auto& counts : UnevenCounts(p)) specs.push_back({.kind = Kind::kSendRecvRing, .dtype = dtype, .counts = counts});
    }
    ShmHub hub;
    RunAndCheck(hub, "ring", p, specs, /*queued=*/true, 600 + p);
  }
}

TEST(ShmCommunicatorTest, SendRecvMatchInOrderPerPairIndependentOfCollectives) {
  constexpr int p = 3;
  constexpr int kMessages = 6;
  // message(s, d, k) holds k + 1 elements valued s * 10000 + d * 100 + k.
  auto message = [](int s, int d, int k) {
    std::vector<int32_t> v(static_cast<size_t>(k + 1), s * 10000 + d * 100 + k);
    return Tensor::FromVector(Shape{k + 1}, v);
  };
  std::vector<std::vector<std::vector<Tensor>>> received(p, std::vector<std::vector<Tensor>>(p));
  ShmHub hub;
  RunRanks(hub, "p2p", p, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<Completion> done;
    auto launch = [&](auto&& fn) {
      done.emplace_back();
      fn(done.back().Fn());
    };
    // Receives first on even ranks, sends first on odd ones; a collective in
    // the middle of the point-to-point stream does not disturb its order.
    auto post_receives = [&] {
      for (int s = 0; s < p; ++s) {
        for (int k = 0; k < kMessages; ++k) {
          Tensor out = Make(DType::kI32, k + 1);
          received[static_cast<size_t>(r)][static_cast<size_t>(s)].push_back(out);
          launch([&](DoneFn fn) { comm.Recv(out, s, std::move(fn)); });
        }
      }
    };
    auto post_sends = [&] {
      for (int k = 0; k < kMessages; ++k) {
        for (int d = 0; d < p; ++d) launch([&](DoneFn fn) { comm.Send(message(r, d, k), d, std::move(fn)); });
      }
    };
    Tensor value = Tensor::FromVector(Shape{1}, std::vector<int64_t>{r + 1});
    if (r % 2 == 0) post_receives();
    launch([&](DoneFn fn) { comm.AllReduce(value, value, ReduceOp::kSum, std::move(fn)); });
    if (r % 2 == 0) post_sends();
    if (r % 2 == 1) {
      post_sends();
      post_receives();
    }
    for (const Completion& c : done) EXPECT_TRUE(c.Wait().ok()) << c.Wait();
    EXPECT_EQ(value.data<int64_t>()[0], 6);
  });
  for (int d = 0; d < p; ++d) {
    for (int s = 0; s < p; ++s) {
      for (int k = 0; k < kMessages; ++k) {
        const Tensor& t = received[static_cast<size_t>(d)][static_cast<size_t>(s)][static_cast<size_t>(k)];
        EXPECT_EQ(t.ToVector<int32_t>(), message(s, d, k).ToVector<int32_t>()) << s << " -> " << d << " #" << k;
      }
    }
  }
}

// 200 ops of random kinds, dtypes and sizes, the same seeded sequence on every
// rank, all launched before any is waited for; without and with a pool.
TEST(ShmCommunicatorTest, RandomSequenceMatchesReferences) {
  for (int p : {3, 4}) {
    std::mt19937_64 rng(2024 + p);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
    auto count = [&] { return pick(5) == 0 ? int64_t{0} : static_cast<int64_t>(pick(200)); };
    const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64};
    std::vector<OpSpec> specs;
    for (int i = 0; i < 200; ++i) {
      OpSpec spec;
      spec.kind = static_cast<Kind>(pick(6));
      spec.dtype = dtypes[pick(5)];
      spec.op = pick(2) == 0 ? ReduceOp::kSum : ReduceOp::kMax;
      spec.root = pick(p);
      spec.n = count();
      spec.in_place = pick(2) == 0;
      for (int r = 0; r < p; ++r) spec.counts.push_back(count());
      spec.matrix.assign(static_cast<size_t>(p), {});
      for (auto& row : spec.matrix) {
        for (int d = 0; d < p; ++d) row.push_back(count());
      }
      specs.push_back(spec);
    }
    ShmHub hub;
    RunAndCheck(hub, "random", p, specs, /*queued=*/true, 9000 + p);
    // Again with reductions and copies split over a pool shared by the ranks.
    ThreadPool pool(3);
    ShmHub pooled_hub(ShmHub::Options{.pool = &pool, .min_parallel_elements = 16});
    RunAndCheck(pooled_hub, "random-pooled", p, specs, /*queued=*/true, 9000 + p);
  }
}

// ---- Errors -------------------------------------------------------------------

// p communicators of one group, joined on the test's thread.
std::vector<std::shared_ptr<Communicator>> JoinAll(ShmHub& hub, const std::string& key, int p) {
  std::vector<std::shared_ptr<Communicator>> comms;
  for (int r = 0; r < p; ++r) {
    auto c = hub.Join(key, p, r);
    TESSERA_CHECK(c.ok(), c.status().ToString());
    comms.push_back(*c);
  }
  return comms;
}

TEST(ShmCommunicatorTest, DescribeAndJoinErrors) {
  ShmHub hub;
  auto a = hub.Join("ranks:0,2", 2, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->Describe(), "shm group 'ranks:0,2' rank 1/2");
  EXPECT_EQ((*a)->rank(), 1);
  EXPECT_EQ((*a)->size(), 2);

  auto duplicate = hub.Join("ranks:0,2", 2, 1);
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(duplicate.status().message()), HasSubstr("rank 1 already joined shm group 'ranks:0,2'"));
  auto wrong_size = hub.Join("ranks:0,2", 3, 0);
  EXPECT_THAT(std::string(wrong_size.status().message()), HasSubstr("has 2 ranks but rank 0 joined with size 3"));
  EXPECT_THAT(std::string(hub.Join("g", 0, 0).status().message()), HasSubstr("size 0 must be at least 1"));
  EXPECT_THAT(std::string(hub.Join("g", 2, 2).status().message()), HasSubstr("rank 2 is outside [0, 2)"));
  EXPECT_THAT(std::string(hub.Join("g", 2, -1).status().message()), HasSubstr("rank -1 is outside [0, 2)"));

  // Once every communicator of a group is gone, the key starts a fresh group.
  a->reset();
  auto fresh = hub.Join("ranks:0,2", 1, 0);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  Tensor t = Tensor::FromVector(Shape{2}, std::vector<float>{1.5f, -2.0f});
  Completion done;
  (*fresh)->AllReduce(t, t, ReduceOp::kSum, done.Fn());
  EXPECT_TRUE(done.Wait().ok());
  EXPECT_EQ(t.ToVector<float>(), (std::vector<float>{1.5f, -2.0f}));
}

TEST(ShmCommunicatorTest, MismatchFailsEveryRankNamingBothCalls) {
  struct Case {
    std::function<void(Communicator&, DoneFn)> rank0;
    std::function<void(Communicator&, DoneFn)> others;
    std::vector<std::string> expected;
  };
  const Tensor f10 = Make(DType::kF32, 10);
  const Tensor f12 = Make(DType::kF32, 12);
  const Tensor b10 = Make(DType::kBF16, 10);
  auto all_reduce = [](const Tensor& t, ReduceOp op) {
    return [t, op](Communicator& c, DoneFn done) { c.AllReduce(t, t.Clone(), op, std::move(done)); };
  };
  const std::vector<Case> cases = {
      {all_reduce(f10, ReduceOp::kSum),
       [&](Communicator& c, DoneFn done) { c.AllGather(Make(DType::kF32, 5), Make(DType::kF32, 15), {5, 5, 5}, std::move(done)); },
       {"rank 0 called AllReduce(f32 x 10, sum)", "called AllGather(f32, counts [5, 5, 5])"}},
      {all_reduce(f10, ReduceOp::kSum), all_reduce(f12, ReduceOp::kSum),
       {"rank 0 called AllReduce(f32 x 10, sum)", "called AllReduce(f32 x 12, sum)"}},
      {all_reduce(f10, ReduceOp::kSum), all_reduce(f10, ReduceOp::kMax),
       {"rank 0 called AllReduce(f32 x 10, sum)", "called AllReduce(f32 x 10, max)"}},
      {all_reduce(f10, ReduceOp::kSum), all_reduce(b10, ReduceOp::kSum),
       {"rank 0 called AllReduce(f32 x 10, sum)", "called AllReduce(bf16 x 10, sum)"}},
      {[&](Communicator& c, DoneFn done) { c.Broadcast(f10.Clone(), 0, std::move(done)); },
       [&](Communicator& c, DoneFn done) { c.Broadcast(f10.Clone(), 1, std::move(done)); },
       {"rank 0 called Broadcast(f32 x 10, root 0)", "called Broadcast(f32 x 10, root 1)"}},
  };
  constexpr int p = 3;
  for (size_t i = 0; i < cases.size(); ++i) {
    ShmHub hub;
    std::vector<absl::Status> statuses(p);
    RunRanks(hub, "mismatch", p, [&](Communicator& comm) {
      Completion done;
      if (comm.rank() == 0) {
        cases[i].rank0(comm, done.Fn());
      } else {
        cases[i].others(comm, done.Fn());
      }
      statuses[static_cast<size_t>(comm.rank())] = done.Wait();
      // The sequence stays aligned: the next collective works.
      Tensor one = Tensor::FromVector(Shape{1}, std::vector<int32_t>{1});
      Completion next;
      comm.AllReduce(one, one, ReduceOp::kSum, next.Fn());
      EXPECT_TRUE(next.Wait().ok()) << next.Wait();
      EXPECT_EQ(one.data<int32_t>()[0], p);
    });
    for (int r = 0; r < p; ++r) {
      const absl::Status& s = statuses[static_cast<size_t>(r)];
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "case " << i << " rank " << r << ": " << s;
      EXPECT_EQ(s, statuses[0]) << "every rank gets the same error";
      EXPECT_THAT(std::string(s.message()), HasSubstr("mismatched collective #0 in shm group 'mismatch'"));
      for (const std::string& e : cases[i].expected) EXPECT_THAT(std::string(s.message()), HasSubstr(e)) << "case " << i;
    }
  }
}

TEST(ShmCommunicatorTest, AllToAllCountMismatchNamesSenderAndReceiver) {
  ShmHub hub;
  auto comms = JoinAll(hub, "a2a", 2);
  Completion d0, d1;
  // Rank 0 sends 2 elements to rank 1, which expects 3.
  comms[0]->AllToAll(Make(DType::kF32, 3), {1, 2}, Make(DType::kF32, 2), {1, 1}, d0.Fn());
  comms[1]->AllToAll(Make(DType::kF32, 2), {1, 1}, Make(DType::kF32, 4), {3, 1}, d1.Fn());
  for (const Completion* d : {&d0, &d1}) {
    const absl::Status s = d->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 called AllToAll(f32, send [1, 2], recv [1, 1]) sending 2 "
                                                    "elements to rank 1 but rank 1 called AllToAll(f32, send [1, 1], "
                                                    "recv [3, 1]) expecting 3 from rank 0"));
  }
}

TEST(ShmCommunicatorTest, SendRecvMismatchFailsBoth) {
  ShmHub hub;
  auto comms = JoinAll(hub, "p2p-mismatch", 2);
  Completion send, recv;
  comms[0]->Send(Make(DType::kF32, 4), 1, send.Fn());
  comms[1]->Recv(Make(DType::kF32, 5), 0, recv.Fn());
  for (const Completion* d : {&send, &recv}) {
    const absl::Status s = d->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("mismatched Send/Recv #0 from rank 0 to rank 1 in shm group 'p2p-mismatch': rank 0 sends f32 x 4 but rank 1 receives f32 x 5"));
  }
}

// A call that fails its own argument checks is reported to its rank at once
// and still takes its place in the sequence, failing the peers' matching op.
TEST(ShmCommunicatorTest, InvalidCallFailsItsRankAtOnceAndThePeersMatchingOp) {
  ShmHub hub;
  auto comms = JoinAll(hub, "invalid", 2);
  Completion bad;
  comms[0]->AllReduce(Make(DType::kF32, 4), Make(DType::kF32, 5), ReduceOp::kSum, bad.Fn());
  ASSERT_EQ(bad.calls(), 1) << "argument errors are reported inline";
  EXPECT_THAT(std::string(bad.Wait().message()), HasSubstr("AllReduce in shm group 'invalid' rank 0/2: output shape (5,) differs from input shape (4,)"));
  Completion peer;
  comms[1]->AllReduce(Make(DType::kF32, 4), Make(DType::kF32, 4), ReduceOp::kSum, peer.Fn());
  EXPECT_EQ(peer.Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(peer.Wait().message()), HasSubstr("AllReduce #0 in shm group 'invalid' failed: rank 0's call was invalid (AllReduce in shm group 'invalid' rank 0/2: output shape"));
  EXPECT_EQ(bad.calls(), 1);
  // Aligned again.
  Completion a, b;
  Tensor t0 = Tensor::FromVector(Shape{1}, std::vector<float>{1});
  Tensor t1 = Tensor::FromVector(Shape{1}, std::vector<float>{2});
  comms[0]->AllReduce(t0, t0, ReduceOp::kSum, a.Fn());
  comms[1]->AllReduce(t1, t1, ReduceOp::kSum, b.Fn());
  EXPECT_TRUE(a.Wait().ok());
  EXPECT_TRUE(b.Wait().ok());
  EXPECT_EQ(t0.data<float>()[0], 3.0f);
}

TEST(ShmCommunicatorTest, ArgumentErrorsNameOpGroupAndArgument) {
  ShmHub hub;
  auto comms = JoinAll(hub, "args", 2);
  Communicator& c = *comms[0];
  const Tensor f4 = Make(DType::kF32, 4);
  const Tensor f3 = Make(DType::kF32, 3);
  const Tensor f8 = Make(DType::kF32, 8);
  auto rows = Make(DType::kF32, 6).Reshape(Shape{6, 1});
  ASSERT_TRUE(rows.ok());
  const Tensor low = *rows->SliceRows(0, 4);
  const Tensor high = *rows->SliceRows(2, 4);
  struct Case {
    std::function<void(DoneFn)> call;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[&](DoneFn d) { c.AllReduce(f4, Make(DType::kI32, 4), ReduceOp::kSum, d); },
       "AllReduce in shm group 'args' rank 0/2: output dtype i32 differs from input dtype f32"},
      {[&](DoneFn d) { c.AllReduce(f4, f3, ReduceOp::kSum, d); }, "output shape (3,) differs from input shape (4,)"},
      {[&](DoneFn d) { c.AllReduce(Tensor(), f4, ReduceOp::kSum, d); }, "AllReduce in shm group 'args' rank 0/2: input is undefined"},
      {[&](DoneFn d) { c.AllReduce(Make(DType::kBool, 2), Make(DType::kBool, 2), ReduceOp::kMax, d); },
       "input dtype bool cannot be reduced"},
      {[&](DoneFn d) { c.AllReduce(low, high, ReduceOp::kSum, d); }, "output partially overlaps input"},
      {[&](DoneFn d) { c.AllGather(f4, f8, {4, 4, 0}, d); }, "AllGather in shm group 'args' rank 0/2: counts has 3 entries for a group of 2"},
      {[&](DoneFn d) { c.AllGather(f4, f8, {4, -1}, d); }, "counts[1] = -1 is negative"},
      {[&](DoneFn d) { c.AllGather(f3, f8, {4, 4}, d); }, "input has 3 elements but counts[0] = 4"},
      {[&](DoneFn d) { c.AllGather(f4, f8, {4, 3}, d); }, "output has 8 elements but counts sum to 7"},
      {[&](DoneFn d) { c.AllGather(low, high, {4, 0}, d); }, "AllGather in shm group 'args' rank 0/2: output overlaps input"},
      {[&](DoneFn d) { c.ReduceScatter(f8, f3, {4, 4}, ReduceOp::kSum, d); },
       "ReduceScatter in shm group 'args' rank 0/2: output has 3 elements but counts[0] = 4"},
      {[&](DoneFn d) { c.ReduceScatter(f8, f4, {4, 5}, ReduceOp::kSum, d); }, "input has 8 elements but counts sum to 9"},
      {[&](DoneFn d) { c.AllToAll(f4, {4}, f4, {2, 2}, d); }, "AllToAll in shm group 'args' rank 0/2: send_counts has 1 entries"},
      {[&](DoneFn d) { c.AllToAll(f4, {2, 2}, f4, {2, 3}, d); }, "output has 4 elements but recv_counts sum to 5"},
      {[&](DoneFn d) { c.AllToAll(f4, {2, 2}, f4, {-2, 6}, d); }, "recv_counts[0] = -2 is negative"},
      {[&](DoneFn d) { c.Broadcast(f4, 2, d); }, "Broadcast in shm group 'args' rank 0/2: root 2 is outside [0, 2)"},
      {[&](DoneFn d) { c.Broadcast(f4, -1, d); }, "root -1 is outside [0, 2)"},
      {[&](DoneFn d) { c.Broadcast(Tensor(), 0, d); }, "buffer is undefined"},
      {[&](DoneFn d) { c.Send(f4, 5, d); }, "Send in shm group 'args' rank 0/2: peer 5 is outside [0, 2)"},
      {[&](DoneFn d) { c.Recv(f4, -1, d); }, "Recv in shm group 'args' rank 0/2: peer -1 is outside [0, 2)"},
      {[&](DoneFn d) { c.Send(Tensor(), 1, d); }, "Send in shm group 'args' rank 0/2: input is undefined"},
  };
  for (const Case& k : cases) {
    Completion done;
    k.call(done.Fn());
    ASSERT_EQ(done.calls(), 1) << k.expected << ": argument errors are reported inline";
    const absl::Status s = done.Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(k.expected));
  }
}

TEST(ShmCommunicatorTest, AbortFailsPendingAndFutureOpsPromptly) {
  ShmHub hub;
  auto comms = JoinAll(hub, "abort", 3);
  Completion pending_reduce, pending_recv, pending_send;
  // Rank 2 never issues the all-reduce nor the send ranks 0 and 1 wait for.
  comms[0]->AllReduce(Make(DType::kF32, 8), Make(DType::kF32, 8), ReduceOp::kSum, pending_reduce.Fn());
  comms[1]->AllReduce(Make(DType::kF32, 8), Make(DType::kF32, 8), ReduceOp::kSum, Completion().Fn());
  comms[1]->Recv(Make(DType::kF32, 8), 2, pending_recv.Fn());
  comms[0]->Send(Make(DType::kF32, 8), 2, pending_send.Fn());
  const absl::Status reason = absl::AbortedError("job 7 aborted: worker 3 lost");
  absl::Status waited;
  std::chrono::steady_clock::duration waited_for{};
  std::thread waiter([&] {
    const auto start = std::chrono::steady_clock::now();
    waited = pending_reduce.Wait();
    waited_for = std::chrono::steady_clock::now() - start;
  });
  comms[2]->Abort(reason);
  waiter.join();
  EXPECT_EQ(waited, reason);
  EXPECT_LT(waited_for, std::chrono::seconds(5));
  EXPECT_EQ(pending_recv.Wait(), reason);
  EXPECT_EQ(pending_send.Wait(), reason);

  // Future ops fail at once with the first reason, on every rank.
  comms[1]->Abort(absl::CancelledError("a later reason"));
  Completion later_reduce, later_send;
  comms[2]->AllReduce(Make(DType::kF32, 8), Make(DType::kF32, 8), ReduceOp::kSum, later_reduce.Fn());
  comms[1]->Send(Make(DType::kF32, 1), 0, later_send.Fn());
  ASSERT_EQ(later_reduce.calls(), 1);
  ASSERT_EQ(later_send.calls(), 1);
  EXPECT_EQ(later_reduce.Wait(), reason);
  EXPECT_EQ(later_send.Wait(), reason);
  EXPECT_EQ(pending_reduce.calls(), 1);
}

TEST(ShmCommunicatorTest, DepartedRankFailsWhatWaitsForItButFinishesWhatItIssued) {
  ShmHub hub;
  auto comms = JoinAll(hub, "leave", 2);
  // Rank 1 issues a collective and a send, then goes away.
  Tensor mine = Tensor::FromVector(Shape{2}, std::vector<float>{1, 2});
  Tensor theirs = Tensor::FromVector(Shape{2}, std::vector<float>{10, 20});
  Completion theirs_reduce, theirs_send;
  comms[1]->AllReduce(theirs, theirs, ReduceOp::kSum, theirs_reduce.Fn());
  comms[1]->Send(Tensor::FromVector(Shape{1}, std::vector<int32_t>{42}), 0, theirs_send.Fn());
  comms[1].reset();
  // What it issued still completes.
  Completion reduce, recv;
  Tensor got = Make(DType::kI32, 1);
  comms[0]->AllReduce(mine, mine, ReduceOp::kSum, reduce.Fn());
  comms[0]->Recv(got, 1, recv.Fn());
  EXPECT_TRUE(reduce.Wait().ok());
  EXPECT_TRUE(theirs_reduce.Wait().ok());
  EXPECT_TRUE(recv.Wait().ok());
  EXPECT_TRUE(theirs_send.Wait().ok());
  EXPECT_EQ(mine.ToVector<float>(), (std::vector<float>{11, 22}));
  EXPECT_EQ(got.data<int32_t>()[0], 42);
  // What needs it from now on fails at once.
  Completion next, next_recv;
  comms[0]->AllReduce(mine, mine, ReduceOp::kSum, next.Fn());
  comms[0]->Recv(got, 1, next_recv.Fn());
  ASSERT_EQ(next.calls(), 1);
  ASSERT_EQ(next_recv.calls(), 1);
  EXPECT_EQ(next.Wait().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(next.Wait().message()),
              HasSubstr("AllReduce #1 in shm group 'leave': rank 1 left the group (its communicator was destroyed) after 1 collectives"));
  EXPECT_THAT(std::string(next_recv.Wait().message()), HasSubstr("rank 1 left the group"));
}

TEST(ShmCommunicatorTest, LeavingFailsOpsAlreadyWaitingForTheRank) {
  ShmHub hub;
  auto comms = JoinAll(hub, "leave-pending", 2);
  Completion reduce, recv, send;
  comms[0]->AllReduce(Make(DType::kF32, 3), Make(DType::kF32, 3), ReduceOp::kSum, reduce.Fn());
  comms[0]->Recv(Make(DType::kF32, 3), 1, recv.Fn());
  comms[0]->Send(Make(DType::kF32, 3), 1, send.Fn());
  std::thread leaver([&] { comms[1].reset(); });
  leaver.join();
  for (const Completion* c : {&reduce, &recv, &send}) {
    EXPECT_EQ(c->Wait().code(), absl::StatusCode::kFailedPrecondition) << c->Wait();
    EXPECT_THAT(std::string(c->Wait().message()), HasSubstr("rank 1 left the group"));
  }
}

}  // namespace
}  // namespace tessera::comm
