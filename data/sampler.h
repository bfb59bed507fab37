#pragma once
// The order in which a job reads its samples (DESIGN §4, §11).
//
// Layout invariance: the order is defined once, globally, over positions
//   p = iteration · global_batch + row
// (row: the row of the iteration's global batch), never per rank. A layout
// only decides which rows a rank reads (RankPositions), so every parallel
// configuration trains on the same samples in the same order, and resuming
// at iteration i needs nothing but i: position i · global_batch.
//
// Positions run through epochs back to back: epoch e = p / N covers positions
// [e·N, (e+1)·N) and maps them through a permutation of [0, N) drawn from
// (seed, e). The permutation is a keyed bijection, not a shuffled array: a
// balanced Feistel network (6 rounds, Philox4x32 as the round function keyed
// by the seed, counter (half, epoch, stream tag + round)) over the smallest
// 2^(2h) >= N, restricted to [0, N) by cycle walking (re-applying it until the
// value lands below N; under 4 applications on average since 2^(2h) < 4N).
// So SampleAt is O(1) time and the sampler O(1) memory whatever N, and any
// position can be read first.

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace tessera::data {

// The global order of samples. Thread-safe (immutable); cheap to copy.
class GlobalSampler {
 public:
  // num_samples >= 1 (a precondition: a dataset with no samples fails when
  // it is made). Without `shuffle` the order is 0, 1, ..., N-1 every epoch
  // (evaluation).
  GlobalSampler(int64_t num_samples, uint64_t seed, bool shuffle);

  int64_t num_samples() const { return num_samples_; }
  // The sample at global position p >= 0.
  int64_t SampleAt(int64_t position) const;
  // The epoch that position p falls in.
  int64_t EpochOf(int64_t position) const { return position / num_samples_; }
  // SampleAt for positions [first, first + out.size()).
  void SamplesAt(int64_t first, std::span<int64_t> out) const;

 private:
  uint64_t Permute(uint64_t value, uint64_t epoch) const;

  int64_t num_samples_;
  uint64_t seed_;
  bool shuffle_;
  int half_bits_ = 0;  // h: the Feistel domain is 2^(2h) values
};

// How a global batch is cut: rows per rank per micro-batch (b), micro-batches
// per iteration (m, gradient accumulation) and data-parallel ranks (dp).
// As train/engine.h describes, micro-batch k of an iteration is rows
// [k·b·dp, (k+1)·b·dp) of its global batch, and data-parallel rank r takes
// rows [r·b, (r+1)·b) of each micro-batch.
struct BatchLayout {
  int64_t micro_batch_size = 1;    // b
  int64_t num_micro_batches = 1;   // m
  int64_t data_parallel_size = 1;  // dp
  int64_t global_batch_size() const { return micro_batch_size * num_micro_batches * data_parallel_size; }
};

// InvalidArgument naming the field when b, m or dp is < 1.
[[nodiscard]] absl::Status ValidateBatchLayout(const BatchLayout& layout);

// Global positions [begin, end) (b of them, contiguous).
struct PositionRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The positions data-parallel rank `rank` reads for micro-batch `micro_batch`
// of iteration `iteration`: iteration · G + k·b·dp + r·b + [0, b), with G the
// global batch size. Preconditions (checked): a valid layout, iteration >= 0,
// 0 <= micro_batch < m, 0 <= rank < dp.
PositionRange RankPositions(const BatchLayout& layout, int64_t iteration, int64_t micro_batch, int64_t rank);

// The first position of iteration i, i.e. where a job resumed at iteration i
// starts reading: i · G.
inline int64_t FirstPositionOfIteration(const BatchLayout& layout, int64_t iteration) {
  return iteration * layout.global_batch_size();
}

}  // namespace tessera::data
