// The CUDA emulator's NCCL (cmake/cuda_emu/nccl.cc): ranks each driven by
// its own thread and stream on an emulated GPU, as Tessera's NCCL
// communicator drives them, in one process or in several (forked, joined
// over 127.0.0.1).
#include <arpa/inet.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_emu/internal.h"

namespace {

using std::chrono::steady_clock;

int DeviceCount() {
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  return count > 0 ? count : 1;
}

// The stream's state once it ran dry, or cudaErrorNotReady after `seconds`.
cudaError_t Finish(cudaStream_t stream, double seconds = 20) {
  const auto deadline = steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    const cudaError_t err = cudaStreamQuery(stream);
    if (err != cudaErrorNotReady || steady_clock::now() > deadline) return err;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

cudaStream_t NewStream() {
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  return stream;
}

void* DeviceBytes(const void* host, size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  if (bytes > 0) {
    EXPECT_EQ(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  return p;
}
template <class T>
T* Device(const std::vector<T>& v) {
  return static_cast<T*>(DeviceBytes(v.data(), v.size() * sizeof(T)));
}
template <class T>
std::vector<T> Host(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

std::string LastError(ncclComm_t comm) { return ncclGetLastError(comm); }

// bf16: the top half of a float, rounded to nearest even.
uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
float FromBf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
// f16 of a value it holds exactly.
uint16_t ExactHalf(double v) {
  if (v == 0) return std::signbit(v) ? 0x8000 : 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  int e = 0;
  std::frexp(std::fabs(v), &e);
  if (e - 1 < -14) return sign | static_cast<uint16_t>(std::ldexp(std::fabs(v), 24));
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) |
         static_cast<uint16_t>(std::ldexp(std::fabs(v), -(e - 1)) * 1024 - 1024);
}

// One rank as a test body sees it.
struct Rank {
  int rank;
  int nranks;
  ncclComm_t comm;
  cudaStream_t stream;
};

// Runs `body` for ranks 0 .. n-1, each on its own thread with its own
// stream on cuda:(rank % devices) and a communicator it created (blocking),
// then destroys them. Bodies free buffers with cudaFreeAsync on their
// stream: cudaFree waits for the whole device, as a GPU's does, and so for
// the ops of peers on the same device that wait for this rank.
void RunRanks(int n, const std::function<void(Rank&)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const int devices = DeviceCount();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r % devices), cudaSuccess);
      Rank rank{r, n, nullptr, NewStream()};
      ASSERT_EQ(ncclCommInitRank(&rank.comm, n, id, r), ncclSuccess) << LastError(nullptr);
      int device = -1;
      EXPECT_EQ(ncclCommCuDevice(rank.comm, &device), ncclSuccess);
      EXPECT_EQ(device, r % devices);
      body(rank);
      EXPECT_EQ(ncclCommDestroy(rank.comm), ncclSuccess);
      EXPECT_EQ(cudaStreamDestroy(rank.stream), cudaSuccess);
    });
  }
  for (std::thread& t : threads) t.join();
}

// ---------------------------------------------------------------------------
// All-reduce over ranks, types, reductions, in place or not.

enum class Type { kF32, kI64, kBf16 };

class AllReduceTest : public ::testing::TestWithParam<std::tuple<int, Type, ncclRedOp_t, bool>> {};

// Rank r's element i, exact in every type.
double Input(Type type, int r, size_t i) {
  switch (type) {
    case Type::kF32:
      return (r + 1) * 0.25 + static_cast<double>(i) * (r % 2 != 0 ? -1 : 1);
    case Type::kI64:
      return static_cast<double>((r + 1) * 1000003LL * (static_cast<int64_t>(i % 5) - 2) + r);
    case Type::kBf16:
      return i == 0 ? 1.0078125 : (r + 1) + static_cast<double>(i % 8);  // element 0: a tie when summed by 3
  }
  return 0;
}

TEST_P(AllReduceTest, MatchesTheReductionInRankOrder) {
  // Not a structured binding: lambdas capture those from C++20 / clang 16 only.
  const int n = std::get<0>(GetParam());
  const Type type = std::get<1>(GetParam());
  const ncclRedOp_t op = std::get<2>(GetParam());
  const bool in_place = std::get<3>(GetParam());
  const size_t count = 37;
  RunRanks(n, [&](Rank& me) {
    std::vector<double> expected(count);
    for (size_t i = 0; i < count; ++i) {
      double acc = Input(type, 0, i);
      for (int r = 1; r < n; ++r) {
        const double x = Input(type, r, i);
        acc = op == ncclMax ? std::max(acc, x) : acc + x;
      }
      if (op == ncclAvg) acc = type == Type::kI64 ? std::trunc(acc / n) : acc / n;
      expected[i] = acc;
    }
    void* send = nullptr;
    ncclDataType_t nccl_type = ncclFloat32;
    size_t size = 4;
    if (type == Type::kF32) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(Input(type, me.rank, i));
      send = Device(v);
    } else if (type == Type::kI64) {
      std::vector<int64_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int64_t>(Input(type, me.rank, i));
      send = Device(v), nccl_type = ncclInt64, size = 8;
    } else {
      std::vector<uint16_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = ToBf16(static_cast<float>(Input(type, me.rank, i)));
      send = Device(v), nccl_type = ncclBfloat16, size = 2;
    }
    void* recv = send;
    if (!in_place) {
      ASSERT_EQ(cudaMalloc(&recv, count * size), cudaSuccess);
    }
    ASSERT_EQ(ncclAllReduce(send, recv, count, nccl_type, op, me.comm, me.stream), ncclSuccess) << LastError(me.comm);
    ASSERT_EQ(Finish(me.stream), cudaSuccess);
    for (size_t i = 0; i < count; ++i) {
      if (type == Type::kF32) {
        EXPECT_EQ(Host<float>(recv, count)[i], static_cast<float>(expected[i])) << "element " << i;
      } else if (type == Type::kI64) {
        EXPECT_EQ(Host<int64_t>(recv, count)[i], static_cast<int64_t>(expected[i])) << "element " << i;
      } else {
        EXPECT_EQ(Host<uint16_t>(recv, count)[i], ToBf16(static_cast<float>(expected[i])))
            << "element " << i << ": " << FromBf16(Host<uint16_t>(recv, count)[i]) << " vs " << expected[i];
      }
    }
    if (!in_place) cudaFreeAsync(recv, me.stream);
    cudaFreeAsync(send, me.stream);
  });
}

INSTANTIATE_TEST_SUITE_P(RanksTypesOps, AllReduceTest,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(Type::kF32, Type::kI64, Type::kBf16),
                                            ::testing::Values(ncclSum, ncclMax, ncclAvg), ::testing::Bool()));

// Every type with every reduction: 4 ranks add 1, 2, 3, 6 to a base, so
// sums, averages and products are exact (integers wrap as NCCL's do).
TEST(NcclEmuTest, AllReduceEveryTypeAndReduction) {
  const std::vector<ncclDataType_t> types = {ncclInt8,   ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                             ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
  const std::vector<ncclRedOp_t> ops = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  const int kAdd[] = {1, 2, 3, 6};
  const size_t count = 8;
  auto encode = [](ncclDataType_t type, const std::vector<int64_t>& values) {
    std::vector<unsigned char> bytes;
    for (int64_t v : values) {
      unsigned char b[8] = {};
      size_t size = 0;
      auto put = [&](auto x) {
        std::memcpy(b, &x, sizeof(x));
        size = sizeof(x);
      };
      switch (type) {
        case ncclInt8:
        case ncclUint8:
          put(static_cast<uint8_t>(v));
          break;
        case ncclInt32:
        case ncclUint32:
          put(static_cast<uint32_t>(v));
          break;
        case ncclFloat16:
          put(ExactHalf(static_cast<double>(v)));
          break;
        case ncclBfloat16:
          put(ToBf16(static_cast<float>(v)));
          break;
        case ncclFloat32:
          put(static_cast<float>(v));
          break;
        case ncclFloat64:
          put(static_cast<double>(v));
          break;
        default:
          put(static_cast<uint64_t>(v));
          break;
      }
      bytes.insert(bytes.end(), b, b + size);
    }
    return bytes;
  };
  RunRanks(4, [&](Rank& me) {
    for (ncclDataType_t type : types) {
      const bool is_unsigned = type == ncclUint8 || type == ncclUint32 || type == ncclUint64;
      for (ncclRedOp_t op : ops) {
        std::vector<int64_t> mine(count), expected(count);
        for (size_t i = 0; i < count; ++i) {
          // No factor is 0: a product -0.0 would differ from the integers' 0.
          const int64_t kSigned[] = {-5, -4, 0, 1};
          const int64_t base = is_unsigned ? static_cast<int64_t>(i % 2) : kSigned[i % 4];
          mine[i] = base + kAdd[me.rank];
          int64_t acc = op == ncclProd ? 1 : op == ncclMax ? INT64_MIN : op == ncclMin ? INT64_MAX : 0;
          for (int a : kAdd) {
            const int64_t x = base + a;
            acc = op == ncclProd  ? acc * x
                  : op == ncclMax ? std::max(acc, x)
                  : op == ncclMin ? std::min(acc, x)
                                  : acc + x;
          }
          expected[i] = op == ncclAvg ? acc / 4 : acc;
        }
        const std::vector<unsigned char> in = encode(type, mine);
        void* buffer = DeviceBytes(in.data(), in.size());
        ASSERT_EQ(ncclAllReduce(buffer, buffer, count, type, op, me.comm, me.stream), ncclSuccess);
        ASSERT_EQ(Finish(me.stream), cudaSuccess);
        EXPECT_EQ(Host<unsigned char>(buffer, in.size()), encode(type, expected)) << "type " << type << " op " << op;
        cudaFreeAsync(buffer, me.stream);
      }
    }
  });
}

// f16 / bf16 results are rounded once, to nearest even, from the exact sum.
TEST(NcclEmuTest, HalfPrecisionSumsRoundToNearestEven) {
  RunRanks(3, [](Rank& me) {
    // 3 * (1 + 2^-10) = 3 + 3 * 2^-10 lies halfway between 3 and 3 + 2^-8
    // (f16's spacing there is 2^-9): even is 3 + 2^-8. 40000 * 3 overflows.
    std::vector<uint16_t> half = {0x3c01, 0x78e2};
    std::vector<uint16_t> bf16 = {ToBf16(1.0078125f)};  // 3 * (1 + 2^-7): a tie too
    uint16_t* h = Device(half);
    uint16_t* b = Device(bf16);
    ASSERT_EQ(ncclAllReduce(h, h, 2, ncclFloat16, ncclSum, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(b, b, 1, ncclBfloat16, ncclSum, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(Finish(me.stream), cudaSuccess);
    EXPECT_EQ(Host<uint16_t>(h, 2), (std::vector<uint16_t>{ExactHalf(3.00390625), 0x7c00}));
    EXPECT_EQ(FromBf16(Host<uint16_t>(b, 1)[0]), 3.03125f);
    cudaFreeAsync(h, me.stream);
    cudaFreeAsync(b, me.stream);
  });
}

// ---------------------------------------------------------------------------
// Broadcast and reduce, grouped or not.

TEST(NcclEmuTest, BroadcastAndReduceFromEachRoot) {
  for (int n : {2, 3, 4}) {
    RunRanks(n, [n](Rank& me) {
      for (int root = 0; root < n; ++root) {
        for (bool in_place : {true, false}) {
          std::vector<float> mine(5);
          for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(me.rank * 10 + i);
          float* send = Device(mine);
          float* recv = in_place ? send : Device(std::vector<float>(5, -1));
          ASSERT_EQ(ncclBroadcast(send, recv, 5, ncclFloat32, root, me.comm, me.stream), ncclSuccess);
          ASSERT_EQ(Finish(me.stream), cudaSuccess);
          for (size_t i = 0; i < 5; ++i) EXPECT_EQ(Host<float>(recv, 5)[i], static_cast<float>(root * 10 + i));
          if (!in_place) cudaFreeAsync(recv, me.stream);
          cudaFreeAsync(send, me.stream);

          std::vector<int32_t> values = {me.rank + 1, -me.rank, 7};
          int32_t* input = Device(values);
          // Only the root's output is written: the others pass none.
          int32_t* output = me.rank != root ? nullptr : in_place ? input : Device(std::vector<int32_t>(3, 0));
          ASSERT_EQ(ncclReduce(input, output, 3, ncclInt32, ncclSum, root, me.comm, me.stream), ncclSuccess);
          ASSERT_EQ(Finish(me.stream), cudaSuccess);
          if (me.rank == root) {
            EXPECT_EQ(Host<int32_t>(output, 3), (std::vector<int32_t>{n * (n + 1) / 2, -n * (n - 1) / 2, 7 * n}));
            if (!in_place) cudaFreeAsync(output, me.stream);
          } else {
            EXPECT_EQ(Host<int32_t>(input, 3), values);  // untouched
          }
          cudaFreeAsync(input, me.stream);
        }
      }
    });
  }
}

// Tessera's uneven all-gather: one broadcast per root, grouped; and its
// reduce-scatter: one reduce per root. Zero-element chunks included.
TEST(NcclEmuTest, GroupedBroadcastsAndReducesWithDifferentRoots) {
  const std::vector<size_t> counts = {3, 0, 5, 2};
  const size_t total = 10;
  RunRanks(4, [&](Rank& me) {
    const size_t own = counts[static_cast<size_t>(me.rank)];
    std::vector<float> input(own);
    for (size_t i = 0; i < own; ++i) input[i] = static_cast<float>(100 * me.rank + i);
    float* in = Device(input);
    float* out = Device(std::vector<float>(total, -1));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    size_t offset = 0;
    for (int root = 0; root < me.nranks; ++root) {
      float* chunk = out + offset;
      ASSERT_EQ(ncclBroadcast(root == me.rank ? in : chunk, chunk, counts[static_cast<size_t>(root)], ncclFloat32, root,
                              me.comm, me.stream),
                ncclSuccess);
      offset += counts[static_cast<size_t>(root)];
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << LastError(me.comm);
    ASSERT_EQ(Finish(me.stream), cudaSuccess);
    std::vector<float> gathered;
    for (int r = 0; r < me.nranks; ++r) {
      for (size_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) gathered.push_back(static_cast<float>(100 * r + i));
    }
    EXPECT_EQ(Host<float>(out, total), gathered);

    // Reduce-scatter: element j of everyone's input is j + rank.
    std::vector<float> chunks(total);
    for (size_t j = 0; j < total; ++j) chunks[j] = static_cast<float>(j + static_cast<size_t>(me.rank));
    float* all = Device(chunks);
    float* mine = Device(std::vector<float>(own, -1));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    offset = 0;
    for (int root = 0; root < me.nranks; ++root) {
      ASSERT_EQ(ncclReduce(all + offset, root == me.rank ? mine : nullptr, counts[static_cast<size_t>(root)],
                           ncclFloat32, ncclSum, root, me.comm, me.stream),
                ncclSuccess);
      offset += counts[static_cast<size_t>(root)];
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(Finish(me.stream), cudaSuccess);
    size_t start = 0;
    for (int r = 0; r < me.rank; ++r) start += counts[static_cast<size_t>(r)];
    std::vector<float> expected(own);
    for (size_t i = 0; i < own; ++i) expected[i] = static_cast<float>(4 * (start + i) + 6);  // + 0 + 1 + 2 + 3
    EXPECT_EQ(Host<float>(mine, own), expected);
    for (float* p : {in, out, all, mine}) cudaFreeAsync(p, me.stream);
  });
}

// ---------------------------------------------------------------------------
// Point-to-point.

// Tessera's all-to-all: grouped sends and receives with every peer (itself
// included), uneven counts, zeros among them.
TEST(NcclEmuTest, GroupedAllToAllWithUnevenCounts) {
  const int n = 3;
  auto send_count = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 4); };
  RunRanks(n, [&](Rank& me) {
    std::vector<int64_t> input;
    for (int to = 0; to < n; ++to) {
      for (size_t j = 0; j < send_count(me.rank, to); ++j) input.push_back(me.rank * 100 + to * 10 + j);
    }
    std::vector<int64_t> expected;
    for (int from = 0; from < n; ++from) {
      for (size_t j = 0; j < send_count(from, me.rank); ++j) expected.push_back(from * 100 + me.rank * 10 + j);
    }
    int64_t* in = Device(input);
    int64_t* out = Device(std::vector<int64_t>(expected.size(), -1));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    size_t sent = 0, received = 0;
    for (int peer = 0; peer < n; ++peer) {
      ASSERT_EQ(ncclSend(in + sent, send_count(me.rank, peer), ncclInt64, peer, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(ncclRecv(out + received, send_count(peer, me.rank), ncclInt64, peer, me.comm, me.stream), ncclSuccess);
      sent += send_count(me.rank, peer);
      received += send_count(peer, me.rank);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << LastError(me.comm);
    ASSERT_EQ(Finish(me.stream), cudaSuccess);
    EXPECT_EQ(Host<int64_t>(out, expected.size()), expected);
    cudaFreeAsync(in, me.stream);
    cudaFreeAsync(out, me.stream);
  });
}

// Ungrouped: the k-th send pairs with the k-th receive.
TEST(NcclEmuTest, SendsPairWithReceivesInOrder) {
  RunRanks(2, [](Rank& me) {
    if (me.rank == 0) {
      int32_t* a = Device(std::vector<int32_t>{1, 2, 3});
      int32_t* b = Device(std::vector<int32_t>{4, 5});
      ASSERT_EQ(ncclSend(a, 3, ncclInt32, 1, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(ncclSend(b, 2, ncclInt32, 1, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(Finish(me.stream), cudaSuccess);
      cudaFreeAsync(a, me.stream);
      cudaFreeAsync(b, me.stream);
    } else {
      int32_t* a = Device(std::vector<int32_t>(3, 0));
      int32_t* b = Device(std::vector<int32_t>(2, 0));
      ASSERT_EQ(ncclRecv(a, 3, ncclInt32, 0, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(ncclRecv(b, 2, ncclInt32, 0, me.comm, me.stream), ncclSuccess);
      ASSERT_EQ(Finish(me.stream), cudaSuccess);
      EXPECT_EQ(Host<int32_t>(a, 3), (std::vector<int32_t>{1, 2, 3}));
      EXPECT_EQ(Host<int32_t>(b, 2), (std::vector<int32_t>{4, 5}));
      cudaFreeAsync(a, me.stream);
      cudaFreeAsync(b, me.stream);
    }
  });
}

// NCCL's single-thread pattern: one thread creates every rank in a group and
// drives them all in groups.
TEST(NcclEmuTest, OneThreadDrivesEveryRankInGroups) {
  const int n = 3;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(n);
  std::vector<cudaStream_t> streams(n);
  std::vector<float*> buffers(n);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(cudaSetDevice(r % DeviceCount()), cudaSuccess);
    ASSERT_EQ(ncclCommInitRank(&comms[r], n, id, r), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(cudaSetDevice(r % DeviceCount()), cudaSuccess);
    streams[r] = NewStream();
    buffers[r] = Device(std::vector<float>{1.0f * r, 2.0f});
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclAllReduce(buffers[r], buffers[r], 2, ncclFloat32, ncclSum, comms[r], streams[r]), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(Finish(streams[r]), cudaSuccess);
    EXPECT_EQ(Host<float>(buffers[r], 2), (std::vector<float>{3.0f, 6.0f}));
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
    cudaFree(buffers[r]);
    cudaStreamDestroy(streams[r]);
  }
}

// ---------------------------------------------------------------------------
// Creation.

TEST(NcclEmuTest, NonBlockingInitIsInProgressUntilEveryRankJoined) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::vector<ncclComm_t> comms(3);
  for (int r = 0; r < 2; ++r) {
    const ncclResult_t got = ncclCommInitRankConfig(&comms[r], 3, id, r, &config);
    EXPECT_EQ(got, ncclInProgress);
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(comms[r], &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress);
  }
  // A collective on a communicator still forming is refused.
  float x = 0;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[0], nullptr), ncclInvalidUsage);
  EXPECT_NE(LastError(comms[0]).find("initialising"), std::string::npos) << LastError(comms[0]);
  // The last rank joins from another thread; the others poll, as Tessera does.
  std::thread last([&] { EXPECT_EQ(ncclCommInitRankConfig(&comms[2], 3, id, 2, &config), ncclSuccess); });
  const auto deadline = steady_clock::now() + std::chrono::seconds(10);
  for (int r = 0; r < 2; ++r) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && steady_clock::now() < deadline) {
      ASSERT_EQ(ncclCommGetAsyncError(comms[r], &state), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(state, ncclSuccess);
  }
  last.join();
  for (ncclComm_t c : comms) {
    int count = 0;
    EXPECT_EQ(ncclCommCount(c, &count), ncclSuccess);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

TEST(NcclEmuTest, InitRejectsBadArguments) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInProgress);
  ncclComm_t twice = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&twice, 2, id, 0, &config), ncclInvalidUsage);
  EXPECT_EQ(twice, nullptr);
  ncclComm_t other_size = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&other_size, 3, id, 1, &config), ncclInvalidUsage);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);

  ncclUniqueId junk;
  std::memset(&junk, 7, sizeof(junk));
  EXPECT_EQ(ncclCommInitRank(&comm, 1, junk, 0), ncclInvalidArgument);
}

// A rank aborting before the group formed: the others fail instead of
// waiting, and so does a rank joining later.
TEST(NcclEmuTest, AbortWhileFormingFailsTheOtherRanks) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t a = nullptr, b = nullptr, c = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&a, 3, id, 0, &config), ncclInProgress);
  ASSERT_EQ(ncclCommInitRankConfig(&b, 3, id, 1, &config), ncclInProgress);
  ASSERT_EQ(ncclCommAbort(a), ncclSuccess);
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(b, &state), ncclSuccess);
  EXPECT_EQ(state, ncclRemoteError);
  EXPECT_EQ(ncclCommInitRank(&c, 3, id, 2), ncclRemoteError);  // blocking: would wait forever otherwise
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(ncclCommAbort(b), ncclSuccess);  // gone: a later call with b is a use after free (below)
}

// ---------------------------------------------------------------------------
// Errors.

TEST(NcclEmuTest, CallsCheckTheirArguments) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  cudaStream_t stream = NewStream();
  float* buffer = Device(std::vector<float>{1, 2});
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 2, ncclFloat32, ncclSum, nullptr, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buffer, nullptr, 2, ncclFloat32, ncclSum, comm, stream), ncclInvalidArgument);
  EXPECT_NE(LastError(comm).find("null recvbuff"), std::string::npos) << LastError(comm);
  EXPECT_EQ(ncclAllReduce(nullptr, buffer, 2, ncclFloat32, ncclSum, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 2, static_cast<ncclDataType_t>(12), ncclSum, comm, stream),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 2, ncclFloat32, static_cast<ncclRedOp_t>(9), comm, stream),
            ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(buffer, buffer, 2, ncclFloat32, 1, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclReduce(buffer, buffer, 2, ncclFloat32, ncclSum, -1, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buffer, 2, ncclFloat32, 1, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclRecv(buffer, 2, ncclFloat32, -1, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buffer, 2, ncclFloat32, 0, comm, stream), ncclInvalidUsage);  // to itself, ungrouped
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  // A group reports its first error, and none of it runs.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 2, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
  EXPECT_EQ(ncclBroadcast(buffer, nullptr, 2, ncclFloat32, 0, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  // The rejected calls kept every rank (here, the only one) in step.
  ASSERT_EQ(ncclAllReduce(buffer, buffer, 2, ncclFloat32, ncclProd, comm, stream), ncclSuccess) << LastError(comm);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(buffer, 2, ncclFloat32, 0, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(buffer, 2, ncclFloat32, 0, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(Finish(stream), cudaSuccess);
  EXPECT_EQ(Host<float>(buffer, 2), (std::vector<float>{1, 2}));
  ncclResult_t state = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidUsage), "invalid usage");
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  // A freed handle: real NCCL would read freed memory; the emulator stops the
  // process naming the call.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(ncclCommDestroy(comm), "ncclCommDestroy with a communicator this process already aborted or destroyed");
  cudaFree(buffer);
  cudaStreamDestroy(stream);
}

// TESSERA_CUDA_EMU_NCCL_ENQUEUE_POLLS=2 (ctest nccl_emu_test_enqueuing; the
// emulator reads it once per process, so other runs skip this): an op on a
// non-blocking communicator, alone or in a group, answers ncclInProgress,
// the communicator stays in progress for two polls, an op call meanwhile is
// refused, and the ops still run; a blocking communicator is not affected.
TEST(NcclEmuEnqueuing, NonBlockingOpsAnswerInProgressForThePolls) {
  const char* polls = std::getenv("TESSERA_CUDA_EMU_NCCL_ENQUEUE_POLLS");
  if (polls == nullptr || std::string(polls) != "2") GTEST_SKIP() << "runs with TESSERA_CUDA_EMU_NCCL_ENQUEUE_POLLS=2";
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t state = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  while (state == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  ASSERT_EQ(state, ncclSuccess);
  cudaStream_t stream = NewStream();
  float* x = Device(std::vector<float>{1, 2});
  float* y = Device(std::vector<float>{0, 0});
  ASSERT_EQ(ncclAllReduce(x, y, 2, ncclFloat32, ncclSum, comm, stream), ncclInProgress);
  EXPECT_EQ(ncclAllReduce(x, y, 2, ncclFloat32, ncclSum, comm, stream), ncclInvalidUsage);
  EXPECT_NE(LastError(comm).find("an earlier call is still in progress"), std::string::npos) << LastError(comm);
  for (int poll = 0; poll < 2; ++poll) {
    ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress) << "poll " << poll;
  }
  ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  EXPECT_EQ(Finish(stream), cudaSuccess);
  EXPECT_EQ(Host<float>(y, 2), (std::vector<float>{1, 2}));
  // A group: ncclGroupEnd answers for it.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(x, 2, ncclFloat32, 0, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(y, 2, ncclFloat32, 0, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclInProgress);
  do {
    ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  } while (state == ncclInProgress);
  EXPECT_EQ(state, ncclSuccess);
  EXPECT_EQ(Finish(stream), cudaSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  // Blocking: as ever.
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(x, y, 2, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
  EXPECT_EQ(Finish(stream), cudaSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(stream);
}

// With TESSERA_CUDA_EMU_NCCL_CONCURRENT=1 (ctest nccl_emu_test_concurrent)
// an op waiting for its peers keeps the other NCCL ops of its device from
// starting, as on a GPU whose SMs it holds; another device's ops go on.
TEST(NcclEmuConcurrent, AnOpWaitingForPeersHoldsItsDevicesOtherOps) {
  const char* limit = std::getenv("TESSERA_CUDA_EMU_NCCL_CONCURRENT");
  if (limit == nullptr || std::string(limit) != "1") GTEST_SKIP() << "runs with TESSERA_CUDA_EMU_NCCL_CONCURRENT=1";
  ASSERT_GE(DeviceCount(), 2);
  // Two ranks on cuda:0 and cuda:1, and a one-rank communicator on cuda:0.
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t pair[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    ASSERT_EQ(ncclCommInitRank(&pair[r], 2, id, r), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t alone = nullptr;
  ASSERT_EQ(ncclCommInitRank(&alone, 1, id, 0), ncclSuccess);
  cudaStream_t waiting = NewStream(), other = NewStream();
  float* x = Device(std::vector<float>{1, 2});
  float* y = Device(std::vector<float>{5});
  ASSERT_EQ(ncclAllReduce(x, x, 2, ncclFloat32, ncclSum, pair[0], waiting), ncclSuccess);  // rank 1 not yet
  // Once it runs (holding cuda:0), the one-rank op comes.
  for (int i = 0; i < 10000 && cuda_emu::RunningNcclOps(0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(cuda_emu::RunningNcclOps(0), 1);
  ASSERT_EQ(ncclAllReduce(y, y, 1, ncclFloat32, ncclSum, alone, other), ncclSuccess);
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, other), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady) << "cuda:0's second op ran beside the one holding the device";
  // Rank 1 on cuda:1 runs at once; the pair completes, then the held op.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t peer = NewStream();
  float* x1 = Device(std::vector<float>{10, 20});
  ASSERT_EQ(ncclAllReduce(x1, x1, 2, ncclFloat32, ncclSum, pair[1], peer), ncclSuccess);
  ASSERT_EQ(Finish(peer), cudaSuccess);
  EXPECT_EQ(Host<float>(x1, 2), (std::vector<float>{11, 22}));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(done), cudaSuccess);
  ASSERT_EQ(Finish(waiting), cudaSuccess);
  EXPECT_EQ(Host<float>(x, 2), (std::vector<float>{11, 22}));
  EXPECT_EQ(Host<float>(y, 1), (std::vector<float>{5}));
  cudaEventDestroy(done);
  EXPECT_EQ(ncclCommDestroy(alone), ncclSuccess);
  for (ncclComm_t c : pair) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  cudaFree(x);
  cudaFree(y);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaFree(x1);
  cudaStreamDestroy(peer);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStreamDestroy(waiting);
  cudaStreamDestroy(other);
}

// Any call with an aborted communicator's handle is a use after free.
TEST(NcclEmuDeathTest, ACallAfterAbortStopsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(comm), ncclSuccess);
  ncclResult_t state = ncclSuccess;
  EXPECT_DEATH(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError with a communicator this process already");
  EXPECT_DEATH(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, nullptr), "ncclAllReduce with a comm");
  EXPECT_DEATH(ncclGetLastError(comm), "ncclGetLastError with a comm");
  EXPECT_DEATH(ncclCommAbort(comm), "ncclCommAbort with a comm");
}

// Ranks issuing different collectives: every rank's op fails (real NCCL
// would hang) and says why.
TEST(NcclEmuTest, MismatchedCollectivesFailOnEveryRank) {
  for (int variant = 0; variant < 3; ++variant) {
    RunRanks(2, [variant](Rank& me) {
      float* buffer = Device(std::vector<float>(8, 1.0f));
      ncclResult_t issued = ncclSuccess;
      if (me.rank == 0 || variant == 2) {
        issued = ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclSum, me.comm, me.stream);
      } else if (variant == 0) {
        issued = ncclBroadcast(buffer, buffer, 4, ncclFloat32, 0, me.comm, me.stream);
      } else {
        issued = ncclAllReduce(buffer, buffer, 8, ncclFloat32, ncclSum, me.comm, me.stream);
      }
      if (variant == 2 && me.rank == 1) {
        // A send whose receive expects another count.
        issued = ncclSend(buffer, 3, ncclFloat32, 0, me.comm, me.stream);
      } else if (variant == 2) {
        issued = ncclRecv(buffer, 2, ncclFloat32, 1, me.comm, me.stream);
      }
      ASSERT_EQ(issued, ncclSuccess) << LastError(me.comm);
      EXPECT_EQ(Finish(me.stream, 5), cudaErrorLaunchFailure);
      ncclResult_t state = ncclSuccess;
      ASSERT_EQ(ncclCommGetAsyncError(me.comm, &state), ncclSuccess);
      EXPECT_EQ(state, ncclInvalidUsage);
      EXPECT_NE(LastError(me.comm).find("does not match"), std::string::npos) << LastError(me.comm);
      // Later calls are refused with the communicator's error.
      EXPECT_EQ(ncclAllReduce(buffer, buffer, 1, ncclFloat32, ncclSum, me.comm, me.stream), ncclInvalidUsage);
      cudaFreeAsync(buffer, me.stream);
    });
  }
}

// A call that fails its checks on one rank fails the matching op of the
// others instead of leaving them waiting.
TEST(NcclEmuTest, ACallRejectedOnOneRankFailsItsPeers) {
  RunRanks(2, [](Rank& me) {
    float* buffer = Device(std::vector<float>(4, 1.0f));
    if (me.rank == 0) {
      EXPECT_EQ(ncclAllReduce(buffer, nullptr, 4, ncclFloat32, ncclSum, me.comm, me.stream), ncclInvalidArgument);
    } else {
      ASSERT_EQ(ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
      EXPECT_EQ(Finish(me.stream, 5), cudaErrorLaunchFailure);
      EXPECT_NE(LastError(me.comm).find("null recvbuff"), std::string::npos) << LastError(me.comm);
    }
    const auto deadline = steady_clock::now() + std::chrono::seconds(5);
    ncclResult_t state = ncclSuccess;
    while (state == ncclSuccess && steady_clock::now() < deadline) {
      ASSERT_EQ(ncclCommGetAsyncError(me.comm, &state), ncclSuccess);
    }
    EXPECT_EQ(state, ncclInvalidUsage);
    cudaFreeAsync(buffer, me.stream);
  });
}

// What Tessera relies on when a peer dies: rank 1 waits in an all-reduce,
// rank 0 aborts; rank 1's stream ends at once and its communicator reports
// the error, so its watchdog can abort it too.
TEST(NcclEmuTest, AbortEndsThePeersWaitingOps) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const int n = 3;
  std::vector<ncclComm_t> comms(n);
  std::vector<std::thread> init;
  for (int r = 0; r < n; ++r) {
    init.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r % DeviceCount()), cudaSuccess);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclResult_t state = ncclCommInitRankConfig(&comms[r], n, id, r, &config);
      while (state == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(comms[r], &state), ncclSuccess);
      EXPECT_EQ(state, ncclSuccess);
    });
  }
  for (std::thread& t : init) t.join();
  // Ranks 0 and 1 enter an all-reduce that rank 2 never joins.
  std::vector<cudaStream_t> streams(n);
  std::vector<float*> buffers(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r % DeviceCount()), cudaSuccess);
      streams[r] = NewStream();
      buffers[r] = Device(std::vector<float>(16, 1.0f));
      ASSERT_EQ(ncclAllReduce(buffers[r], buffers[r], 16, ncclFloat32, ncclSum, comms[r], streams[r]), ncclSuccess);
    });
  }
  for (std::thread& t : ranks) t.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaStreamQuery(streams[1]), cudaErrorNotReady);
  ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  const auto start = steady_clock::now();
  EXPECT_EQ(Finish(streams[1], 1.0), cudaErrorLaunchFailure);
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(Finish(streams[0], 1.0), cudaSuccess);  // the aborting rank's op just ends
  for (int r = 1; r < n; ++r) {
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(comms[r], &state), ncclSuccess);
    EXPECT_EQ(state, ncclRemoteError);
    EXPECT_NE(LastError(comms[r]).find("rank 0/3 aborted"), std::string::npos) << LastError(comms[r]);
  }
  float x = 0;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[2], nullptr), ncclRemoteError);
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms[2]), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    cudaFree(buffers[r]);
    cudaStreamDestroy(streams[r]);
  }
}

// A rank whose stream skips its op (an earlier error there) fails its peers
// instead of leaving them waiting.
TEST(NcclEmuTest, AnOpItsStreamSkipsFailsThePeers) {
  std::atomic<int> issued{0};
  RunRanks(2, [&](Rank& me) {
    float* buffer = Device(std::vector<float>(4, 1.0f));
    if (me.rank == 1) {
      // Fails once both ranks issued their all-reduce (else the failure
      // could refuse rank 0's call instead).
      ASSERT_EQ(cuda_emu::Enqueue(me.stream,
                                  [&issued] {
                                    while (issued.load() < 2) std::this_thread::yield();
                                    return cudaErrorIllegalAddress;
                                  }),
                cudaSuccess);
    }
    ASSERT_EQ(ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
    ++issued;
    EXPECT_EQ(Finish(me.stream, 5), me.rank == 1 ? cudaErrorIllegalAddress : cudaErrorLaunchFailure);
    const auto deadline = steady_clock::now() + std::chrono::seconds(5);
    ncclResult_t state = ncclSuccess;
    while (state == ncclSuccess && steady_clock::now() < deadline) {
      ASSERT_EQ(ncclCommGetAsyncError(me.comm, &state), ncclSuccess);
    }
    EXPECT_EQ(state, me.rank == 1 ? ncclUnhandledCudaError : ncclRemoteError);
    EXPECT_NE(LastError(me.comm).find("never ran"), std::string::npos) << LastError(me.comm);
    cudaFreeAsync(buffer, me.stream);
  });
}

// ---------------------------------------------------------------------------
// Ranks in different processes: the test forks them (127.0.0.1 only). A
// child runs its part on a thread of its own (the parent's threads, its
// streams' among them, do not exist in the child), checks with REQUIRE
// (never gtest) and exits with 0 when everything held; the parent reaps it
// within a deadline.

// A check that works in a forked child too: prints what failed and makes
// the enclosing function return 1.
#define REQUIRE(cond)                                                                                              \
  do {                                                                                                             \
    if (!(cond)) {                                                                                                 \
      std::fprintf(stderr, "[pid %d] %s:%d: failed: %s\n", static_cast<int>(getpid()), __FILE__, __LINE__, #cond); \
      return 1;                                                                                                    \
    }                                                                                                              \
  } while (0)

// A forked child running `body` on a thread of its own (the parent's
// threads do not exist in it), exiting with body's result; SIGALRM ends it
// after `seconds`. Killed and reaped if the test leaves before reaping it.
class Child {
 public:
  explicit Child(const std::function<int()>& body, unsigned seconds = 60) {
    std::fflush(nullptr);
    pid_ = fork();
    if (pid_ != 0) return;
    alarm(seconds);
    int code = 100;
    std::thread([&] { code = body(); }).join();
    _exit(code);
  }
  ~Child() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  pid_t pid() const { return pid_; }
  void Kill() const { kill(pid_, SIGKILL); }
  // Its exit status (128 + the signal that ended it), or -1 when it did not
  // end within `seconds` (it is killed then).
  int Reap(double seconds = 60) {
    if (pid_ <= 0) return -2;  // no fork, or reaped already
    const auto deadline = steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (true) {
      const pid_t got = waitpid(pid_, &status, WNOHANG);
      if (got == pid_) break;
      if (got < 0) return -2;
      if (steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
};

// A pipe between a test and its children, made before the fork.
class Pipe {
 public:
  Pipe() {
    if (pipe(fds_) != 0) fds_[0] = fds_[1] = -1;
  }
  ~Pipe() {
    close(fds_[0]);
    close(fds_[1]);
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  bool Put(const void* data, size_t n) const { return write(fds_[1], data, n) == static_cast<ssize_t>(n); }
  bool Signal() const { return Put("!", 1); }
  // n bytes within `seconds`.
  bool Get(void* data, size_t n, double seconds = 30) const {
    char* p = static_cast<char*>(data);
    const auto deadline = steady_clock::now() + std::chrono::duration<double>(seconds);
    while (n > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_clock::now()).count();
      if (left <= 0) return false;
      pollfd pfd{fds_[0], POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
      const ssize_t got = read(fds_[0], p, n);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  bool Wait(double seconds = 30) const {
    char c = 0;
    return Get(&c, 1, seconds);
  }
  int write_fd() const { return fds_[1]; }
  int read_fd() const { return fds_[0]; }

 private:
  int fds_[2];
};

// The unique id's documented layout (nccl.cc): the maker's pid (int64 at
// byte 32) and its hub's port (uint16 at byte 56).
int64_t IdPid(const ncclUniqueId& id) {
  int64_t pid = 0;
  std::memcpy(&pid, id.internal + 32, sizeof(pid));
  return pid;
}
uint16_t IdPort(const ncclUniqueId& id) {
  uint16_t port = 0;
  std::memcpy(&port, id.internal + 56, sizeof(port));
  return port;
}

int Devices() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? count : 1;
}

// Polls a communicator until its state is no longer `from` (or `seconds`
// passed): ncclInProgress for an init, ncclSuccess for an error to come.
ncclResult_t PollState(ncclComm_t comm, ncclResult_t from, double seconds = 20) {
  const auto deadline = steady_clock::now() + std::chrono::duration<double>(seconds);
  ncclResult_t state = from;
  while (state == from && steady_clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state == from) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

bool Has(ncclComm_t comm, const char* what) {
  const std::string message = ncclGetLastError(comm);
  if (message.find(what) != std::string::npos) return true;
  std::fprintf(stderr, "[pid %d] no '%s' in: %s\n", static_cast<int>(getpid()), what, message.c_str());
  return false;
}

// Joins rank `rank` of `id` on cuda:(rank % devices) with a stream of its
// own: non-blocking and polled, as Tessera does, or blocking. comm is null
// when that failed.
Rank Join(const ncclUniqueId& id, int rank, int nranks, bool blocking = false) {
  cudaSetDevice(rank % Devices());
  Rank me{rank, nranks, nullptr, nullptr};
  cudaStreamCreateWithFlags(&me.stream, cudaStreamNonBlocking);
  ncclResult_t r = ncclSuccess;
  if (blocking) {
    r = ncclCommInitRank(&me.comm, nranks, id, rank);
  } else {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    r = ncclCommInitRankConfig(&me.comm, nranks, id, rank, &config);
    if (r == ncclInProgress) r = PollState(me.comm, ncclInProgress);
  }
  if (r != ncclSuccess) {
    std::fprintf(stderr, "[pid %d] rank %d/%d: %s (%s)\n", static_cast<int>(getpid()), rank, nranks,
                 ncclGetErrorString(r), ncclGetLastError(me.comm));
    if (me.comm != nullptr) ncclCommAbort(me.comm);
    me.comm = nullptr;
  }
  return me;
}

// Ends a rank: destroys (or aborts) its communicator and its stream.
int Leave(Rank& me, bool abort = false) {
  const ncclResult_t r = abort ? ncclCommAbort(me.comm) : ncclCommDestroy(me.comm);
  cudaStreamDestroy(me.stream);
  REQUIRE(r == ncclSuccess);
  return 0;
}

// Rank r's inputs: float sums of them round, int32 sums wrap.
float FloatInput(int r, size_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * (1 + r) / 3.0);
}
int32_t Int32Input(int r, size_t i) { return INT32_MAX - static_cast<int32_t>(i) * 1000 - r; }
int64_t Int64Input(int r, size_t i) { return static_cast<int64_t>((r * 7919 + i * 31) % 101) - 50; }

// The ops Tessera runs, on host buffers (the emulated GPUs' memory is the
// host's), by every rank of a clique wherever it lives; results bit-exact
// against the model (and `model`'s float sums, when given).
int Exchange(const Rank& me, const std::vector<float>* model = nullptr) {
  const int n = me.nranks, r = me.rank;
  {  // Float sums: the exact sum in rank order, rounded once.
    const size_t count = 1001;
    std::vector<float> in(count), out(count, -1), expected(count);
    for (size_t i = 0; i < count; ++i) {
      in[i] = FloatInput(r, i);
      double acc = FloatInput(0, i);
      for (int k = 1; k < n; ++k) acc += FloatInput(k, i);
      expected[i] = static_cast<float>(acc);
    }
    REQUIRE(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
    REQUIRE(Finish(me.stream) == cudaSuccess);
    REQUIRE(std::memcmp(out.data(), expected.data(), count * sizeof(float)) == 0);
    if (model != nullptr) {
      REQUIRE(model->size() == count && std::memcmp(out.data(), model->data(), count * sizeof(float)) == 0);
    }
  }
  {  // int32 sums wrap; in place.
    const size_t count = 33;
    std::vector<int32_t> buffer(count), expected(count);
    for (size_t i = 0; i < count; ++i) {
      buffer[i] = Int32Input(r, i);
      uint32_t acc = 0;
      for (int k = 0; k < n; ++k) acc += static_cast<uint32_t>(Int32Input(k, i));
      expected[i] = static_cast<int32_t>(acc);
    }
    REQUIRE(ncclAllReduce(buffer.data(), buffer.data(), count, ncclInt32, ncclSum, me.comm, me.stream) == ncclSuccess);
    REQUIRE(Finish(me.stream) == cudaSuccess);
    REQUIRE(buffer == expected);
  }
  {  // int64 max.
    const size_t count = 17;
    std::vector<int64_t> in(count), out(count, 0), expected(count, INT64_MIN);
    for (size_t i = 0; i < count; ++i) {
      in[i] = Int64Input(r, i);
      for (int k = 0; k < n; ++k) expected[i] = std::max(expected[i], Int64Input(k, i));
    }
    REQUIRE(ncclAllReduce(in.data(), out.data(), count, ncclInt64, ncclMax, me.comm, me.stream) == ncclSuccess);
    REQUIRE(Finish(me.stream) == cudaSuccess);
    REQUIRE(out == expected);
  }
  for (int root = 0; root < n; ++root) {  // a broadcast and a reduce from each root
    const size_t count = 13;
    std::vector<float> mine(count), out(count, -1), expected(count);
    for (size_t i = 0; i < count; ++i) mine[i] = FloatInput(r + 10, i), expected[i] = FloatInput(root + 10, i);
    REQUIRE(ncclBroadcast(root == r ? mine.data() : out.data(), out.data(), count, ncclFloat32, root, me.comm,
                          me.stream) == ncclSuccess);
    REQUIRE(Finish(me.stream) == cudaSuccess);
    REQUIRE(out == expected);

    std::vector<int32_t> values = {r + 1, -r, 7, Int32Input(r, 0)};
    std::vector<int32_t> sum(values.size(), 0), reduced(values.size(), 0);
    for (int k = 0; k < n; ++k) {
      const std::vector<int32_t> theirs = {k + 1, -k, 7, Int32Input(k, 0)};
      for (size_t i = 0; i < sum.size(); ++i) {
        sum[i] = static_cast<int32_t>(static_cast<uint32_t>(sum[i]) + static_cast<uint32_t>(theirs[i]));
      }
    }
    REQUIRE(ncclReduce(values.data(), root == r ? reduced.data() : nullptr, values.size(), ncclInt32, ncclSum, root,
                       me.comm, me.stream) == ncclSuccess);
    REQUIRE(Finish(me.stream) == cudaSuccess);
    REQUIRE(reduced == (root == r ? sum : std::vector<int32_t>(values.size(), 0)));
  }
  {  // Tessera's all-to-all: grouped sends and receives with every peer, itself included; uneven, zeros among them.
    auto send_count = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 4); };
    std::vector<int64_t> in, expected;
    for (int to = 0; to < n; ++to) {
      for (size_t j = 0; j < send_count(r, to); ++j) in.push_back(r * 100 + to * 10 + static_cast<int64_t>(j));
    }
    for (int from = 0; from < n; ++from) {
      for (size_t j = 0; j < send_count(from, r); ++j)
        expected.push_back(from * 100 + r * 10 + static_cast<int64_t>(j));
    }
    std::vector<int64_t> out(expected.size(), -1);
    // A group always ends, after a failed call too: the thread may drive
    // other tests' ranks afterwards.
    REQUIRE(ncclGroupStart() == ncclSuccess);
    bool issued = true;
    size_t sent = 0, received = 0;
    for (int peer = 0; peer < n; ++peer) {
      issued &= ncclSend(in.data() + sent, send_count(r, peer), ncclInt64, peer, me.comm, me.stream) == ncclSuccess;
      issued &=
          ncclRecv(out.data() + received, send_count(peer, r), ncclInt64, peer, me.comm, me.stream) == ncclSuccess;
      sent += send_count(r, peer);
      received += send_count(peer, r);
    }
    REQUIRE(ncclGroupEnd() == ncclSuccess && issued);
    REQUIRE(Finish(me.stream) == cudaSuccess);
    REQUIRE(out == expected);
  }
  {  // Tessera's uneven all-gather: grouped broadcasts, one chunk empty.
    auto count = [](int k) { return static_cast<size_t>(k == 1 ? 0 : k + 2); };
    std::vector<float> mine(count(r)), out, expected;
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = FloatInput(r + 20, i);
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < count(k); ++i) expected.push_back(FloatInput(k + 20, i));
    }
    out.assign(expected.size(), -1);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    bool issued = true;
    size_t offset = 0;
    for (int root = 0; root < n; ++root) {
      float* chunk = out.data() + offset;
      issued &= ncclBroadcast(root == r ? mine.data() : chunk, chunk, count(root), ncclFloat32, root, me.comm,
                              me.stream) == ncclSuccess;
      offset += count(root);
    }
    REQUIRE(ncclGroupEnd() == ncclSuccess && issued);
    REQUIRE(Finish(me.stream) == cudaSuccess);
    REQUIRE(out == expected);
  }
  ncclResult_t state = ncclInternalError;
  REQUIRE(ncclCommGetAsyncError(me.comm, &state) == ncclSuccess && state == ncclSuccess);
  return 0;
}

// Two processes, a rank each; the remote rank joins first, polling until the
// hub's own rank joins; every op's result equals the in-process model's.
TEST(NcclEmuTest, TwoProcessesOneRankEach) {
  std::vector<float> model;  // the float sums of two ranks in one process
  RunRanks(2, [&](Rank& me) {
    std::vector<float> in(1001), out(1001, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = FloatInput(me.rank, i);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
    ASSERT_EQ(Finish(me.stream), cudaSuccess);
    if (me.rank == 0) model = out;
  });
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(IdPid(id), getpid());
  EXPECT_NE(IdPort(id), 0);
  Pipe joined;
  Child child([&] {
    cudaSetDevice(1 % Devices());
    Rank me{1, 2, nullptr, nullptr};
    REQUIRE(cudaStreamCreateWithFlags(&me.stream, cudaStreamNonBlocking) == cudaSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    REQUIRE(ncclCommInitRankConfig(&me.comm, 2, id, 1, &config) == ncclInProgress);
    ncclResult_t state = ncclSuccess;
    REQUIRE(ncclCommGetAsyncError(me.comm, &state) == ncclSuccess && state == ncclInProgress);
    float x = 0;
    REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, me.comm, me.stream) == ncclInvalidUsage);
    REQUIRE(Has(me.comm, "initialising"));
    REQUIRE(joined.Signal());
    REQUIRE(PollState(me.comm, ncclInProgress) == ncclSuccess);
    int count = 0, rank = -1, device = -1;
    REQUIRE(ncclCommCount(me.comm, &count) == ncclSuccess && count == 2);
    REQUIRE(ncclCommUserRank(me.comm, &rank) == ncclSuccess && rank == 1);
    REQUIRE(ncclCommCuDevice(me.comm, &device) == ncclSuccess && device == 1 % Devices());
    REQUIRE(Exchange(me, &model) == 0);
    return Leave(me);
  });
  ASSERT_TRUE(joined.Wait());
  Rank me = Join(id, 0, 2);
  ASSERT_NE(me.comm, nullptr);
  EXPECT_EQ(Exchange(me, &model), 0);
  EXPECT_EQ(Leave(me, /*abort=*/HasFailure()), 0);
  EXPECT_EQ(child.Reap(), 0);
}

// A clique of four: ranks 0 and 2 on threads of the hub's process, ranks 1
// and 3 on threads of another (each its own connection, joined blocking).
TEST(NcclEmuTest, ACliqueMixesLocalAndRemoteRanks) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  Child child([&] {
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int r : {1, 3}) {
      threads.emplace_back([&, r] {
        Rank me = Join(id, r, 4, /*blocking=*/true);
        const bool ok = me.comm != nullptr && Exchange(me) == 0;
        if (!ok) ++failed;
        if (me.comm != nullptr && Leave(me, /*abort=*/!ok) != 0) ++failed;
      });
    }
    for (std::thread& t : threads) t.join();
    return failed.load();
  });
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      Rank me = Join(id, r, 4);
      ASSERT_NE(me.comm, nullptr);
      EXPECT_EQ(Exchange(me), 0);
      EXPECT_EQ(Leave(me, /*abort=*/HasFailure()), 0);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(child.Reap(), 0);
}

// Mismatches and failed calls across processes fail both sides, as within
// one. Variants: 0 counts differ; 1 the remote rank's call fails its checks
// (it still takes its place); 2 a call of the remote rank's group is refused
// (the group's posted calls fail); 3 the hub's rank's call fails its checks;
// 4 the remote rank's stream never runs its op (an error ahead of it, once
// the hub's rank waits). The hub's rank calls first (else the failure could
// refuse its call instead).
TEST(NcclEmuTest, FailuresAcrossProcessesFailBothSides) {
  const char* const kWhy[] = {"does not match", "null recvbuff", "its group failed", "null recvbuff", "never ran"};
  for (int variant = 0; variant < 5; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    Pipe issued;
    Child child([&] {
      Rank me = Join(id, 1, 2);
      REQUIRE(me.comm != nullptr);
      std::vector<float> buffer(8, 1.0f);
      float* b = buffer.data();
      if (variant != 4) REQUIRE(issued.Wait());
      if (variant == 0) {
        REQUIRE(ncclAllReduce(b, b, 8, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
      } else if (variant == 1) {
        REQUIRE(ncclAllReduce(b, nullptr, 4, ncclFloat32, ncclSum, me.comm, me.stream) == ncclInvalidArgument);
      } else if (variant == 2) {
        REQUIRE(ncclGroupStart() == ncclSuccess);
        REQUIRE(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
        REQUIRE(ncclSend(b, 4, ncclFloat32, 5, me.comm, me.stream) == ncclInvalidArgument);  // no such peer
        REQUIRE(ncclGroupEnd() == ncclInvalidArgument);
      } else if (variant == 3) {
        REQUIRE(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
      } else {
        REQUIRE(cuda_emu::Enqueue(me.stream, [&] {
                  issued.Wait();
                  return cudaErrorIllegalAddress;
                }) == cudaSuccess);
        REQUIRE(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
      }
      if (variant == 0 || variant >= 3) {
        REQUIRE(Finish(me.stream, 5) == (variant == 4 ? cudaErrorIllegalAddress : cudaErrorLaunchFailure));
      }
      const ncclResult_t state = PollState(me.comm, ncclSuccess, 5);
      REQUIRE(state == (variant == 4 ? ncclUnhandledCudaError : ncclInvalidUsage));
      REQUIRE(Has(me.comm, kWhy[variant]));
      REQUIRE(ncclAllReduce(b, b, 1, ncclFloat32, ncclSum, me.comm, me.stream) == state);  // refused
      REQUIRE(Finish(me.stream, 5) == (variant == 4                   ? cudaErrorIllegalAddress
                                       : variant == 0 || variant == 3 ? cudaErrorLaunchFailure
                                                                      : cudaSuccess));
      return Leave(me);
    });
    Rank me = Join(id, 0, 2);
    ASSERT_NE(me.comm, nullptr);
    std::vector<float> buffer(8, 1.0f);
    float* b = buffer.data();
    if (variant == 3) {
      EXPECT_EQ(ncclAllReduce(b, nullptr, 4, ncclFloat32, ncclSum, me.comm, me.stream), ncclInvalidArgument);
    } else {
      EXPECT_EQ(ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
    }
    EXPECT_TRUE(issued.Signal());
    if (variant != 3) {
      EXPECT_EQ(Finish(me.stream, 5), cudaErrorLaunchFailure);
    }
    EXPECT_EQ(PollState(me.comm, ncclSuccess, 5), variant == 4 ? ncclRemoteError : ncclInvalidUsage);
    EXPECT_TRUE(Has(me.comm, kWhy[variant]));
    EXPECT_EQ(Leave(me, /*abort=*/HasFailure()), 0);
    EXPECT_EQ(child.Reap(), 0);
  }
}

// An abort in one process ends the waiting ops of the other's rank at once,
// which reports ncclRemoteError: the remote rank aborts (0), or the hub's
// (1).
TEST(NcclEmuTest, AnAbortInOneProcessEndsThePeersOps) {
  for (int remote_aborts : {1, 0}) {
    SCOPED_TRACE(remote_aborts ? "the remote rank aborts" : "the hub's rank aborts");
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    Pipe issued;
    Child child([&] {
      Rank me = Join(id, 1, 2);
      REQUIRE(me.comm != nullptr);
      std::vector<float> buffer(16, 1.0f);
      if (remote_aborts) {
        REQUIRE(issued.Wait());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return Leave(me, /*abort=*/true);
      }
      REQUIRE(ncclAllReduce(buffer.data(), buffer.data(), 16, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
      REQUIRE(issued.Signal());
      const auto start = steady_clock::now();
      REQUIRE(Finish(me.stream, 5) == cudaErrorLaunchFailure);
      REQUIRE(steady_clock::now() - start < std::chrono::seconds(2));
      REQUIRE(PollState(me.comm, ncclSuccess, 2) == ncclRemoteError);
      REQUIRE(Has(me.comm, "rank 0/2 aborted"));
      return Leave(me, /*abort=*/true);
    });
    Rank me = Join(id, 0, 2);
    ASSERT_NE(me.comm, nullptr);
    std::vector<float> buffer(16, 1.0f);
    if (remote_aborts) {
      ASSERT_EQ(ncclAllReduce(buffer.data(), buffer.data(), 16, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      EXPECT_EQ(cudaStreamQuery(me.stream), cudaErrorNotReady);
      ASSERT_TRUE(issued.Signal());
      const auto start = steady_clock::now();
      EXPECT_EQ(Finish(me.stream, 5), cudaErrorLaunchFailure);
      EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(2));
      EXPECT_EQ(PollState(me.comm, ncclSuccess, 2), ncclRemoteError);
      EXPECT_TRUE(Has(me.comm, "rank 1/2 aborted"));
      float x = 0;
      EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, me.comm, me.stream), ncclRemoteError);
    } else {
      ASSERT_TRUE(issued.Wait());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(Leave(me, /*abort=*/true), 0);
    EXPECT_EQ(child.Reap(), 0);
  }
}

// A remote rank's process killed while the hub's rank waits in an
// `me` (rank 0 or 1 of 2) all-reduces while `peer`'s process, holding the
// other rank, is SIGKILLed: by default nothing fails, the op still waits a
// second later (and, with `call_again`, a later call still takes its
// place), the state stays ncclSuccess; the abort then ends the op at once.
void ExpectAllReduceWaitsPastPeersDeath(Rank& me, Child& peer, bool call_again = false) {
  std::vector<float> buffer(16, 1.0f);
  ASSERT_EQ(ncclAllReduce(buffer.data(), buffer.data(), 16, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
  peer.Kill();
  EXPECT_EQ(peer.Reap(10), 128 + SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(cudaStreamQuery(me.stream), cudaErrorNotReady);
  ncclResult_t state = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(me.comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  float x = 0;
  if (call_again) {
    EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, me.comm, me.stream), ncclSuccess);
  }
  ASSERT_EQ(ncclCommAbort(me.comm), ncclSuccess);
  const auto start = steady_clock::now();
  EXPECT_EQ(Finish(me.stream, 2), cudaSuccess);  // the aborting rank's ops just end
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(1));
  cudaStreamDestroy(me.stream);
}

// all-reduce: by default nothing fails (as NCCL over NVLink hangs); only the
// abort ends the op.
TEST(NcclEmuTest, AKilledRemoteProcessLeavesThePeersWaiting) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  Pipe ready;
  Child child([&] {
    Rank me = Join(id, 1, 2);
    REQUIRE(me.comm != nullptr);
    REQUIRE(ready.Signal());
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));  // until killed
    return 0;
  });
  Rank me = Join(id, 0, 2);
  ASSERT_NE(me.comm, nullptr);
  ASSERT_TRUE(ready.Wait());
  ExpectAllReduceWaitsPastPeersDeath(me, child);
}

// The same with TESSERA_CUDA_EMU_NCCL_PEER_LOSS=error in the hub's process
// (a child: the variable is read once per process): the clique fails.
TEST(NcclEmuTest, WithPeerLossErrorAKilledRemoteProcessFailsTheClique) {
  Pipe id_pipe, ready, issued;
  Child hub([&] {
    setenv("TESSERA_CUDA_EMU_NCCL_PEER_LOSS", "error", 1);
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    REQUIRE(id_pipe.Put(&id, sizeof(id)));
    Rank me = Join(id, 0, 2);
    REQUIRE(me.comm != nullptr);
    std::vector<float> buffer(16, 1.0f);
    REQUIRE(ncclAllReduce(buffer.data(), buffer.data(), 16, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
    REQUIRE(issued.Signal());
    const auto start = steady_clock::now();  // the peer is killed now
    REQUIRE(PollState(me.comm, ncclSuccess, 5) == ncclRemoteError);
    REQUIRE(steady_clock::now() - start < std::chrono::seconds(2));
    REQUIRE(Has(me.comm, "rank 1/2's process"));
    REQUIRE(Has(me.comm, "went away"));
    REQUIRE(Finish(me.stream, 2) == cudaErrorLaunchFailure);
    return Leave(me, /*abort=*/true);
  });
  ncclUniqueId id;
  ASSERT_TRUE(id_pipe.Get(&id, sizeof(id)));
  Child remote([&] {
    Rank me = Join(id, 1, 2, /*blocking=*/true);
    REQUIRE(me.comm != nullptr);
    REQUIRE(ready.Signal());
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));  // until killed
    return 0;
  });
  EXPECT_TRUE(ready.Wait());
  EXPECT_TRUE(issued.Wait());
  remote.Kill();
  EXPECT_EQ(remote.Reap(10), 128 + SIGKILL);
  EXPECT_EQ(hub.Reap(30), 0);
}

// A child's life as rank 0 of 2 and the clique's hub: it makes the id,
// sends it, joins, says so, and waits to be killed.
int HubRankUntilKilled(Pipe& id_pipe, Pipe& ready) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  REQUIRE(id_pipe.Put(&id, sizeof(id)));
  Rank me = Join(id, 0, 2);
  REQUIRE(me.comm != nullptr);
  REQUIRE(ready.Signal());
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// The hub's process killed while a remote rank waits: by default it waits
// on, until its own abort ends it.
TEST(NcclEmuTest, AKilledHubProcessLeavesTheRemoteRankWaiting) {
  Pipe id_pipe, ready;
  Child hub([&] { return HubRankUntilKilled(id_pipe, ready); });
  ncclUniqueId id;
  ASSERT_TRUE(id_pipe.Get(&id, sizeof(id)));
  EXPECT_EQ(IdPid(id), hub.pid());
  Rank me = Join(id, 1, 2);
  ASSERT_NE(me.comm, nullptr);
  ASSERT_TRUE(ready.Wait());
  ExpectAllReduceWaitsPastPeersDeath(me, hub, /*call_again=*/true);
}

// The same with TESSERA_CUDA_EMU_NCCL_PEER_LOSS=error in the remote rank's
// process: its state becomes ncclRemoteError and its op fails.
TEST(NcclEmuTest, WithPeerLossErrorAKilledHubProcessFailsTheRemoteRank) {
  Pipe id_pipe, ready, issued;
  Child hub([&] { return HubRankUntilKilled(id_pipe, ready); });
  ncclUniqueId id;
  ASSERT_TRUE(id_pipe.Get(&id, sizeof(id)));
  Child remote([&] {
    setenv("TESSERA_CUDA_EMU_NCCL_PEER_LOSS", "error", 1);
    Rank me = Join(id, 1, 2);
    REQUIRE(me.comm != nullptr);
    std::vector<float> buffer(16, 1.0f);
    REQUIRE(ncclAllReduce(buffer.data(), buffer.data(), 16, ncclFloat32, ncclSum, me.comm, me.stream) == ncclSuccess);
    REQUIRE(issued.Signal());
    const auto start = steady_clock::now();  // the hub is killed now
    REQUIRE(Finish(me.stream, 5) == cudaErrorLaunchFailure);
    REQUIRE(steady_clock::now() - start < std::chrono::seconds(2));
    REQUIRE(PollState(me.comm, ncclSuccess, 1) == ncclRemoteError);
    REQUIRE(Has(me.comm, "went away"));
    float x = 0;
    REQUIRE(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, me.comm, me.stream) == ncclRemoteError);
    return Leave(me, /*abort=*/true);
  });
  EXPECT_TRUE(ready.Wait());
  EXPECT_TRUE(issued.Wait());
  hub.Kill();
  EXPECT_EQ(hub.Reap(10), 128 + SIGKILL);
  EXPECT_EQ(remote.Reap(30), 0);
}

// The wire's frame header (nccl.cc): magic "TEMU", type, payload length.
std::string Frame(uint32_t type, uint64_t length, const std::string& payload = "", uint32_t magic = 0x554d4554) {
  std::string frame(16, '\0');
  std::memcpy(frame.data(), &magic, 4);
  std::memcpy(frame.data() + 4, &type, 4);
  std::memcpy(frame.data() + 8, &length, 8);
  return frame + payload;
}
// A join's payload: the id, nranks, rank, device, pid.
std::string JoinPayload(const ncclUniqueId& id, int32_t nranks, int32_t rank) {
  std::string payload(id.internal, sizeof(id.internal));
  const int32_t device = 0;
  const int64_t pid = getpid();
  payload.append(reinterpret_cast<const char*>(&nranks), 4).append(reinterpret_cast<const char*>(&rank), 4);
  payload.append(reinterpret_cast<const char*>(&device), 4).append(reinterpret_cast<const char*>(&pid), 8);
  return payload;
}

int ConnectTo(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Whether the other end closed the connection within `seconds` (what it
// sent before is read and dropped).
bool ClosedByPeer(int fd, double seconds = 5) {
  const auto deadline = steady_clock::now() + std::chrono::duration<double>(seconds);
  char buffer[4096];
  while (steady_clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 10) <= 0) continue;
    const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
  return false;
}

// Bytes on the hub's port from anything but an emulator's rank end that
// connection, never the hub: a cross-process all-reduce works afterwards,
// with silent and half-sent connections still open.
TEST(NcclEmuTest, GarbageOnTheHubsPortEndsOnlyThatConnection) {
  ncclUniqueId id, other;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&other), ncclSuccess);
  const uint16_t port = IdPort(id);
  ASSERT_NE(port, 0);
  ASSERT_EQ(IdPort(other), port);  // one hub per process
  ncclUniqueId foreign = other;    // another process's id
  const int64_t pid = IdPid(other) + 1;
  std::memcpy(foreign.internal + 32, &pid, sizeof(pid));
  ncclUniqueId junk;
  std::memset(junk.internal, 0x5a, sizeof(junk.internal));
  std::string random(1000, '\0');
  for (size_t i = 0; i < random.size(); ++i) random[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::vector<std::pair<std::string, std::string>> garbage = {
      {"http", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"},
      {"random bytes", random},
      {"a wrong magic", Frame(1, 0, "", 0x12345678)},
      {"an absurd length", Frame(1, uint64_t{1} << 40)},
      {"a data frame's length beyond its bound", Frame(32, (uint64_t{1} << 30) + 1)},
      {"an unknown frame", Frame(999, 0)},
      {"a post before a join", Frame(2, 8, std::string(8, '\0'))},
      {"a join too short", Frame(1, 10, std::string(10, '\1'))},
      {"a join with a junk id", Frame(1, 148, JoinPayload(junk, 2, 0))},
      {"a join with another process's id", Frame(1, 148, JoinPayload(foreign, 2, 0))},
      {"a join of no such rank", Frame(1, 148, JoinPayload(other, 2, 5))},
  };
  for (const auto& [what, bytes] : garbage) {
    SCOPED_TRACE(what);
    const int fd = ConnectTo(port);
    EXPECT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
  }
  close(ConnectTo(port));  // connects and goes
  const int half = ConnectTo(port);
  const std::string head = Frame(1, 148, JoinPayload(other, 2, 0)).substr(0, 40);
  EXPECT_EQ(send(half, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  const int silent = ConnectTo(port);

  Child child([&] {
    Rank me = Join(id, 1, 2);
    REQUIRE(me.comm != nullptr);
    REQUIRE(Exchange(me) == 0);
    return Leave(me);
  });
  Rank me = Join(id, 0, 2);
  ASSERT_NE(me.comm, nullptr);
  EXPECT_EQ(Exchange(me), 0);
  EXPECT_EQ(Leave(me, /*abort=*/HasFailure()), 0);
  EXPECT_EQ(child.Reap(), 0);
  close(half);
  close(silent);
}

// An id whose process is gone: the join fails at once.
TEST(NcclEmuTest, InitFailsWhenTheIdsProcessIsGone) {
  Pipe id_pipe;
  Child child([&] {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    REQUIRE(id_pipe.Put(&id, sizeof(id)));
    return 0;
  });
  ncclUniqueId id;
  ASSERT_TRUE(id_pipe.Get(&id, sizeof(id)));
  EXPECT_EQ(IdPid(id), child.pid());
  ASSERT_EQ(child.Reap(), 0);
  ncclComm_t comm = nullptr;
  const auto start = steady_clock::now();
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 1), ncclSystemError);
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(LastError(nullptr).find("cannot reach"), std::string::npos) << LastError(nullptr);
}

// TESSERA_CUDA_EMU_NCCL_PEER_LOSS other than hang or error: the process
// aborts with one line saying what is allowed.
TEST(NcclEmuTest, ABadPeerLossSettingAbortsWithAMessage) {
  Pipe err;
  Child child([&] {
    dup2(err.write_fd(), STDERR_FILENO);
    setenv("TESSERA_CUDA_EMU_NCCL_PEER_LOSS", "sometimes", 1);
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    return 0;
  });
  EXPECT_EQ(child.Reap(), 128 + SIGABRT);
  std::string message(512, '\0');
  pollfd pfd{err.read_fd(), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 1000), 1);
  message.resize(static_cast<size_t>(std::max<ssize_t>(0, read(err.read_fd(), message.data(), message.size()))));
  EXPECT_NE(message.find("TESSERA_CUDA_EMU_NCCL_PEER_LOSS=sometimes"), std::string::npos) << message;
  EXPECT_NE(message.find("hang"), std::string::npos) << message;
  EXPECT_NE(message.find("error"), std::string::npos) << message;
}

}  // namespace
