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
static_assert(kMaxEvents <= (int64_t{1} << 30), "ProtocolModel holds positions as int32 and in 30-bit sort keys");
constexpr int64_t kReachBytes = int64_t{96} << 20;
// A source this many positions (plus its chunk's span) past what its chunk
// walks starts a chunk of its own.
constexpr int64_t kChunkGap = 1024;
// On a device of more than kManyBlocks registers, those smaller than
// kMinSharedBytes get bytes of their own: the pairwise lifetime analysis
// grows with the square of the blocks it covers, and a deep model has
// thousands of tiny ones (norm and bias gradients, scalars) whose sharing
// would save little.
constexpr size_t kManyBlocks = 4096;
constexpr int64_t kMinSharedBytes = 4096;

int64_t AlignUp(int64_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

bool Bit(const std::vector<uint64_t>& row, size_t j) { return (row[j / 64] >> (j % 64)) & 1; }

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
      task_of_event_.clear();
      position_.clear();
      position_edge_start_.clear();
      position_edges_.clear();
    }
  }
  const std::string& unsupported() const { return error_; }

  // The descs that go into arenas, in plan order, with what the ordering
  // queries need. A desc written r times per iteration has r uses an
  // iteration (one per register written: micro-batches under accumulation).
  struct Block {
    int desc = 0;   // index into plan.register_descs (-1: a scratch block)
    int task = -1;  // a collective's scratch or a compute's workspace: index into plan.tasks
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
      if (b.task >= 0) {  // a collective's scratch, a compute's workspace: in use during each of its acts
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
  // Stored by the later block: row j holds, per block i of j's device (by
  // i's local index), the bit of i's releases against j's writes.
  struct OrderBits {
    std::vector<std::vector<uint64_t>> last, wrap, same, step;
  };
  // The periodic band of rate r: layers [first, last] (empty when last <
  // first) of iteration 0 that are copies of one another, so that use p's
  // tests give use p''s bits for p, p + 1, p', p' + 1 all in the band, and
  // only one use of the band need be walked. The layer of an event (rate r):
  // act a of a task of r acts an iteration is layer a (a global index:
  // iteration i's layer k is i r + k); a Repeat of r pieces from a
  // per-iteration input has its piece acts as layers and its ack act outside
  // them, as every other task's acts are. The band is found, not assumed:
  //  - every edge into a layer event comes from events of no later layer
  //    (an event outside the layers counts as the latest layer it follows),
  //    so a path from layer p to layer p + 1 runs through layers p and
  //    p + 1 only, and once a path leaves the layers it never comes back
  //    below the layer it left;
  //  - no event of a band layer has an edge out of the layers, so such a
  //    path never leaves them;
  //  - the edges out of each task's events at layer k, as (task, start or
  //    end, layer - k), are those at layer k + 1, across the band.
  // So shifting a path by p' - p maps it onto a path, both ways.
  struct Band {
    int64_t first = 0, last = -1;
  };
  int64_t Layer(int64_t event, int64_t r) const {
    const Task& t = tasks_[static_cast<size_t>(task_of_event_[static_cast<size_t>(event)])];
    const int64_t act = (event - t.base) / 2;
    if (t.acts == r) return act;
    if (t.kind == proto::ACTOR_KIND_REPEAT && t.m == r && t.acts == r + 1 && act % (r + 1) < r) {
      return act / (r + 1) * r + act % (r + 1);
    }
    return -1;
  }
  Band PeriodicBand(int64_t r) const {
    const size_t n = position_.size();
    constexpr int32_t kNone = INT32_MIN;  // an event outside the layers that follows none
    std::vector<int32_t> layer(n);        // by position: the layer, or (outside) the latest layer it follows
    std::vector<bool> in_layers(n);
    for (size_t p = 0; p < n; ++p) {
      const int64_t g = Layer(order_[p], r);
      in_layers[p] = g >= 0;
      layer[p] = g >= 0 ? static_cast<int32_t>(g) : kNone;
    }
    std::vector<bool> regular(static_cast<size_t>(r), true);  // iteration 0's layers with no edge out of the layers
    for (size_t p = 0; p < n; ++p) {
      for (int64_t k = position_edge_start_[p]; k < position_edge_start_[p + 1]; ++k) {
        const size_t q = static_cast<size_t>(position_edges_[static_cast<size_t>(k)]);
        if (in_layers[q]) {
          if (layer[p] > layer[q]) return {};  // an edge back to an earlier layer
        } else {
          layer[q] = std::max(layer[q], layer[p]);
          if (in_layers[p] && layer[p] < r) regular[static_cast<size_t>(layer[p])] = false;
        }
      }
    }
    // The edges out of an event, as (task, end?, layer difference), sorted.
    using Edges = std::vector<std::tuple<int32_t, int32_t, int32_t>>;
    const auto edges_out = [&](int64_t event, Edges& out) {
      out.clear();
      const size_t p = static_cast<size_t>(position_[static_cast<size_t>(event)]);
      for (int64_t k = position_edge_start_[p]; k < position_edge_start_[p + 1]; ++k) {
        const size_t q = static_cast<size_t>(position_edges_[static_cast<size_t>(k)]);
        const int32_t to = order_[q];
        const Task& t = tasks_[static_cast<size_t>(task_of_event_[static_cast<size_t>(to)])];
        out.emplace_back(task_of_event_[static_cast<size_t>(to)], static_cast<int32_t>((to - t.base) % 2),
                         in_layers[q] ? layer[q] - layer[p] : INT32_MAX);
      }
      std::sort(out.begin(), out.end());
    };
    // shifts[k]: layer k + 1's edges are layer k's, shifted.
    std::vector<bool> shifts(static_cast<size_t>(std::max<int64_t>(0, r - 1)), true);
    Edges here, next;
    bool any_layers = false;
    for (const Task& t : tasks_) {
      const bool piece_acts = t.kind == proto::ACTOR_KIND_REPEAT && t.m == r && t.acts == r + 1;
      if (t.acts != r && !piece_acts) continue;
      any_layers = true;
      // Iteration 0's layer k is act k of either kind of task.
      for (int64_t k = 0; k + 1 < r; ++k) {
        for (int64_t end = 0; end < 2 && shifts[static_cast<size_t>(k)]; ++end) {
          edges_out(t.base + 2 * k + end, here);
          edges_out(t.base + 2 * (k + 1) + end, next);
          if (here != next) shifts[static_cast<size_t>(k)] = false;
        }
      }
    }
    // The longest run of regular layers, each a shift of the one before.
    Band best;
    if (!any_layers) return best;
    for (int64_t first = 0; first < r;) {
      if (!regular[static_cast<size_t>(first)]) {
        ++first;
        continue;
      }
      int64_t last = first;
      while (last + 1 < r && regular[static_cast<size_t>(last) + 1] && shifts[static_cast<size_t>(last)]) ++last;
      if (last - first > best.last - best.first) best = {first, last};
      first = last + 1;
    }
    return best;
  }

  // Sources: one bit per (block, use, release event), by device. A source
  // is tested against writes up to its horizon (the topological position
  // past which none of its tests look): a last use against every peer's
  // writes up to iteration 1's first; any other use p against the writes of
  // uses p and p + 1 of the peers of equal uses alone. So the sources of a
  // chunk need the reachability walked only from the first of them to the
  // furthest horizon: most uses of many-use blocks (micro-batches under
  // accumulation) look a little ahead. And of the uses that lie in the
  // periodic band (PeriodicBand), only the first is walked: the others'
  // tests are shifts of its tests. A last use's tests against the next
  // iteration's first writes (which may lie at its end) are WrapSources'.
  struct Source {
    uint64_t key;      // the sort order: last uses first, then by uses, then by position
    int64_t position;  // of its release event
    int64_t horizon;
    uint32_t local;  // the block's index on its device
    uint32_t use;
    uint32_t uses;
    uint32_t block;  // index into blocks
  };
  struct Chunk {
    size_t first = 0, count = 0;  // sources[first, first + count)
    int64_t words = 1;
    int64_t lo = 0, hi = -1;  // topological positions walked
    uint32_t peer_uses = 0;   // the peers tested against: those of this many uses (0: all)
    int peer_list = -1;       // ... or these (DeviceSources::peer_lists)
    bool wrap = false;        // a WrapSources chunk: wrap tests only
    bool with_wrap = false;   // a last uses' chunk that does the wrap tests too
  };
  struct DeviceSources {
    std::vector<Source> sources;
    std::vector<size_t> all_peers;                          // analysed blocks
    std::map<uint32_t, std::vector<size_t>> peers_by_uses;  // ... by their uses
    std::vector<std::vector<size_t>> peer_lists;
    std::vector<Chunk> chunks;
    bool with_wrap = false;  // the last uses' chunks do the wrap tests
    const std::vector<size_t>& Peers(const Chunk& c) const {
      if (c.peer_list >= 0) return peer_lists[static_cast<size_t>(c.peer_list)];
      return c.peer_uses == 0 ? all_peers : peers_by_uses.at(c.peer_uses);
    }
  };
  // The `analysed` blocks (null: all) by device.
  static std::map<DeviceKey, std::vector<size_t>> AnalysedByDevice(const std::vector<Block>& blocks,
                                                                   const std::vector<bool>* analysed) {
    std::map<DeviceKey, std::vector<size_t>> on_device;
    for (size_t j = 0; j < blocks.size(); ++j) {
      if (analysed == nullptr || (*analysed)[j]) on_device[blocks[j].device].push_back(j);
    }
    return on_device;
  }
  // Whether some of `members` are used several times an iteration.
  static bool MicroBatches(const std::vector<Block>& blocks, const std::vector<size_t>& members) {
    return std::any_of(members.begin(), members.end(), [&](size_t j) { return blocks[j].uses >= 2; });
  }
  // Words of source bits a chunk may take: the reach buffer's bytes over the events.
  int64_t MaxWords() const { return std::max<int64_t>(1, kReachBytes / 8 / std::max<int64_t>(1, EventCount())); }

  // The sources of the `analysed` blocks (null: all) and their chunks.
  // `exhaustive`: every chunk walks every event (the reference the windows
  // are tested against).
  std::vector<DeviceSources> Sources(const std::vector<Block>& blocks, const std::vector<bool>* analysed,
                                     bool exhaustive = false) const {
    const auto position = [&](int64_t event) { return static_cast<int64_t>(position_[static_cast<size_t>(event)]); };
    const int64_t max_words = MaxWords();
    std::vector<DeviceSources> out;
    std::map<int64_t, Band> bands;  // by number of uses
    for (const auto& [device, members] : AnalysedByDevice(blocks, analysed)) {
      DeviceSources& d = out.emplace_back();
      d.all_peers = members;
      // Horizons: of a last use, the latest first write (iteration 0's) of
      // any peer, and with r >= 2 uses that of use p + 1 below; of use p of
      // r, the latest write of use p + 1 among the peers of r uses. (A last
      // use's wrap tests, against iteration 1's first writes, are
      // WrapSources'.)
      int64_t last_horizon = -1;
      std::map<int64_t, std::vector<int64_t>> horizon_of_use;  // uses r -> [p]
      // A device whose blocks are all used once an iteration (no
      // micro-batches) walks its last uses' wrap tests with them, as far
      // as every peer's write of iteration 1: splitting them off
      // (WrapSources) saves walks across micro-batches, and without any it
      // only walks twice.
      d.with_wrap = !MicroBatches(blocks, members);
      for (size_t j : members) {
        const Block& b = blocks[j];
        d.peers_by_uses[static_cast<uint32_t>(b.uses)].push_back(j);
        last_horizon = std::max(last_horizon, position(b.writes.front()));
        if (d.with_wrap) last_horizon = std::max(last_horizon, position(b.writes.back()));
        std::vector<int64_t>& h = horizon_of_use[b.uses];
        h.resize(static_cast<size_t>(b.uses), -1);
        for (int64_t p = 0; p < b.uses; ++p) {
          h[static_cast<size_t>(p)] = std::max({h[static_cast<size_t>(p)], position(b.writes[static_cast<size_t>(p)]),
                                                position(b.writes[static_cast<size_t>(p) + 1])});
        }
      }
      // Uses whose tests are those of an earlier use (PeriodicBand), per
      // number of uses: [first, last], for blocks whose peers of as many
      // uses are all regular over the band.
      std::map<int64_t, std::pair<int64_t, int64_t>> repeated;
      for (const auto& [uses, peers] : d.peers_by_uses) {
        if (exhaustive || uses < 4) continue;
        auto band = bands.find(uses);
        if (band == bands.end()) band = bands.emplace(uses, PeriodicBand(uses)).first;
        // Uses p in [first, last] are tested within band layers p and p + 1;
        // the last use is tested apart.
        const int64_t first = band->second.first, last = std::min(band->second.last - 1, int64_t{uses} - 2);
        if (last <= first) continue;
        bool regular = true;
        for (size_t j : peers) regular = regular && Regular(blocks[j], first, last);
        if (regular) repeated[uses] = {first + 1, last};
      }
      for (size_t i : members) {
        const Block& b = blocks[i];
        const auto skip = repeated.find(b.uses);
        for (int64_t p = 0; p < b.uses; ++p) {
          if (skip != repeated.end() && p >= skip->second.first && p <= skip->second.second) continue;
          const int64_t use_horizon = horizon_of_use[b.uses][static_cast<size_t>(p)];
          const int64_t horizon = p + 1 < b.uses ? use_horizon
                                  : b.uses >= 2  ? std::max(last_horizon, use_horizon)
                                                 : last_horizon;
          for (int64_t e : b.releases[static_cast<size_t>(p)]) {
            // (uses and positions are below kMaxEvents = 2^24)
            const bool last = p + 1 == b.uses;
            const uint64_t key = (uint64_t{!last} << 60) | (static_cast<uint64_t>(last ? 0 : b.uses) << 30) |
                                 static_cast<uint64_t>(position(e));
            d.sources.push_back({key, position(e), horizon, static_cast<uint32_t>(b.local), static_cast<uint32_t>(p),
                                 static_cast<uint32_t>(b.uses), static_cast<uint32_t>(i)});
          }
        }
      }
      // Last uses first (tested against every peer, walked far: as many
      // words a chunk as the reach buffer allows), then the others by their
      // number of uses (tested against those peers alone, one word a chunk:
      // a short walk each), each group by position.
      const auto is_last = [](const Source& s) { return s.use + 1 == s.uses; };
      std::sort(d.sources.begin(), d.sources.end(), [](const Source& a, const Source& b) { return a.key < b.key; });
      for (size_t group = 0; group < d.sources.size();) {
        const Source& head = d.sources[group];
        size_t group_end = group;
        while (group_end < d.sources.size() && is_last(d.sources[group_end]) == is_last(head) &&
               (is_last(head) || d.sources[group_end].uses == head.uses)) {
          ++group_end;
        }
        const int64_t words =
            is_last(head) ? std::min<int64_t>(max_words, static_cast<int64_t>((group_end - group + 63) / 64)) : 1;
        Chunk kind;
        kind.peer_uses = is_last(head) ? 0 : head.uses;
        kind.with_wrap = d.with_wrap && is_last(head);
        Chunks(d, group, group_end, words, kind, exhaustive);
        group = group_end;
      }
    }
    return out;
  }
  // Cuts d.sources[begin, end) (by position) into chunks like `kind`, of
  // at most `words` x 64 sources each, walking from their first source's
  // position to their furthest horizon. A source well past what the chunk
  // walks so far starts a chunk of its own, so no chunk walks a long gap
  // between its sources' windows (the uses PeriodicBand leaves out make
  // such gaps).
  void Chunks(DeviceSources& d, size_t begin, size_t end, int64_t words, const Chunk& kind, bool exhaustive) const {
    for (size_t first = begin; first < end;) {
      Chunk c = kind;
      c.first = first;
      c.words = words;
      const size_t most = std::min(end - first, static_cast<size_t>(words) * 64);
      c.lo = d.sources[first].position;
      // (A source's own position too: its horizon may lie before it.)
      for (c.count = 0; c.count < most; ++c.count) {
        const Source& source = d.sources[first + c.count];
        if (c.count > 0 && source.position > c.hi + kChunkGap + (c.hi - c.lo)) break;
        c.hi = std::max({c.hi, source.horizon, source.position});
      }
      if (exhaustive) {
        c.lo = 0;
        c.hi = EventCount() - 1;
      }
      d.chunks.push_back(c);
      first += c.count;
    }
  }

  // The wrap tests of every analysed block's last use (a release of
  // iteration 0 against a peer's first write of iteration 1), given the
  // last bits `bits` (Orders of Sources). A wrap bit wrap(i, j) counts only
  // together with last(j, i) (MayShare), so a release is tested against
  // the peers j with last(j, i) alone (every peer when exhaustive), and
  // MaskWraps clears the others. Iteration 1's first write of a block
  // written once an iteration may lie at that iteration's end (gradient
  // sums, optimizer buffers), a walk across all its micro-batches; such
  // blocks are rarely finished before another's first write of iteration
  // 0, so most releases need no such walk.
  std::vector<DeviceSources> WrapSources(const std::vector<Block>& blocks, const std::vector<bool>* analysed,
                                         const OrderBits& bits, bool exhaustive) const {
    const auto position = [&](int64_t event) { return static_cast<int64_t>(position_[static_cast<size_t>(event)]); };
    const int64_t max_words = MaxWords();
    std::vector<DeviceSources> out;
    for (const auto& [device, members] : AnalysedByDevice(blocks, analysed)) {
      if (!MicroBatches(blocks, members)) continue;  // (Sources' chunks did the wrap tests)
      DeviceSources& d = out.emplace_back();
      d.all_peers = members;
      for (size_t i : members) {
        const Block& b = blocks[i];
        int64_t horizon = -1;
        for (size_t j : members) {
          if (exhaustive || Bit(bits.last[i], blocks[j].local)) {
            horizon = std::max(horizon, position(blocks[j].writes.back()));
          }
        }
        if (horizon < 0) continue;  // no peer needs its wrap bit
        const int64_t p = b.uses - 1;
        for (int64_t e : b.releases[static_cast<size_t>(p)]) {
          d.sources.push_back({static_cast<uint64_t>(position(e)), position(e), horizon, static_cast<uint32_t>(b.local),
                               static_cast<uint32_t>(p), static_cast<uint32_t>(b.uses), static_cast<uint32_t>(i)});
        }
      }
      std::sort(d.sources.begin(), d.sources.end(), [](const Source& a, const Source& b) { return a.key < b.key; });
      Chunk kind;
      kind.wrap = true;
      Chunks(d, 0, d.sources.size(), std::min<int64_t>(max_words, static_cast<int64_t>((d.sources.size() + 63) / 64)),
             kind, exhaustive);
      // Each chunk's peers: those some source of it needs.
      std::vector<bool> needed(blocks.size());
      for (Chunk& c : d.chunks) {
        std::fill(needed.begin(), needed.end(), false);
        for (size_t k = c.first; k < c.first + c.count; ++k) {
          const size_t i = d.sources[k].block;
          for (size_t j : members) needed[j] = needed[j] || exhaustive || Bit(bits.last[i], blocks[j].local);
        }
        std::vector<size_t>& peers = d.peer_lists.emplace_back();
        for (size_t j : members) {
          if (needed[j]) peers.push_back(j);
        }
        c.peer_list = static_cast<int>(d.peer_lists.size()) - 1;
      }
    }
    return out;
  }

  // Whether block b's uses p in [first, last] are shifts of use `first`:
  // each release of use p, and the writes of uses p and p + 1, at layer p
  // (p + 1) of the same task and kind as use `first`'s (rate b.uses).
  bool Regular(const Block& b, int64_t first, int64_t last) const {
    const auto same_kind = [&](int64_t event, int64_t model, int64_t layer, int64_t model_layer) {
      return Layer(event, b.uses) == layer && Layer(model, b.uses) == model_layer &&
             task_of_event_[static_cast<size_t>(event)] == task_of_event_[static_cast<size_t>(model)] &&
             (event - model) % 2 == 0;
    };
    const auto& base_releases = b.releases[static_cast<size_t>(first)];
    for (int64_t p = first; p <= last; ++p) {
      const auto& releases = b.releases[static_cast<size_t>(p)];
      if (releases.size() != base_releases.size()) return false;
      for (size_t k = 0; k < releases.size(); ++k) {
        if (!same_kind(releases[k], base_releases[k], p, first)) return false;
      }
      if (!same_kind(b.writes[static_cast<size_t>(p)], b.writes[static_cast<size_t>(first)], p, first) ||
          !same_kind(b.writes[static_cast<size_t>(p) + 1], b.writes[static_cast<size_t>(first) + 1], p + 1,
                     first + 1)) {
        return false;
      }
    }
    return true;
  }

  // About how many word operations Orders(blocks, analysis) takes (the
  // events its chunks walk, times their words, and the bit tests).
  int64_t Work(const std::vector<DeviceSources>& analysis) const {
    double work = 0;
    const double degree =
        position_.empty() ? 0 : static_cast<double>(position_edges_.size()) / static_cast<double>(position_.size());
    for (const DeviceSources& device : analysis) {
      for (const Chunk& c : device.chunks) {
        work += static_cast<double>(c.hi - c.lo + 1) * static_cast<double>(c.words) * (1 + degree) +
                static_cast<double>(c.count) * static_cast<double>(device.Peers(c).size());
      }
    }
    // Saturating: a huge plan must read as over budget, never wrap.
    return static_cast<int64_t>(std::min(work, static_cast<double>(INT64_MAX / 2)));
  }

  // The blocks' bits (analysis: Sources(blocks, analysed), of the same
  // blocks): only the analysed blocks' rows and sources are worked out; the
  // others' bits are left set and mean nothing.
  OrderBits Orders(const std::vector<Block>& blocks, const std::vector<DeviceSources>& analysis) const {
    const size_t n = blocks.size();
    std::map<DeviceKey, size_t> per_device;
    for (const Block& b : blocks) ++per_device[b.device];
    OrderBits bits;
    for (auto* rows : {&bits.last, &bits.wrap, &bits.same, &bits.step}) {
      rows->assign(n, {});
      for (size_t j = 0; j < n; ++j) (*rows)[j].assign((per_device[blocks[j].device] + 63) / 64, ~uint64_t{0});
    }
    Walk(blocks, analysis, bits);
    return bits;
  }
  // Clears in `bits` what the chunks of `analysis` find unordered.
  void Walk(const std::vector<Block>& blocks, const std::vector<DeviceSources>& analysis, OrderBits& bits) const {
    std::vector<uint64_t> reach;
    for (const DeviceSources& device : analysis) {
      for (const Chunk& chunk : device.chunks) {
        // reach[(position - lo) * words + s / 64], bit s % 64: source s of
        // the chunk happens before the event at that topological position.
        const size_t words = static_cast<size_t>(chunk.words);
        reach.assign(static_cast<size_t>(chunk.hi - chunk.lo + 1) * words, 0);
        const auto row = [&](int64_t position) { return &reach[static_cast<size_t>(position - chunk.lo) * words]; };
        for (size_t s = 0; s < chunk.count; ++s) {
          row(device.sources[chunk.first + s].position)[s / 64] |= uint64_t{1} << (s % 64);
        }
        for (int64_t p = chunk.lo; p <= chunk.hi; ++p) {
          const uint64_t* from = row(p);
          bool any = false;
          for (size_t w = 0; w < words && !any; ++w) any = from[w] != 0;
          if (!any) continue;
          for (int64_t k = position_edge_start_[static_cast<size_t>(p)];
               k < position_edge_start_[static_cast<size_t>(p) + 1]; ++k) {
            const int64_t to_position = position_edges_[static_cast<size_t>(k)];
            if (to_position > chunk.hi) continue;
            uint64_t* to = row(to_position);
            for (size_t w = 0; w < words; ++w) to[w] |= from[w];
          }
        }
        // A write before the chunk's first source is reached by none of
        // them; none of the writes tested lies past `hi` (the horizons),
        // and one that did would read as not reached (less sharing).
        const auto write_row = [&](int64_t event) -> const uint64_t* {
          const int64_t p = position_[static_cast<size_t>(event)];
          return p < chunk.lo || p > chunk.hi ? nullptr : row(p);
        };
        const auto reached = [](const uint64_t* r, size_t s) {
          return r != nullptr && ((r[s / 64] >> (s % 64)) & 1) != 0;
        };
        // Peer by peer: its few write rows stay in cache while every source
        // of the chunk is tested against them, and its own bit rows are
        // written in order.
        for (size_t j : device.Peers(chunk)) {
          const Block& b = blocks[j];
          // (Write rows are looked up per test: listing a block's rows for
          // each chunk would cost its micro-batches per chunk, their square
          // in all.)
          const uint64_t* front = write_row(b.writes.front());
          const uint64_t* back = write_row(b.writes.back());
          uint64_t* last = bits.last[j].data();
          uint64_t* wrap = bits.wrap[j].data();
          uint64_t* same = bits.same[j].data();
          uint64_t* step = bits.step[j].data();
          const auto unless = [](uint64_t bit, bool r) { return ~(bit & (uint64_t{r} - 1)); };
          if (chunk.wrap) {
            for (size_t s = 0; s < chunk.count; ++s) {
              const Source& source = device.sources[chunk.first + s];
              wrap[source.local / 64] &= unless(uint64_t{1} << (source.local % 64), reached(back, s));
            }
            continue;
          }
          // Branch-free: half the tests fail, unpredictably. `unless(r)`
          // is the mask that clears the source's bit when r is false.
          // (Wrap bits are the wrap chunks' where the device has
          // micro-batches; same and step of blocks used once an iteration
          // mean nothing, MayShare alternating only blocks of several uses.)
          for (size_t s = 0; s < chunk.count; ++s) {
            const Source& source = device.sources[chunk.first + s];
            const uint64_t bit = uint64_t{1} << (source.local % 64);
            const size_t word = source.local / 64;
            if (source.uses == 1 && b.uses == 1) {  // the common case
              last[word] &= unless(bit, reached(front, s));
              if (chunk.with_wrap) wrap[word] &= unless(bit, reached(back, s));
              continue;
            }
            if (source.use + 1 == source.uses) {
              last[word] &= unless(bit, reached(front, s));
              if (chunk.with_wrap) wrap[word] &= unless(bit, reached(back, s));
            }
            // (Once both bits are clear, as for most pairs after a few
            // uses, the lookups of the writes are skipped.)
            if (static_cast<int64_t>(source.uses) == b.uses && ((same[word] | step[word]) & bit) != 0) {
              same[word] &= unless(bit, reached(write_row(b.writes[source.use]), s));
              step[word] &= unless(bit, reached(write_row(b.writes[source.use + 1]), s));
            }
          }
        }
      }
    }
  }

 private:
  int64_t EventCount() const { return static_cast<int64_t>(position_.size()); }

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
    int64_t window = 0;  // RegisterDesc.window
  };
  // A window desc's s-th register (RegisterDesc.window): written by its Acc
  // at act k of iteration i (s = i (M - w) + k, M the Acc's acts per
  // iteration), read by a Source at act k + w of iteration i.
  int64_t WindowAct(const Desc& d, int64_t s, bool reader) const {
    const int64_t acts = tasks_[static_cast<size_t>(d.producer)].acts;
    const int64_t n = acts - d.window;
    return s / n * acts + s % n + (reader ? d.window : 0);
  }

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
    pairs_.emplace_back(static_cast<int32_t>(from_end ? End(from, from_act) : Start(from, from_act)),
                        static_cast<int32_t>(to_end ? End(to, to_act) : Start(to, to_act)));
  }

  // Registers per iteration of desc `d` (REPEAT and ACC follow their
  // input's), or -1 when the plan does not fit.
  int64_t PerIteration(int d, int depth) {
    Desc& desc = descs_[static_cast<size_t>(d)];
    if (desc.per_iteration != 0) return desc.per_iteration;
    if (depth > 64) return -1;
    const Task& p = tasks_[static_cast<size_t>(desc.producer)];
    if (desc.window > 0) {  // the Acc's micro-batches less the window
      if (p.kind != proto::ACTOR_KIND_ACC || p.consumed.size() != 1) return -1;
      const int64_t in = PerIteration(p.consumed[0], depth + 1);
      if (in <= desc.window) return -1;
      desc.per_iteration = in - desc.window;
      return desc.per_iteration;
    }
    int64_t r = PiecesPerIteration(*p.task);
    if (p.kind == proto::ACTOR_KIND_PARAMETER) r = 1;
    if (Relays(p.kind)) {
      // An Acc's produced descs after the first are its window descs.
      if (p.consumed.size() != 1 || p.produced.empty() || p.produced[0] != d || p.m < 1) return -1;
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
      d.window = desc.window();
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
        const int64_t window = descs_[static_cast<size_t>(d)].window;
        const int64_t wanted = window > 0                              ? t.acts - window
                               : Relays(t.kind)                        ? descs_[static_cast<size_t>(d)].per_iteration
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
    // Program order: start -> end -> next start. An asynchronous task
    // (Task.async_acts) starts (launches) act a + 1 possibly before act a
    // ended (completed on its stream): its starts are ordered, and its ends.
    // (But a Parameter: it emits the variable again only once its update
    // completed.)
    for (const Task& t : tasks_) {
      for (int64_t a = 0; a < kUnrolled * t.acts; ++a) {
        Edge(t, a, false, t, a, true);
        if (t.task->async_acts() && t.kind != proto::ACTOR_KIND_PARAMETER) {
          Edge(t, a, false, t, a + 1, false);
          Edge(t, a, true, t, a + 1, true);
        } else {
          Edge(t, a, true, t, a + 1, false);
        }
      }
    }
    for (size_t di = 0; di < descs_.size(); ++di) {
      const Desc& d = descs_[di];
      const Task& p = tasks_[static_cast<size_t>(d.producer)];
      const int64_t total = kUnrolled * d.per_iteration;
      for (int64_t s = 0; s < total && d.window > 0; ++s) {
        for (int c : d.consumers) {
          const Task& reader = tasks_[static_cast<size_t>(c)];
          if (reader.acts != p.acts) continue;  // (checked when the plan loads)
          Edge(p, WindowAct(d, s, false), true, reader, WindowAct(d, s, true), false);
          Edge(reader, WindowAct(d, s, true), true, p, WindowAct(d, s + d.quota, false), false);
        }
      }
      for (int64_t s = 0; s < total && d.window == 0; ++s) {
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
    std::vector<int32_t> indegree(static_cast<size_t>(events), 0);
    for (const auto& [from, to] : pairs_) {
      edges_[static_cast<size_t>(fill[static_cast<size_t>(from)]++)] = to;
      ++indegree[static_cast<size_t>(to)];
    }
    pairs_.clear();
    pairs_.shrink_to_fit();
    order_.reserve(static_cast<size_t>(events));
    for (int64_t v = 0; v < events; ++v) {
      if (indegree[static_cast<size_t>(v)] == 0) order_.push_back(static_cast<int32_t>(v));
    }
    for (size_t i = 0; i < order_.size(); ++i) {
      const int64_t v = order_[i];
      for (int64_t k = edge_start_[static_cast<size_t>(v)]; k < edge_start_[static_cast<size_t>(v) + 1]; ++k) {
        if (--indegree[static_cast<size_t>(edges_[static_cast<size_t>(k)])] == 0)
          order_.push_back(edges_[static_cast<size_t>(k)]);
      }
    }
    if (static_cast<int64_t>(order_.size()) != events) return "the unrolled acts form a cycle";
    position_.assign(order_.size(), 0);
    for (size_t p = 0; p < order_.size(); ++p) position_[static_cast<size_t>(order_[p])] = static_cast<int32_t>(p);
    // The edges again, by topological position (what Orders walks, in order).
    position_edge_start_.assign(order_.size() + 1, 0);
    position_edges_.resize(edges_.size());
    for (size_t p = 0; p < order_.size(); ++p) {
      const int64_t v = order_[p];
      int64_t k = position_edge_start_[p];
      for (int64_t e = edge_start_[static_cast<size_t>(v)]; e < edge_start_[static_cast<size_t>(v) + 1]; ++e) {
        position_edges_[static_cast<size_t>(k++)] = position_[static_cast<size_t>(edges_[static_cast<size_t>(e)])];
      }
      position_edge_start_[p + 1] = k;
    }
    std::vector<int32_t>().swap(edges_);
    std::vector<int64_t>().swap(edge_start_);
    task_of_event_.resize(static_cast<size_t>(events));
    for (size_t t = 0; t < tasks_.size(); ++t) {
      const int64_t end = tasks_[t].base + 2 * kUnrolled * tasks_[t].acts;
      for (int64_t e = tasks_[t].base; e < end; ++e) task_of_event_[static_cast<size_t>(e)] = static_cast<int32_t>(t);
    }
    return "";
  }

  const proto::Plan& plan_;
  std::string error_;
  std::vector<Task> tasks_;
  std::vector<Desc> descs_;
  // Events are below kMaxEvents (int32). While building: the edges, as
  // pairs, then by event (CSR); kept after: a topological order, each
  // event's position in it and its task, and the edges by position.
  std::vector<std::pair<int32_t, int32_t>> pairs_;
  std::vector<int64_t> edge_start_;
  std::vector<int32_t> edges_;
  std::vector<int32_t> order_;                      // [position]: the event there
  std::vector<int32_t> task_of_event_;              // [event]: its task (index into tasks_)
  std::vector<int32_t> position_;                   // [event]: its index in order_
  std::vector<int64_t> position_edge_start_;        // CSR by position: edges from order_[p] ...
  std::vector<int32_t> position_edges_;             // ... to these positions
};

// Whether blocks i and j (one device) may share bytes: within each iteration
// all of one's uses end before the other's begin, and the other's before the
// one's next iteration; or, with as many uses each, the two alternate use by
// use (one's use p, the other's use p, the one's use p + 1, ...).
bool MayShare(const std::vector<ProtocolModel::Block>& blocks, const ProtocolModel::OrderBits& bits, size_t i,
              size_t j) {
  // last(i, j): bits.last[j] at i (rows are the later block's).
  const size_t li = blocks[i].local, lj = blocks[j].local;
  if ((Bit(bits.last[j], li) && Bit(bits.wrap[i], lj)) || (Bit(bits.last[i], lj) && Bit(bits.wrap[j], li))) return true;
  if (blocks[i].uses != blocks[j].uses || blocks[i].uses < 2) return false;
  return (Bit(bits.same[j], li) && Bit(bits.step[i], lj)) || (Bit(bits.same[i], lj) && Bit(bits.step[j], li));
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
    if ((task.kind() != proto::ACTOR_KIND_COLLECTIVE && task.kind() != proto::ACTOR_KIND_COMPUTE) ||
        task.scratch_bytes() <= 0) {
      continue;
    }
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

// Transposes a 64 x 64 bit matrix in place: bit c of a[r] <-> bit r of a[c].
void Transpose64(uint64_t a[64]) {
  uint64_t m = 0x00000000FFFFFFFFULL;
  for (int j = 32; j != 0; j >>= 1, m ^= m << j) {
    for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {
      const uint64_t t = ((a[k] >> j) ^ a[k | j]) & m;
      a[k] ^= t << j;
      a[k | j] ^= t;
    }
  }
}

// Bit rows indexed [block][local index of a block of its device], as
// OrderBits holds them, transposed within each device (64 x 64 tiles).
std::vector<std::vector<uint64_t>> TransposedWithinDevices(const std::vector<std::vector<uint64_t>>& rows,
                                                           const std::map<DeviceKey, std::vector<size_t>>& on_device) {
  std::vector<std::vector<uint64_t>> out(rows.size());
  uint64_t tile[64];
  for (const auto& [device, members] : on_device) {
    const size_t n = members.size(), words = (n + 63) / 64;
    for (size_t i : members) out[i].assign(words, 0);
    for (size_t row_word = 0; row_word < words; ++row_word) {
      for (size_t col_word = 0; col_word < words; ++col_word) {
        for (size_t t = 0; t < 64; ++t) {
          const size_t r = row_word * 64 + t;
          tile[t] = r < n ? rows[members[r]][col_word] : 0;
        }
        Transpose64(tile);
        for (size_t t = 0; t < 64; ++t) {
          const size_t c = col_word * 64 + t;
          if (c < n) out[members[c]][row_word] = tile[t];
        }
      }
    }
  }
  return out;
}

// Clears wrap(i, j) where last(j, i) is clear (the only wrap bits MayShare
// reads are those whose last bit is set; WrapSources tests only those).
void MaskWraps(const std::vector<ProtocolModel::Block>& blocks, ProtocolModel::OrderBits& bits) {
  const std::vector<std::vector<uint64_t>> last_by_earlier =
      TransposedWithinDevices(bits.last, ProtocolModel::AnalysedByDevice(blocks, nullptr));
  for (size_t j = 0; j < blocks.size(); ++j) {
    for (size_t w = 0; w < bits.wrap[j].size(); ++w) bits.wrap[j][w] &= last_by_earlier[j][w];
  }
}

// The lifetime order bits of the `analysed` blocks (null: all): Orders of
// Sources, then the wrap walks WrapSources asks for given those. Nothing
// (and `work` the estimate that is over) when the walks would take more
// than `max_work` word operations.
std::optional<ProtocolModel::OrderBits> Analyse(const ProtocolModel& model,
                                                const std::vector<ProtocolModel::Block>& blocks,
                                                const std::vector<bool>* analysed, bool exhaustive, int64_t max_work,
                                                int64_t& work) {
  const auto first = model.Sources(blocks, analysed, exhaustive);
  work = model.Work(first);
  if (work > max_work) return std::nullopt;
  ProtocolModel::OrderBits bits = model.Orders(blocks, first);
  const auto wraps = model.WrapSources(blocks, analysed, bits, exhaustive);
  work = std::min(work + model.Work(wraps), INT64_MAX / 2);  // (each saturates at INT64_MAX / 2)
  if (work > max_work) return std::nullopt;
  model.Walk(blocks, wraps, bits);
  MaskWraps(blocks, bits);
  return bits;
}

absl::StatusOr<MemoryPlanResult> PlanMemory(proto::Plan& plan, const PlanMemoryOptions& options) {
  const int64_t max_work = options.max_analysis_work;
  for (auto& desc : *plan.mutable_register_descs()) desc.clear_arena_offset();
  plan.clear_arenas();
  for (auto& task : *plan.mutable_tasks()) {
    task.clear_scratch_offset();
    if (task.kind() == proto::ACTOR_KIND_COMPUTE) continue;  // its kernel's workspace, from the lowering
    std::optional<BoxingRoutine> routine;
    if (task.kind() == proto::ACTOR_KIND_COLLECTIVE) routine = RoutineOf(task);
    task.set_scratch_bytes(routine ? routine->ScratchBytes() : 0);
  }
  ASSIGN_OR_RETURN(std::vector<ProtocolModel::Block> blocks, Blocks(plan, false));
  MemoryPlanResult result;
  ProtocolModel::OrderBits bits;
  std::vector<bool> analysed;  // blocks that may share (kManyBlocks, kMinSharedBytes)
  if (!blocks.empty()) {
    ProtocolModel model(plan);
    result.unshared_reason = model.unsupported();
    if (result.unshared_reason.empty()) {
      model.Events(blocks);
      std::map<DeviceKey, size_t> per_device;
      for (const ProtocolModel::Block& b : blocks) ++per_device[b.device];
      for (const ProtocolModel::Block& b : blocks) {
        analysed.push_back(per_device[b.device] <= kManyBlocks || b.bytes >= kMinSharedBytes);
      }
      // Over budget: leave out the blocks of the most uses per iteration,
      // one use count at a time, until the analysis fits (or none is left).
      int64_t left_out = 0;
      for (;;) {
        int64_t work = 0;
        std::optional<ProtocolModel::OrderBits> found = Analyse(model, blocks, &analysed, false, max_work, work);
        if (found) {
          bits = std::move(*found);
          break;
        }
        int64_t most = 0;
        for (size_t i = 0; i < blocks.size(); ++i) {
          if (analysed[i]) most = std::max(most, blocks[i].uses);
        }
        if (most <= 1) {
          result.unshared_reason = StrCat("its lifetime analysis would take about ", work,
                                          " word operations, more than the budget of ", max_work);
          break;
        }
        for (size_t i = 0; i < blocks.size(); ++i) {
          if (analysed[i] && blocks[i].uses == most) {
            analysed[i] = false;
            ++left_out;
          }
        }
        result.partly_unshared_reason =
            StrCat(left_out, " blocks used ", most, " or more times an iteration got bytes of their own: ",
                   "analysing their lifetimes would take more than ", max_work, " word operations");
      }
    }
  }
  const bool share = result.unshared_reason.empty();
  std::map<DeviceKey, std::vector<size_t>> on_device;
  for (size_t i = 0; i < blocks.size(); ++i) on_device[blocks[i].device].push_back(i);
  // MayShare(b, j) for every j of b's device at once, word by word, from
  // rows of b alone: bits holds x(i, j) in row j, `by_earlier` in row i.
  ProtocolModel::OrderBits by_earlier;
  if (share) {
    by_earlier.last = TransposedWithinDevices(bits.last, on_device);
    by_earlier.wrap = TransposedWithinDevices(bits.wrap, on_device);
    by_earlier.same = TransposedWithinDevices(bits.same, on_device);
    by_earlier.step = TransposedWithinDevices(bits.step, on_device);
  }
  std::vector<uint64_t> shares;
  for (auto& [device, members] : on_device) {
    // The device's analysed blocks by their number of uses (alternating use
    // by use needs equal numbers); blocks left out of the analysis share
    // nothing, their bits meaning nothing.
    std::map<int64_t, std::vector<uint64_t>> with_uses;
    for (size_t i : members) {
      std::vector<uint64_t>& mask = with_uses[blocks[i].uses];
      mask.resize((members.size() + 63) / 64, 0);
      if (share && analysed[i]) mask[blocks[i].local / 64] |= uint64_t{1} << (blocks[i].local % 64);
    }
    std::vector<uint64_t> analysed_mask((members.size() + 63) / 64, 0);
    for (const auto& [uses, mask] : with_uses) {
      for (size_t w = 0; w < mask.size(); ++w) analysed_mask[w] |= mask[w];
    }
    // Largest first (ties: plan order), each at the lowest offset clear of
    // every placed block it may not share with.
    std::stable_sort(members.begin(), members.end(),
                     [&](size_t a, size_t b) { return blocks[a].bytes > blocks[b].bytes; });
    // Placed blocks by offset: the first gap is found walking them in order.
    std::vector<std::pair<int64_t, size_t>> placed;  // (offset, block), by offset
    int64_t arena = 0;
    for (size_t b : members) {
      if (share) {
        const std::vector<uint64_t>& equal = with_uses.at(blocks[b].uses);
        const bool alternate = blocks[b].uses >= 2;
        shares.assign(equal.size(), 0);
        for (size_t w = 0; analysed[b] && w < shares.size(); ++w) {
          shares[w] = (by_earlier.last[b][w] & bits.wrap[b][w]) | (bits.last[b][w] & by_earlier.wrap[b][w]);
          if (alternate) {
            shares[w] |= equal[w] & ((by_earlier.same[b][w] & bits.step[b][w]) |
                                     (bits.same[b][w] & by_earlier.step[b][w]));
          }
          shares[w] &= analysed_mask[w];
        }
      }
      int64_t offset = 0;
      for (const auto& [begin, other] : placed) {
        if (begin - offset >= blocks[b].bytes) break;
        if (share && Bit(shares, blocks[other].local)) continue;
        offset = std::max(offset, AlignUp(begin + blocks[other].bytes));
      }
      placed.insert(std::upper_bound(placed.begin(), placed.end(), std::pair<int64_t, size_t>(offset, SIZE_MAX)),
                    {offset, b});
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
          StrCat("the arena of node ", a.node(), " device ", a.device_index(), " has ", a.bytes(), " bytes"));
    if (!arenas.emplace(DeviceKey{a.node(), a.device_index()}, a.bytes()).second) {
      return absl::InvalidArgumentError(StrCat("two arenas for node ", a.node(), " device ", a.device_index()));
    }
  }
  // An arena is one device's memory, of one type (keyed by node and index,
  // registers of cpu:0 and cuda:0 would share storage allocated on one).
  std::map<DeviceKey, DeviceType> arena_types;
  const auto same_type = [&](uint64_t actor_id, const auto& where) -> absl::Status {
    const ActorId id = DecodeActorId(actor_id);
    const auto [it, first] = arena_types.emplace(DeviceOf(actor_id), id.device_type);
    if (!first && it->second != id.device_type) {
      return absl::InvalidArgumentError(StrCat(where(), " is on ", id.device().ToString(), ", but the arena of node ",
                                               id.node, " device ", id.device_index, " holds ",
                                               DeviceTypeName(it->second), " registers"));
    }
    return absl::OkStatus();
  };
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
    RETURN_IF_ERROR(same_type(desc.producer(), where));
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
    if (task.kind() != proto::ACTOR_KIND_COLLECTIVE && task.kind() != proto::ACTOR_KIND_COMPUTE &&
        (task.scratch_bytes() != 0 || task.has_scratch_offset())) {
      return absl::InvalidArgumentError(
          StrCat(where(), " has scratch, but only collectives and computes (their kernels' workspace) have any"));
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
    RETURN_IF_ERROR(same_type(task.actor_id(), where));
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
  // Only the overlapping blocks' lifetimes matter (the planner's budget
  // bounds the analysis of those it lets share).
  std::vector<bool> overlapping(blocks.size(), false);
  for (const auto& [a, b] : overlaps) overlapping[a] = overlapping[b] = true;
  int64_t work = 0;
  const std::optional<ProtocolModel::OrderBits> found =
      Analyse(model, blocks, &overlapping, false, kDefaultMaxAnalysisWork, work);
  if (!found) {
    return absl::FailedPreconditionError(
        StrCat(name(overlaps[0].first), " and ", name(overlaps[0].second),
               " share arena bytes, but checking the lifetimes of the plan's overlapping blocks would take about ",
               work, " word operations, more than the budget of ", kDefaultMaxAnalysisWork));
  }
  const ProtocolModel::OrderBits& bits = *found;
  for (const auto& [a, b] : overlaps) {
    if (!MayShare(blocks, bits, a, b)) {
      return absl::FailedPreconditionError(
          StrCat(name(a), " and ", name(b),
                 " share arena bytes, but the register protocol does not keep their lifetimes apart"));
    }
  }
  return absl::OkStatus();
}

namespace internal {

absl::StatusOr<std::vector<std::vector<uint64_t>>> LifetimeOrders(const proto::Plan& plan, bool exhaustive) {
  ASSIGN_OR_RETURN(std::vector<ProtocolModel::Block> blocks, Blocks(plan, false));
  ProtocolModel model(plan);
  if (!model.unsupported().empty()) return absl::FailedPreconditionError(model.unsupported());
  model.Events(blocks);
  int64_t work = 0;
  const std::optional<ProtocolModel::OrderBits> bits = Analyse(model, blocks, nullptr, exhaustive, INT64_MAX, work);
  std::vector<std::vector<uint64_t>> rows;
  for (const auto* kind : {&bits->last, &bits->wrap, &bits->same, &bits->step}) {
    rows.insert(rows.end(), kind->begin(), kind->end());
  }
  return rows;
}

absl::StatusOr<std::pair<int64_t, int64_t>> PeriodicBand(const proto::Plan& plan, int64_t uses) {
  ProtocolModel model(plan);
  if (!model.unsupported().empty()) return absl::FailedPreconditionError(model.unsupported());
  const auto band = model.PeriodicBand(uses);
  return std::pair<int64_t, int64_t>{band.first, band.last};
}

}  // namespace internal
}  // namespace tessera::comm
