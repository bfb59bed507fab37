// BERT dataset: sample structure, NSP pairs, truncation, masking rates, and
// determinism per (seed, index).
#include "data/bert_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "tests/data/dataset_test_util.h"

namespace tessera::data {
namespace {

using testing::BuildCorpus;
using testing::ByteTokenizer;
using testing::Corpus;
using ::testing::HasSubstr;
using testing::ScratchDir;

constexpr int64_t kPad = 0, kCls = 1, kSep = 2, kMask = 3;
// Token t of document d is kBase + d·kStride + (its position in d), so any
// token says where it came from; the vocabulary holds every document's
// (at most 300 here).
constexpr int64_t kBase = 100, kStride = 500;
constexpr int64_t kVocab = kBase + 300 * kStride;

struct Origin {
  int64_t document;
  int64_t position;
};
Origin OriginOf(int64_t token) { return {(token - kBase) / kStride, (token - kBase) % kStride}; }

// Documents of `min_sentences`..`max_sentences` sentences of 1..max_length tokens.
Corpus MakeCorpus(int num_documents, int min_sentences, int max_sentences, int max_length, uint32_t seed) {
  std::mt19937 random(seed);
  Corpus corpus(static_cast<size_t>(num_documents));
  for (int d = 0; d < num_documents; ++d) {
    int64_t position = 0;
    const int sentences = min_sentences + static_cast<int>(random() % (max_sentences - min_sentences + 1));
    for (int s = 0; s < sentences; ++s) {
      std::vector<int64_t> sentence(1 + random() % max_length);
      for (int64_t& token : sentence) token = kBase + d * kStride + position++;
      corpus[static_cast<size_t>(d)].push_back(sentence);
    }
  }
  return corpus;
}

BertDatasetOptions Options(int64_t max_seq_length) {
  BertDatasetOptions options;
  options.max_seq_length = max_seq_length;
  options.splits = "1";
  options.special_ids = {kCls, kSep, kMask, kPad};
  options.vocab_size = kVocab;
  options.seed = 17;
  return options;
}

// A sample with its masked tokens restored, cut into A and B.
struct Pair {
  std::vector<int64_t> a, b;
};

Pair Parse(const BertSample& sample, const BertDatasetOptions& options) {
  const size_t s = static_cast<size_t>(options.max_seq_length);
  EXPECT_EQ(sample.tokens.size(), s);
  EXPECT_EQ(sample.token_types.size(), s);
  EXPECT_EQ(sample.padding_mask.size(), s);
  EXPECT_EQ(sample.labels.size(), s);
  std::vector<int64_t> original = sample.tokens;
  for (size_t k = 0; k < s; ++k) {
    if (sample.labels[k] != options.ignore_label) original[k] = sample.labels[k];
  }
  const size_t used = static_cast<size_t>(std::count(sample.padding_mask.begin(), sample.padding_mask.end(), 1));
  for (size_t k = 0; k < s; ++k) {
    EXPECT_EQ(sample.padding_mask[k], k < used ? 1 : 0) << "padding mask is not a prefix";
    if (k >= used) {
      EXPECT_EQ(sample.tokens[k], kPad);
      EXPECT_EQ(sample.token_types[k], 0);
      EXPECT_EQ(sample.labels[k], options.ignore_label);
    }
  }
  EXPECT_EQ(original[0], kCls);
  EXPECT_EQ(original[used - 1], kSep);
  const size_t first_sep =
      static_cast<size_t>(std::find(original.begin() + 1, original.end(), kSep) - original.begin());
  EXPECT_LT(first_sep, used - 1) << "no [SEP] between A and B";
  for (size_t k = 0; k < used; ++k) EXPECT_EQ(sample.token_types[k], k > first_sep ? 1 : 0) << k;
  // Special positions are never MLM targets.
  for (const size_t k : {size_t{0}, first_sep, used - 1}) EXPECT_EQ(sample.labels[k], options.ignore_label);
  return Pair{std::vector<int64_t>(original.begin() + 1, original.begin() + static_cast<std::ptrdiff_t>(first_sep)),
              std::vector<int64_t>(original.begin() + static_cast<std::ptrdiff_t>(first_sep) + 1,
                                   original.begin() + static_cast<std::ptrdiff_t>(used) - 1)};
}

// A run of consecutive tokens of one document.
bool IsContiguous(const std::vector<int64_t>& tokens) {
  for (size_t k = 1; k < tokens.size(); ++k) {
    if (tokens[k] != tokens[k - 1] + 1 || OriginOf(tokens[k]).document != OriginOf(tokens[0]).document) return false;
  }
  return !tokens.empty();
}

class BertDatasetTest : public ::testing::Test {
 protected:
  void Load(const Corpus& corpus) {
    // int32: the position-coding token values outgrow uint16.
    BuildCorpus(dir_ / "b", corpus, TokenDtype::kInt32);
    auto dataset = IndexedDataset::Open(dir_ / "b");
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_ = std::move(*dataset);
  }
  ScratchDir dir_;
  std::unique_ptr<IndexedDataset> dataset_;
};

TEST_F(BertDatasetTest, SamplesArePairsOfContiguousSegments) {
  Load(MakeCorpus(120, 1, 12, 9, 1));
  const BertDatasetOptions options = Options(40);
  auto bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok()) << bert.status();
  ASSERT_GT(bert->size(), 100);
  BertSample sample;
  int random_next = 0;
  for (int64_t i = 0; i < bert->size(); ++i) {
    ASSERT_TRUE(bert->Sample(i, &sample).ok());
    const Pair pair = Parse(sample, options);
    EXPECT_LE(pair.a.size() + pair.b.size(), 37u);
    ASSERT_TRUE(IsContiguous(pair.a)) << "sample " << i;
    ASSERT_TRUE(IsContiguous(pair.b)) << "sample " << i;
    const Origin a = OriginOf(pair.a.back()), b = OriginOf(pair.b.front());
    if (sample.nsp_label == 0) {
      EXPECT_EQ(a.document, b.document) << "sample " << i;
      EXPECT_GT(b.position, a.position) << "sample " << i;
    } else {
      EXPECT_EQ(sample.nsp_label, 1);
      EXPECT_NE(a.document, b.document) << "sample " << i;
      ++random_next;
    }
  }
  // Every one-sentence chunk takes a random B, so a bit over half do.
  EXPECT_GT(random_next, bert->size() * 4 / 10);
  EXPECT_LT(random_next, bert->size() * 8 / 10);
}

TEST_F(BertDatasetTest, TruncatesTheLongerSideFromEitherEnd) {
  // Long sentences: nearly every pair needs trimming.
  Load(MakeCorpus(8, 2, 6, 60, 2));
  const BertDatasetOptions options = Options(16);
  auto bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok()) << bert.status();
  BertSample sample;
  int a_front_trimmed = 0, gap_trimmed = 0;
  for (int64_t i = 0; i < bert->size(); ++i) {
    ASSERT_TRUE(bert->Sample(i, &sample).ok());
    const Pair pair = Parse(sample, options);
    EXPECT_LE(pair.a.size() + pair.b.size(), 13u) << "sample " << i;
    EXPECT_GE(pair.a.size(), 1u);
    EXPECT_GE(pair.b.size(), 1u);
    if (sample.nsp_label == 0) {
      const int64_t a_end = OriginOf(pair.a.back()).position, b_start = OriginOf(pair.b.front()).position;
      if (b_start > a_end + 1) ++gap_trimmed;  // A's back or B's front went
    }
    // A starts at a sentence start unless its front was trimmed.
    const int64_t document = OriginOf(pair.a.front()).document;
    const int64_t position = OriginOf(pair.a.front()).position;
    bool at_sentence_start = false;
    for (int64_t s = dataset_->document_begin(document), p = 0; s < dataset_->document_begin(document + 1); ++s) {
      if (p == position) at_sentence_start = true;
      p += dataset_->sequence_length(s);
    }
    if (!at_sentence_start) ++a_front_trimmed;
  }
  EXPECT_GT(a_front_trimmed, 0);
  EXPECT_GT(gap_trimmed, 0);
}

TEST_F(BertDatasetTest, MasksFifteenPercentWithEightyTenTen) {
  Load(MakeCorpus(300, 4, 12, 12, 3));
  BertDatasetOptions options = Options(64);
  auto bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok()) << bert.status();
  BertSample sample;
  int64_t chosen = 0, masked = 0, kept = 0, replaced = 0;
  for (int64_t i = 0; i < bert->size(); ++i) {
    ASSERT_TRUE(bert->Sample(i, &sample).ok());
    const Pair pair = Parse(sample, options);
    const int64_t candidates = static_cast<int64_t>(pair.a.size() + pair.b.size());
    int64_t in_sample = 0;
    for (size_t k = 0; k < sample.labels.size(); ++k) {
      if (sample.labels[k] == options.ignore_label) continue;
      ++in_sample;
      if (sample.tokens[k] == kMask) {
        ++masked;
      } else if (sample.tokens[k] == sample.labels[k]) {
        ++kept;
      } else {
        ++replaced;
        EXPECT_GE(sample.tokens[k], 0);
        EXPECT_LT(sample.tokens[k], kVocab);
      }
    }
    EXPECT_EQ(in_sample, std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(0.15 * candidates))));
    chosen += in_sample;
  }
  ASSERT_GT(chosen, 1500);
  EXPECT_NEAR(static_cast<double>(masked) / chosen, 0.8, 0.04);
  EXPECT_NEAR(static_cast<double>(kept) / chosen, 0.1, 0.03);
  EXPECT_NEAR(static_cast<double>(replaced) / chosen, 0.1, 0.03);
}

TEST_F(BertDatasetTest, PredictionCapAndIgnoreLabel) {
  Load(MakeCorpus(6, 3, 8, 10, 4));
  BertDatasetOptions options = Options(48);
  options.max_predictions_per_seq = 2;
  options.ignore_label = -1;
  auto bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok()) << bert.status();
  BertSample sample;
  for (int64_t i = 0; i < bert->size(); ++i) {
    ASSERT_TRUE(bert->Sample(i, &sample).ok());
    const auto labelled = std::count_if(sample.labels.begin(), sample.labels.end(), [](int64_t l) { return l != -1; });
    EXPECT_GE(labelled, 1);
    EXPECT_LE(labelled, 2);
  }
}

TEST_F(BertDatasetTest, PureFunctionOfSeedAndIndex) {
  Load(MakeCorpus(10, 2, 9, 10, 5));
  const BertDatasetOptions options = Options(32);
  auto first = BertDataset::Make(*dataset_, options);
  auto second = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(first->size(), second->size());
  std::vector<BertSample> forward(static_cast<size_t>(first->size()));
  for (int64_t i = 0; i < first->size(); ++i) ASSERT_TRUE(first->Sample(i, &forward[static_cast<size_t>(i)]).ok());
  BertSample sample;
  for (int64_t i = second->size() - 1; i >= 0; --i) {
    ASSERT_TRUE(second->Sample(i, &sample).ok());
    const BertSample& expected = forward[static_cast<size_t>(i)];
    EXPECT_EQ(sample.tokens, expected.tokens);
    EXPECT_EQ(sample.token_types, expected.token_types);
    EXPECT_EQ(sample.labels, expected.labels);
    EXPECT_EQ(sample.nsp_label, expected.nsp_label);
  }
  BertDatasetOptions other = options;
  other.seed = 18;
  auto reseeded = BertDataset::Make(*dataset_, other);
  ASSERT_TRUE(reseeded.ok());
  int differing = 0;
  for (int64_t i = 0; i < std::min(reseeded->size(), first->size()); ++i) {
    ASSERT_TRUE(reseeded->Sample(i, &sample).ok());
    differing += sample.tokens != forward[static_cast<size_t>(i)].tokens;
  }
  EXPECT_GT(differing, 0);
}

TEST_F(BertDatasetTest, SpecialIdsFromTheTokenizer) {
  const ByteTokenizer tokenizer;
  auto ids = BertSpecialIds::FromTokenizer(tokenizer);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->cls, ByteTokenizer::kCls);
  EXPECT_EQ(ids->sep, ByteTokenizer::kSep);
  EXPECT_EQ(ids->mask, ByteTokenizer::kMask);
  EXPECT_EQ(ids->pad, ByteTokenizer::kPad);

  class NoMask : public ByteTokenizer {
    std::optional<int64_t> SpecialId(std::string_view token) const override {
      return token == "[MASK]" ? std::nullopt : ByteTokenizer::SpecialId(token);
    }
  };
  const auto missing = BertSpecialIds::FromTokenizer(NoMask());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("[MASK]"));
}

// Without next-sentence prediction (the model's binary head off) a sample
// is one segment, [CLS] A [SEP], A the whole chunk (cut to S - 2 from
// either end), every token type 0, nsp_label 0; one document suffices (two
// were required, and half the samples took a B of another document).
TEST_F(BertDatasetTest, WithoutNextSentenceASampleIsOneSegmentOfItsChunk) {
  // The segment of a sample, its masked tokens restored, checked for the
  // one-segment layout.
  const auto segment = [](const BertSample& sample, const BertDatasetOptions& options) {
    std::vector<int64_t> original = sample.tokens;
    for (size_t k = 0; k < original.size(); ++k) {
      if (sample.labels[k] != options.ignore_label) original[k] = sample.labels[k];
    }
    const auto used = static_cast<size_t>(std::count(sample.padding_mask.begin(), sample.padding_mask.end(), 1));
    EXPECT_GE(used, 3u);
    EXPECT_EQ(sample.nsp_label, 0);
    EXPECT_EQ(original[0], kCls);
    EXPECT_EQ(original[used - 1], kSep);
    EXPECT_EQ(std::count(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(used), kSep), 1);
    EXPECT_EQ(std::count(sample.token_types.begin(), sample.token_types.end(), 0),
              static_cast<std::ptrdiff_t>(sample.token_types.size()));
    EXPECT_EQ(sample.labels[0], options.ignore_label);
    EXPECT_EQ(sample.labels[used - 1], options.ignore_label);
    return std::vector<int64_t>(original.begin() + 1, original.begin() + static_cast<std::ptrdiff_t>(used) - 1);
  };
  // One document of short sentences: no chunk needs cutting, so the
  // samples' segments, in order, are the whole document.
  Load(MakeCorpus(1, 60, 60, 2, 7));
  BertDatasetOptions options = Options(24);
  options.short_seq_prob = 0;
  EXPECT_EQ(BertDataset::Make(*dataset_, options).status().code(), absl::StatusCode::kFailedPrecondition);
  options.next_sentence = false;
  auto bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok()) << bert.status();
  ASSERT_GT(bert->size(), 3);
  BertSample sample;
  std::vector<int64_t> joined;
  for (int64_t i = 0; i < bert->size(); ++i) {
    ASSERT_TRUE(bert->Sample(i, &sample).ok());
    const std::vector<int64_t> a = segment(sample, options);
    EXPECT_LE(a.size(), 22u) << "sample " << i;
    joined.insert(joined.end(), a.begin(), a.end());
  }
  ASSERT_EQ(joined.size(), static_cast<size_t>(dataset_->num_tokens()));
  for (size_t k = 0; k < joined.size(); ++k) ASSERT_EQ(joined[k], kBase + static_cast<int64_t>(k)) << k;
  // Long sentences: chunks cut to S - 2, still one contiguous run each.
  Load(MakeCorpus(3, 2, 6, 40, 8));
  bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok()) << bert.status();
  int cut = 0;
  for (int64_t i = 0; i < bert->size(); ++i) {
    ASSERT_TRUE(bert->Sample(i, &sample).ok());
    const std::vector<int64_t> a = segment(sample, options);
    EXPECT_TRUE(IsContiguous(a)) << "sample " << i;
    EXPECT_LE(a.size(), 22u) << "sample " << i;
    cut += a.size() == 22u;
  }
  EXPECT_GT(cut, 0);
}

TEST_F(BertDatasetTest, BadOptionsAndTooFewDocuments) {
  Load(MakeCorpus(3, 2, 3, 5, 6));
  BertDatasetOptions options = Options(4);
  EXPECT_THAT(BertDataset::Make(*dataset_, options).status().message(), HasSubstr("max_seq_length must be >= 5"));
  options = Options(32);
  options.masked_lm_prob = 1.5;
  EXPECT_THAT(BertDataset::Make(*dataset_, options).status().message(), HasSubstr("masked_lm_prob"));
  options = Options(32);
  options.special_ids.mask = kVocab;
  EXPECT_THAT(BertDataset::Make(*dataset_, options).status().message(),
              HasSubstr("[MASK] id " + std::to_string(kVocab) + " is outside"));
  options = Options(32);
  options.splits = "1,1,1";  // one document per split
  const auto single = BertDataset::Make(*dataset_, options);
  EXPECT_EQ(single.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(single.status().message(), HasSubstr("split train"));
  options = Options(32);
  auto bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok());
  BertSample sample;
  EXPECT_EQ(bert->Sample(bert->size(), &sample).code(), absl::StatusCode::kOutOfRange);
  // Ids outside the vocabulary (document 1's are 600 and up) are named
  // where a sample reads them.
  options.vocab_size = 600;
  bert = BertDataset::Make(*dataset_, options);
  ASSERT_TRUE(bert.ok());
  int refused = 0;
  for (int64_t i = 0; i < bert->size(); ++i) {
    const absl::Status status = bert->Sample(i, &sample);
    if (status.ok()) continue;
    ++refused;
    EXPECT_THAT(std::string(status.message()),
                ::testing::ContainsRegex("b.bin: token [0-9]+ \\(document [12]\\) is id [0-9]+, "
                                         "outside the vocabulary \\[0, 600\\)"));
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace tessera::data
