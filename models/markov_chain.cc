#include "models/markov_chain.h"

#include <algorithm>
#include <cmath>

#include "core/philox.h"
#include "core/status.h"
#include "core/strings.h"

namespace tessera::models {
namespace {

// Philox streams (the last counter word).
constexpr uint32_t kChainStream = 1;
constexpr uint32_t kSampleStream = 2;
constexpr int64_t kMaxSuccessors = 30;

double Uniform01(uint32_t bits) { return static_cast<double>(bits >> 8) * (1.0 / 16777216.0); }

}  // namespace

absl::Status MarkovChain::Validate(const Options& o, std::string_view prefix) {
  if (o.vocab_size < 2) return absl::InvalidArgumentError(StrCat(prefix, "vocab_size must be >= 2, got ", o.vocab_size));
  if (o.successors < 1 || o.successors > o.vocab_size || o.successors > kMaxSuccessors) {
    return absl::InvalidArgumentError(
        StrCat(prefix, "markov_successors must be in [1, min(vocab_size, ", kMaxSuccessors, ")], got ", o.successors));
  }
  return absl::OkStatus();
}

MarkovChain::MarkovChain(Options options) : options_(options) {
  const absl::Status valid = Validate(options_, "");
  TESSERA_CHECK(valid.ok(), std::string(valid.message()));
  const int64_t K = options_.successors;
  double total = 0;
  for (int64_t k = 0; k < K; ++k) total += std::ldexp(1.0, -static_cast<int>(k));
  double acc = 0;
  for (int64_t k = 0; k < K; ++k) {
    acc += std::ldexp(1.0, -static_cast<int>(k)) / total;
    cumulative_.push_back(acc);
  }
  cumulative_.back() = 1.0;
}

int64_t MarkovChain::Successor(int64_t v, int64_t k) const {
  // Successor j of v is the j-th distinct draw of v's stream.
  const PhiloxKey key = MakePhiloxKey(static_cast<uint64_t>(options_.seed));
  const auto V = static_cast<uint32_t>(options_.vocab_size);
  std::vector<int64_t> taken;
  uint32_t attempt = 0;
  while (true) {
    const auto r = Philox4x32(key, static_cast<uint32_t>(v), static_cast<uint32_t>(taken.size()), attempt++, kChainStream);
    const auto next = static_cast<int64_t>(r[0] % V);
    if (std::find(taken.begin(), taken.end(), next) != taken.end()) continue;
    if (static_cast<int64_t>(taken.size()) == k) return next;
    taken.push_back(next);
  }
}

std::vector<int64_t> MarkovChain::Sample(int64_t iteration, int64_t sample, int64_t length) const {
  const int64_t V = options_.vocab_size, K = options_.successors;
  const PhiloxKey key = MakePhiloxKey(static_cast<uint64_t>(options_.seed));
  // Draw t of the sample: Philox counter (t, sample, iteration, stream).
  auto draw = [&](int64_t t) {
    return Philox4x32(key, static_cast<uint32_t>(t), static_cast<uint32_t>(sample), static_cast<uint32_t>(iteration),
                      kSampleStream)[0];
  };
  std::vector<int64_t> tokens(static_cast<size_t>(std::max<int64_t>(length, 0)));
  if (tokens.empty()) return tokens;
  tokens[0] = static_cast<int64_t>(draw(0) % static_cast<uint32_t>(V));
  for (int64_t t = 1; t < length; ++t) {
    const double u = Uniform01(draw(t));
    int64_t k = 0;
    while (k + 1 < K && u >= cumulative_[static_cast<size_t>(k)]) ++k;
    tokens[static_cast<size_t>(t)] = Successor(tokens[static_cast<size_t>(t - 1)], k);
  }
  return tokens;
}

void MarkovChain::Fill(int64_t iteration, int64_t offset, const Tensor& out) const {
  const int64_t rows = out.shape()[0], T = out.shape()[1];
  int64_t* data = out.data<int64_t>();
  for (int64_t j = 0; j < rows; ++j) {
    const std::vector<int64_t> tokens = Sample(iteration, j, T + 1);
    for (int64_t t = 0; t < T; ++t) data[j * T + t] = tokens[static_cast<size_t>(t + offset)];
  }
}

}  // namespace tessera::models
