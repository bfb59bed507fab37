#include "core/boxing_cost.h"

#include <limits>

#include "core/dtype.h"
#include "core/status.h"

namespace tessera {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

double LogicalBytes(const TensorMeta& logical) {
  return static_cast<double>(logical.shape.NumElements()) * static_cast<double>(DTypeSize(logical.dtype));
}

bool SplitsAxis(const Sbp& sbp, int tensor_axis) { return sbp.is_split() && sbp.axis() == tensor_axis; }

// Whether converting hierarchy axis `a` of `state` from x to y is a 1-D boxing
// of the axis group's common block: no inner axis may split a tensor axis that
// x or y splits, else the inner pieces move with the outer conversion.
bool AxisLocal(const NdSbp& state, size_t a, const Sbp& x, const Sbp& y) {
  for (size_t b = a + 1; b < state.size(); ++b) {
    if (!state[b].is_split()) continue;
    if (SplitsAxis(x, state[b].axis()) || SplitsAxis(y, state[b].axis())) return false;
  }
  return true;
}

// Bytes each rank sends converting axis `a` of `state` from x to y, on the
// axis group's block estimated without the uneven remainders (so that the
// cost is the same on every rank).
double StepCost(double logical_bytes, const std::vector<int64_t>& hierarchy, const NdSbp& state, size_t a,
                const Sbp& x, const Sbp& y) {
  double block = logical_bytes;
  for (size_t b = 0; b < state.size(); ++b) {
    if (b != a && state[b].is_split()) block /= static_cast<double>(hierarchy[b]);
  }
  return AxisBoxingCost(block, x, y, hierarchy[a]);
}

void AddUnique(std::vector<Sbp>& values, const Sbp& sbp) {
  for (const Sbp& v : values) {
    if (v == sbp) return;
  }
  values.push_back(sbp);
}

// The cheapest sequence of states from `from` to `to` in which each step
// changes one hierarchy axis to one of its candidates by a valid, axis-local
// conversion (Dijkstra over every combination of candidates; a handful of
// axes with at most three candidates each). Each step also costs one byte so
// that fewer steps win ties; ties go to the lowest state index. Empty when
// there is none.
std::vector<NdSbp> CheapestPath(double logical_bytes, const NdSbp& from, const NdSbp& to,
                                const std::vector<int64_t>& hierarchy,
                                const std::vector<std::vector<Sbp>>& candidates) {
  const size_t n = candidates.size();
  size_t count = 1;
  for (const auto& c : candidates) count *= c.size();
  auto decode = [&](size_t index) {
    NdSbp state;
    for (size_t a = n; a-- > 0;) {
      state.insert(state.begin(), candidates[a][index % candidates[a].size()]);
      index /= candidates[a].size();
    }
    return state;
  };
  auto encode = [&](const NdSbp& state) {
    size_t index = 0;
    for (size_t a = 0; a < n; ++a) {
      size_t k = 0;
      while (!(candidates[a][k] == state[a])) ++k;
      index = index * candidates[a].size() + k;
    }
    return index;
  };
  const size_t source = encode(from);
  const size_t target = encode(to);
  std::vector<double> distance(count, kInfinity);
  std::vector<size_t> previous(count, count);
  std::vector<bool> settled(count, false);
  distance[source] = 0;
  for (;;) {
    size_t u = count;
    for (size_t i = 0; i < count; ++i) {
      if (!settled[i] && distance[i] < kInfinity && (u == count || distance[i] < distance[u])) u = i;
    }
    if (u == count || u == target) break;
    settled[u] = true;
    const NdSbp state = decode(u);
    for (size_t a = 0; a < n; ++a) {
      for (const Sbp& y : candidates[a]) {
        const Sbp& x = state[a];
        if (x == y || !AxisConversionError(x, y).empty() || !AxisLocal(state, a, x, y)) continue;
        NdSbp next = state;
        next[a] = y;
        if (MixesPartials(next)) continue;
        const size_t v = encode(next);
        const double d = distance[u] + StepCost(logical_bytes, hierarchy, state, a, x, y) + 1;
        if (d < distance[v]) {
          distance[v] = d;
          previous[v] = u;
        }
      }
    }
  }
  if (distance[target] == kInfinity) return {};
  std::vector<NdSbp> path;
  for (size_t v = target; v != count; v = previous[v]) path.insert(path.begin(), decode(v));
  return path;
}

}  // namespace

double AxisBoxingCost(double block_bytes, const Sbp& from, const Sbp& to, int64_t p) {
  if (from == to || p <= 1) return 0;
  const double n = static_cast<double>(p);
  if (from.is_partial()) {
    if (to.is_broadcast()) return 2 * block_bytes * (n - 1) / n;  // all-reduce
    if (to.is_split()) return block_bytes * (n - 1) / n;          // reduce-scatter
    return 0;  // the other partial kind: not one step (routes go through B)
  }
  if (from.is_split()) {
    if (to.is_broadcast()) return block_bytes * (n - 1) / n;    // all-gather
    if (to.is_split()) return block_bytes * (n - 1) / (n * n);  // all-to-all
    return 0;                                                   // local: fill outside the shard
  }
  return 0;  // from B: slice, or keep; no communication
}

std::string AxisConversionError(const Sbp& x, const Sbp& y) {
  if (x == y) return "";
  if (x.is_partial_max()) {
    return y.is_partial_sum() ? "P(max) converts only to B, S(i) or P(max)" : "";
  }
  if (y.is_partial_max()) return "only P(max) converts to P(max), not " + x.ToString();
  return "";
}

bool MixesPartials(const NdSbp& nd_sbp) {
  bool sum = false, max = false;
  for (const Sbp& s : nd_sbp) {
    sum = sum || s.is_partial_sum();
    max = max || s.is_partial_max();
  }
  return sum && max;
}

std::optional<BoxingRoute> ChooseBoxingRoute(const TensorMeta& logical, const NdSbp& from, const NdSbp& to,
                                             const std::vector<int64_t>& hierarchy) {
  TESSERA_CHECK(from.size() == hierarchy.size() && to.size() == hierarchy.size(), "layouts ", NdSbpToString(from),
                " and ", NdSbpToString(to), " over a hierarchy of ", hierarchy.size(), " axes");
  BoxingRoute route;
  if (from == to) {
    route.states = {from};
    return route;
  }
  const double bytes = LogicalBytes(logical);
  // Axis by axis first (each axis only ever from[a] or to[a]); else through B.
  const size_t n = hierarchy.size();
  std::vector<std::vector<Sbp>> direct(n), general(n);
  for (size_t a = 0; a < n; ++a) {
    AddUnique(direct[a], from[a]);
    AddUnique(direct[a], to[a]);
    general[a] = direct[a];
    AddUnique(general[a], Sbp::Broadcast());
  }
  route.states = CheapestPath(bytes, from, to, hierarchy, direct);
  if (route.states.empty()) {
    route.axis_by_axis = false;
    route.states = CheapestPath(bytes, from, to, hierarchy, general);
    if (route.states.empty()) return std::nullopt;
  }
  for (size_t i = 0; i + 1 < route.states.size(); ++i) {
    size_t a = 0;
    while (route.states[i][a] == route.states[i + 1][a]) ++a;
    route.cost += StepCost(bytes, hierarchy, route.states[i], a, route.states[i][a], route.states[i + 1][a]);
  }
  return route;
}

double BoxingCost(const TensorMeta& logical, const NdSbp& from, const NdSbp& to, const std::vector<int64_t>& hierarchy,
                  bool same_placement) {
  if (!same_placement) return LogicalBytes(logical);
  const std::optional<BoxingRoute> route = ChooseBoxingRoute(logical, from, to, hierarchy);
  return route.has_value() ? route->cost : kInfinity;
}

}  // namespace tessera
