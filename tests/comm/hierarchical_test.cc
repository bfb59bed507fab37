// Hierarchical collectives: members of several "nodes" in one process, the
// leaders a real gloo group over loopback (one rank per node), against
// ShmHub's flat group of the same members on the same inputs, bit for bit.
// Layouts: two nodes of two members, interleaved ranks, and three nodes of
// 3, 1 and 2 members. Then errors: a mismatched and an invalid call fail on
// every member and later ops stay aligned; point-to-point is refused; an
// abort and a member that never issues fail the others promptly.

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective/gloo_communicator.h"
#include "comm/collective/hierarchical_communicator.h"
#include "comm/collective/kv_store.h"
#include "comm/collective/shm_communicator.h"
#include "core/text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/completion.h"
#include "tests/deadline.h"

namespace tessera::comm {
namespace {

using testing::Completion;
using ::testing::HasSubstr;

using Members = std::vector<std::shared_ptr<Communicator>>;

// Rank r's communicator of a hierarchical group with `node_of`, the leaders
// connected over gloo through an in-process KV store.
struct Hierarchy {
  InProcessKvStore store;
  Members members;
};

std::unique_ptr<Hierarchy> MakeGroup(const std::string& name, const std::vector<int>& node_of,
                                     absl::Duration timeout = absl::Seconds(20)) {
  auto h = std::make_unique<Hierarchy>();
  int nodes = 0;
  for (int n : node_of) nodes = std::max(nodes, n + 1);
  std::vector<std::shared_ptr<Communicator>> leaders(static_cast<size_t>(nodes));
  {
    tessera::testing::Deadline deadline(std::chrono::seconds(20), "connecting the leaders");
    std::vector<std::thread> threads;
    for (int n = 0; n < nodes; ++n) {
      threads.emplace_back([&, n] {
        GlooOptions options;
        options.group = name;
        options.rank = n;
        options.size = nodes;
        options.timeout = timeout;
        auto comm = ConnectGloo(h->store, options);
        TESSERA_CHECK(comm.ok(), comm.status().ToString());
        leaders[static_cast<size_t>(n)] = std::shared_ptr<Communicator>(std::move(*comm));
      });
    }
    for (std::thread& t : threads) t.join();
  }
  h->members.resize(node_of.size());
  for (int n = 0; n < nodes; ++n) {
    HierarchicalLayout layout;
    layout.node_of = node_of;
    layout.this_node = n;
    layout.timeout = timeout;
    auto local = MakeHierarchical(name, layout, leaders[static_cast<size_t>(n)]);
    TESSERA_CHECK(local.ok(), local.status().ToString());
    for (const auto& member : *local) h->members[static_cast<size_t>(member->rank())] = member;
  }
  return h;
}

Members ShmGroup(ShmHub& hub, const std::string& name, int p) {
  Members members;
  for (int r = 0; r < p; ++r) {
    auto comm = hub.Join(name, p, r);
    TESSERA_CHECK(comm.ok(), comm.status().ToString());
    members.push_back(*comm);
  }
  return members;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Tensor Input(DType dtype, int64_t n, int rank, uint64_t salt) {
  auto t = Tensor::Zeros(Shape{n}, dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = Mix(salt * 1000003u + static_cast<uint64_t>(rank) * 7919u + static_cast<uint64_t>(i));
    const float f = static_cast<float>(static_cast<double>(h >> 40) / static_cast<double>(1 << 23) - 1.0);
    switch (dtype) {
      case DType::kF32:
        t->data<float>()[i] = f;
        break;
      case DType::kBF16:
        t->data<BFloat16>()[i] = BFloat16{FloatToBFloat16(f)};
        break;
      case DType::kI64:
        t->data<int64_t>()[i] = static_cast<int64_t>(h);
        break;
      default:
        TESSERA_CHECK(false, "no inputs of ", DTypeName(dtype));
    }
  }
  return *t;
}

Tensor Zeros(DType dtype, int64_t n) {
  auto t = Tensor::Zeros(Shape{n}, dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  return *t;
}

// One op as every rank issues it: returns the tensor whose bytes are the
// result, after calling `issue` with the rank's communicator.
using Op = std::function<Tensor(int rank, Communicator& comm, DoneFn done)>;

// Runs `op` on every member at once (one thread each); the results in rank
// order, or the first error.
absl::StatusOr<std::vector<Tensor>> RunEverywhere(Members& members, const Op& op) {
  const size_t p = members.size();
  std::vector<Tensor> results(p);
  std::vector<absl::Status> statuses(p);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      Completion done;
      results[r] = op(static_cast<int>(r), *members[r], done.Fn());
      statuses[r] = done.Wait();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) RETURN_IF_ERROR(s);
  return results;
}

// "" when both groups give the same bytes on every rank.
std::string Compare(const std::string& what, Members& hierarchical, Members& flat, const Op& op) {
  auto got = RunEverywhere(hierarchical, op);
  auto want = RunEverywhere(flat, op);
  if (!got.ok()) return StrCat(what, ": ", got.status().ToString(), "\n");
  if (!want.ok()) return StrCat(what, ": reference failed: ", want.status().ToString(), "\n");
  std::string errors;
  for (size_t r = 0; r < got->size(); ++r) {
    const Tensor& a = (*got)[r];
    const Tensor& b = (*want)[r];
    if (a.NumBytes() != b.NumBytes() ||
        (a.NumBytes() > 0 && std::memcmp(a.raw_data(), b.raw_data(), a.NumBytes()) != 0)) {
      errors += StrCat(what, ": rank ", r, " differs from the flat group\n");
    }
  }
  return errors;
}

std::string OpMatrix(Members& hierarchical, Members& flat) {
  const int p = static_cast<int>(hierarchical.size());
  std::string errors;
  uint64_t salt = 0;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1003}}) {
      const std::string at = StrCat(DTypeName(dtype), " n=", n, " p=", p);
      ++salt;
      errors += Compare(StrCat("AllReduce sum ", at), hierarchical, flat, [&](int r, Communicator& c, DoneFn done) {
        Tensor out = Zeros(dtype, n);
        c.AllReduce(Input(dtype, n, r, salt), out, ReduceOp::kSum, std::move(done));
        return out;
      });
      ++salt;
      errors +=
          Compare(StrCat("AllReduce max in place ", at), hierarchical, flat, [&](int r, Communicator& c, DoneFn done) {
            Tensor x = Input(dtype, n, r, salt);
            c.AllReduce(x, x, ReduceOp::kMax, std::move(done));
            return x;
          });
      std::vector<int64_t> counts(static_cast<size_t>(p));
      for (int r = 0; r < p; ++r) counts[static_cast<size_t>(r)] = (n + r) % 4 + (r == 1 ? n : 0);
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      ++salt;
      errors += Compare(StrCat("ReduceScatter ", at), hierarchical, flat, [&](int r, Communicator& c, DoneFn done) {
        Tensor out = Zeros(dtype, counts[static_cast<size_t>(r)]);
        c.ReduceScatter(Input(dtype, total, r, salt), out, counts, ReduceOp::kSum, std::move(done));
        return out;
      });
      ++salt;
      errors += Compare(StrCat("AllGather ", at), hierarchical, flat, [&](int r, Communicator& c, DoneFn done) {
        Tensor out = Zeros(dtype, total);
        c.AllGather(Input(dtype, counts[static_cast<size_t>(r)], r, salt), out, counts, std::move(done));
        return out;
      });
      ++salt;
      errors += Compare(StrCat("AllToAll ", at), hierarchical, flat, [&](int r, Communicator& c, DoneFn done) {
        const auto count = [&](int s, int d) { return (n + 3 * s + d) % 5 + (n > 100 ? s * 11 + d : 0); };
        std::vector<int64_t> send(static_cast<size_t>(p)), recv(static_cast<size_t>(p));
        int64_t sent = 0, received = 0;
        for (int q = 0; q < p; ++q) {
          sent += send[static_cast<size_t>(q)] = count(r, q);
          received += recv[static_cast<size_t>(q)] = count(q, r);
        }
        Tensor out = Zeros(dtype, received);
        c.AllToAll(Input(dtype, sent, r, salt), send, out, recv, std::move(done));
        return out;
      });
      for (int root : {p - 1, 1}) {
        ++salt;
        errors += Compare(StrCat("Broadcast root ", root, " ", at), hierarchical, flat,
                          [&](int r, Communicator& c, DoneFn done) {
                            Tensor buffer = r == root ? Input(dtype, n, r, salt) : Zeros(dtype, n);
                            c.Broadcast(buffer, root, std::move(done));
                            return buffer;
                          });
      }
    }
  }
  return errors;
}

void MatchesFlat(const std::string& name, const std::vector<int>& node_of) {
  tessera::testing::Deadline deadline(std::chrono::seconds(120), "the op matrix");
  auto h = MakeGroup(name, node_of);
  ShmHub hub;
  Members flat = ShmGroup(hub, name, static_cast<int>(node_of.size()));
  EXPECT_EQ(OpMatrix(h->members, flat), "");
}

TEST(HierarchicalCommunicator, TwoNodesOfTwoMatchTheFlatGroup) { MatchesFlat("two_by_two", {0, 0, 1, 1}); }
TEST(HierarchicalCommunicator, InterleavedRanksMatchTheFlatGroup) { MatchesFlat("interleaved", {0, 1, 0, 1}); }
TEST(HierarchicalCommunicator, UnevenNodesMatchTheFlatGroup) { MatchesFlat("uneven", {0, 0, 2, 1, 0, 2}); }

TEST(HierarchicalCommunicator, DescribesItsPlace) {
  auto h = MakeGroup("describe", {0, 1, 0});
  EXPECT_EQ(h->members[2]->rank(), 2);
  EXPECT_EQ(h->members[2]->size(), 3);
  EXPECT_EQ(h->members[2]->Describe(), "hierarchical group 'describe' rank 2/3 (node 0 of 2, 2 members here)");
}

Tensor Floats(std::vector<float> v) { return Tensor::FromVector<float>(Shape{static_cast<int64_t>(v.size())}, v); }

TEST(HierarchicalCommunicator, MismatchedCallFailsEverywhereAndLaterOpsStayAligned) {
  tessera::testing::Deadline deadline(std::chrono::seconds(30), "the mismatched call");
  auto h = MakeGroup("mismatch", {0, 0, 1, 1});
  auto first = RunEverywhere(h->members, [](int r, Communicator& c, DoneFn done) {
    Tensor x = Zeros(DType::kF32, r == 2 ? 6 : 5);
    c.AllReduce(x, x, ReduceOp::kSum, std::move(done));
    return x;
  });
  ASSERT_FALSE(first.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(first.status())) << first.status();
  EXPECT_THAT(std::string(first.status().message()),
              HasSubstr("mismatched collective AllReduce #0 in mismatch: rank 0 called AllReduce(f32 x 5, sum) but "
                        "rank 2 called AllReduce(f32 x 6, sum)"));
  // Every member failed (RunEverywhere waits for all), and the next op works.
  auto next = RunEverywhere(h->members, [](int r, Communicator& c, DoneFn done) {
    Tensor x = Floats({static_cast<float>(r), 1});
    c.AllReduce(x, x, ReduceOp::kSum, std::move(done));
    return x;
  });
  ASSERT_TRUE(next.ok()) << next.status();
  for (const Tensor& t : *next)
    EXPECT_EQ(std::vector<float>(t.data<float>(), t.data<float>() + 2), (std::vector<float>{6, 4}));
}

TEST(HierarchicalCommunicator, InvalidCallFailsEverywhereWithItsOwnErrorOnItsRank) {
  tessera::testing::Deadline deadline(std::chrono::seconds(30), "the invalid call");
  auto h = MakeGroup("invalid", {0, 0, 1, 1});
  std::vector<absl::Status> statuses(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      Completion done;
      Tensor in = Zeros(DType::kF32, 8);
      Tensor out = Zeros(DType::kF32, 2);
      std::vector<int64_t> counts = r == 1 ? std::vector<int64_t>{2, 2, 4} : std::vector<int64_t>{2, 2, 2, 2};
      h->members[static_cast<size_t>(r)]->ReduceScatter(in, out, counts, ReduceOp::kSum, done.Fn());
      statuses[static_cast<size_t>(r)] = done.Wait();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(statuses[1].ToString(), HasSubstr("ReduceScatter in invalid: counts has 3 entries for 4 ranks"));
  for (int r : {0, 2, 3}) {
    EXPECT_TRUE(absl::IsInvalidArgument(statuses[static_cast<size_t>(r)]));
    EXPECT_THAT(statuses[static_cast<size_t>(r)].ToString(), HasSubstr("rank 1's call was invalid"));
  }
  auto next = RunEverywhere(h->members, [](int r, Communicator& c, DoneFn done) {
    Tensor out = Zeros(DType::kF32, 4);
    c.AllGather(Floats({static_cast<float>(r)}), out, {1, 1, 1, 1}, std::move(done));
    return out;
  });
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(std::vector<float>((*next)[3].data<float>(), (*next)[3].data<float>() + 4),
            (std::vector<float>{0, 1, 2, 3}));
}

TEST(HierarchicalCommunicator, PointToPointIsRefused) {
  auto h = MakeGroup("p2p", {0, 0, 1});
  Completion done;
  h->members[0]->Send(Floats({1}), 1, done.Fn());
  const absl::Status s = done.Wait();
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("point-to-point is not offered"));
}

TEST(HierarchicalCommunicator, AbortFailsWaitingAndLaterOpsPromptly) {
  auto h = MakeGroup("abort", {0, 0, 1, 1});
  tessera::testing::Deadline deadline(std::chrono::seconds(10), "the aborted op");
  Completion waiting;
  Tensor x = Zeros(DType::kF32, 16);
  h->members[0]->AllReduce(x, x, ReduceOp::kSum, waiting.Fn());
  const auto start = std::chrono::steady_clock::now();
  h->members[3]->Abort(absl::AbortedError("job 3 cancelled"));
  // Member 0's local partner never issued, so node 0's leader is not talking
  // to node 1: node 1's abort reaches node 0 at its next exchange. The
  // runtime aborts every node's communicators on a stop; so does this test.
  h->members[1]->Abort(absl::AbortedError("job 3 cancelled"));
  EXPECT_EQ(waiting.Wait(std::chrono::seconds(5)), absl::AbortedError("job 3 cancelled"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  Completion later;
  h->members[2]->AllReduce(x, x, ReduceOp::kSum, later.Fn());
  EXPECT_EQ(later.Wait(std::chrono::seconds(5)), absl::AbortedError("job 3 cancelled"));
}

TEST(HierarchicalCommunicator, MemberThatNeverIssuesTimesTheOthersOut) {
  auto h = MakeGroup("late", {0, 0, 1, 1}, absl::Milliseconds(500));
  tessera::testing::Deadline deadline(std::chrono::seconds(15), "the timed-out ops");
  Tensor x = Zeros(DType::kF32, 16);
  std::vector<Completion> done(3);
  h->members[0]->AllReduce(x, x, ReduceOp::kSum, done[0].Fn());  // member 1 never issues
  Tensor y = Zeros(DType::kF32, 16), z = Zeros(DType::kF32, 16);
  h->members[2]->AllReduce(y, y, ReduceOp::kSum, done[1].Fn());
  h->members[3]->AllReduce(z, z, ReduceOp::kSum, done[2].Fn());
  const absl::Status local = done[0].Wait(std::chrono::seconds(10));
  EXPECT_TRUE(absl::IsDeadlineExceeded(local)) << local;
  EXPECT_THAT(std::string(local.message()), HasSubstr("did not issue its collective #0"));
  for (int i : {1, 2}) EXPECT_FALSE(done[static_cast<size_t>(i)].Wait(std::chrono::seconds(10)).ok());
}

// A leaders communicator (one rank) whose collectives complete `delay`
// late: a slow remote node.
class SlowLeaders : public Communicator {
 public:
  SlowLeaders(std::shared_ptr<Communicator> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  ~SlowLeaders() override {
    for (std::thread& t : late_) t.join();
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string Describe() const override { return "slow " + inner_->Describe(); }
  void AllReduce(const Tensor& input, Tensor output, ReduceOp op, DoneFn done) override {
    inner_->AllReduce(input, std::move(output), op, Late(std::move(done)));
  }
  void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts, DoneFn done) override {
    inner_->AllGather(input, std::move(output), std::move(counts), Late(std::move(done)));
  }
  void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts, ReduceOp op,
                     DoneFn done) override {
    inner_->ReduceScatter(input, std::move(output), std::move(counts), op, Late(std::move(done)));
  }
  void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output, std::vector<int64_t> recv_counts,
                DoneFn done) override {
    inner_->AllToAll(input, std::move(send_counts), std::move(output), std::move(recv_counts), Late(std::move(done)));
  }
  void Broadcast(Tensor buffer, int root, DoneFn done) override {
    inner_->Broadcast(std::move(buffer), root, Late(std::move(done)));
  }
  void Send(const Tensor& input, int peer, DoneFn done) override { inner_->Send(input, peer, std::move(done)); }
  void Recv(Tensor output, int peer, DoneFn done) override { inner_->Recv(std::move(output), peer, std::move(done)); }
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }

 private:
  DoneFn Late(DoneFn done) {
    return [this, done = std::move(done)](absl::Status status) {
      std::lock_guard<std::mutex> lock(mu_);
      late_.emplace_back([this, done, status] {
        std::this_thread::sleep_for(delay_);
        done(status);
      });
    };
  }
  std::shared_ptr<Communicator> inner_;
  std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::vector<std::thread> late_;
};

// The timeout counts from when the group could take a call: a member that
// issued its next call while the group still ran the previous one (slow
// leaders: each exchange 0.4 s, the collective longer than the 1 s timeout)
// does not fail the group on a partner who issues its own as soon as the
// previous one completed (it failed: "did not issue its collective #1").
TEST(HierarchicalCommunicator, TheTimeoutCountsFromWhenTheGroupIsFree) {
  ShmHub hub;
  auto inner = hub.Join("slow_leaders", 1, 0);
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto leaders = std::make_shared<SlowLeaders>(*inner, std::chrono::milliseconds(400));
  HierarchicalLayout layout;
  layout.node_of = {0, 0};
  layout.this_node = 0;
  layout.timeout = absl::Seconds(1);
  auto members = MakeHierarchical("slow", layout, leaders);
  ASSERT_TRUE(members.ok()) << members.status();
  tessera::testing::Deadline deadline(std::chrono::seconds(30), "the slow group's ops");
  const Members& m = *members;
  Tensor a1 = Input(DType::kF32, 8, 0, 1), a2 = Input(DType::kF32, 8, 0, 2);
  Tensor b1 = Input(DType::kF32, 8, 1, 1), b2 = Input(DType::kF32, 8, 1, 2);
  std::vector<float> expected;
  for (int64_t i = 0; i < 8; ++i) expected.push_back(a2.data<float>()[i] + b2.data<float>()[i]);
  Completion a_first, a_second, b_first, b_second;
  const auto start = std::chrono::steady_clock::now();
  m[0]->AllReduce(a1, a1, ReduceOp::kSum, a_first.Fn());
  m[0]->AllReduce(a2, a2, ReduceOp::kSum, a_second.Fn());
  m[1]->AllReduce(b1, b1, ReduceOp::kSum, b_first.Fn());
  ASSERT_TRUE(b_first.Wait().ok());
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  m[1]->AllReduce(b2, b2, ReduceOp::kSum, b_second.Fn());
  EXPECT_TRUE(a_first.Wait().ok());
  const absl::Status second = a_second.Wait();
  EXPECT_TRUE(second.ok()) << second << " (the first collective took " << first_s << " s)";
  EXPECT_TRUE(b_second.Wait().ok());
  if (second.ok()) {
    for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(b2.data<float>()[i], expected[static_cast<size_t>(i)]) << i;
  }
}

TEST(HierarchicalCommunicator, BadLayoutsAreRefused) {
  InProcessKvStore store;
  GlooOptions options;
  options.group = "solo";
  auto solo = ConnectGloo(store, options);
  ASSERT_TRUE(solo.ok()) << solo.status();
  std::shared_ptr<Communicator> leaders(std::move(*solo));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeHierarchical("g", {{}, 0}, leaders).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeHierarchical("g", {{0, 2}, 0}, leaders).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeHierarchical("g", {{0, -1}, 0}, leaders).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeHierarchical("g", {{0, 1}, 0}, leaders).status()));  // leaders of 1
  EXPECT_TRUE(absl::IsInvalidArgument(MakeHierarchical("g", {{0, 0}, 1}, leaders).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeHierarchical("g", {{0, 0}, 0}, nullptr).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MakeHierarchical("g", {{0, 0}, 0, absl::ZeroDuration()}, leaders).status()));
  auto ok = MakeHierarchical("g", {{0, 0}, 0, absl::InfiniteDuration()}, leaders);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 2u);
}

TEST(HierarchicalCommunicator, NeedsHierarchyOnlyWithSeveralMembersOnSomeNodeOfSeveral) {
  EXPECT_TRUE(NeedsHierarchy({5, 5, 7, 7}));
  EXPECT_TRUE(NeedsHierarchy({5, 7, 7}));
  EXPECT_FALSE(NeedsHierarchy({5, 7}));
  EXPECT_FALSE(NeedsHierarchy({3, 3}));
  EXPECT_FALSE(NeedsHierarchy({}));
}

}  // namespace
}  // namespace tessera::comm
