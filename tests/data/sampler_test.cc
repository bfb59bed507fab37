// Samplers: each epoch a permutation, deterministic per (seed, epoch),
// layout-invariant rank shares, resumable at any iteration.
#include "data/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace tessera::data {
namespace {

std::vector<int64_t> Epoch(const GlobalSampler& sampler, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(sampler.num_samples()));
  sampler.SamplesAt(epoch * sampler.num_samples(), order);
  return order;
}

TEST(GlobalSamplerTest, EveryEpochIsAPermutation) {
  for (const int64_t n : {1, 2, 3, 4, 5, 16, 17, 100, 1000, 4097}) {
    const GlobalSampler sampler(n, /*seed=*/42, /*shuffle=*/true);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> order = Epoch(sampler, epoch);
      std::sort(order.begin(), order.end());
      std::vector<int64_t> identity(static_cast<size_t>(n));
      std::iota(identity.begin(), identity.end(), 0);
      EXPECT_EQ(order, identity) << "n=" << n << " epoch " << epoch;
    }
  }
}

TEST(GlobalSamplerTest, DeterministicPerSeedAndEpoch) {
  const GlobalSampler a(1000, 7, true);
  const GlobalSampler b(1000, 7, true);
  const GlobalSampler other_seed(1000, 8, true);
  EXPECT_EQ(Epoch(a, 0), Epoch(b, 0));
  EXPECT_EQ(Epoch(a, 5), Epoch(b, 5));
  EXPECT_NE(Epoch(a, 0), Epoch(a, 1));
  EXPECT_NE(Epoch(a, 0), Epoch(other_seed, 0));
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(Epoch(a, 0), identity);
  EXPECT_EQ(a.EpochOf(2999), 2);
}

TEST(GlobalSamplerTest, NoShuffleIsInOrderEveryEpoch) {
  const GlobalSampler sampler(5, 7, /*shuffle=*/false);
  std::vector<int64_t> order(12);
  sampler.SamplesAt(0, order);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1}));
}

// Where sample 0 lands over many epochs: uniform over the 10 positions
// (chi-square with 9 degrees of freedom; 40 is far in the tail, p < 1e-5).
TEST(GlobalSamplerTest, PositionsAreUniform) {
  constexpr int64_t kN = 10, kEpochs = 4000;
  const GlobalSampler sampler(kN, 3, true);
  std::vector<int64_t> counts(kN, 0);
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    const std::vector<int64_t> order = Epoch(sampler, epoch);
    ++counts[static_cast<size_t>(std::find(order.begin(), order.end(), 0) - order.begin())];
  }
  double chi_square = 0;
  const double expected = static_cast<double>(kEpochs) / kN;
  for (const int64_t count : counts) chi_square += (count - expected) * (count - expected) / expected;
  EXPECT_LT(chi_square, 40.0) << ::testing::PrintToString(counts);
}

TEST(GlobalSamplerTest, HugeDatasetsNeedNoMemory) {
  const int64_t n = int64_t{1} << 40;
  const GlobalSampler sampler(n, 11, true);
  std::vector<int64_t> seen;
  for (int64_t p = 5 * n; p < 5 * n + 1000; ++p) {
    const int64_t sample = sampler.SampleAt(p);
    ASSERT_GE(sample, 0);
    ASSERT_LT(sample, n);
    seen.push_back(sample);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
}

TEST(BatchLayoutTest, ValidationNamesTheField) {
  EXPECT_TRUE(ValidateBatchLayout({2, 3, 4}).ok());
  EXPECT_THAT(ValidateBatchLayout({0, 1, 1}).message(), ::testing::HasSubstr("micro_batch_size"));
  EXPECT_THAT(ValidateBatchLayout({1, 0, 1}).message(), ::testing::HasSubstr("num_micro_batches"));
  EXPECT_THAT(ValidateBatchLayout({1, 1, -2}).message(), ::testing::HasSubstr("data_parallel_size"));
}

// The samples of an iteration's global batch, by global row, as the ranks of
// `layout` read them.
std::vector<int64_t> GlobalBatchAsRead(const GlobalSampler& sampler, const BatchLayout& layout, int64_t iteration) {
  const int64_t b = layout.micro_batch_size;
  std::vector<int64_t> rows(static_cast<size_t>(layout.global_batch_size()), -1);
  for (int64_t k = 0; k < layout.num_micro_batches; ++k) {
    for (int64_t r = 0; r < layout.data_parallel_size; ++r) {
      const PositionRange range = RankPositions(layout, iteration, k, r);
      EXPECT_EQ(range.end - range.begin, b);
      std::vector<int64_t> samples(static_cast<size_t>(b));
      sampler.SamplesAt(range.begin, samples);
      // The engine's rows: micro-batch k is rows [k·b·dp, (k+1)·b·dp), rank r
      // its rows [r·b, (r+1)·b).
      const int64_t first_row = k * b * layout.data_parallel_size + r * b;
      for (int64_t j = 0; j < b; ++j) {
        EXPECT_EQ(rows[static_cast<size_t>(first_row + j)], -1) << "row read twice";
        rows[static_cast<size_t>(first_row + j)] = samples[static_cast<size_t>(j)];
      }
    }
  }
  return rows;
}

TEST(RankPositionsTest, EveryLayoutReadsTheSameGlobalBatch) {
  const GlobalSampler sampler(37, 5, true);
  const std::vector<BatchLayout> layouts = {{8, 1, 1}, {2, 1, 4}, {2, 2, 2}, {2, 4, 1},
                                            {1, 8, 1}, {4, 1, 2}, {1, 2, 4}};
  for (int64_t iteration = 0; iteration < 12; ++iteration) {
    std::vector<int64_t> expected(8);
    sampler.SamplesAt(iteration * 8, expected);
    for (const BatchLayout& layout : layouts) {
      EXPECT_EQ(GlobalBatchAsRead(sampler, layout, iteration), expected)
          << "b=" << layout.micro_batch_size << " m=" << layout.num_micro_batches << " dp=" << layout.data_parallel_size
          << " iteration " << iteration;
    }
  }
}

TEST(RankPositionsTest, ExplicitPositions) {
  const BatchLayout layout{3, 2, 2};  // G = 12
  EXPECT_EQ(RankPositions(layout, 0, 0, 0).begin, 0);
  EXPECT_EQ(RankPositions(layout, 0, 0, 1).begin, 3);
  EXPECT_EQ(RankPositions(layout, 0, 1, 0).begin, 6);
  EXPECT_EQ(RankPositions(layout, 2, 1, 1).begin, 24 + 6 + 3);
  EXPECT_EQ(RankPositions(layout, 2, 1, 1).end, 24 + 6 + 3 + 3);
  EXPECT_EQ(FirstPositionOfIteration(layout, 10), 120);
}

// Resuming: iterations 10..19 of a fresh sampler equal those of one that ran
// iterations 0..19, for every rank and micro-batch.
TEST(RankPositionsTest, ResumesMidEpoch) {
  const BatchLayout layout{3, 2, 2};
  const auto run = [&](const GlobalSampler& sampler, int64_t first, int64_t last) {
    std::vector<std::vector<int64_t>> batches;
    for (int64_t i = first; i <= last; ++i) {
      for (int64_t k = 0; k < layout.num_micro_batches; ++k) {
        for (int64_t r = 0; r < layout.data_parallel_size; ++r) {
          const PositionRange range = RankPositions(layout, i, k, r);
          std::vector<int64_t> samples(static_cast<size_t>(range.end - range.begin));
          sampler.SamplesAt(range.begin, samples);
          batches.push_back(samples);
        }
      }
    }
    return batches;
  };
  // 50 samples, 12 per iteration: iteration 10 starts mid-epoch (position 120).
  const GlobalSampler long_run(50, 9, true);
  const std::vector<std::vector<int64_t>> all = run(long_run, 0, 19);
  const GlobalSampler resumed(50, 9, true);
  const std::vector<std::vector<int64_t>> tail = run(resumed, 10, 19);
  ASSERT_EQ(tail.size(), all.size() / 2);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), all.begin() + static_cast<std::ptrdiff_t>(all.size() / 2)));
}

}  // namespace
}  // namespace tessera::data
