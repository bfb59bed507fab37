#include "data/bert_dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <span>
#include <utility>

#include "core/philox.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::data {
namespace {

// Philox stream ids ("tensor id" in the counter), so the chunking draws and
// the per-sample draws never share a counter.
constexpr uint32_t kChunkStream = 0xB0C0'0001u;
constexpr uint32_t kSampleStream = 0xB0C0'0002u;

// Sequential draws from Philox at (key = seed, counter = (index, stream, n)):
// the n-th block of four words of `index` in `stream`.
class RandomStream {
 public:
  RandomStream(uint64_t seed, uint64_t index, uint32_t stream)
      : key_(MakePhiloxKey(seed)), index_(index), stream_(stream) {}

  uint32_t Next32() {
    if (used_ == block_.size()) {
      block_ = PhiloxForElement(key_, index_, stream_, block_number_++);
      used_ = 0;
    }
    return block_[used_++];
  }
  uint64_t Next64() {
    const uint64_t high = Next32();
    return (high << 32) | Next32();
  }
  // Uniform in [0, n), n >= 1: the high word of a 64x64-bit product, whose
  // bias (n / 2^64) is far below anything measurable.
  int64_t Uniform(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(Next64()) * static_cast<uint64_t>(n)) >> 64);
  }
  // Uniform in [0, 1) with 53 bits.
  double Unit() { return static_cast<double>(Next64() >> 11) * 0x1p-53; }
  bool Coin() { return (Next32() & 1u) != 0; }

 private:
  PhiloxKey key_;
  uint64_t index_;
  uint32_t stream_;
  uint32_t block_number_ = 0;
  std::array<uint32_t, 4> block_{};
  size_t used_ = 4;
};

// A run of tokens of the token stream.
struct Segment {
  int64_t first = 0;
  int64_t length = 0;
};

absl::Status CheckProbability(double value, std::string_view name) {
  if (value >= 0.0 && value <= 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat("BERT dataset: ", name, " must be in [0, 1], got ", value));
}

}  // namespace

absl::StatusOr<BertSpecialIds> BertSpecialIds::FromTokenizer(const Tokenizer& tokenizer) {
  BertSpecialIds ids;
  for (const auto& [token, id] : {std::pair<std::string_view, int64_t*>{"[CLS]", &ids.cls},
                                  {"[SEP]", &ids.sep},
                                  {"[MASK]", &ids.mask},
                                  {"[PAD]", &ids.pad}}) {
    const std::optional<int64_t> found = tokenizer.SpecialId(token);
    if (!found) {
      return absl::NotFoundError(StrCat("the ", tokenizer.kind(), " tokenizer has no ", token, " token for BERT"));
    }
    *id = *found;
  }
  return ids;
}

absl::StatusOr<BertDataset> BertDataset::Make(const IndexedDataset& dataset, const BertDatasetOptions& options) {
  if (options.max_seq_length < 5) {
    return absl::InvalidArgumentError(
        StrCat("BERT dataset: max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]), got ", options.max_seq_length));
  }
  RETURN_IF_ERROR(CheckProbability(options.short_seq_prob, "short_seq_prob"));
  RETURN_IF_ERROR(CheckProbability(options.masked_lm_prob, "masked_lm_prob"));
  if (options.max_predictions_per_seq < 0) {
    return absl::InvalidArgumentError(
        StrCat("BERT dataset: max_predictions_per_seq must be >= 0, got ", options.max_predictions_per_seq));
  }
  if (options.vocab_size < 1) {
    return absl::InvalidArgumentError(StrCat("BERT dataset: vocab_size must be >= 1, got ", options.vocab_size));
  }
  const BertSpecialIds& ids = options.special_ids;
  for (const auto& [name, id] : {std::pair<std::string_view, int64_t>{"[CLS]", ids.cls},
                                 {"[SEP]", ids.sep},
                                 {"[MASK]", ids.mask},
                                 {"[PAD]", ids.pad}}) {
    if (id < 0 || id >= options.vocab_size) {
      return absl::InvalidArgumentError(
          StrCat("BERT dataset: ", name, " id ", id, " is outside the vocabulary [0, ", options.vocab_size, ")"));
    }
  }
  ASSIGN_OR_RETURN(const DocumentRange range, SplitDocuments(options.splits, dataset.num_documents(), options.split));

  BertDataset result(&dataset, options);
  const int64_t max_tokens = options.max_seq_length - 3;
  for (int64_t d = range.begin; d < range.end; ++d) {
    const int64_t first = dataset.document_begin(d);
    const int64_t end = dataset.document_begin(d + 1);
    if (first == end) continue;
    const int64_t rank = static_cast<int64_t>(result.documents_.size());
    result.documents_.push_back(d);
    RandomStream random(options.seed, static_cast<uint64_t>(d), kChunkStream);
    const auto draw_target = [&] {
      return random.Unit() < options.short_seq_prob ? 2 + random.Uniform(max_tokens - 1) : max_tokens;
    };
    int64_t target = draw_target();
    int64_t chunk_begin = first;
    int64_t length = 0;
    for (int64_t s = first; s < end; ++s) {
      length += dataset.sequence_length(s);
      if (s + 1 == end || length >= target) {
        result.chunks_.push_back(Chunk{chunk_begin, s + 1, rank, target});
        chunk_begin = s + 1;
        length = 0;
        target = draw_target();
      }
    }
  }
  const size_t needed = options.next_sentence ? 2 : 1;
  if (result.documents_.size() < needed) {
    return absl::FailedPreconditionError(
        StrCat("BERT dataset '", dataset.prefix().string(), "': split ", DatasetSplitName(options.split), " (splits '",
               options.splits, "') has ", result.documents_.size(), " documents with sentences; ",
               options.next_sentence ? "next-sentence prediction needs at least 2" : "masked LM needs at least 1"));
  }
  return result;
}

absl::Status BertDataset::Sample(int64_t index, BertSample* out) const {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(StrCat("BERT sample ", index, " is outside [0, ", size(), ")"));
  }
  const Chunk& chunk = chunks_[static_cast<size_t>(index)];
  const IndexedDataset& data = *dataset_;
  RandomStream random(options_.seed, static_cast<uint64_t>(index), kSampleStream);

  // Sequences are back to back in the token stream, so A and B (runs of
  // whole sentences) are each one contiguous segment.
  const int64_t num_sentences = chunk.end - chunk.begin;
  const bool pair = options_.next_sentence;
  const int64_t a_end = pair && num_sentences >= 2 ? chunk.begin + 1 + random.Uniform(num_sentences - 1) : chunk.end;
  Segment a{data.sequence_offset(chunk.begin), data.sequence_offset(a_end) - data.sequence_offset(chunk.begin)};
  Segment b;
  const bool random_next = pair && (num_sentences == 1 || random.Unit() < 0.5);
  if (!pair) {
    b = Segment{data.sequence_offset(chunk.end), 0};
  } else if (random_next) {
    int64_t other = random.Uniform(static_cast<int64_t>(documents_.size()) - 1);
    if (other >= chunk.document_rank) ++other;  // uniform over the other documents
    const int64_t document = documents_[static_cast<size_t>(other)];
    const int64_t first = data.document_begin(document);
    const int64_t end = data.document_begin(document + 1);
    const int64_t start = first + random.Uniform(end - first);
    const int64_t target_b = chunk.target_length - a.length;
    int64_t stop = start;
    while (stop < end) {
      ++stop;
      if (data.sequence_offset(stop) - data.sequence_offset(start) >= target_b) break;
    }
    b = Segment{data.sequence_offset(start), data.sequence_offset(stop) - data.sequence_offset(start)};
  } else {
    b = Segment{data.sequence_offset(a_end), data.sequence_offset(chunk.end) - data.sequence_offset(a_end)};
  }

  const int64_t max_tokens = options_.max_seq_length - (pair ? 3 : 2);
  while (a.length + b.length > max_tokens) {
    Segment& longer = a.length > b.length ? a : b;
    if (random.Coin()) ++longer.first;
    --longer.length;
  }

  const int64_t s = options_.max_seq_length;
  const BertSpecialIds& ids = options_.special_ids;
  out->tokens.assign(static_cast<size_t>(s), ids.pad);
  out->token_types.assign(static_cast<size_t>(s), 0);
  out->padding_mask.assign(static_cast<size_t>(s), 0);
  out->labels.assign(static_cast<size_t>(s), options_.ignore_label);
  out->nsp_label = random_next ? 1 : 0;
  std::span<int64_t> tokens(out->tokens);
  const int64_t b_start = a.length + 2;  // position of B's first token
  const int64_t used = pair ? b_start + b.length + 1 : b_start;
  tokens[0] = ids.cls;
  data.ReadTokens(a.first, tokens.subspan(1, static_cast<size_t>(a.length)));
  RETURN_IF_ERROR(data.CheckIds(a.first, tokens.subspan(1, static_cast<size_t>(a.length)), options_.vocab_size));
  tokens[static_cast<size_t>(a.length + 1)] = ids.sep;
  if (pair) {
    data.ReadTokens(b.first, tokens.subspan(static_cast<size_t>(b_start), static_cast<size_t>(b.length)));
    RETURN_IF_ERROR(data.CheckIds(b.first, tokens.subspan(static_cast<size_t>(b_start), static_cast<size_t>(b.length)),
                                  options_.vocab_size));
    tokens[static_cast<size_t>(used - 1)] = ids.sep;
    std::fill_n(out->token_types.begin() + b_start, b.length + 1, 1);
  }
  std::fill_n(out->padding_mask.begin(), used, 1);

  // Masked LM over the non-special positions: a partial Fisher–Yates shuffle
  // picks the positions, then each draws its replacement.
  const int64_t num_candidates = a.length + b.length;
  int64_t num_to_predict = static_cast<int64_t>(std::nearbyint(options_.masked_lm_prob * num_candidates));
  if (options_.masked_lm_prob > 0 && num_candidates > 0) num_to_predict = std::max<int64_t>(num_to_predict, 1);
  if (options_.max_predictions_per_seq > 0) num_to_predict = std::min(num_to_predict, options_.max_predictions_per_seq);
  std::vector<int64_t> candidates(static_cast<size_t>(num_candidates));
  for (int64_t k = 0; k < num_candidates; ++k) candidates[static_cast<size_t>(k)] = k < a.length ? 1 + k : 2 + k;
  for (int64_t k = 0; k < num_to_predict; ++k) {
    const int64_t pick = k + random.Uniform(num_candidates - k);
    std::swap(candidates[static_cast<size_t>(k)], candidates[static_cast<size_t>(pick)]);
    const size_t position = static_cast<size_t>(candidates[static_cast<size_t>(k)]);
    out->labels[position] = tokens[position];
    const double roll = random.Unit();
    if (roll < 0.8) {
      tokens[position] = ids.mask;
    } else if (roll < 0.9) {
      tokens[position] = random.Uniform(options_.vocab_size);
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::data
