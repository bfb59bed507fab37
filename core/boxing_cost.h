#pragma once
// The cost of converting a global tensor from one nd-SBP to another
// (DESIGN.md §7), and the route that conversion takes. One model for both
// users: SBP inference (scheduler/sbp_infer.h) chooses layouts by
// BoxingCost, and boxing (comm/collective/boxing.h) runs the route
// ChooseBoxingRoute picks — so the cost the scheduler plans with is the cost
// of the routine that runs.
//
// Cost = bytes each rank sends, ring algorithms. On one hierarchy axis of p
// devices, T = the logical bytes of the block the axis' group shares:
//   X -> X         0               B -> S(i)      0 (local slice)
//   B -> P         0 (keep)        S(i) -> P      0 (zeros outside the shard)
//   S(i) -> B      T(p−1)/p        P -> S(i)      T(p−1)/p
//   P -> B         2T(p−1)/p       S(i) -> S(j)   T(p−1)/p²
//   P(max) costs as P.
// nd-SBP: the sum over the steps of the chosen route, each converting one
// axis on its group's block (the whole logical tensor divided by the devices
// of the other axes that split it at that step). Across placements (a
// pipeline transfer): the whole logical tensor, whatever the layouts.
// Pure functions; thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/sbp.h"
#include "core/tensor.h"

namespace tessera {

// One axis' row of the table above: `block_bytes` = T, `p` devices.
double AxisBoxingCost(double block_bytes, const Sbp& from, const Sbp& to, int64_t p);

// Why `x -> y` on one axis is not a conversion boxing does, or "" when it is
// (only P(max) converts to P(max); P(max) converts only to B, S(i), P(max)).
std::string AxisConversionError(const Sbp& x, const Sbp& y);
// Whether `nd_sbp` has both P and P(max) entries (no routine holds those).
bool MixesPartials(const NdSbp& nd_sbp);

// The route of a conversion: states from `from` to `to`, each step changing
// one hierarchy axis by a conversion boxing does on that axis' group alone
// ("axis-local": no inner axis splits a tensor axis that the step splits or
// gathers).
struct BoxingRoute {
  std::vector<NdSbp> states;  // states.front() == from, states.back() == to; one state when equal
  bool axis_by_axis = true;   // each axis only ever from[a] or to[a]; false: via B entries
  double cost = 0;            // bytes each rank sends, summed over the steps
};

// The route boxing takes: the cheapest axis-by-axis one if any exists, else
// the cheapest through intermediate states whose axes take values from
// {from[a], to[a], B}. Among equal costs fewer steps win, then the lowest
// state in a fixed order, so every rank gets the same route. nullopt when no
// route exists. `from`, `to` and `hierarchy` must have the same size.
std::optional<BoxingRoute> ChooseBoxingRoute(const TensorMeta& logical, const NdSbp& from, const NdSbp& to,
                                             const std::vector<int64_t>& hierarchy);

// Bytes each rank sends to turn `from` into `to` over `hierarchy`: the
// chosen route's cost on one placement, the logical bytes across placements;
// infinity when no route exists.
double BoxingCost(const TensorMeta& logical, const NdSbp& from, const NdSbp& to, const std::vector<int64_t>& hierarchy,
                  bool same_placement = true);

}  // namespace tessera
