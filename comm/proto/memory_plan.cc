#include "comm/proto/memory_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "comm/collective/boxing.h"
#include "comm/proto/actor_id.h"
#include "comm/proto/plan_codec.h"
#include "core/checked.h"
#include "core/sbp.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::comm {
namespace {

// Iterations unrolled: releases in iteration 0 are checked against writes in
// iterations 0 and 1. Paths through later iterations are left out, which
// only means less sharing.
constexpr int64_t kUnrolled = 2;
// The most events the model builds (beyond it: no sharing), and the most
// bytes its reachability bitsets take at once.
constexpr int64_t kMaxEvents = int64_t{1} << 24;
constexpr int64_t kReachBytes = int64_t{96} << 20;

int64_t AlignUp(int64_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

struct DeviceKey {
  uint32_t node = 0;
  uint32_t index = 0;
  auto operator<=>(const DeviceKey&) const = default;
};

DeviceKey DeviceOf(uint64_t actor_id) {
  const ActorId id = DecodeActorId(actor_id);
  return {id.node, id.device_index};
}

// Coordinates of position `index` in a row-major mesh of shape `hierarchy`
// (empty when a extent is not positive).
std::vector<int64_t> MeshCoordinates(int64_t index, const std::vector<int64_t>& hierarchy) {
  std::vector<int64_t> coords(hierarchy.size(), 0);
  for (size_t a = hierarchy.size(); a-- > 0;) {
    if (hierarchy[a] < 1) return {};
    coords[a] = index % hierarchy[a];
    index /= hierarchy[a];
  }
  return coords;
}

// The boxing routine a collective task runs (as its actor builds it), or
// nothing when its boxing is not valid (the runtime reports that at load).
std::optional<BoxingRoutine> RoutineOf(const proto::Task& task) {
  const proto::BoxingDesc& desc = task.boxing();
  auto logical = TensorMetaFromProto(desc.logical());
  auto from = ParseNdSbp(desc.from());
  auto to = ParseNdSbp(desc.to());
  if (!logical.ok() || !from.ok() || !to.ok() || desc.hierarchy_size() == 0) return std::nullopt;
  BoxingSpec spec;
  spec.logical = *logical;
  spec.from = *from;
  spec.to = *to;
  spec.hierarchy.assign(desc.hierarchy().begin(), desc.hierarchy().end());
  const std::vector<int64_t> coords = MeshCoordinates(desc.rank_index(), spec.hierarchy);
  if (coords.empty()) return std::nullopt;
  auto routine = BoxingRoutine::Create(spec, coords);
  if (!routine.ok()) return std::nullopt;
  return *std::move(routine);
}

// The register protocol of a plan, unrolled into events (actors/kinds/ hold
// the act conditions these patterns follow). Act j of a task has events
// 2j (start) and 2j + 1 (end), from the task's `base`.
class ProtocolModel {
 public:
  // Builds the model; `unsupported()` says why it could not (then it holds
  // no events).
  explicit ProtocolModel(const proto::Plan& plan) : plan_(plan) {
    error_ = Build();
    if (!error_.empty()) {
      edges_.clear();
      order_.clear();
    }
  }
  const std::string& unsupported() const { return error_; }

  // The descs that go into arenas, in plan order, with what the ordering
  // queries need. A desc written r times per iteration has r uses an
  // iteration (one per register written: micro-batches under accumulation).
  struct Block {
    int desc = 0;   // index into plan.register_descs (-1: a scratch block)
    int task = -1;  // a collective's scratch: index into plan.tasks
    DeviceKey device;
    size_t local = 0;                            // index among its device's blocks (plan order)
    int64_t bytes = 0;                           // register_num x stride
    int64_t uses = 1;                            // r: registers written per iteration
    std::vector<std::vector<int64_t>> releases;  // [use p of iteration 0]: each reader's release of it
    std::vector<int64_t> writes;                 // [use t in 0..r]: its write (t = r: iteration 1's first)
  };
  // Fills blocks' events (the model must be supported).
  void Events(std::vector<Block>& blocks) const {
    for (Block& b : blocks) {
      if (b.task >= 0) {  // a collective's scratch: in use during each of its acts
        const Task& t = tasks_[static_cast<size_t>(b.task)];
        b.uses = t.acts;
        b.writes.clear();
        b.releases.assign(static_cast<size_t>(b.uses), {});
        for (int64_t a = 0; a <= b.uses; ++a) b.writes.push_back(Start(t, a));
        for (int64_t a = 0; a < b.uses; ++a) b.releases[static_cast<size_t>(a)].push_back(End(t, a));
        continue;
      }
      const Desc& d = descs_[static_cast<size_t>(b.desc)];
      const Task& producer = tasks_[static_cast<size_t>(d.producer)];
      b.uses = d.per_iteration;
      b.writes.clear();
      b.releases.assign(static_cast<size_t>(b.uses), {});
      for (int64_t t = 0; t <= b.uses; ++t) b.writes.push_back(Start(producer, TakeAct(producer, t)));
      for (int64_t p = 0; p < b.uses; ++p) {
        auto& releases = b.releases[static_cast<size_t>(p)];
        if (d.consumers.empty()) releases.push_back(End(producer, ReadyAct(producer, p)));
        for (int c : d.consumers) {
          const Task& consumer = tasks_[static_cast<size_t>(c)];
          releases.push_back(End(consumer, ReleaseAct(consumer, p)));
        }
      }
    }
  }

  // Which uses of one block happen before which of another's, as bit rows
  // over the blocks of the same device (by `local` index): for block i and
  // a block j of its device,
  //   last[i][j]  every release of i's last use of iteration 0 happens
  //               before j's first write of iteration 0;
  //   wrap[i][j]  ... before j's first write of iteration 1;
  //   same[i][j]  (equal uses r) for every use p, i's release before j's
  //               write of use p;
  //   step[i][j]  (equal uses r) ... before j's write of use p + 1.
  struct OrderBits {
    std::vector<std::vector<uint64_t>> last, wrap, same, step;
  };
  OrderBits Orders(const std::vector<Block>& blocks) const {
    const size_t n = blocks.size();
    std::map<DeviceKey, std::vector<size_t>> on_device;
    for (size_t j = 0; j < n; ++j) on_device[blocks[j].device].push_back(j);
    OrderBits bits;
    for (auto* rows : {&bits.last, &bits.wrap, &bits.same, &bits.step}) {
      rows->assign(n, {});
      for (size_t i = 0; i < n; ++i) (*rows)[i].assign((on_device[blocks[i].device].size() + 63) / 64, ~uint64_t{0});
    }
    // Sources: one bit per (block, use, release event).
    struct Source {
      int64_t event;
      size_t block;
      int64_t use;
    };
    std::vector<Source> sources;
    for (size_t i = 0; i < n; ++i) {
      for (int64_t p = 0; p < blocks[i].uses; ++p) {
        for (int64_t e : blocks[i].releases[static_cast<size_t>(p)]) sources.push_back({e, i, p});
      }
    }
    const auto events = static_cast<int64_t>(order_.size());
    const int64_t max_words = std::max<int64_t>(1, kReachBytes / 8 / std::max<int64_t>(1, events));
    std::vector<uint64_t> reach;
    const auto clear = [](std::vector<uint64_t>& row, size_t l) { row[l / 64] &= ~(uint64_t{1} << (l % 64)); };
    for (size_t first = 0; first < sources.size();) {
      const size_t words =
          static_cast<size_t>(std::min<int64_t>(max_words, static_cast<int64_t>((sources.size() - first + 63) / 64)));
      const size_t count = std::min(sources.size() - first, words * 64);
      reach.assign(static_cast<size_t>(events) * words, 0);
      for (size_t s = 0; s < count; ++s) {
        reach[static_cast<size_t>(sources[first + s].event) * words + s / 64] |= uint64_t{1} << (s % 64);
      }
      for (int64_t v : order_) {
        const uint64_t* from = &reach[static_cast<size_t>(v) * words];
        bool any = false;
        for (size_t w = 0; w < words && !any; ++w) any = from[w] != 0;
        if (!any) continue;
        for (int64_t k = edge_start_[static_cast<size_t>(v)]; k < edge_start_[static_cast<size_t>(v) + 1]; ++k) {
          uint64_t* to = &reach[static_cast<size_t>(edges_[static_cast<size_t>(k)]) * words];
          for (size_t w = 0; w < words; ++w) to[w] |= from[w];
        }
      }
      for (size_t s = 0; s < count; ++s) {
        const Source& source = sources[first + s];
        const size_t i = source.block;
        const size_t word = s / 64;
        const uint64_t bit = uint64_t{1} << (s % 64);
        const auto reached = [&](int64_t event) {
          return (reach[static_cast<size_t>(event) * words + word] & bit) != 0;
        };
        const bool last_use = source.use == blocks[i].uses - 1;
        const std::vector<size_t>& peers = on_device[blocks[i].device];
        for (size_t l = 0; l < peers.size(); ++l) {
          const Block& j = blocks[peers[l]];
          if (last_use) {
            if (!reached(j.writes.front())) clear(bits.last[i], l);
            if (!reached(j.writes.back())) clear(bits.wrap[i], l);
          }
          if (j.uses == blocks[i].uses) {
            if (!reached(j.writes[static_cast<size_t>(source.use)])) clear(bits.same[i], l);
            if (!reached(j.writes[static_cast<size_t>(source.use) + 1])) clear(bits.step[i], l);
          }
        }
      }
      first += count;
    }
    return bits;
  }

 private:
  struct Task {
    const proto::Task* task = nullptr;
    proto::ActorKind kind = proto::ACTOR_KIND_UNSPECIFIED;
    int64_t acts = 0;                     // per iteration
    int64_t m = 1;                        // REPEAT / ACC: repeat_num
    int64_t base = 0;                     // first event
    std::vector<int> consumed, produced;  // desc indices
  };
  struct Desc {
    int producer = -1;
    std::vector<int> consumers;
    int64_t per_iteration = 0;  // registers written per iteration
    int64_t quota = 1;
  };

  static bool Relays(proto::ActorKind kind) {
    return kind == proto::ACTOR_KIND_REPEAT || kind == proto::ACTOR_KIND_ACC;
  }
  // The act of `t` that takes (writes from) / hands on its s-th register.
  static int64_t TakeAct(const Task& t, int64_t s) {
    switch (t.kind) {
      case proto::ACTOR_KIND_REPEAT:
        return (t.m + 1) * (s / t.m) + s % t.m;
      case proto::ACTOR_KIND_ACC:
        return t.m * s;
      case proto::ACTOR_KIND_PARAMETER:
        return t.acts * s;
      default:
        return s;
    }
  }
  static int64_t ReadyAct(const Task& t, int64_t s) {
    switch (t.kind) {
      case proto::ACTOR_KIND_REPEAT:
        return (t.m + 1) * (s / t.m) + s % t.m;
      case proto::ACTOR_KIND_ACC:
        return t.m * s + t.m - 1;
      case proto::ACTOR_KIND_PARAMETER:
        return t.acts * s;
      default:
        return s;
    }
  }
  // The act of `t` that starts reading / hands back the s-th register of a
  // desc it consumes.
  static int64_t UseAct(const Task& t, int64_t s) {
    switch (t.kind) {
      case proto::ACTOR_KIND_REPEAT:
        return (t.m + 1) * s;
      case proto::ACTOR_KIND_PARAMETER:
        return t.acts * s + 1;
      default:
        return s;
    }
  }
  static int64_t ReleaseAct(const Task& t, int64_t s) {
    switch (t.kind) {
      case proto::ACTOR_KIND_REPEAT:
        return (t.m + 1) * s + t.m;
      case proto::ACTOR_KIND_PARAMETER:
        return t.acts * s + 1;
      default:
        return s;
    }
  }
  static int64_t Start(const Task& t, int64_t act) { return t.base + 2 * act; }
  static int64_t End(const Task& t, int64_t act) { return t.base + 2 * act + 1; }
  bool InRange(const Task& t, int64_t act) const { return act >= 0 && act < kUnrolled * t.acts; }

  void Edge(const Task& from, int64_t from_act, bool from_end, const Task& to, int64_t to_act, bool to_end) {
    if (!InRange(from, from_act) || !InRange(to, to_act)) return;
    pairs_.emplace_back(from_end ? End(from, from_act) : Start(from, from_act),
                        to_end ? End(to, to_act) : Start(to, to_act));
  }

  // Registers per iteration of desc `d` (REPEAT and ACC follow their
  // input's), or -1 when the plan does not fit.
  int64_t PerIteration(int d, int depth) {
    Desc& desc = descs_[static_cast<size_t>(d)];
    if (desc.per_iteration != 0) return desc.per_iteration;
    if (depth > 64) return -1;
    const Task& p = tasks_[static_cast<size_t>(desc.producer)];
    int64_t r = PiecesPerIteration(*p.task);
    if (p.kind == proto::ACTOR_KIND_PARAMETER) r = 1;
    if (Relays(p.kind)) {
      if (p.consumed.size() != 1 || p.produced.size() != 1 || p.m < 1) return -1;
      const int64_t in = PerIteration(p.consumed[0], depth + 1);
      if (in < 1) return -1;
      if (p.kind == proto::ACTOR_KIND_REPEAT) {
        r = in * p.m;
      } else {
        if (in % p.m != 0) return -1;
        r = in / p.m;
      }
    }
    desc.per_iteration = r;
    return r;
  }

  std::string Build() {
    std::unordered_map<uint64_t, int> task_of;
    for (const auto& task : plan_.tasks()) {
      Task t;
      t.task = &task;
      t.kind = task.kind();
      t.m = std::max<int64_t>(1, task.repeat_num());
      if (!task_of.emplace(task.actor_id(), static_cast<int>(tasks_.size())).second) {
        return StrCat("task ", ActorIdToString(task.actor_id()), " appears twice");
      }
      tasks_.push_back(t);
    }
    std::unordered_map<int64_t, int> desc_of;
    for (const auto& desc : plan_.register_descs()) {
      Desc d;
      auto producer = task_of.find(desc.producer());
      if (producer == task_of.end()) return StrCat("register desc ", desc.id(), " has no producer task");
      d.producer = producer->second;
      d.quota = std::max(1, desc.register_num());
      const int index = static_cast<int>(descs_.size());
      if (!desc_of.emplace(desc.id(), index).second) return StrCat("register desc ", desc.id(), " appears twice");
      for (uint64_t c : desc.consumers()) {
        auto consumer = task_of.find(c);
        if (consumer == task_of.end()) return StrCat("register desc ", desc.id(), " has a reader that is no task");
        d.consumers.push_back(consumer->second);
      }
      descs_.push_back(std::move(d));
    }
    for (Task& t : tasks_) {
      for (int64_t id : t.task->consumed_register_desc_ids()) {
        auto it = desc_of.find(id);
        if (it == desc_of.end())
          return StrCat("task '", t.task->name(), "' reads register desc ", id, ", which is not in the plan");
        t.consumed.push_back(it->second);
      }
      for (int64_t id : t.task->produced_register_desc_ids()) {
        auto it = desc_of.find(id);
        if (it == desc_of.end())
          return StrCat("task '", t.task->name(), "' writes register desc ", id, ", which is not in the plan");
        t.produced.push_back(it->second);
      }
    }
    for (size_t d = 0; d < descs_.size(); ++d) {
      if (PerIteration(static_cast<int>(d), 0) < 1) {
        return StrCat("register desc ", plan_.register_descs(static_cast<int>(d)).id(),
                      " is written at a rate the model does not know");
      }
    }
    // Acts per iteration, and readers reading at their producer's rate.
    int64_t events = 0;
    for (Task& t : tasks_) {
      if (Relays(t.kind)) {
        const int64_t in = descs_[static_cast<size_t>(t.consumed[0])].per_iteration;
        t.acts = t.kind == proto::ACTOR_KIND_REPEAT ? (t.m + 1) * in : in;
      } else if (t.kind == proto::ACTOR_KIND_PARAMETER) {
        if (t.produced.size() != 1)
          return StrCat("parameter '", t.task->name(), "' writes ", t.produced.size(), " descs");
        t.acts = t.consumed.empty() ? 1 : 2;
      } else {
        t.acts = PiecesPerIteration(*t.task);
      }
      for (int d : t.consumed) {
        const int64_t wanted = Relays(t.kind)                          ? descs_[static_cast<size_t>(d)].per_iteration
                               : t.kind == proto::ACTOR_KIND_PARAMETER ? 1
                                                                       : t.acts;
        if (descs_[static_cast<size_t>(d)].per_iteration != wanted) {
          return StrCat("task '", t.task->name(), "' reads register desc ", plan_.register_descs(d).id(), " at ",
                        wanted, " registers per iteration, written at ", descs_[static_cast<size_t>(d)].per_iteration);
        }
      }
      t.base = events;
      events += 2 * kUnrolled * t.acts;
      if (events > kMaxEvents)
        return StrCat("the plan has more than ", kMaxEvents / 2, " acts in ", kUnrolled, " iterations");
    }
    // Program order: start -> end -> next start.
    for (const Task& t : tasks_) {
      for (int64_t a = 0; a < kUnrolled * t.acts; ++a) {
        Edge(t, a, false, t, a, true);
        Edge(t, a, true, t, a + 1, false);
      }
    }
    for (size_t di = 0; di < descs_.size(); ++di) {
      const Desc& d = descs_[di];
      const Task& p = tasks_[static_cast<size_t>(d.producer)];
      const int64_t total = kUnrolled * d.per_iteration;
      for (int64_t s = 0; s < total; ++s) {
        for (int c : d.consumers) {
          const Task& reader = tasks_[static_cast<size_t>(c)];
          Edge(p, ReadyAct(p, s), true, reader, UseAct(reader, s), false);               // handed on
          Edge(reader, ReleaseAct(reader, s), true, p, TakeAct(p, s + d.quota), false);  // handed back
          // A Parameter updates once every reader of the variable is back;
          // a Repeat acks its input once every piece is back.
          if (p.kind == proto::ACTOR_KIND_PARAMETER && p.acts == 2)
            Edge(reader, ReleaseAct(reader, s), true, p, 2 * s + 1, false);
          if (p.kind == proto::ACTOR_KIND_REPEAT && s % p.m == p.m - 1) {
            Edge(reader, ReleaseAct(reader, s), true, p, (p.m + 1) * (s / p.m) + p.m, false);
          }
        }
      }
    }
    // A collective's members meet: a member's act j ends after act j started
    // on every peer it shares one of the routine's collective steps with
    // (the ranks that differ from it only on that step's hierarchy axis).
    // A local conversion meets no one. Only a complete, consistent group
    // counts.
    std::map<std::tuple<std::string, int64_t, std::string>, std::vector<int>> collectives;
    std::map<std::pair<std::string, int64_t>, std::vector<int>> transfers;
    for (size_t i = 0; i < tasks_.size(); ++i) {
      const proto::Task& task = *tasks_[i].task;
      if (task.kind() == proto::ACTOR_KIND_COLLECTIVE) {
        collectives[{task.boxing().group(), task.boxing().order(), absl::StrJoin(task.boxing().ranks(), ",")}]
            .push_back(static_cast<int>(i));
      } else if (task.kind() == proto::ACTOR_KIND_SEND || task.kind() == proto::ACTOR_KIND_RECV) {
        transfers[{task.transfer().group(), task.transfer().order()}].push_back(static_cast<int>(i));
      }
    }
    for (const auto& [key, members] : collectives) {
      const proto::BoxingDesc& first = tasks_[static_cast<size_t>(members[0])].task->boxing();
      std::vector<bool> seen(static_cast<size_t>(first.ranks_size()), false);
      bool complete = static_cast<int>(members.size()) == first.ranks_size();
      for (int m : members) {
        const Task& t = tasks_[static_cast<size_t>(m)];
        const int index = t.task->boxing().rank_index();
        complete = complete && t.acts == tasks_[static_cast<size_t>(members[0])].acts && index >= 0 &&
                   index < first.ranks_size() && !seen[static_cast<size_t>(index)];
        if (complete) seen[static_cast<size_t>(index)] = true;
      }
      if (!complete) continue;
      const std::optional<BoxingRoutine> routine = RoutineOf(*tasks_[static_cast<size_t>(members[0])].task);
      if (!routine) continue;
      const std::vector<int> axes = routine->CollectiveAxes();
      const std::vector<int64_t> hierarchy(first.hierarchy().begin(), first.hierarchy().end());
      for (int a : members) {
        const Task& ta = tasks_[static_cast<size_t>(a)];
        const std::vector<int64_t> ca = MeshCoordinates(ta.task->boxing().rank_index(), hierarchy);
        for (int b : members) {
          const Task& tb = tasks_[static_cast<size_t>(b)];
          const std::vector<int64_t> cb = MeshCoordinates(tb.task->boxing().rank_index(), hierarchy);
          if (a == b || ca.empty() || cb.empty()) continue;
          int differing = -1, count = 0;
          for (size_t k = 0; k < ca.size(); ++k) {
            if (ca[k] != cb[k]) {
              differing = static_cast<int>(k);
              ++count;
            }
          }
          if (count != 1 || std::find(axes.begin(), axes.end(), differing) == axes.end()) continue;
          for (int64_t j = 0; j < kUnrolled * ta.acts; ++j) Edge(ta, j, false, tb, j, true);
        }
      }
    }
    for (const auto& [key, pair] : transfers) {
      if (pair.size() != 2) continue;
      int send = pair[0], recv = pair[1];
      if (tasks_[static_cast<size_t>(send)].kind == proto::ACTOR_KIND_RECV) std::swap(send, recv);
      const Task& ts = tasks_[static_cast<size_t>(send)];
      const Task& tr = tasks_[static_cast<size_t>(recv)];
      if (ts.kind != proto::ACTOR_KIND_SEND || tr.kind != proto::ACTOR_KIND_RECV || ts.acts != tr.acts) continue;
      for (int64_t j = 0; j < kUnrolled * ts.acts; ++j) Edge(ts, j, false, tr, j, true);
    }
    // Adjacency (CSR) and a topological order; a cycle means the model does
    // not describe the plan.
    edge_start_.assign(static_cast<size_t>(events) + 1, 0);
    for (const auto& [from, to] : pairs_) ++edge_start_[static_cast<size_t>(from) + 1];
    for (size_t v = 0; v < static_cast<size_t>(events); ++v) edge_start_[v + 1] += edge_start_[v];
    edges_.assign(pairs_.size(), 0);
    std::vector<int64_t> fill(edge_start_.begin(), edge_start_.end() - 1);
    std::vector<int64_t> indegree(static_cast<size_t>(events), 0);
    for (const auto& [from, to] : pairs_) {
      edges_[static_cast<size_t>(fill[static_cast<size_t>(from)]++)] = to;
      ++indegree[static_cast<size_t>(to)];
    }
    pairs_.clear();
    pairs_.shrink_to_fit();
    order_.reserve(static_cast<size_t>(events));
    for (int64_t v = 0; v < events; ++v) {
      if (indegree[static_cast<size_t>(v)] == 0) order_.push_back(v);
    }
    for (size_t i = 0; i < order_.size(); ++i) {
      const int64_t v = order_[i];
      for (int64_t k = edge_start_[static_cast<size_t>(v)]; k < edge_start_[static_cast<size_t>(v) + 1]; ++k) {
        if (--indegree[static_cast<size_t>(edges_[static_cast<size_t>(k)])] == 0)
          order_.push_back(edges_[static_cast<size_t>(k)]);
      }
    }
    if (static_cast<int64_t>(order_.size()) != events) return "the unrolled acts form a cycle";
    return "";
  }

  const proto::Plan& plan_;
  std::string error_;
  std::vector<Task> tasks_;
  std::vector<Desc> descs_;
  std::vector<std::pair<int64_t, int64_t>> pairs_;  // edges while building
  std::vector<int64_t> edge_start_, edges_;         // CSR
  std::vector<int64_t> order_;                      // topological
};

bool Bit(const std::vector<uint64_t>& row, size_t j) { return (row[j / 64] >> (j % 64)) & 1; }

// Whether blocks i and j (one device) may share bytes: within each iteration
// all of one's uses end before the other's begin, and the other's before the
// one's next iteration; or, with as many uses each, the two alternate use by
// use (one's use p, the other's use p, the one's use p + 1, ...).
bool MayShare(const std::vector<ProtocolModel::Block>& blocks, const ProtocolModel::OrderBits& bits, size_t i,
              size_t j) {
  const size_t li = blocks[i].local, lj = blocks[j].local;
  if ((Bit(bits.last[i], lj) && Bit(bits.wrap[j], li)) || (Bit(bits.last[j], li) && Bit(bits.wrap[i], lj))) return true;
  if (blocks[i].uses != blocks[j].uses || blocks[i].uses < 2) return false;
  return (Bit(bits.same[i], lj) && Bit(bits.step[j], li)) || (Bit(bits.same[j], li) && Bit(bits.step[i], lj));
}

absl::StatusOr<std::map<int64_t, proto::ActorKind>> ProducerKinds(const proto::Plan& plan) {
  std::unordered_map<uint64_t, proto::ActorKind> kind_of;
  for (const auto& task : plan.tasks()) kind_of[task.actor_id()] = task.kind();
  std::map<int64_t, proto::ActorKind> out;
  for (const auto& desc : plan.register_descs()) {
    auto it = kind_of.find(desc.producer());
    out[desc.id()] = it == kind_of.end() ? proto::ACTOR_KIND_UNSPECIFIED : it->second;
  }
  return out;
}

// The plan's arena descs as blocks (eligible descs, with their sizes).
absl::StatusOr<std::vector<ProtocolModel::Block>> Blocks(const proto::Plan& plan, bool planned_only) {
  ASSIGN_OR_RETURN(auto kinds, ProducerKinds(plan));
  std::vector<ProtocolModel::Block> blocks;
  std::map<DeviceKey, int64_t> per_device;
  for (int i = 0; i < plan.register_descs_size(); ++i) {
    const proto::RegisterDesc& desc = plan.register_descs(i);
    if (!ArenaEligible(desc, kinds[desc.id()]) || (planned_only && !desc.has_arena_offset())) continue;
    ASSIGN_OR_RETURN(const int64_t stride, RegisterStride(desc));
    ProtocolModel::Block b;
    b.desc = i;
    b.device = DeviceOf(desc.producer());
    b.local = static_cast<size_t>(per_device[b.device]++);
    ASSIGN_OR_RETURN(b.bytes, CheckedMul(stride, std::max(1, desc.register_num()),
                                         StrCat("arena bytes of register desc ", desc.id())));
    blocks.push_back(std::move(b));
  }
  for (int i = 0; i < plan.tasks_size(); ++i) {
    const proto::Task& task = plan.tasks(i);
    if (task.kind() != proto::ACTOR_KIND_COLLECTIVE || task.scratch_bytes() <= 0) continue;
    if (planned_only && !task.has_scratch_offset()) continue;
    ProtocolModel::Block b;
    b.desc = -1;
    b.task = i;
    b.device = DeviceOf(task.actor_id());
    b.local = static_cast<size_t>(per_device[b.device]++);
    ASSIGN_OR_RETURN(b.bytes, CheckedAdd(task.scratch_bytes(), kArenaAlignment - 1, "scratch bytes"));
    b.bytes = b.bytes / kArenaAlignment * kArenaAlignment;
    blocks.push_back(std::move(b));
  }
  return blocks;
}

}  // namespace

absl::StatusOr<int64_t> RegisterStride(const proto::RegisterDesc& desc) {
  int64_t stride = 0;
  for (const auto& tensor : desc.tensors()) {
    ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(tensor));
    ASSIGN_OR_RETURN(const int64_t bytes, CheckedByteSize(meta));
    ASSIGN_OR_RETURN(const int64_t aligned,
                     CheckedAdd(bytes, kArenaAlignment - 1, StrCat("register desc ", desc.id())));
    ASSIGN_OR_RETURN(stride, CheckedAdd(stride, aligned / kArenaAlignment * kArenaAlignment,
                                        StrCat("register bytes of desc ", desc.id())));
  }
  return stride;
}

bool ArenaEligible(const proto::RegisterDesc& desc, proto::ActorKind producer_kind) {
  return desc.bytes_per_register() > 0 && producer_kind != proto::ACTOR_KIND_PARAMETER &&
         producer_kind != proto::ACTOR_KIND_REPEAT;
}

absl::StatusOr<MemoryPlanResult> PlanMemory(proto::Plan& plan) {
  for (auto& desc : *plan.mutable_register_descs()) desc.clear_arena_offset();
  plan.clear_arenas();
  for (auto& task : *plan.mutable_tasks()) {
    task.clear_scratch_offset();
    std::optional<BoxingRoutine> routine;
    if (task.kind() == proto::ACTOR_KIND_COLLECTIVE) routine = RoutineOf(task);
    task.set_scratch_bytes(routine ? routine->ScratchBytes() : 0);
  }
  ASSIGN_OR_RETURN(std::vector<ProtocolModel::Block> blocks, Blocks(plan, false));
  MemoryPlanResult result;
  ProtocolModel::OrderBits bits;
  if (!blocks.empty()) {
    ProtocolModel model(plan);
    result.unshared_reason = model.unsupported();
    if (result.unshared_reason.empty()) {
      model.Events(blocks);
      bits = model.Orders(blocks);
    }
  }
  const bool share = result.unshared_reason.empty();
  std::map<DeviceKey, std::vector<size_t>> on_device;
  for (size_t i = 0; i < blocks.size(); ++i) on_device[blocks[i].device].push_back(i);
  for (auto& [device, members] : on_device) {
    // Largest first (ties: plan order), each at the lowest offset clear of
    // every placed block it may not share with.
    std::stable_sort(members.begin(), members.end(),
                     [&](size_t a, size_t b) { return blocks[a].bytes > blocks[b].bytes; });
    std::vector<std::pair<int64_t, size_t>> placed;  // (offset, block)
    int64_t arena = 0;
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (size_t b : members) {
      busy.clear();
      for (const auto& [offset, other] : placed) {
        if (!share || !MayShare(blocks, bits, b, other)) busy.emplace_back(offset, offset + blocks[other].bytes);
      }
      std::sort(busy.begin(), busy.end());
      int64_t offset = 0;
      for (const auto& [begin, end] : busy) {
        if (begin - offset >= blocks[b].bytes) break;
        offset = std::max(offset, AlignUp(end));
      }
      placed.emplace_back(offset, b);
      if (blocks[b].task >= 0) {
        plan.mutable_tasks(blocks[b].task)->set_scratch_offset(offset);
      } else {
        plan.mutable_register_descs(blocks[b].desc)->set_arena_offset(offset);
      }
      ASSIGN_OR_RETURN(const int64_t end, CheckedAdd(offset, blocks[b].bytes, "arena bytes"));
      arena = std::max(arena, end);
    }
    proto::DeviceArena* a = plan.add_arenas();
    a->set_node(device.node);
    a->set_device_index(device.index);
    a->set_bytes(arena);
  }
  return result;
}

absl::Status CheckArenaBounds(const proto::Plan& plan) {
  std::map<DeviceKey, int64_t> arenas;
  for (const auto& a : plan.arenas()) {
    if (a.bytes() < 0)
      return absl::InvalidArgumentError(
          StrCat("the arena of node ", a.node(), " cpu:", a.device_index(), " has ", a.bytes(), " bytes"));
    if (!arenas.emplace(DeviceKey{a.node(), a.device_index()}, a.bytes()).second) {
      return absl::InvalidArgumentError(StrCat("two arenas for node ", a.node(), " cpu:", a.device_index()));
    }
  }
  ASSIGN_OR_RETURN(auto kinds, ProducerKinds(plan));
  for (const auto& desc : plan.register_descs()) {
    if (!desc.has_arena_offset()) continue;
    const auto where = [&] { return StrCat("register desc ", desc.id(), " of ", ActorIdToString(desc.producer())); };
    if (!ArenaEligible(desc, kinds[desc.id()])) {
      return absl::InvalidArgumentError(
          StrCat(where(), " has an arena offset, but its registers ",
                 desc.bytes_per_register() == 0 ? "are views" : "live across iterations"));
    }
    if (desc.arena_offset() < 0 || desc.arena_offset() % kArenaAlignment != 0) {
      return absl::InvalidArgumentError(
          StrCat(where(), " has arena offset ", desc.arena_offset(), ", not a multiple of ", kArenaAlignment));
    }
    auto arena = arenas.find(DeviceOf(desc.producer()));
    if (arena == arenas.end())
      return absl::InvalidArgumentError(StrCat(where(), " has an arena offset, but its device has no arena"));
    ASSIGN_OR_RETURN(const int64_t stride, RegisterStride(desc));
    ASSIGN_OR_RETURN(const int64_t bytes, CheckedMul(stride, std::max(1, desc.register_num()), where()));
    if (bytes > arena->second - desc.arena_offset()) {
      return absl::InvalidArgumentError(StrCat(where(), " takes bytes [", desc.arena_offset(), ", ",
                                               desc.arena_offset() + bytes, ") of an arena of ", arena->second));
    }
  }
  for (const auto& task : plan.tasks()) {
    if (!task.has_scratch_offset() && task.scratch_bytes() == 0) continue;
    const auto where = [&] { return StrCat("task '", task.name(), "' (", ActorIdToString(task.actor_id()), ")"); };
    if (task.kind() != proto::ACTOR_KIND_COLLECTIVE && (task.scratch_bytes() != 0 || task.has_scratch_offset())) {
      return absl::InvalidArgumentError(StrCat(where(), " has scratch, but only collectives have any"));
    }
    if (task.scratch_bytes() < 0 || task.scratch_bytes() > kMaxTensorBytes) {
      return absl::InvalidArgumentError(StrCat(where(), " has ", task.scratch_bytes(), " bytes of scratch"));
    }
    if (!task.has_scratch_offset()) continue;
    if (task.scratch_offset() < 0 || task.scratch_offset() % kArenaAlignment != 0) {
      return absl::InvalidArgumentError(
          StrCat(where(), " has scratch offset ", task.scratch_offset(), ", not a multiple of ", kArenaAlignment));
    }
    auto arena = arenas.find(DeviceOf(task.actor_id()));
    if (arena == arenas.end()) {
      return absl::InvalidArgumentError(StrCat(where(), " has a scratch offset, but its device has no arena"));
    }
    if (task.scratch_bytes() > arena->second - task.scratch_offset()) {
      return absl::InvalidArgumentError(StrCat(where(), " takes scratch bytes [", task.scratch_offset(), ", ",
                                               task.scratch_offset() + task.scratch_bytes(), ") of an arena of ",
                                               arena->second));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMemoryPlan(const proto::Plan& plan) {
  RETURN_IF_ERROR(CheckArenaBounds(plan));
  ASSIGN_OR_RETURN(std::vector<ProtocolModel::Block> blocks, Blocks(plan, true));
  // Overlapping pairs, by a sweep over each device's offsets.
  std::vector<std::pair<size_t, size_t>> overlaps;
  std::map<DeviceKey, std::vector<size_t>> on_device;
  for (size_t i = 0; i < blocks.size(); ++i) on_device[blocks[i].device].push_back(i);
  const auto offset = [&](size_t i) {
    return blocks[i].task >= 0 ? plan.tasks(blocks[i].task).scratch_offset()
                               : plan.register_descs(blocks[i].desc).arena_offset();
  };
  for (auto& [device, members] : on_device) {
    std::sort(members.begin(), members.end(), [&](size_t a, size_t b) { return offset(a) < offset(b); });
    for (size_t x = 0; x < members.size(); ++x) {
      for (size_t y = x + 1; y < members.size() && offset(members[y]) < offset(members[x]) + blocks[members[x]].bytes;
           ++y) {
        if (blocks[members[x]].bytes > 0 && blocks[members[y]].bytes > 0) overlaps.emplace_back(members[x], members[y]);
      }
    }
  }
  if (overlaps.empty()) return absl::OkStatus();
  ProtocolModel model(plan);
  const auto name = [&](size_t i) {
    if (blocks[i].task >= 0) {
      const auto& task = plan.tasks(blocks[i].task);
      return StrCat("the scratch of '", task.name(), "' (bytes [", task.scratch_offset(), ", ",
                    task.scratch_offset() + blocks[i].bytes, "))");
    }
    const auto& desc = plan.register_descs(blocks[i].desc);
    return StrCat("register desc ", desc.id(), " of ", ActorIdToString(desc.producer()), " (bytes [",
                  desc.arena_offset(), ", ", desc.arena_offset() + blocks[i].bytes, "))");
  };
  if (!model.unsupported().empty()) {
    return absl::FailedPreconditionError(
        StrCat(name(overlaps[0].first), " and ", name(overlaps[0].second),
               " share arena bytes, but the plan's lifetimes cannot be told apart: ", model.unsupported()));
  }
  model.Events(blocks);
  const ProtocolModel::OrderBits bits = model.Orders(blocks);
  for (const auto& [a, b] : overlaps) {
    if (!MayShare(blocks, bits, a, b)) {
      return absl::FailedPreconditionError(
          StrCat(name(a), " and ", name(b),
                 " share arena bytes, but the register protocol does not keep their lifetimes apart"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::comm
