// GPT dataset: windows over a split's token stream, split boundaries, errors.
#include "data/gpt_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/data/dataset_test_util.h"

namespace tessera::data {
namespace {

using testing::BuildCorpus;
using testing::Corpus;
using ::testing::HasSubstr;
using testing::ScratchDir;

// Ten documents; token values are their positions in the whole stream, so a
// window's expected contents are plain arithmetic. Document d has d + 2
// tokens, split into sequences of at most 3.
class GptDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Corpus corpus;
    int64_t next = 0;
    for (int d = 0; d < 10; ++d) {
      document_starts_.push_back(next);
      std::vector<std::vector<int64_t>> document;
      for (int k = 0; k < d + 2; ++k) {
        if (k % 3 == 0) document.emplace_back();
        document.back().push_back(next++);
      }
      corpus.push_back(document);
    }
    document_starts_.push_back(next);
    BuildCorpus(dir_ / "g", corpus);
    auto dataset = IndexedDataset::Open(dir_ / "g");
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_ = std::move(*dataset);
  }

  ScratchDir dir_;
  std::unique_ptr<IndexedDataset> dataset_;
  std::vector<int64_t> document_starts_;  // 65 tokens in all
};

TEST_F(GptDatasetTest, SamplesAreOverlappingWindowsOfTheStream) {
  auto gpt = GptDataset::Make(*dataset_, {.seq_length = 4, .splits = "1"});
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_EQ(gpt->num_tokens(), 65);
  EXPECT_EQ(gpt->size(), (65 - 1) / 4);
  EXPECT_EQ(gpt->sample_length(), 5);
  std::vector<int64_t> sample(5);
  for (int64_t s = 0; s < gpt->size(); ++s) {
    ASSERT_TRUE(gpt->Sample(s, sample).ok());
    for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(sample[static_cast<size_t>(k)], 4 * s + k) << "sample " << s;
  }
}

TEST_F(GptDatasetTest, SplitsTakeTheirDocuments) {
  // 10 documents, weights 6,2,2: train [0,6), valid [6,8), test [8,10).
  for (const auto& [split, first_document, last_document] :
       {std::tuple{DatasetSplit::kTrain, 0, 6}, std::tuple{DatasetSplit::kValid, 6, 8},
        std::tuple{DatasetSplit::kTest, 8, 10}}) {
    auto gpt = GptDataset::Make(*dataset_, {.seq_length = 3, .splits = "6,2,2", .split = split});
    ASSERT_TRUE(gpt.ok()) << gpt.status();
    EXPECT_EQ(gpt->documents().begin, first_document);
    EXPECT_EQ(gpt->documents().end, last_document);
    const int64_t first = document_starts_[static_cast<size_t>(first_document)];
    const int64_t tokens = document_starts_[static_cast<size_t>(last_document)] - first;
    EXPECT_EQ(gpt->num_tokens(), tokens);
    ASSERT_EQ(gpt->size(), (tokens - 1) / 3);
    std::vector<int64_t> sample(4);
    ASSERT_TRUE(gpt->Sample(gpt->size() - 1, sample).ok());
    EXPECT_EQ(sample.front(), first + 3 * (gpt->size() - 1));
    EXPECT_LE(sample.back(), first + tokens - 1);  // never past the split
  }
}

TEST_F(GptDatasetTest, AnEmptySplitIsAnErrorOnlyWhenUsed) {
  EXPECT_TRUE(GptDataset::Make(*dataset_, {.seq_length = 3, .splits = "1,0,0", .split = DatasetSplit::kTrain}).ok());
  const auto valid = GptDataset::Make(*dataset_, {.seq_length = 3, .splits = "1,0,0", .split = DatasetSplit::kValid});
  EXPECT_EQ(valid.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(valid.status().message(),
              HasSubstr("split valid (splits '1,0,0') holds documents [10, 10) with 0 tokens"));
  // The test split (2 documents, 21 tokens) has no whole window of 65.
  const auto test = GptDataset::Make(*dataset_, {.seq_length = 64, .splits = "6,2,2", .split = DatasetSplit::kTest});
  EXPECT_EQ(test.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GptDataset::Make(*dataset_, {.seq_length = 64, .splits = "1"})->size(), 1);
}

TEST_F(GptDatasetTest, BadArguments) {
  EXPECT_EQ(GptDataset::Make(*dataset_, {.seq_length = 0, .splits = "1"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GptDataset::Make(*dataset_, {.seq_length = 4, .splits = "a,b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto gpt = GptDataset::Make(*dataset_, {.seq_length = 4, .splits = "1"});
  ASSERT_TRUE(gpt.ok());
  std::vector<int64_t> sample(5);
  EXPECT_EQ(gpt->Sample(gpt->size(), sample).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(gpt->Sample(-1, sample).code(), absl::StatusCode::kOutOfRange);
  std::vector<int64_t> short_buffer(4);
  EXPECT_EQ(gpt->Sample(0, short_buffer).code(), absl::StatusCode::kInvalidArgument);
}

// Ids outside the model's vocabulary (a dataset of another tokenizer) are
// named with their token and document when a sample holds them.
TEST_F(GptDatasetTest, IdsOutsideTheVocabularyAreNamed) {
  auto gpt = GptDataset::Make(*dataset_, {.seq_length = 4, .splits = "1", .vocab_size = 50});
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  std::vector<int64_t> sample(5);
  EXPECT_TRUE(gpt->Sample(11, sample).ok());         // tokens 44..48
  const absl::Status bad = gpt->Sample(12, sample);  // tokens 48..52
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("g.bin: token 50 (document 8) is id 50, outside the vocabulary [0, 50)"));
}

}  // namespace
}  // namespace tessera::data
