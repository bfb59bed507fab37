// Boxing tests: every SBP conversion on 1-D placements of 2, 3 and 4 ranks and
// on 2-D ([2, 2], [2, 3], [3, 2]) and 3-D ([2, 2, 2]) hierarchies, in f32 and
// bf16 (1-D also f16, i32 and a scalar), with uneven and empty shards. Each rank runs on its own thread over
// shared-memory communicators; every output is checked against the reference
// shard of the logical tensor (for partial outputs: their sum or max over the
// partial group), and every group's members must have issued the same
// collectives. Also: plans (Describe / Collectives), spec and launch errors,
// and failures of the communicator. Every wait has a deadline.

#include "comm/collective/boxing.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/collective/shm_communicator.h"
#include "core/boxing_cost.h"
#include "tests/comm/completion.h"
#include "core/tensor_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using testing::Completion;
using testing::kDeadline;

// Forwards to a shared-memory communicator and records the collectives this
// rank issues, with what every member of a group must agree on.
class RecordingCommunicator final : public Communicator {
 public:
  explicit RecordingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string Describe() const override { return inner_->Describe(); }
  void AllReduce(const Tensor& input, Tensor output, ReduceOp op, DoneFn done) override {
    Record(StrCat("all_reduce ", DTypeName(input.dtype()), " n ", input.NumElements(), " ", ReduceOpName(op)));
    inner_->AllReduce(input, std::move(output), op, std::move(done));
  }
  void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts, DoneFn done) override {
    Record(StrCat("all_gather ", DTypeName(input.dtype()), " counts [", Join(counts, ", "), "]"));
    inner_->AllGather(input, std::move(output), std::move(counts), std::move(done));
  }
  void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts, ReduceOp op,
                     DoneFn done) override {
    Record(
        StrCat("reduce_scatter ", DTypeName(input.dtype()), " counts [", Join(counts, ", "), "] ", ReduceOpName(op)));
    inner_->ReduceScatter(input, std::move(output), std::move(counts), op, std::move(done));
  }
  void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output, std::vector<int64_t> recv_counts,
                DoneFn done) override {
    // Counts differ per rank here (send row vs receive column).
    Record(StrCat("all_to_all ", DTypeName(input.dtype())));
    inner_->AllToAll(input, std::move(send_counts), std::move(output), std::move(recv_counts), std::move(done));
  }
  void Broadcast(Tensor buffer, int root, DoneFn done) override {
    Record("broadcast");
    inner_->Broadcast(std::move(buffer), root, std::move(done));
  }
  void Send(const Tensor& input, int peer, DoneFn done) override {
    Record("send");
    inner_->Send(input, peer, std::move(done));
  }
  void Recv(Tensor output, int peer, DoneFn done) override {
    Record("recv");
    inner_->Recv(std::move(output), peer, std::move(done));
  }
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }

  // The calls recorded since the last Take.
  std::vector<std::string> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(calls_, {});
  }

 private:
  void Record(std::string call) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(std::move(call));
  }
  std::shared_ptr<Communicator> inner_;
  std::mutex mu_;
  std::vector<std::string> calls_;
};

// Built field by field: brace-initialised nests of these aggregates trip
// GCC 12's -Wmaybe-uninitialized at -O3.
TensorMeta Meta(DType dtype, Shape shape) {
  TensorMeta meta;
  meta.dtype = dtype;
  meta.shape = std::move(shape);
  return meta;
}

BoxingSpec Spec(TensorMeta logical, NdSbp from, NdSbp to, std::vector<int64_t> hierarchy) {
  BoxingSpec spec;
  spec.logical = std::move(logical);
  spec.from = std::move(from);
  spec.to = std::move(to);
  spec.hierarchy = std::move(hierarchy);
  return spec;
}

// ---- Layouts ------------------------------------------------------------------

int64_t Count(const std::vector<int64_t>& hierarchy) {
  int64_t n = 1;
  for (int64_t h : hierarchy) n *= h;
  return n;
}

std::vector<int64_t> Coordinates(const std::vector<int64_t>& hierarchy, int64_t id) {
  std::vector<int64_t> coords(hierarchy.size());
  for (size_t a = hierarchy.size(); a-- > 0;) {
    coords[a] = id % hierarchy[a];
    id /= hierarchy[a];
  }
  return coords;
}

// The communicators of every rank: per rank, one per hierarchy axis.
struct Mesh {
  explicit Mesh(std::vector<int64_t> hierarchy_in) : hierarchy(std::move(hierarchy_in)) {
    for (int64_t id = 0; id < Count(hierarchy); ++id) {
      const auto coords = Coordinates(hierarchy, id);
      comms.emplace_back();
      for (size_t a = 0; a < hierarchy.size(); ++a) {
        std::vector<int64_t> others = coords;
        others[a] = -1;  // the group: every rank that differs only on axis a
        auto comm = hub.Join(StrCat("axis", a, "/", Join(others, ",")), static_cast<int>(hierarchy[a]),
                             static_cast<int>(coords[a]));
        TESSERA_CHECK(comm.ok(), comm.status().ToString());
        comms.back().push_back(std::make_unique<RecordingCommunicator>(*std::move(comm)));
      }
    }
  }
  BoxingComms For(int64_t id) const {
    BoxingComms out;
    for (const auto& c : comms[static_cast<size_t>(id)]) out.axis.push_back(c.get());
    return out;
  }

  std::vector<int64_t> hierarchy;
  ShmHub hub;
  std::vector<std::vector<std::unique_ptr<RecordingCommunicator>>> comms;  // [rank][axis]
};

// ---- Data ---------------------------------------------------------------------

uint64_t Hash(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x =
      a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^ c * 0x94d049bb133111ebull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return x;
}

// Values are small integers: logical values in [-8, 8], partial parts (at
// most 8 of them) in [-64, 64]. They are exact in bf16 (8 significant bits:
// every integer up to 256), f16 and f32, and so is every partial sum, whatever
// the order of the reduction: outputs compare exactly in every dtype.
int64_t Small(uint64_t seed, int64_t element, int64_t salt) {
  return static_cast<int64_t>(Hash(seed, static_cast<uint64_t>(element), static_cast<uint64_t>(salt)) % 17) - 8;
}

Tensor Logical(const TensorMeta& meta, uint64_t seed) {
  auto t = Tensor::Empty(meta.shape, meta.dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  for (int64_t i = 0; i < t->NumElements(); ++i) SetElementFromDouble(*t, i, static_cast<double>(Small(seed, i, 0)));
  return *t;
}

// The partial axes of `nd`: this rank's index among the ranks that differ
// only on them (its "partial group"), and the group's size.
std::pair<int64_t, int64_t> PartialIndex(const NdSbp& nd, const std::vector<int64_t>& hierarchy,
                                         const std::vector<int64_t>& coords) {
  int64_t index = 0, size = 1;
  for (size_t a = 0; a < nd.size(); ++a) {
    if (!nd[a].is_partial()) continue;
    index = index * hierarchy[a] + coords[a];
    size *= hierarchy[a];
  }
  return {index, size};
}

bool HasPartial(const NdSbp& nd, bool max) {
  for (const Sbp& s : nd) {
    if (max ? s.is_partial_max() : s.is_partial_sum()) return true;
  }
  return false;
}

// Rank `id`'s input under spec.from. For P: part j of q is a random integer
// for j < q - 1 and the remainder for the last, so the parts sum to the
// logical value. For P(max): one random part holds the value, the others are
// smaller.
Tensor MakeInput(const BoxingSpec& spec, const Tensor& logical, int64_t id, uint64_t seed) {
  const auto coords = Coordinates(spec.hierarchy, id);
  const auto [j, q] = PartialIndex(spec.from, spec.hierarchy, coords);
  Tensor part = logical.Clone();
  for (int64_t e = 0; q > 1 && e < part.NumElements(); ++e) {
    const int64_t value = Small(seed, e, 0);
    int64_t mine = 0;
    if (HasPartial(spec.from, /*max=*/true)) {
      const int64_t holder = static_cast<int64_t>(Hash(seed, static_cast<uint64_t>(e), 999) % static_cast<uint64_t>(q));
      mine = j == holder ? value : value - 1 - (Small(seed, e, 100 + j) + 8) % 8;
    } else {
      int64_t others = 0;
      for (int64_t k = 0; k + 1 < q; ++k) others += Small(seed, e, 1 + k);
      mine = j + 1 < q ? Small(seed, e, 1 + j) : value - others;
    }
    SetElementFromDouble(part, e, static_cast<double>(mine));
  }
  auto slice = LocalSlice(spec.logical.shape, spec.from, spec.hierarchy, id);
  TESSERA_CHECK(slice.ok(), slice.status().ToString());
  auto block = ExtractBlock(part, slice->offset, slice->local);
  TESSERA_CHECK(block.ok(), block.status().ToString());
  return *block;
}

// Output buffers start as a pattern no conversion produces (0x7f7f... is
// about 3.4e38 in f32 and bf16), so unwritten elements show.
Tensor Garbage(const Shape& shape, DType dtype) {
  auto t = Tensor::Empty(shape, dtype);
  TESSERA_CHECK(t.ok(), t.status().ToString());
  if (t->NumBytes() > 0) std::memset(t->raw_data(), 0x7f, t->NumBytes());
  return *t;
}

// Whether Create must accept the spec (given valid axes and ranks): P(max)
// converts only to B, S or itself; nothing else converts to P(max); P and
// P(max) do not mix in one layout.
bool ExpectedValid(const BoxingSpec& spec) {
  for (size_t a = 0; a < spec.from.size(); ++a) {
    if (spec.to[a].is_partial_max() && !spec.from[a].is_partial_max()) return false;
    if (spec.from[a].is_partial_max() && spec.to[a].is_partial_sum()) return false;
  }
  for (const NdSbp* nd : {&spec.from, &spec.to}) {
    if (HasPartial(*nd, true) && HasPartial(*nd, false)) return false;
  }
  return true;
}

// ---- Running and checking -------------------------------------------------------

struct RankRun {
  Tensor input, output;
  absl::Status status = absl::UnknownError("not run");
  std::string description;
  std::vector<std::string> collectives;
  std::vector<int> axes;
  std::vector<std::vector<std::string>> recorded;  // per hierarchy axis
};

struct Case {
  BoxingSpec spec;
  Tensor logical;
  std::vector<RankRun> ranks;
};

// Checks every rank's output of one case against the logical tensor, and
// that the members of each axis group issued the same collectives.
void Check(const Case& c) {
  const BoxingSpec& spec = c.spec;
  const std::string name = spec.ToString();
  const int64_t n = Count(spec.hierarchy);
  for (int64_t id = 0; id < n; ++id) {
    const RankRun& run = c.ranks[static_cast<size_t>(id)];
    ASSERT_TRUE(run.status.ok()) << name << " rank " << id << ": " << run.status;
    EXPECT_EQ(run.description, c.ranks[0].description) << name;
    EXPECT_EQ(run.collectives, c.ranks[0].collectives) << name;
    EXPECT_EQ(run.axes, c.ranks[0].axes) << name;
    // What this rank sent on each axis is what the plan says.
    for (size_t a = 0; a < spec.hierarchy.size(); ++a) {
      std::vector<std::string> planned, issued;
      for (size_t k = 0; k < run.collectives.size(); ++k) {
        if (run.axes[k] == static_cast<int>(a)) planned.push_back(run.collectives[k]);
      }
      for (const std::string& call : run.recorded[a]) issued.push_back(call.substr(0, call.find(' ')));
      EXPECT_EQ(issued, planned) << name << " rank " << id << " axis " << a;
    }
  }
  // Every member of a group issued the same calls (kinds, dtypes, counts).
  for (size_t a = 0; a < spec.hierarchy.size(); ++a) {
    std::map<std::vector<int64_t>, const RankRun*> first;
    for (int64_t id = 0; id < n; ++id) {
      auto key = Coordinates(spec.hierarchy, id);
      key[a] = -1;
      const RankRun& run = c.ranks[static_cast<size_t>(id)];
      auto [it, fresh] = first.emplace(key, &run);
      if (!fresh) {
        EXPECT_EQ(run.recorded[a], it->second->recorded[a]) << name << " axis " << a << " rank " << id;
      }
    }
  }
  // Outputs: the reference block; for partial layouts, the sum (or max) over
  // each partial group, every member holding the full block shape.
  const bool max = HasPartial(spec.to, true);
  std::map<std::vector<int64_t>, std::vector<double>> reduced;
  std::map<std::vector<int64_t>, TensorSlice> slices;
  for (int64_t id = 0; id < n; ++id) {
    auto slice = LocalSlice(spec.logical.shape, spec.to, spec.hierarchy, id);
    ASSERT_TRUE(slice.ok()) << slice.status();
    const Tensor& out = c.ranks[static_cast<size_t>(id)].output;
    ASSERT_EQ(out.shape(), slice->local) << name << " rank " << id;
    auto key = Coordinates(spec.hierarchy, id);
    for (size_t a = 0; a < key.size(); ++a) {
      if (spec.to[a].is_partial()) key[a] = -1;
    }
    const std::vector<double> values = out.ToDoubleVector();
    auto [it, fresh] = reduced.emplace(key, values);
    slices.emplace(key, *slice);
    if (fresh) continue;
    for (size_t i = 0; i < values.size(); ++i) {
      it->second[i] = max ? std::max(it->second[i], values[i]) : it->second[i] + values[i];
    }
  }
  for (const auto& [key, values] : reduced) {
    const TensorSlice& slice = slices.at(key);
    auto expected = ExtractBlock(c.logical, slice.offset, slice.local);
    ASSERT_TRUE(expected.ok());
    EXPECT_EQ(values, expected->ToDoubleVector()) << name << " at [" << Join(key, ", ") << "] (-1: partial axis)";
  }
}

// Runs `specs` (all on mesh.hierarchy and valid) one after another, each rank
// on its own thread, launching a case once the previous one completed on
// that rank; then checks every case.
void RunAndCheck(Mesh& mesh, const std::vector<BoxingSpec>& specs, uint64_t seed) {
  const int64_t n = Count(mesh.hierarchy);
  std::vector<Case> cases;
  for (size_t i = 0; i < specs.size(); ++i) {
    Case c{.spec = specs[i], .logical = Logical(specs[i].logical, seed + i), .ranks = {}};
    for (int64_t id = 0; id < n; ++id) {
      RankRun run;
      run.input = MakeInput(c.spec, c.logical, id, seed + i);
      auto slice = LocalSlice(c.spec.logical.shape, c.spec.to, c.spec.hierarchy, id);
      TESSERA_CHECK(slice.ok(), slice.status().ToString());
      run.output = Garbage(slice->local, c.spec.logical.dtype);
      c.ranks.push_back(std::move(run));
    }
    cases.push_back(std::move(c));
  }
  std::vector<std::thread> threads;
  for (int64_t id = 0; id < n; ++id) {
    threads.emplace_back([&, id] {
      const BoxingComms comms = mesh.For(id);
      for (Case& c : cases) {
        RankRun& run = c.ranks[static_cast<size_t>(id)];
        auto routine = BoxingRoutine::Create(c.spec, Coordinates(mesh.hierarchy, id));
        if (!routine.ok()) {
          run.status = routine.status();
          return;
        }
        run.description = routine->Describe();
        run.collectives = routine->Collectives();
        run.axes = routine->CollectiveAxes();
        if (routine->input_shape() != run.input.shape() || routine->output_shape() != run.output.shape()) {
          run.status = absl::InternalError(StrCat("shapes ", routine->input_shape().ToString(), " -> ",
                                                  routine->output_shape().ToString(), " differ from LocalSlice's"));
          return;
        }
        // Every other case brings its scratch, exactly ScratchBytes() of
        // garbage (NaN bytes): the routine must write every scratch byte it
        // reads; the others allocate theirs per launch.
        Tensor scratch;
        if ((&c - cases.data()) % 2 == 0 && routine->ScratchBytes() > 0) {
          scratch = Garbage(Shape{(routine->ScratchBytes() + 3) / 4}, DType::kF32);
        }
        Completion done;
        routine->Launch(run.input, run.output, comms, done.Fn(), nullptr, scratch);
        run.status = done.Wait();
        for (const auto& comm : mesh.comms[static_cast<size_t>(id)]) run.recorded.push_back(comm->Take());
        if (!run.status.ok() || done.calls() != 1) return;  // the sequences no longer line up
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const Case& c : cases) Check(c);
}

std::vector<NdSbp> AllNdSbps(const std::vector<Sbp>& values, size_t axes) {
  std::vector<NdSbp> out = {{}};
  for (size_t a = 0; a < axes; ++a) {
    std::vector<NdSbp> next;
    for (const NdSbp& prefix : out) {
      for (const Sbp& v : values) {
        next.push_back(prefix);
        next.back().push_back(v);
      }
    }
    out = std::move(next);
  }
  return out;
}

// Every valid pair of `values` per axis, checking that Create rejects exactly
// the invalid ones.
std::vector<BoxingSpec> AllPairs(const TensorMeta& logical, const std::vector<int64_t>& hierarchy,
                                 const std::vector<Sbp>& values) {
  std::vector<BoxingSpec> specs;
  const auto layouts = AllNdSbps(values, hierarchy.size());
  for (const NdSbp& from : layouts) {
    for (const NdSbp& to : layouts) {
      BoxingSpec spec = Spec(logical, from, to, hierarchy);
      const bool created = BoxingRoutine::Create(spec, std::vector<int64_t>(hierarchy.size(), 0)).ok();
      EXPECT_EQ(created, ExpectedValid(spec)) << spec.ToString();
      if (created) specs.push_back(spec);
    }
  }
  return specs;
}

const Sbp kB = Sbp::Broadcast();
const Sbp kP = Sbp::PartialSum();
const Sbp kMax = Sbp::PartialMax();
const Sbp kS0 = Sbp::Split(0);
const Sbp kS1 = Sbp::Split(1);
const Sbp kS2 = Sbp::Split(2);

// ---- Conversions ------------------------------------------------------------------

TEST(BoxingTest, OneDimensionalEveryConversion) {
  for (int64_t p : {2, 3, 4}) {
    Mesh mesh({p});
    std::vector<BoxingSpec> specs;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      // (7, 5): uneven on both axes; (2, 3): empty shards for p > 2 or 3.
      for (const Shape& shape : {Shape{7, 5}, Shape{2, 3}}) {
        auto more = AllPairs(Meta(dtype, shape), {p}, {kB, kP, kMax, kS0, kS1});
        specs.insert(specs.end(), more.begin(), more.end());
      }
      auto three_d = AllPairs(Meta(dtype, Shape{3, 5, 4}), {p}, {kB, kP, kS0, kS1, kS2});
      specs.insert(specs.end(), three_d.begin(), three_d.end());
    }
    // Other dtypes the communicator reduces, and a scalar.
    for (DType dtype : {DType::kF16, DType::kI32}) {
      auto more = AllPairs(Meta(dtype, Shape{7, 5}), {p}, {kB, kP, kMax, kS0, kS1});
      specs.insert(specs.end(), more.begin(), more.end());
    }
    auto scalar = AllPairs(Meta(DType::kF32, Shape{}), {p}, {kB, kP, kMax});
    specs.insert(specs.end(), scalar.begin(), scalar.end());
    RunAndCheck(mesh, specs, 1000 * static_cast<uint64_t>(p));
  }
}

TEST(BoxingTest, TwoDimensionalEveryConversion) {
  Mesh mesh({2, 2});
  std::vector<BoxingSpec> specs;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto more = AllPairs(Meta(dtype, Shape{7, 5}), {2, 2}, {kB, kP, kS0, kS1});
    specs.insert(specs.end(), more.begin(), more.end());
  }
  RunAndCheck(mesh, specs, 20000);
}

TEST(BoxingTest, TwoDimensionalPartialMaxAndThreeDimensionalTensor) {
  Mesh mesh({2, 2});
  auto specs = AllPairs(Meta(DType::kF32, Shape{7, 5}), {2, 2}, {kB, kMax, kS0, kS1});
  auto three_d = AllPairs(Meta(DType::kBF16, Shape{3, 5, 4}), {2, 2}, {kB, kP, kS0, kS2});
  specs.insert(specs.end(), three_d.begin(), three_d.end());
  RunAndCheck(mesh, specs, 30000);
}

TEST(BoxingTest, UnevenHierarchies) {
  for (const std::vector<int64_t>& hierarchy : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{3, 2}}) {
    Mesh mesh(hierarchy);
    // (5, 4) over 6 ranks: S(0), S(0) leaves some ranks empty.
    RunAndCheck(mesh, AllPairs(Meta(DType::kF32, Shape{5, 4}), hierarchy, {kB, kP, kS0, kS1}), 40000);
  }
}

TEST(BoxingTest, ThreeAxisHierarchySample) {
  Mesh mesh({2, 2, 2});
  auto all = AllPairs(Meta(DType::kF32, Shape{7, 6, 3}), {2, 2, 2}, {kB, kP, kS0, kS1});
  // Every 9th pair of the 4096: from and to still range over every layout.
  std::vector<BoxingSpec> specs;
  for (size_t i = 0; i < all.size(); i += 9) specs.push_back(all[i]);
  RunAndCheck(mesh, specs, 50000);
}

TEST(BoxingTest, RoutinesRunBackToBackOnSharedCommunicators) {
  // A chain of conversions, each consuming the previous output, on the same
  // communicators: the last layout's value is still the logical tensor.
  Mesh mesh({2, 2});
  const std::vector<NdSbp> chain = {{kP, kS1}, {kS0, kS1}, {kS0, kS0}, {kB, kS0}, {kS1, kP}, {kB, kB}};
  const TensorMeta meta = Meta(DType::kBF16, Shape{7, 5});
  std::vector<BoxingSpec> specs;
  for (size_t i = 0; i + 1 < chain.size(); ++i) specs.push_back(Spec(meta, chain[i], chain[i + 1], {2, 2}));
  const Tensor logical = Logical(meta, 7);
  std::vector<Tensor> last(4);
  std::vector<absl::Status> statuses(4);
  std::vector<std::thread> threads;
  for (int64_t id = 0; id < 4; ++id) {
    threads.emplace_back([&, id] {
      Tensor current = MakeInput(specs[0], logical, id, 7);
      for (const BoxingSpec& spec : specs) {
        auto routine = BoxingRoutine::Create(spec, Coordinates({2, 2}, id));
        ASSERT_TRUE(routine.ok()) << routine.status();
        Tensor out = Garbage(routine->output_shape(), meta.dtype);
        Completion done;
        routine->Launch(current, out, mesh.For(id), done.Fn());
        statuses[static_cast<size_t>(id)] = done.Wait();
        if (!statuses[static_cast<size_t>(id)].ok()) return;
        current = out;
      }
      last[static_cast<size_t>(id)] = current;
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t id = 0; id < 4; ++id) {
    ASSERT_TRUE(statuses[static_cast<size_t>(id)].ok()) << statuses[static_cast<size_t>(id)];
    EXPECT_EQ(last[static_cast<size_t>(id)].ToDoubleVector(), logical.ToDoubleVector()) << "rank " << id;
  }
}

TEST(BoxingTest, StepGateHoldsLaterStepsOnTheirOwnCommunicators) {
  // (P, P) -> (B, B): an all-reduce over axis 1, then one over axis 0. The
  // second runs on a communicator of its own (BoxingComms::steps) and only
  // when the gate lets it, here from another thread 20 ms later.
  Mesh mesh({2, 2});
  Mesh second({2, 2});
  const BoxingSpec spec = Spec(Meta(DType::kF32, Shape{3, 4}), {kP, kP}, {kB, kB}, {2, 2});
  const Tensor logical = Logical(spec.logical, 11);
  std::vector<Tensor> out(4);
  std::vector<absl::Status> statuses(4);
  std::vector<std::vector<int>> gated(4);
  std::vector<std::thread> threads;
  for (int64_t id = 0; id < 4; ++id) {
    threads.emplace_back([&, id] {
      auto routine = BoxingRoutine::Create(spec, Coordinates({2, 2}, id));
      ASSERT_TRUE(routine.ok()) << routine.status();
      ASSERT_EQ(routine->CollectiveAxes(), (std::vector<int>{1, 0}));
      BoxingComms comms = mesh.For(id);
      comms.steps = {comms.axis[1], second.For(id).axis[0]};
      out[static_cast<size_t>(id)] = Garbage(routine->output_shape(), DType::kF32);
      std::thread releaser;
      Completion done;
      routine->Launch(MakeInput(spec, logical, id, 11), out[static_cast<size_t>(id)], comms, done.Fn(),
                      [&, id](int index, std::function<void()> issue) {
                        gated[static_cast<size_t>(id)].push_back(index);
                        releaser = std::thread([issue] {
                          std::this_thread::sleep_for(std::chrono::milliseconds(20));
                          issue();
                        });
                      });
      statuses[static_cast<size_t>(id)] = done.Wait();
      if (releaser.joinable()) releaser.join();
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t id = 0; id < 4; ++id) {
    ASSERT_TRUE(statuses[static_cast<size_t>(id)].ok()) << statuses[static_cast<size_t>(id)];
    EXPECT_EQ(gated[static_cast<size_t>(id)], std::vector<int>{1}) << "rank " << id;
    EXPECT_EQ(out[static_cast<size_t>(id)].ToDoubleVector(), logical.ToDoubleVector()) << "rank " << id;
    // Step 1 ran on the second mesh's axis-0 communicator, not the first's.
    EXPECT_EQ(mesh.comms[static_cast<size_t>(id)][0]->Take().size(), 0u) << "rank " << id;
    EXPECT_EQ(second.comms[static_cast<size_t>(id)][0]->Take().size(), 1u) << "rank " << id;
  }
  // A steps list that does not match the collective steps is an argument error.
  auto routine = BoxingRoutine::Create(spec, {0, 0});
  ASSERT_TRUE(routine.ok());
  BoxingComms wrong = mesh.For(0);
  wrong.steps = {wrong.axis[1]};
  Completion done;
  routine->Launch(Garbage(routine->input_shape(), DType::kF32), Garbage(routine->output_shape(), DType::kF32), wrong,
                  done.Fn());
  EXPECT_THAT(std::string(done.Wait().message()), HasSubstr("1 step communicators for 2 collective steps"));
}

// ---- Plans ----------------------------------------------------------------------------

struct PlanCase {
  NdSbp from, to;
  std::vector<int64_t> hierarchy;
  std::string description;
  std::vector<std::string> collectives;
  std::vector<int> axes;
};

// Scratch is what the steps need and no more: an all-gather into a
// non-contiguous layout receives flat (its output's bytes), one into
// contiguous rows needs none; a launch with too little is refused inline.
TEST(BoxingTest, ScratchIsSizedByTheStepsAndChecked) {
  const auto scratch_of = [](const NdSbp& from, const NdSbp& to, const std::vector<int64_t>& hierarchy) {
    auto routine = BoxingRoutine::Create(Spec(Meta(DType::kF32, Shape{8, 6}), from, to, hierarchy),
                                         std::vector<int64_t>(hierarchy.size(), 0));
    TESSERA_CHECK(routine.ok(), routine.status().ToString());
    return routine->ScratchBytes();
  };
  EXPECT_EQ(scratch_of({kS0}, {kB}, {2}), 0);            // rows: received in place
  EXPECT_EQ(scratch_of({kS1}, {kB}, {2}), 8 * 6 * 4);    // columns: received flat, then unpacked
  EXPECT_EQ(scratch_of({kP}, {kS1}, {2}), 8 * 6 * 4);    // the input packed into piece order
  EXPECT_EQ(scratch_of({kP}, {kS0}, {2}), 0);
  EXPECT_EQ(scratch_of({kP}, {kB}, {2}), 0);             // all-reduce in place
  // Two gathers: the first's output (8, 3) = 96 bytes, rounded to 128, and
  // its flat receive (128), then the second's flat receive (8 x 6).
  EXPECT_EQ(scratch_of({kS1, kS1}, {kB, kB}, {2, 2}), 128 + 128 + 8 * 6 * 4);

  Mesh mesh({2});
  const BoxingSpec spec = Spec(Meta(DType::kF32, Shape{8, 6}), {kS1}, {kB}, {2});
  auto routine = BoxingRoutine::Create(spec, {0});
  ASSERT_TRUE(routine.ok());
  Completion done;
  routine->Launch(Garbage(routine->input_shape(), DType::kF32), Garbage(routine->output_shape(), DType::kF32),
                  mesh.For(0), done.Fn(), nullptr, Garbage(Shape{4}, DType::kF32));
  const absl::Status status = done.Wait();
  EXPECT_NE(status.message().find("scratch of 16 bytes, 192 needed"), std::string_view::npos) << status;
}

TEST(BoxingTest, DescribeAndCollectivesNameThePath) {
  const TensorMeta meta = Meta(DType::kF32, Shape{6, 5});
  const std::vector<PlanCase> cases = {
      {{kP}, {kB}, {4}, "P -> B: all-reduce", {"all_reduce"}, {0}},
      {{kP}, {kS0}, {4}, "P -> S(0): reduce-scatter", {"reduce_scatter"}, {0}},
      {{kMax}, {kS1}, {4}, "P(max) -> S(1): reduce-scatter max (pack axis 1)", {"reduce_scatter"}, {0}},
      {{kMax}, {kB}, {4}, "P(max) -> B: all-reduce max", {"all_reduce"}, {0}},
      {{kS1}, {kB}, {4}, "S(1) -> B: all-gather (unpack axis 1)", {"all_gather"}, {0}},
      {{kS0}, {kS1}, {4}, "S(0) -> S(1): all-to-all (pack axis 1)", {"all_to_all"}, {0}},
      {{kS1}, {kS0}, {4}, "S(1) -> S(0): all-to-all (unpack axis 1)", {"all_to_all"}, {0}},
      {{kB}, {kS1}, {4}, "B -> S(1): local slice", {}, {}},
      {{kB}, {kP}, {4}, "B -> P: keep on rank 0, zeros elsewhere", {}, {}},
      {{kS0}, {kP}, {4}, "S(0) -> P: local, zeros outside the shard", {}, {}},
      {{kS0}, {kS0}, {4}, "S(0) -> S(0): copy", {}, {}},
      {{kS0, kP},
       {kS0, kB},
       {2, 2},
       "(S(0), P) -> (S(0), B) axis by axis: axis 1 P -> B: all-reduce",
       {"all_reduce"},
       {1}},
      {{kS1, kP},
       {kB, kB},
       {2, 2},
       "(S(1), P) -> (B, B) axis by axis: axis 1 P -> B: all-reduce; axis 0 S(1) -> B: all-gather (unpack axis 1)",
       {"all_reduce", "all_gather"},
       {1, 0}},
      // An inner S(0) makes axis 0's S(0) -> B non-local: gather the inner
      // axis first, then the outer one, then slice the inner one again.
      {{kS0, kS0},
       {kB, kS0},
       {2, 2},
       "(S(0), S(0)) -> (B, S(0)) via (S(0), B), (B, B): axis 1 S(0) -> B: all-gather; axis 0 S(0) -> B: all-gather; "
       "axis 1 B -> S(0): local slice",
       {"all_gather", "all_gather"},
       {1, 0}},
      {{kB, kS1}, {kB, kS1}, {2, 2}, "(B, S(1)) -> (B, S(1)): copy", {}, {}},
  };
  for (const PlanCase& c : cases) {
    const BoxingSpec spec = Spec(meta, c.from, c.to, c.hierarchy);
    for (int64_t id = 0; id < Count(c.hierarchy); ++id) {
      auto routine = BoxingRoutine::Create(spec, Coordinates(c.hierarchy, id));
      ASSERT_TRUE(routine.ok()) << routine.status();
      EXPECT_EQ(routine->Describe(), c.description);
      EXPECT_EQ(routine->Collectives(), c.collectives) << c.description;
      EXPECT_EQ(routine->CollectiveAxes(), c.axes) << c.description;
    }
  }
}

// ---- the cost model (core/boxing_cost.h), shared with SBP inference -------

// Each row of DESIGN §7's table, on one axis of 4 devices.
TEST(BoxingCostTest, OneAxisCostsAreTheDesignTable) {
  const TensorMeta meta = Meta(DType::kF32, Shape{16, 8});  // T = 512 bytes
  const std::vector<int64_t> p4 = {4};
  auto cost = [&](const Sbp& from, const Sbp& to) { return BoxingCost(meta, {from}, {to}, p4); };
  EXPECT_DOUBLE_EQ(cost(kS0, kS0), 0);  // same
  EXPECT_DOUBLE_EQ(cost(kP, kP), 0);
  EXPECT_DOUBLE_EQ(cost(kB, kS0), 0);                   // local slice
  EXPECT_DOUBLE_EQ(cost(kB, kP), 0);                    // kept on one rank
  EXPECT_DOUBLE_EQ(cost(kS1, kP), 0);                   // zeros outside the shard
  EXPECT_DOUBLE_EQ(cost(kS0, kB), 512.0 * 3 / 4);       // all-gather: T(p-1)/p
  EXPECT_DOUBLE_EQ(cost(kP, kS1), 512.0 * 3 / 4);       // reduce-scatter: T(p-1)/p
  EXPECT_DOUBLE_EQ(cost(kP, kB), 2 * 512.0 * 3 / 4);    // all-reduce: 2T(p-1)/p
  EXPECT_DOUBLE_EQ(cost(kS0, kS1), 512.0 * 3 / 16);     // all-to-all: T(p-1)/p^2
  EXPECT_DOUBLE_EQ(cost(kMax, kB), 2 * 512.0 * 3 / 4);  // P(max) as P
  EXPECT_DOUBLE_EQ(cost(kMax, kS0), 512.0 * 3 / 4);
  // One partial kind to the other goes through B: an all-reduce.
  EXPECT_DOUBLE_EQ(cost(kMax, kP), 2 * 512.0 * 3 / 4);
  // Across placements: T, whatever the layouts.
  EXPECT_DOUBLE_EQ(BoxingCost(meta, {kS0}, {kS0}, p4, /*same_placement=*/false), 512);
  EXPECT_DOUBLE_EQ(BoxingCost(meta, {kP}, {kB}, p4, /*same_placement=*/false), 512);
  // The element size counts; an axis of one device costs nothing.
  EXPECT_DOUBLE_EQ(BoxingCost(Meta(DType::kF16, Shape{16, 8}), {kP}, {kB}, p4), 2 * 256.0 * 3 / 4);
  EXPECT_DOUBLE_EQ(BoxingCost(meta, {kP}, {kB}, {1}), 0);
}

// nd-SBP: the sum over the steps of the route the routine runs, each on the
// block its axis group shares.
TEST(BoxingCostTest, NdSbpCostsTheStepsOfTheRouteTheRoutineRuns) {
  const TensorMeta meta = Meta(DType::kF32, Shape{16, 8});  // T = 512 bytes
  struct Case {
    NdSbp from, to;
    std::vector<int64_t> hierarchy;
    double cost;
  };
  const std::vector<Case> cases = {
      // The dp all-reduce runs on the tp shard (T/4), then tp gathers all of T.
      {{kP, kS1}, {kB, kB}, {2, 4}, 2 * 128.0 / 2 + 512.0 * 3 / 4},
      // An axis that does not change costs nothing; the other axis' split
      // divides the block.
      {{kS0, kP}, {kS0, kB}, {2, 2}, 2 * 256.0 / 2},
      // Reducing the split block first is cheaper than gathering first.
      {{kS0, kP}, {kB, kB}, {2, 2}, 2 * 256.0 / 2 + 512.0 / 2},
      // Via B: gather the inner axis (block T/2), the outer one (T), slice
      // the inner one again (free).
      {{kS0, kS0}, {kB, kS0}, {2, 2}, 256.0 / 2 + 512.0 / 2},
      {{kB, kS1}, {kB, kS1}, {2, 2}, 0},
  };
  for (const Case& c : cases) {
    const std::string what = StrCat(NdSbpToString(c.from), " -> ", NdSbpToString(c.to));
    EXPECT_DOUBLE_EQ(BoxingCost(meta, c.from, c.to, c.hierarchy), c.cost) << what;
    const std::optional<BoxingRoute> route = ChooseBoxingRoute(meta, c.from, c.to, c.hierarchy);
    ASSERT_TRUE(route.has_value()) << what;
    EXPECT_DOUBLE_EQ(route->cost, c.cost) << what;
    // The routine's collectives are the route's communicating steps.
    std::vector<int> axes;
    for (size_t i = 0; i + 1 < route->states.size(); ++i) {
      int a = 0;
      while (route->states[i][static_cast<size_t>(a)] == route->states[i + 1][static_cast<size_t>(a)]) ++a;
      const Sbp& x = route->states[i][static_cast<size_t>(a)];
      const Sbp& y = route->states[i + 1][static_cast<size_t>(a)];
      if (AxisBoxingCost(1, x, y, 2) > 0) axes.push_back(a);
    }
    auto routine = BoxingRoutine::Create(Spec(meta, c.from, c.to, c.hierarchy), Coordinates(c.hierarchy, 0));
    ASSERT_TRUE(routine.ok()) << routine.status();
    EXPECT_EQ(routine->CollectiveAxes(), axes) << what << ": " << routine->Describe();
  }
}

TEST(BoxingTest, ShapesFollowLocalSlice) {
  const BoxingSpec spec = Spec(Meta(DType::kF32, Shape{7, 5}), {kS0, kS1}, {kP, kS0}, {2, 2});
  auto routine = BoxingRoutine::Create(spec, {1, 1});
  ASSERT_TRUE(routine.ok()) << routine.status();
  EXPECT_EQ(routine->input_shape(), (Shape{3, 2}));   // rows 4..6, columns 3..4
  EXPECT_EQ(routine->output_shape(), (Shape{3, 5}));  // P keeps the block; S(0) of 7 on axis 1: rows 4..6
  EXPECT_EQ(routine->spec().ToString(), "f32(7, 5) (S(0), S(1)) -> (P, S(0)) on [2, 2]");
  EXPECT_THAT(routine->rank_coordinates(), ElementsAre(1, 1));
}

// The plan depends only on the spec: every rank of every hierarchy gets the
// same collectives on the same axes in the same order.
TEST(BoxingTest, CollectiveSequenceIsIdenticalOnEveryRank) {
  for (const std::vector<int64_t>& hierarchy : {std::vector<int64_t>{3}, std::vector<int64_t>{2, 2},
                                                std::vector<int64_t>{3, 2}, std::vector<int64_t>{2, 1, 3}}) {
    const auto layouts = AllNdSbps({kB, kP, kS0, kS1}, hierarchy.size());
    for (const NdSbp& from : layouts) {
      for (const NdSbp& to : layouts) {
        // (2, 3): shards of some ranks are empty, which must not change the plan.
        const BoxingSpec spec = Spec(Meta(DType::kBF16, Shape{2, 3}), from, to, hierarchy);
        std::string description;
        std::vector<std::string> collectives;
        std::vector<int> axes;
        for (int64_t id = 0; id < Count(hierarchy); ++id) {
          auto routine = BoxingRoutine::Create(spec, Coordinates(hierarchy, id));
          ASSERT_TRUE(routine.ok()) << routine.status();
          if (id == 0) {
            description = routine->Describe();
            collectives = routine->Collectives();
            axes = routine->CollectiveAxes();
            continue;
          }
          EXPECT_EQ(routine->Describe(), description);
          EXPECT_EQ(routine->Collectives(), collectives) << description;
          EXPECT_EQ(routine->CollectiveAxes(), axes) << description;
        }
      }
    }
  }
}

// ---- Errors ---------------------------------------------------------------------------

TEST(BoxingTest, BadSpecsAreOneLineErrorsNamingTheSpec) {
  const TensorMeta meta = Meta(DType::kF32, Shape{6, 5});
  struct Bad {
    BoxingSpec spec;
    std::vector<int64_t> coordinates;
    std::string expected;
  };
  const std::vector<Bad> cases = {
      {Spec(meta, NdSbp{kMax}, NdSbp{kP}, {4}),
       {0},
       "boxing f32(6, 5) (P(max)) -> (P) on [4]: P(max) converts only to B, S(i) or P(max)"},
      {Spec(meta, NdSbp{kB}, NdSbp{kMax}, {4}),
       {0},
       "boxing f32(6, 5) (B) -> (P(max)) on [4]: only P(max) converts to P(max), not B"},
      {Spec(meta, NdSbp{kS0, kMax}, NdSbp{kS0, kP}, {2, 2}),
       {0, 0},
       "on [2, 2]: axis 1: P(max) converts only to B, S(i) or P(max)"},
      {Spec(meta, NdSbp{kS0}, NdSbp{kS2}, {4}),
       {0},
       "boxing f32(6, 5) (S(0)) -> (S(2)) on [4]: S(2) splits axis 2 of a rank-2 tensor"},
      {Spec(meta, NdSbp{kS0}, NdSbp{kB, kB}, {2, 2}), {0, 0}, "from (S(0)) has 1 axes but the hierarchy has 2"},
      {Spec(meta, NdSbp{kB, kB}, NdSbp{kB}, {2, 2}), {0, 0}, "to (B) has 1 axes but the hierarchy has 2"},
      {Spec(meta, NdSbp{kB, kB}, NdSbp{kS0, kB}, {2, 0}), {0, 0}, "hierarchy axis 1 has 0 devices"},
      {Spec(meta, NdSbp{}, NdSbp{}, {}), {}, "boxing f32(6, 5) () -> () on []: the hierarchy is empty"},
      {Spec(meta, NdSbp{kB, kB}, NdSbp{kS0, kB}, {2, 2}), {2, 0}, "rank coordinates [2, 0] are outside the hierarchy"},
      {Spec(meta, NdSbp{kB, kB}, NdSbp{kS0, kB}, {2, 2}), {0}, "rank coordinates [0] are outside the hierarchy"},
      {Spec(meta, NdSbp{kP, kMax}, NdSbp{kB, kB}, {2, 2}), {0, 0}, "(P, P(max)) mixes P and P(max)"},
      {Spec(Meta(DType::kBool, Shape{6, 5}), {kP}, {kB}, {4}), {0}, "bool(6, 5) (P) -> (B) on [4]: bool cannot be P"},
  };
  for (const Bad& c : cases) {
    auto routine = BoxingRoutine::Create(c.spec, c.coordinates);
    ASSERT_FALSE(routine.ok()) << c.expected;
    EXPECT_EQ(routine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(routine.status().message()), HasSubstr(c.expected));
    EXPECT_EQ(std::string(routine.status().message()).find('\n'), std::string::npos);
  }
}

TEST(BoxingTest, LaunchArgumentErrorsAreReportedInline) {
  Mesh mesh({2});
  const BoxingSpec spec = Spec(Meta(DType::kF32, Shape{7, 5}), {kS1}, {kB}, {2});
  auto routine = BoxingRoutine::Create(spec, {1});
  ASSERT_TRUE(routine.ok()) << routine.status();
  ASSERT_EQ(routine->input_shape(), (Shape{7, 2}));
  const Tensor input = Garbage({7, 2}, DType::kF32);
  const Tensor output = Garbage({7, 5}, DType::kF32);
  struct Case {
    Tensor input, output;
    BoxingComms comms;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {Garbage({7, 3}, DType::kF32), output, mesh.For(1),
       "boxing f32(7, 5) (S(1)) -> (B) on [2]: input is f32(7, 3) but this rank's shard is f32(7, 2)"},
      {input, Garbage({7, 5}, DType::kBF16), mesh.For(1), "output is bf16(7, 5) but this rank's shard is f32(7, 5)"},
      {Tensor(), output, mesh.For(1), "input is undefined"},
      {input, output, BoxingComms{}, "no communicator for hierarchy axis 0"},
      {input, output, mesh.For(0), "the communicator of hierarchy axis 0 is rank 0 of 2, expected rank 1 of 2"},
  };
  for (const Case& c : cases) {
    Completion done;
    routine->Launch(c.input, c.output, c.comms, done.Fn());
    ASSERT_EQ(done.calls(), 1) << c.expected;
    EXPECT_EQ(done.Wait().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(done.Wait().message()), HasSubstr(c.expected));
  }
  EXPECT_THAT(mesh.comms[1][0]->Take(), IsEmpty());
}

TEST(BoxingTest, CommunicatorFailureNamesTheSpecAndStep) {
  Mesh mesh({2, 2});
  const BoxingSpec spec = Spec(Meta(DType::kF32, Shape{7, 5}), {kS0, kS0}, {kB, kS0}, {2, 2});
  auto routine = BoxingRoutine::Create(spec, {0, 0});
  ASSERT_TRUE(routine.ok()) << routine.status();
  // Rank (0, 1) never joins in; its axis-1 group is aborted instead.
  Completion done;
  routine->Launch(Garbage(routine->input_shape(), DType::kF32), Garbage(routine->output_shape(), DType::kF32),
                  mesh.For(0), done.Fn());
  mesh.comms[1][1]->Abort(absl::AbortedError("job 3 aborted"));
  const absl::Status status = done.Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("boxing f32(7, 5) (S(0), S(0)) -> (B, S(0)) on [2, 2]: step 1/3 (axis 1 S(0) -> B: "
                        "all-gather): job 3 aborted"));
  EXPECT_EQ(done.calls(), 1);
}

}  // namespace
}  // namespace tessera::comm
