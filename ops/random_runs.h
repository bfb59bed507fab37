#pragma once
// The runs of consecutive global indices a shard's elements form, for the
// random kernels that draw by each element's index in the logical tensor
// (ops/cpu/random.cc, ops/cuda/random.cc).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/sbp.h"

namespace tessera::ops {

// Where a local tensor's elements sit in the logical row-major order
// (random ops draw by global index: ops/cpu/random.cc): local element p is element p % run_length of run
// p / run_length, and run r starts at global index RunStart(r).
class GlobalIndexer {
 public:
  explicit GlobalIndexer(const TensorSlice& slice) {
    const int rank = slice.logical.rank();
    const std::vector<int64_t> strides = slice.logical.Strides();
    // The run spans axes [outer_rank_, rank): the trailing axes held whole and
    // the first one (from the inside) held in part.
    outer_rank_ = rank;
    run_length_ = 1;
    while (outer_rank_ > 0) {
      --outer_rank_;
      run_length_ *= slice.local[outer_rank_];
      if (slice.local[outer_rank_] != slice.logical[outer_rank_]) break;
    }
    base_ = 0;
    for (int axis = 0; axis < rank; ++axis) {
      base_ += slice.offset[static_cast<size_t>(axis)] * strides[static_cast<size_t>(axis)];
    }
    for (int axis = 0; axis < outer_rank_; ++axis) {
      outer_local_.push_back(slice.local[axis]);
      outer_strides_.push_back(strides[static_cast<size_t>(axis)]);
    }
  }

  int outer_rank() const { return outer_rank_; }
  int64_t run_length() const { return run_length_; }
  int64_t base() const { return base_; }
  const std::vector<int64_t>& outer_local() const { return outer_local_; }
  const std::vector<int64_t>& outer_strides() const { return outer_strides_; }

  int64_t RunStart(int64_t run) const {
    int64_t start = base_;
    for (int axis = outer_rank_ - 1; axis >= 0; --axis) {
      const size_t a = static_cast<size_t>(axis);
      start += (run % outer_local_[a]) * outer_strides_[a];
      run /= outer_local_[a];
    }
    return start;
  }

  // Calls fn(local_begin, global_begin, length) for each piece of local
  // elements [begin, end) with consecutive global indices.
  template <typename Fn>
  void ForEachRun(int64_t begin, int64_t end, Fn&& fn) const {
    for (int64_t p = begin; p < end;) {
      const int64_t within = p % run_length_;
      const int64_t length = std::min(end - p, run_length_ - within);
      fn(p, RunStart(p / run_length_) + within, length);
      p += length;
    }
  }

 private:
  int outer_rank_ = 0;
  int64_t run_length_ = 1;
  int64_t base_ = 0;  // global index of the local element 0
  std::vector<int64_t> outer_local_, outer_strides_;
};

}  // namespace tessera::ops
