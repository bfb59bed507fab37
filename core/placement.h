#pragma once
// Placement: the devices a global tensor or an op lives on — one device type,
// a list of global ranks, and a hierarchy (mesh) over them, e.g. ranks 0..7
// as [2, 4]. parallel_id i is the i-th rank in row-major mesh order.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace tessera {

class Placement {
 public:
  // The most devices one placement holds (a bound on what a text or a
  // hierarchy may ask a vector of).
  static constexpr int64_t kMaxDevices = int64_t{1} << 20;
  // Validates that hierarchy's product equals ranks.size() and ranks are
  // distinct and non-negative.
  static absl::StatusOr<Placement> Create(DeviceType type, std::vector<int64_t> ranks,
                                          std::vector<int64_t> hierarchy);
  // ranks 0..n-1 as a flat [n] mesh.
  static Placement Range(DeviceType type, int64_t n);

  DeviceType device_type() const { return type_; }
  const std::vector<int64_t>& ranks() const { return ranks_; }
  const std::vector<int64_t>& hierarchy() const { return hierarchy_; }
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  int64_t rank(int64_t parallel_id) const { return ranks_[static_cast<size_t>(parallel_id)]; }
  // Mesh coordinates of a parallel id (row-major).
  std::vector<int64_t> Coordinates(int64_t parallel_id) const;
  // parallel id of `rank`, or -1 when the rank is not in the placement.
  int64_t ParallelIdOf(int64_t rank) const;

  // "cpu:{0,1,2,3}@[2,2]"
  std::string ToString() const;
  bool operator==(const Placement&) const = default;

 private:
  Placement(DeviceType type, std::vector<int64_t> ranks, std::vector<int64_t> hierarchy)
      : type_(type), ranks_(std::move(ranks)), hierarchy_(std::move(hierarchy)) {}

  DeviceType type_;
  std::vector<int64_t> ranks_;
  std::vector<int64_t> hierarchy_;
};

// Parses "cpu:0-3", "cuda:0,2,4,6", with an optional "@[2,2]" hierarchy
// (at most kMaxDevices ranks).
absl::StatusOr<Placement> ParsePlacement(std::string_view text);

}  // namespace tessera
