// Indexed dataset: round trips through every token dtype, the exact bytes of
// the format, atomic publication, validation of corrupt files (targeted and
// fuzzed), and interchange with an independent Megatron-style reader/writer
// in Python.
#include "data/indexed_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/data/dataset_test_util.h"

namespace tessera::data {
namespace {

using testing::BuildCorpus;
using testing::Corpus;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

// Checks every accessor of `dataset` against `corpus`.
void ExpectMatches(const IndexedDataset& dataset, const Corpus& corpus) {
  int64_t sequence = 0;
  int64_t token = 0;
  ASSERT_EQ(dataset.num_documents(), static_cast<int64_t>(corpus.size()));
  for (size_t d = 0; d < corpus.size(); ++d) {
    EXPECT_EQ(dataset.document_begin(static_cast<int64_t>(d)), sequence) << "document " << d;
    for (const std::vector<int64_t>& expected : corpus[d]) {
      EXPECT_EQ(dataset.sequence_length(sequence), static_cast<int64_t>(expected.size()));
      EXPECT_EQ(dataset.sequence_offset(sequence), token);
      EXPECT_EQ(dataset.Sequence(sequence), expected) << "sequence " << sequence;
      ++sequence;
      token += static_cast<int64_t>(expected.size());
    }
  }
  EXPECT_EQ(dataset.num_sequences(), sequence);
  EXPECT_EQ(dataset.num_tokens(), token);
  EXPECT_EQ(dataset.document_begin(dataset.num_documents()), sequence);
  EXPECT_EQ(dataset.sequence_offset(sequence), token);
}

// Documents of 0..3 sequences of 0..6 tokens drawn from `values`.
Corpus RandomCorpus(std::mt19937& random, const std::vector<int64_t>& values, int num_documents) {
  Corpus corpus(static_cast<size_t>(num_documents));
  for (auto& document : corpus) {
    document.resize(random() % 4);
    for (auto& sequence : document) {
      sequence.resize(random() % 7);
      for (int64_t& t : sequence) t = values[random() % values.size()];
    }
  }
  return corpus;
}

TEST(IndexedDatasetTest, RoundTripsEveryTokenDtype) {
  ScratchDir dir;
  const std::vector<std::pair<TokenDtype, std::vector<int64_t>>> cases = {
      {TokenDtype::kUint8, {0, 1, 200, 255}},
      {TokenDtype::kInt8, {-128, -1, 0, 127}},
      {TokenDtype::kInt16, {-32768, -5, 7, 32767}},
      {TokenDtype::kInt32, {-2147483648LL, -1, 65536, 2147483647LL}},
      {TokenDtype::kInt64, {INT64_MIN, -1, 1LL << 40, INT64_MAX}},
      {TokenDtype::kUint16, {0, 1, 50256, 65535}},
  };
  std::mt19937 random(7);
  for (const auto& [dtype, values] : cases) {
    SCOPED_TRACE(TokenDtypeName(dtype));
    Corpus corpus = RandomCorpus(random, values, 9);
    corpus.push_back({});    // an empty document
    corpus.push_back({{}});  // a document with one empty sequence
    corpus.push_back({values});
    const auto prefix = dir / TokenDtypeName(dtype);
    BuildCorpus(prefix, corpus, dtype);
    auto dataset = IndexedDataset::Open(prefix);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    EXPECT_EQ((*dataset)->dtype(), dtype);
    ExpectMatches(**dataset, corpus);
    // Reads across sequence boundaries see one token stream.
    std::vector<int64_t> stream;
    for (const auto& document : corpus)
      for (const auto& sequence : document) stream.insert(stream.end(), sequence.begin(), sequence.end());
    std::vector<int64_t> window(stream.size() - 3);
    (*dataset)->ReadTokens(2, window);
    EXPECT_TRUE(std::equal(window.begin(), window.end(), stream.begin() + 2));
  }
}

TEST(IndexedDatasetTest, EmptyDatasetRoundTrips) {
  ScratchDir dir;
  BuildCorpus(dir / "empty", {});
  auto dataset = IndexedDataset::Open(dir / "empty");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->num_sequences(), 0);
  EXPECT_EQ((*dataset)->num_documents(), 0);
  EXPECT_EQ((*dataset)->num_tokens(), 0);
  EXPECT_EQ(ReadFile(dir / "empty.bin"), "");
}

// A file truncated while open is said, naming it, before a read of the
// mapping past its new end would kill the process (SIGBUS: a cluster's
// worker died with no word). Growing is harmless.
TEST(IndexedDatasetTest, AFileThatShrankWhileOpenIsAnError) {
  ScratchDir dir;
  BuildCorpus(dir / "x", {{{1, 2, 3}, {4, 5}}, {{6, 7, 8, 9}}});
  auto dataset = IndexedDataset::Open(dir / "x");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_TRUE((*dataset)->CheckFilesWhole().ok());
  std::ofstream(dir / "x.bin", std::ios::app) << "more";
  EXPECT_TRUE((*dataset)->CheckFilesWhole().ok());
  std::filesystem::resize_file(dir / "x.bin", 4);
  const absl::Status shrank = (*dataset)->CheckFilesWhole();
  EXPECT_EQ(shrank.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shrank.message(), HasSubstr("x.bin' shrank to 4 bytes from 18 while it was read"));
  std::filesystem::resize_file(dir / "x.idx", 10);
  EXPECT_THAT((*dataset)->CheckFilesWhole().message(), HasSubstr("x.idx' shrank to 10 bytes"));
}

TEST(IndexedDatasetTest, WritesMegatronBytesExactly) {
  ScratchDir dir;
  BuildCorpus(dir / "x", {{{1, 2, 3}, {258}}, {{65535}}}, TokenDtype::kUint16);
  std::string idx;
  const auto put = [&idx](const auto& value) { idx.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
  idx.append("MMIDIDX\0\0", 9);
  put(uint64_t{1});
  put(uint8_t{8});   // uint16
  put(uint64_t{3});  // sequences
  put(uint64_t{3});  // document-index entries: 0, 2, 3
  for (const int32_t size : {3, 1, 1}) put(size);
  for (const int64_t pointer : {0, 6, 8}) put(pointer);
  for (const int64_t entry : {0, 2, 3}) put(entry);
  EXPECT_EQ(ReadFile(dir / "x.idx"), idx);
  const std::string bin = ReadFile(dir / "x.bin");
  EXPECT_EQ(bin, std::string("\x01\x00\x02\x00\x03\x00\x02\x01\xff\xff", 10));
}

TEST(IndexedDatasetTest, DtypeForVocabularyFollowsMegatron) {
  EXPECT_EQ(TokenDtypeForVocabulary(50257), TokenDtype::kUint16);
  EXPECT_EQ(TokenDtypeForVocabulary(65499), TokenDtype::kUint16);
  EXPECT_EQ(TokenDtypeForVocabulary(65500), TokenDtype::kInt32);
  EXPECT_EQ(TokenDtypeForVocabulary(250000), TokenDtype::kInt32);
}

TEST(IndexedDatasetTest, BuilderRejectsTokensOutsideTheDtypeAndStaysUsable) {
  ScratchDir dir;
  auto builder = IndexedDatasetBuilder::Create(dir / "x", TokenDtype::kUint16);
  ASSERT_TRUE(builder.ok());
  const absl::Status status = (*builder)->AddSequence(std::vector<int64_t>{1, 65536});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("token 65536 (position 1 of its sequence) does not fit uint16"));
  ASSERT_TRUE((*builder)->AddSequence(std::vector<int64_t>{4}).ok());
  ASSERT_TRUE((*builder)->Finalize().ok());
  auto dataset = IndexedDataset::Open(dir / "x");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ExpectMatches(**dataset, {{{4}}});
}

TEST(IndexedDatasetTest, UnfinishedBuilderLeavesNothingBehind) {
  ScratchDir dir;
  {
    auto builder = IndexedDatasetBuilder::Create(dir / "x", TokenDtype::kUint16);
    ASSERT_TRUE(builder.ok());
    ASSERT_TRUE((*builder)->AddSequence(std::vector<int64_t>{1, 2}).ok());
    EXPECT_EQ(dir.Entries().size(), 1u);  // the .bin temporary; the spools are unlinked
  }
  EXPECT_THAT(dir.Entries(), ::testing::IsEmpty());
}

TEST(IndexedDatasetTest, FinalizeReplacesAnOldPairAndClosesAnOpenDocument) {
  ScratchDir dir;
  BuildCorpus(dir / "x", {{{9, 9, 9}}, {{9}}});
  auto builder = IndexedDatasetBuilder::Create(dir / "x", TokenDtype::kUint16);
  ASSERT_TRUE(builder.ok());
  ASSERT_TRUE((*builder)->AddSequence(std::vector<int64_t>{1}).ok());
  ASSERT_TRUE((*builder)->AddSequence(std::vector<int64_t>{2, 3}).ok());
  // Still the old pair while the new one is being written.
  ASSERT_TRUE(IndexedDataset::Open(dir / "x").ok());
  ASSERT_TRUE((*builder)->Finalize().ok());
  EXPECT_EQ((*builder)->Finalize().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dir.Entries(), ::testing::ElementsAre("x.bin", "x.idx"));
  auto dataset = IndexedDataset::Open(dir / "x");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ExpectMatches(**dataset, {{{1}, {2, 3}}});
}

TEST(IndexedDatasetTest, BuilderErrorsNameThePath) {
  ScratchDir dir;
  const auto missing = IndexedDatasetBuilder::Create(dir / "no" / "such" / "x", TokenDtype::kUint16);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr((dir / "no" / "such" / "x").string()));
  EXPECT_FALSE(IndexedDatasetBuilder::Create(dir.path() / "", TokenDtype::kUint16).ok());
}

// --- Validation -------------------------------------------------------------

class CorruptIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BuildCorpus(prefix_, {{{1, 2, 3}, {4}}, {{5, 6}}});
    idx_ = ReadFile(prefix_.string() + ".idx");
    bin_ = ReadFile(prefix_.string() + ".bin");
    ASSERT_EQ(idx_.size(), 34u + 3 * 12 + 3 * 8);
  }
  // Opens with the index (and data) replaced; returns the error message.
  std::string OpenError(const std::string& idx, const std::string& bin) {
    WriteFile(prefix_.string() + ".idx", idx);
    WriteFile(prefix_.string() + ".bin", bin);
    const auto dataset = IndexedDataset::Open(prefix_);
    EXPECT_FALSE(dataset.ok());
    return dataset.ok() ? "" : std::string(dataset.status().message());
  }
  std::string WithU64(size_t offset, uint64_t value) const {
    std::string idx = idx_;
    std::memcpy(idx.data() + offset, &value, sizeof(value));
    return idx;
  }
  template <typename T>
  std::string WithValue(size_t offset, T value) const {
    std::string idx = idx_;
    std::memcpy(idx.data() + offset, &value, sizeof(value));
    return idx;
  }

  ScratchDir dir_;
  std::filesystem::path prefix_ = dir_ / "c";
  std::string idx_;
  std::string bin_;
  // Offsets in the index of 3 sequences.
  static constexpr size_t kSizes = 34, kPointers = 34 + 12, kDocuments = 34 + 36;
};

TEST_F(CorruptIndexTest, NamesTheFileAndTheFault) {
  const std::string idx_name = prefix_.string() + ".idx";
  const std::string bin_name = prefix_.string() + ".bin";
  EXPECT_THAT(OpenError(idx_.substr(0, 20), bin_), HasSubstr(idx_name + "': truncated: 20 bytes"));
  std::string magic = idx_;
  magic[3] = 'X';
  EXPECT_THAT(OpenError(magic, bin_), HasSubstr("bad magic"));
  EXPECT_THAT(OpenError(WithU64(9, 2), bin_), HasSubstr("version 2 is not supported"));
  EXPECT_THAT(OpenError(WithValue<uint8_t>(17, 7), bin_), HasSubstr("dtype code 7 is a floating-point type"));
  EXPECT_THAT(OpenError(WithValue<uint8_t>(17, 9), bin_), HasSubstr("unknown dtype code 9"));
  EXPECT_THAT(OpenError(WithU64(18, 4), bin_), HasSubstr("do not match its header's 4 sequences and 3"));
  EXPECT_THAT(OpenError(WithU64(18, uint64_t{1} << 62), bin_), HasSubstr("do not match its header's"));
  EXPECT_THAT(OpenError(idx_ + std::string(3, '\0'), bin_), HasSubstr("multimodal indexes are not supported"));
  // (An entry the header does not count, as a writer that left the leading
  // 0 out of it: blamed on multimodal indexes.)
  EXPECT_THAT(OpenError(idx_ + std::string(8, '\0'), bin_),
              HasSubstr("1 document-index entries more than the header counts; the count includes the leading 0"));
  EXPECT_THAT(OpenError(WithValue<int32_t>(kSizes + 4, -1), bin_), HasSubstr("sequence 1 has negative length -1"));
  EXPECT_THAT(OpenError(WithValue<int64_t>(kPointers + 8, 4), bin_),
              HasSubstr("sequence 1 starts at byte 4, expected 6"));
  EXPECT_THAT(OpenError(idx_, bin_.substr(0, 10)), HasSubstr(bin_name + "': 10 bytes, but index"));
  EXPECT_THAT(OpenError(idx_, bin_ + "xy"), HasSubstr("describes 12 (6 uint16 tokens)"));
  EXPECT_THAT(OpenError(WithValue<int64_t>(kDocuments, 1), bin_), HasSubstr("document index starts at 1, not 0"));
  EXPECT_THAT(OpenError(WithValue<int64_t>(kDocuments + 8, 4), bin_),
              HasSubstr("document index entry 1 is 4, past the 3 sequences"));
  EXPECT_THAT(OpenError(WithValue<int64_t>(kDocuments + 16, 2), bin_),
              HasSubstr("document index ends at 2, not at the sequence count 3"));
  std::string decreasing = WithValue<int64_t>(kDocuments + 8, 3);
  std::memcpy(decreasing.data() + kDocuments + 16, "\x02\0\0\0\0\0\0\0", 8);
  EXPECT_THAT(OpenError(decreasing, bin_), HasSubstr("decreases at entry 2 (3 then 2)"));
  EXPECT_THAT(OpenError(WithU64(26, 0).substr(0, 34 + 36), bin_), HasSubstr("no document-index entries"));
}

TEST_F(CorruptIndexTest, MissingFilesAreNamed) {
  std::filesystem::remove(prefix_.string() + ".bin");
  auto dataset = IndexedDataset::Open(prefix_);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dataset.status().message(), HasSubstr(prefix_.string() + ".bin"));
  dataset = IndexedDataset::Open(dir_ / "nothing");
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(dataset.status().message(), HasSubstr("nothing.idx"));
}

// Truncations and byte flips of valid files never crash Open, and whatever
// Open accepts reads within bounds (ASan builds check that part).
TEST(IndexedDatasetFuzzTest, CorruptFilesFailCleanly) {
  ScratchDir dir;
  std::mt19937 random(1234);
  const auto prefix = dir / "f";
  int accepted = 0;
  for (const TokenDtype dtype : {TokenDtype::kUint16, TokenDtype::kInt32, TokenDtype::kUint8}) {
    BuildCorpus(prefix, RandomCorpus(random, {0, 1, 2, 100, 255}, 12), dtype);
    const std::string idx = ReadFile(prefix.string() + ".idx");
    const std::string bin = ReadFile(prefix.string() + ".bin");
    for (int trial = 0; trial < 400; ++trial) {
      std::string new_idx = idx;
      std::string new_bin = bin;
      switch (trial % 4) {
        case 0:
          new_idx.resize(random() % idx.size());
          break;
        case 1:
          new_bin.resize(bin.empty() ? 0 : random() % bin.size());
          break;
        default:
          for (int flips = 1 + static_cast<int>(random() % 3); flips > 0; --flips) {
            new_idx[random() % new_idx.size()] ^= static_cast<char>(1 << (random() % 8));
          }
      }
      WriteFile(prefix.string() + ".idx", new_idx);
      WriteFile(prefix.string() + ".bin", new_bin);
      const auto dataset = IndexedDataset::Open(prefix);
      if (!dataset.ok()) {
        const std::string message(dataset.status().message());
        EXPECT_THAT(message,
                    ::testing::AnyOf(HasSubstr(prefix.string() + ".idx"), HasSubstr(prefix.string() + ".bin")));
        EXPECT_EQ(message.find('\n'), std::string::npos) << message;
        continue;
      }
      ++accepted;
      std::vector<int64_t> all(static_cast<size_t>((*dataset)->num_tokens()));
      (*dataset)->ReadTokens(0, all);
      for (int64_t d = 0; d <= (*dataset)->num_documents(); ++d)
        EXPECT_LE((*dataset)->document_begin(d), (*dataset)->num_sequences());
      for (int64_t s = 0; s < (*dataset)->num_sequences(); ++s) (*dataset)->Sequence(s);
    }
  }
  // Flips inside token-free regions (e.g. a high byte of doc_idx that stays
  // consistent) are rare; most corruptions must be caught.
  EXPECT_LT(accepted, 1200 / 4);
}

TEST(SplitDocumentsTest, MegatronBoundaries) {
  using Range = std::pair<int64_t, int64_t>;
  const auto range = [](std::string_view splits, int64_t n, DatasetSplit split) {
    auto result = SplitDocuments(splits, n, split);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? Range(result->begin, result->end) : Range(-1, -1);
  };
  EXPECT_EQ(range("949,50,1", 1000, DatasetSplit::kTrain), Range(0, 949));
  EXPECT_EQ(range("949,50,1", 1000, DatasetSplit::kValid), Range(949, 999));
  EXPECT_EQ(range("949,50,1", 1000, DatasetSplit::kTest), Range(999, 1000));
  EXPECT_EQ(range("1", 7, DatasetSplit::kTrain), Range(0, 7));
  EXPECT_EQ(range("1", 7, DatasetSplit::kTest), Range(7, 7));
  EXPECT_EQ(range(" 8 / 1 / 1 ", 10, DatasetSplit::kValid), Range(8, 9));
  // Weights 0, 0.5, 0.5 of 3: Megatron's boundaries 0, -1, 1, 3 are clamped.
  EXPECT_EQ(range("0,1,1", 3, DatasetSplit::kTrain), Range(0, 0));
  EXPECT_EQ(range("0,1,1", 3, DatasetSplit::kValid), Range(0, 1));
  for (const std::string_view bad : {"", "1,x", "1,2,3,4", "0,0,0", "-1,2", "inf", "1,,2", "1e308,1e308,0"}) {
    const auto result = SplitDocuments(bad, 10, DatasetSplit::kTrain);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(result.status().message(), HasSubstr(StrCat("splits '", bad, "'")));
  }
  // (A trailing comma said "more than three weights".)
  EXPECT_THAT(SplitDocuments("949,50,1,", 10, DatasetSplit::kTrain).status().message(), HasSubstr("a trailing ','"));
}

// --- Interchange with the Python reference ------------------------------------

const char* const kPython = "/usr/bin/python3";

std::string Script() { return std::string(TESSERA_SOURCE_DIR) + "/tests/data/megatron_indexed_dataset.py"; }

// Runs the reference script; false (with the reason in *output) if it failed.
bool RunPython(const std::string& arguments, std::string* output) {
  const std::string command = StrCat(kPython, " ", Script(), " ", arguments, " 2>&1");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return false;
  output->clear();
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output->append(buffer, n);
  return ::pclose(pipe) == 0;
}

class MegatronInteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::system(StrCat(kPython, " -c 'import numpy' >/dev/null 2>&1").c_str()) != 0) {
      GTEST_SKIP() << kPython << " with numpy is not available";
    }
  }
};

TEST_F(MegatronInteropTest, PythonReadsOurFiles) {
  ScratchDir dir;
  std::mt19937 random(99);
  for (const TokenDtype dtype : {TokenDtype::kUint16, TokenDtype::kInt32, TokenDtype::kInt64, TokenDtype::kInt8}) {
    SCOPED_TRACE(TokenDtypeName(dtype));
    const std::vector<int64_t> values = dtype == TokenDtype::kInt8     ? std::vector<int64_t>{-100, 0, 5, 127}
                                        : dtype == TokenDtype::kUint16 ? std::vector<int64_t>{0, 50256, 65535}
                                                                       : std::vector<int64_t>{-7, 0, 70000, 1 << 30};
    const Corpus corpus = RandomCorpus(random, values, 20);
    const auto prefix = dir / TokenDtypeName(dtype);
    BuildCorpus(prefix, corpus, dtype);
    std::string output;
    ASSERT_TRUE(RunPython(StrCat("read ", prefix.string()), &output)) << output;
    const nlohmann::json read = nlohmann::json::parse(output);
    EXPECT_EQ(read["dtype_code"].get<int>(), static_cast<int>(dtype));
    std::vector<std::vector<int64_t>> sequences;
    std::vector<int64_t> doc_idx = {0};
    for (const auto& document : corpus) {
      sequences.insert(sequences.end(), document.begin(), document.end());
      doc_idx.push_back(static_cast<int64_t>(sequences.size()));
    }
    EXPECT_EQ(read["sequences"].get<std::vector<std::vector<int64_t>>>(), sequences);
    EXPECT_EQ(read["doc_idx"].get<std::vector<int64_t>>(), doc_idx);
  }
}

TEST_F(MegatronInteropTest, WeReadPythonFiles) {
  ScratchDir dir;
  std::mt19937 random(5);
  for (const int64_t vocab_size : {50257, 70000}) {
    SCOPED_TRACE(vocab_size);
    const Corpus corpus = RandomCorpus(random, {0, 1, 50000, vocab_size - 1}, 25);
    WriteFile(dir / "corpus.json", nlohmann::json(corpus).dump());
    const auto prefix = dir / StrCat("py", vocab_size);
    std::string output;
    ASSERT_TRUE(
        RunPython(StrCat("write ", prefix.string(), " ", vocab_size, " ", (dir / "corpus.json").string()), &output))
        << output;
    auto dataset = IndexedDataset::Open(prefix);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    EXPECT_EQ((*dataset)->dtype(), TokenDtypeForVocabulary(vocab_size));
    ExpectMatches(**dataset, corpus);
    // And our builder, given the same corpus and dtype, writes the same bytes.
    BuildCorpus(dir / "ours", corpus, TokenDtypeForVocabulary(vocab_size));
    EXPECT_EQ(ReadFile(dir / "ours.idx"), ReadFile(prefix.string() + ".idx"));
    EXPECT_EQ(ReadFile(dir / "ours.bin"), ReadFile(prefix.string() + ".bin"));
  }
}

TEST_F(MegatronInteropTest, SplitsMatchMegatron) {
  ScratchDir dir;
  std::vector<std::pair<std::string, int64_t>> cases;
  for (const char* splits :
       {"949,50,1", "969,30,1", "98,2,0", "1,1,1", "80/10/10", "2,1", "0.5,0.25,0.25", "7", "3,3,1", "0,1,1"}) {
    for (const int64_t n : {0, 1, 2, 3, 5, 10, 99, 1000, 12345}) cases.emplace_back(splits, n);
  }
  std::string text;
  for (const auto& [splits, n] : cases) text += StrCat(splits, " ", n, "\n");
  WriteFile(dir / "cases.txt", text);
  std::string output;
  ASSERT_TRUE(RunPython(StrCat("splits ", (dir / "cases.txt").string()), &output)) << output;
  const std::vector<std::string_view> lines = Split(StripWhitespace(output), '\n');
  ASSERT_EQ(lines.size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& [splits, n] = cases[k];
    std::vector<int64_t> megatron;
    for (const std::string_view word : Split(lines[k], ' ')) {
      int64_t value = 0;
      ASSERT_TRUE(ParseInteger(word, &value)) << lines[k];
      megatron.push_back(value);
    }
    // Where Megatron's boundaries are already monotone inside [0, n] ours
    // equal them; elsewhere ours are their clamped version.
    for (size_t b = 1; b < 4; ++b) megatron[b] = std::clamp(megatron[b], megatron[b - 1], n);
    for (const DatasetSplit split : {DatasetSplit::kTrain, DatasetSplit::kValid, DatasetSplit::kTest}) {
      const auto range = SplitDocuments(splits, n, split);
      ASSERT_TRUE(range.ok()) << range.status();
      const int which = static_cast<int>(split);
      EXPECT_EQ(range->begin, megatron[which]) << splits << " of " << n;
      EXPECT_EQ(range->end, megatron[which + 1]) << splits << " of " << n;
    }
  }
}

}  // namespace
}  // namespace tessera::data
