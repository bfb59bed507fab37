#include "data/sampler.h"

#include <array>
#include <bit>

#include "core/philox.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::data {
namespace {

// Luby–Rackoff: 4 rounds of a pseudorandom function already give a strong
// pseudorandom permutation; 2 more are margin for the tiny domains (a few
// bits per half) where each round mixes little.
constexpr uint32_t kFeistelRounds = 6;
// Philox counters are (element, element, tensor id, step) elsewhere
// (core/philox.h); the sampler puts this tag plus the round where tensor ids
// go, so its draws never coincide with a tensor's.
constexpr uint32_t kSamplerStream = 0xDA7A'0000u;

}  // namespace

GlobalSampler::GlobalSampler(int64_t num_samples, uint64_t seed, bool shuffle)
    : num_samples_(num_samples), seed_(seed), shuffle_(shuffle) {
  TESSERA_CHECK(num_samples >= 1, "a sampler needs at least one sample, got ", num_samples);
  // Bits to hold N - 1, rounded up to an even count so both halves are equal.
  const int bits = std::bit_width(static_cast<uint64_t>(num_samples - 1));
  half_bits_ = (bits + 1) / 2;
}

uint64_t GlobalSampler::Permute(uint64_t value, uint64_t epoch) const {
  const PhiloxKey key = MakePhiloxKey(seed_);
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = value >> half_bits_;
  uint64_t right = value & mask;
  for (uint32_t round = 0; round < kFeistelRounds; ++round) {
    const std::array<uint32_t, 4> bits = Philox4x32(key, static_cast<uint32_t>(right), static_cast<uint32_t>(epoch),
                                                    kSamplerStream + round, static_cast<uint32_t>(epoch >> 32));
    const uint64_t mixed = ((uint64_t{bits[1]} << 32) | bits[0]) & mask;
    const uint64_t next_right = left ^ mixed;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

int64_t GlobalSampler::SampleAt(int64_t position) const {
  TESSERA_CHECK(position >= 0, "negative sampler position ", position);
  const int64_t index = position % num_samples_;
  if (!shuffle_ || num_samples_ == 1) return index;
  const uint64_t epoch = static_cast<uint64_t>(position / num_samples_);
  // Cycle walking: the Feistel network permutes [0, 2^(2h)); following its
  // cycle from `index` until it re-enters [0, N) permutes [0, N).
  uint64_t value = static_cast<uint64_t>(index);
  do {
    value = Permute(value, epoch);
  } while (value >= static_cast<uint64_t>(num_samples_));
  return static_cast<int64_t>(value);
}

void GlobalSampler::SamplesAt(int64_t first, std::span<int64_t> out) const {
  for (size_t k = 0; k < out.size(); ++k) out[k] = SampleAt(first + static_cast<int64_t>(k));
}

absl::Status ValidateBatchLayout(const BatchLayout& layout) {
  const auto check = [](int64_t value, std::string_view name) {
    return value >= 1 ? absl::OkStatus()
                      : absl::InvalidArgumentError(StrCat("batch layout: ", name, " must be >= 1, got ", value));
  };
  RETURN_IF_ERROR(check(layout.micro_batch_size, "micro_batch_size"));
  RETURN_IF_ERROR(check(layout.num_micro_batches, "num_micro_batches"));
  return check(layout.data_parallel_size, "data_parallel_size");
}

PositionRange RankPositions(const BatchLayout& layout, int64_t iteration, int64_t micro_batch, int64_t rank) {
  TESSERA_CHECK(ValidateBatchLayout(layout).ok(), "invalid batch layout");
  TESSERA_CHECK(iteration >= 0, "iteration ", iteration);
  TESSERA_CHECK(micro_batch >= 0 && micro_batch < layout.num_micro_batches, "micro-batch ", micro_batch, " of ",
                layout.num_micro_batches);
  TESSERA_CHECK(rank >= 0 && rank < layout.data_parallel_size, "rank ", rank, " of ", layout.data_parallel_size);
  const int64_t b = layout.micro_batch_size;
  const int64_t begin =
      FirstPositionOfIteration(layout, iteration) + micro_batch * b * layout.data_parallel_size + rank * b;
  return PositionRange{begin, begin + b};
}

}  // namespace tessera::data
