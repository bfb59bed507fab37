// Preprocessing: input formats, sentence splitting, end-of-document ids,
// byte-identical output for any thread count, errors naming file and line,
// atomic output, progress.
#include "data/preprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>

#include "core/file_util.h"
#include "data/indexed_dataset.h"
#include "tests/data/dataset_test_util.h"

namespace tessera::data {
namespace {

using testing::ByteTokenizer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFile;
using testing::ScratchDir;
using testing::WriteFile;

// The output as text: documents of sequences, ids < 256 as bytes and the
// end-of-document id as "<EOD>".
std::vector<std::vector<std::string>> ReadBack(const std::filesystem::path& prefix) {
  auto dataset = IndexedDataset::Open(prefix);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  if (!dataset.ok()) return {};
  std::vector<std::vector<std::string>> documents;
  for (int64_t d = 0; d < (*dataset)->num_documents(); ++d) {
    documents.emplace_back();
    for (int64_t s = (*dataset)->document_begin(d); s < (*dataset)->document_begin(d + 1); ++s) {
      std::string text;
      for (const int64_t id : (*dataset)->Sequence(s)) {
        text += id == ByteTokenizer::kEndOfText ? std::string("<EOD>") : std::string(1, static_cast<char>(id));
      }
      documents.back().push_back(text);
    }
  }
  return documents;
}

using Documents = std::vector<std::vector<std::string>>;

class PreprocessTest : public ::testing::Test {
 protected:
  absl::StatusOr<PreprocessStats> Run(std::vector<std::string> names, PreprocessOptions options = {},
                                      const Tokenizer* tokenizer = nullptr) {
    for (const std::string& name : names) options.inputs.push_back(dir_ / name);
    options.output_prefix = dir_ / "out";
    if (options.num_threads == 0) options.num_threads = 2;
    return Preprocess(options, tokenizer != nullptr ? *tokenizer : tokenizer_);
  }
  // After a failed run: the inputs only, no output or temporary files.
  void ExpectNoOutput() {
    for (const std::string& entry : dir_.Entries()) EXPECT_THAT(entry, ::testing::Not(HasSubstr("out"))) << entry;
  }

  ScratchDir dir_;
  ByteTokenizer tokenizer_;
};

TEST_F(PreprocessTest, ParagraphsAreDocuments) {
  const std::string text = "Hello world.\nSecond line.\n\n\n  \t\nPara two\r\n\r\nthree";
  WriteFile(dir_ / "a.txt", text);
  const auto stats = Run({"a.txt"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(ReadBack(dir_ / "out"),
            (Documents{{"Hello world.\nSecond line.<EOD>"}, {"Para two<EOD>"}, {"three<EOD>"}}));
  EXPECT_EQ(stats->documents, 3);
  EXPECT_EQ(stats->sequences, 3);
  EXPECT_EQ(stats->tokens, 25 + 8 + 5 + 3);
  EXPECT_EQ(stats->bytes, static_cast<int64_t>(text.size()));
  EXPECT_EQ((*IndexedDataset::Open(dir_ / "out"))->dtype(), TokenDtype::kUint16);
}

// A byte-order mark at a file's start is no text (it was the first
// document's first three tokens); one inside is kept, as any character.
TEST_F(PreprocessTest, AByteOrderMarkIsNoText) {
  WriteFile(dir_ / "a.txt", "\xEF\xBB\xBFHello.\n\nTwo \xEF\xBB\xBF.\n");
  WriteFile(dir_ / "b.jsonl", "\xEF\xBB\xBF{\"text\": \"json\"}\n");
  const auto stats = Run({"a.txt", "b.jsonl"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"Hello.<EOD>"}, {"Two \xEF\xBB\xBF.<EOD>"}, {"json<EOD>"}}));
}

TEST_F(PreprocessTest, LinesAreDocuments) {
  WriteFile(dir_ / "a.txt", "one\ntwo\r\n\n  \nthree\n");
  const auto stats = Run({"a.txt"}, {.format = InputFormat::kLines, .append_end_of_document = false});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"one"}, {"two"}, {"three"}}));
}

TEST_F(PreprocessTest, JsonlByExtension) {
  WriteFile(dir_ / "a.jsonl",
            "{\"text\": \"first\\nline\"}\n\n{\"id\": 3, \"text\": \"\"}\n{\"text\": \"caf\\u00e9\", \"x\": [1]}\n");
  auto stats = Run({"a.jsonl"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  // The empty text encodes to nothing and is dropped.
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"first\nline<EOD>"}, {"caf\xC3\xA9<EOD>"}}));
  EXPECT_EQ(stats->documents, 2);

  WriteFile(dir_ / "b.jsonl", "{\"body\": \"x\", \"text\": 5}\n");
  stats = Run({"b.jsonl"}, {.json_key = "body"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"x<EOD>"}}));
}

TEST_F(PreprocessTest, SentenceSplittingForBert) {
  WriteFile(dir_ / "a.txt", "One two. Three!\nFour? five.\n\nSix");
  auto stats = Run({"a.txt"}, {.split_sentences = true});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"One two.", "Three!", "Four? five.<EOD>"}, {"Six<EOD>"}}));
  EXPECT_EQ(stats->sequences, 4);
  stats = Run({"a.txt"}, {.append_end_of_document = false, .split_sentences = true});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"One two.", "Three!", "Four? five."}, {"Six"}}));
  // A tokenizer without an end-of-document id appends nothing.
  const ByteTokenizer no_end(261, /*has_end_of_document=*/false);
  stats = Run({"a.txt"}, {}, &no_end);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"One two. Three!\nFour? five."}, {"Six"}}));
}

TEST(SplitSentencesTest, Rules) {
  EXPECT_THAT(SplitSentences("Hello world. This is a test."), ElementsAre("Hello world.", "This is a test."));
  EXPECT_THAT(SplitSentences("Wait... what? Yes!"), ElementsAre("Wait... what?", "Yes!"));
  // A sentence's end, then a blank line: each piece once (the text after
  // the blank line was emitted twice, and the rest of the text with it).
  EXPECT_THAT(SplitSentences(".\n\n."), ElementsAre(".", "."));
  EXPECT_THAT(SplitSentences("Hi.\n\nYes?\n\nNo!"), ElementsAre("Hi.", "Yes?", "No!"));
  EXPECT_THAT(SplitSentences("Hi. \n \n Yes. x\n\nNo"), ElementsAre("Hi.", "Yes. x", "No"));
  EXPECT_THAT(SplitSentences("He said \"Stop.\" Then (he left.) Done"),
              ElementsAre("He said \"Stop.\"", "Then (he left.)", "Done"));
  EXPECT_THAT(SplitSentences("It\xE2\x80\x99s \xE2\x80\x9CGo.\xE2\x80\x9D Now."),
              ElementsAre("It\xE2\x80\x99s \xE2\x80\x9CGo.\xE2\x80\x9D", "Now."));
  EXPECT_THAT(SplitSentences("Version 2.5 is out. 3 people came, e.g. me."),
              ElementsAre("Version 2.5 is out. 3 people came, e.g. me."));
  EXPECT_THAT(SplitSentences("No stop here\n \nNew paragraph"), ElementsAre("No stop here", "New paragraph"));
  EXPECT_THAT(SplitSentences("Dr. Smith came."), ElementsAre("Dr.", "Smith came."));
  EXPECT_THAT(SplitSentences("  \n "), ::testing::IsEmpty());
  EXPECT_THAT(SplitSentences("End."), ElementsAre("End."));
}

// Every text of up to 6 characters over an alphabet of the splitter's
// cases: the sentences are pieces of the text, in order, each once, and
// only whitespace lies outside them.
TEST(SplitSentencesTest, SentencesTileTheText) {
  constexpr std::string_view kAlphabet = ".\n ?aA\"";
  for (int length = 1; length <= 6; ++length) {
    std::vector<size_t> digits(static_cast<size_t>(length), 0);
    for (bool more = true; more;) {
      std::string text;
      for (size_t d : digits) text += kAlphabet[d];
      size_t at = 0;
      std::string outside;
      for (std::string_view sentence : SplitSentences(text)) {
        ASSERT_GE(sentence.data(), text.data() + at) << "overlap in " << ::testing::PrintToString(text);
        ASSERT_LE(sentence.data() + sentence.size(), text.data() + text.size());
        outside += text.substr(at, static_cast<size_t>(sentence.data() - text.data()) - at);
        at = static_cast<size_t>(sentence.data() - text.data()) + sentence.size();
      }
      outside += text.substr(at);
      EXPECT_EQ(outside.find_first_not_of(" \n"), std::string::npos) << ::testing::PrintToString(text);
      more = false;
      for (size_t& d : digits) {
        if (++d < kAlphabet.size()) {
          more = true;
          break;
        }
        d = 0;
      }
    }
  }
}

// Paragraph text with words, punctuation, CRLF lines and multi-byte UTF-8.
std::string RandomText(std::mt19937& random, size_t bytes) {
  static const std::vector<std::string> kWords = {
      "the", "cat", "Sat.", "on", "a", "mat!", "caf\xC3\xA9", "\xE4\xB8\xAD\xE6\x96\x87", "Why?", "ok", "end.", "x"};
  std::string text;
  while (text.size() < bytes) {
    text += kWords[random() % kWords.size()];
    const uint32_t roll = random() % 100;
    text += roll < 80 ? " " : roll < 90 ? "\n" : roll < 93 ? "\r\n" : roll < 99 ? "\n\n" : "\n \n\n";
  }
  return text;
}

std::string RandomJsonl(std::mt19937& random, size_t bytes) {
  std::string text;
  while (text.size() < bytes) {
    text += nlohmann::json{{"text", RandomText(random, 1 + random() % 400)}}.dump() + "\n";
  }
  return text;
}

TEST_F(PreprocessTest, OutputIsByteIdenticalForAnyThreadCount) {
  std::mt19937 random(2024);
  WriteFile(dir_ / "a.txt", RandomText(random, 700'000));
  WriteFile(dir_ / "b.jsonl", RandomJsonl(random, 500'000));
  WriteFile(dir_ / "c.txt", RandomText(random, 300'000));
  for (const bool split_sentences : {false, true}) {
    SCOPED_TRACE(split_sentences);
    std::string reference_idx, reference_bin;
    PreprocessStats reference_stats;
    for (const auto& [threads, chunk_bytes] : {std::pair{1, 1 << 20}, std::pair{4, 16 << 10}, std::pair{3, 1000}}) {
      SCOPED_TRACE(StrCat(threads, " threads, chunks of ", chunk_bytes));
      const auto stats = Run({"a.txt", "b.jsonl", "c.txt"},
                             {.split_sentences = split_sentences, .num_threads = threads, .chunk_bytes = chunk_bytes});
      ASSERT_TRUE(stats.ok()) << stats.status();
      if (reference_idx.empty()) {
        reference_idx = ReadFile(dir_ / "out.idx");
        reference_bin = ReadFile(dir_ / "out.bin");
        reference_stats = *stats;
        ASSERT_GT(stats->documents, 1000);
        EXPECT_EQ(stats->bytes, static_cast<int64_t>(std::filesystem::file_size(dir_ / "a.txt") +
                                                     std::filesystem::file_size(dir_ / "b.jsonl") +
                                                     std::filesystem::file_size(dir_ / "c.txt")));
        continue;
      }
      EXPECT_TRUE(ReadFile(dir_ / "out.idx") == reference_idx);
      EXPECT_TRUE(ReadFile(dir_ / "out.bin") == reference_bin);
      EXPECT_EQ(stats->documents, reference_stats.documents);
      EXPECT_EQ(stats->sequences, reference_stats.sequences);
      EXPECT_EQ(stats->tokens, reference_stats.tokens);
      EXPECT_EQ(stats->bytes, reference_stats.bytes);
    }
  }
}

TEST_F(PreprocessTest, ProgressCoversEveryByte) {
  std::mt19937 random(1);
  const std::string text = RandomText(random, 200'000);
  WriteFile(dir_ / "a.txt", text);
  std::vector<std::pair<int64_t, int64_t>> calls;
  PreprocessOptions options{
      .inputs = {dir_ / "a.txt"}, .output_prefix = dir_ / "out", .num_threads = 2, .chunk_bytes = 10'000};
  const auto stats =
      Preprocess(options, tokenizer_, [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_GT(calls.size(), 10u);
  for (size_t k = 0; k < calls.size(); ++k) {
    EXPECT_EQ(calls[k].second, static_cast<int64_t>(text.size()));
    if (k > 0) {
      EXPECT_GE(calls[k].first, calls[k - 1].first);
    }
  }
  EXPECT_EQ(calls.back().first, static_cast<int64_t>(text.size()));
  EXPECT_EQ(stats->bytes, static_cast<int64_t>(text.size()));
}

TEST_F(PreprocessTest, LargeVocabulariesUseInt32) {
  WriteFile(dir_ / "a.txt", "abc");
  const ByteTokenizer big(70000);
  ASSERT_TRUE(Run({"a.txt"}, {}, &big).ok());
  EXPECT_EQ((*IndexedDataset::Open(dir_ / "out"))->dtype(), TokenDtype::kInt32);
}

TEST_F(PreprocessTest, InvalidUtf8NamesFileAndLine) {
  WriteFile(dir_ / "a.txt", "fine\n\nok\nab\xFFz\n");
  auto stats = Run({"a.txt"});
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stats.status().message(), HasSubstr((dir_ / "a.txt").string() + ":4: invalid UTF-8 at byte column 3"));
  ExpectNoOutput();
}

// Many chunks in flight, two bad lines: the first in input order is reported
// whatever the thread count.
TEST_F(PreprocessTest, FirstErrorInInputOrderWins) {
  std::string text;
  for (int line = 1; line <= 30000; ++line) {
    text += line == 20000 ? "bad \xC0\xAF line\n" : line == 25000 ? "worse \x01\n" : StrCat("line ", line, "\n");
  }
  WriteFile(dir_ / "a.txt", "prefix\n");
  WriteFile(dir_ / "b.txt", text);
  for (const int threads : {1, 4}) {
    const auto stats =
        Run({"a.txt", "b.txt"}, {.format = InputFormat::kLines, .num_threads = threads, .chunk_bytes = 4096});
    ASSERT_FALSE(stats.ok());
    EXPECT_THAT(stats.status().message(),
                HasSubstr((dir_ / "b.txt").string() + ":20000: invalid UTF-8 at byte column 5"));
  }
  WriteFile(dir_ / "b.txt", text.substr(text.find("line 20001")));
  const auto stats = Run({"a.txt", "b.txt"}, {.format = InputFormat::kLines, .chunk_bytes = 4096});
  ASSERT_FALSE(stats.ok());
  EXPECT_THAT(stats.status().message(),
              HasSubstr((dir_ / "b.txt").string() + ":5000: cannot tokenize: byte 0x01 at offset 6"));
  ExpectNoOutput();
}

TEST_F(PreprocessTest, JsonErrorsNameFileAndLine) {
  const std::string name = (dir_ / "a.jsonl").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"text\": \"a\"}\n{\"text\": \n", name + ":2: invalid JSON at column "},
      {"\n[1, 2]\n", name + ":2: expected a JSON object"},
      {"{\"body\": \"a\"}\n", name + ":1: no field \"text\""},
      {"{\"text\": [\"a\"]}\n", name + ":1: field \"text\" is not a string"},
      {"{\"text\": \"a\"}\n{\"text\": \"a\", \"id\": 2, \"text\": \"b\"}\n",
       name + ":2: field \"text\" appears 2 times"},
  };
  for (const auto& [content, message] : cases) {
    WriteFile(dir_ / "a.jsonl", content);
    const auto stats = Run({"a.jsonl"});
    ASSERT_FALSE(stats.ok()) << content;
    EXPECT_THAT(stats.status().message(), HasSubstr(message));
    EXPECT_THAT(stats.status().message(), Not(HasSubstr("json.exception")));
    ExpectNoOutput();
  }
  // The same name inside another object is another field.
  WriteFile(dir_ / "a.jsonl", "{\"text\": \"a b\", \"meta\": {\"text\": \"c\"}}\n");
  const auto stats = Run({"a.jsonl"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 1);
}

// Cancelled (a `tessera train`'s Ctrl-C while it builds its dataset): it
// stops at the next chunk and writes nothing; an earlier dataset stays.
TEST_F(PreprocessTest, ACancelledBuildWritesNothing) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "paragraph " + std::to_string(i) + "\n\n";
  WriteFile(dir_ / "a.txt", text);
  PreprocessOptions options;
  options.chunk_bytes = 256;
  int asked = 0;
  options.cancelled = [&] { return ++asked > 3; };
  const auto stats = Run({"a.txt"}, options);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kCancelled) << stats.status();
  EXPECT_EQ(asked, 4);
  ExpectNoOutput();
}

// What commit_also places (bpe:N's vocabulary) is in the dataset's commit:
// a Ctrl-C there waits until it is placed too (it acted between the two:
// the new dataset stayed beside the old vocabulary, the new one deleted).
TEST_F(PreprocessTest, ASignalInTheCommitWaitsForWhatCommitsWithIt) {
  WriteFile(dir_ / "a.txt", "one\n\ntwo\n\n");
  const std::filesystem::path placed = dir_ / "placed";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RemoveTemporariesOnSignals();
    PreprocessOptions options;
    options.num_threads = 1;
    options.commit_also = [&] {
      ::kill(::getpid(), SIGINT);  // held back: the process ends once the commit is done
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      WriteFile(placed, "placed");
      return absl::OkStatus();
    };
    (void)Run({"a.txt"}, options);
    ::_exit(0);  // (not reached: the held signal ends the process)
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  EXPECT_EQ(ReadFile(placed), "placed");
  EXPECT_EQ(ReadBack(dir_ / "out"), (Documents{{"one<EOD>"}, {"two<EOD>"}}));
}

TEST_F(PreprocessTest, UnreadableInputsAreNamed) {
  WriteFile(dir_ / "a.txt", "text");
  auto stats = Run({"a.txt", "missing.txt"});
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(stats.status().message(), HasSubstr("cannot read input '" + (dir_ / "missing.txt").string() + "'"));
  std::filesystem::create_directory(dir_ / "folder");
  stats = Run({"folder"});
  ASSERT_FALSE(stats.ok());
  EXPECT_THAT(stats.status().message(), HasSubstr("not a regular file"));
  EXPECT_FALSE(Preprocess({}, tokenizer_).ok());
  ExpectNoOutput();
}

// PREFIX.source.json: the inputs, their sizes and the vocabulary's
// fingerprint, read back while it describes the index beside it; ignored
// once another tool has replaced the dataset; a malformed one is named.
TEST_F(PreprocessTest, TheDatasetSaysWhatItWasBuiltFrom) {
  const std::string text = "Hello world.\n\nMore text.\n";
  WriteFile(dir_ / "a.txt", text);
  ASSERT_TRUE(Run({"a.txt"}).ok());
  // A field of another type or missing is named (it said nlohmann's
  // "[json.exception.type_error.302] type must be number, but is string").
  const std::string written = ReadFile(dir_ / "out.source.json");
  // The index's time is Unix time in nanoseconds (it was the file clock's,
  // a negative number), within a minute of now.
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LT(std::llabs(nlohmann::json::parse(written)["index_mtime_ns"].get<int64_t>() - now_ns), 60'000'000'000LL);
  for (const auto& [pointer, value, error] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"/data_bytes", "x", "malformed: its 'data_bytes' is not an integer"},
           {"/tokenizer/vocab_size", 1.5, "malformed: its 'tokenizer.vocab_size' is not an integer"},
           {"/tokenizer", 5, "malformed: its 'tokenizer' is not an object"},
           {"/inputs/0/path", 5, "malformed: its 'inputs[0].path' is not a string"},
           {"/inputs/0", "x", "malformed: its 'inputs[0]' is not an object"}}) {
    nlohmann::json bad = nlohmann::json::parse(written);
    bad[nlohmann::json::json_pointer(pointer)] = value;
    WriteFile(dir_ / "out.source.json", bad.dump());
    EXPECT_THAT(ReadDatasetSource(dir_ / "out").status().message(), HasSubstr(error)) << pointer;
  }
  {
    nlohmann::json bad = nlohmann::json::parse(written);
    bad.erase("end_of_document");
    WriteFile(dir_ / "out.source.json", bad.dump());
    EXPECT_THAT(ReadDatasetSource(dir_ / "out").status().message(),
                HasSubstr("malformed: it has no 'end_of_document'"));
  }
  WriteFile(dir_ / "out.source.json", written);
  auto source = ReadDatasetSource(dir_ / "out");
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE(source->has_value());
  EXPECT_EQ((*source)->inputs, std::vector<std::filesystem::path>{std::filesystem::weakly_canonical(dir_ / "a.txt")});
  EXPECT_EQ((*source)->input_bytes, std::vector<int64_t>{static_cast<int64_t>(text.size())});
  EXPECT_EQ((*source)->tokenizer, TokenizerFingerprint(ByteTokenizer()));
  EXPECT_EQ((*source)->tokenizer_description, "bytes, 261 tokens");
  // The fingerprint tells vocabularies apart.
  EXPECT_NE(TokenizerFingerprint(ByteTokenizer(262)), TokenizerFingerprint(ByteTokenizer()));
  EXPECT_NE(TokenizerFingerprint(ByteTokenizer(261, /*has_end_of_document=*/false)),
            TokenizerFingerprint(ByteTokenizer()));
  // A copy that did not keep the times (cp, a restore) is still known, by
  // its index's checksum (every check was skipped for it, silently); the
  // same sizes with other index bytes are another dataset.
  for (const char* suffix : {".bin", ".idx", ".source.json"}) {
    std::filesystem::copy_file(dir_ / ("out" + std::string(suffix)), dir_ / ("copy" + std::string(suffix)));
  }
  const auto later = std::filesystem::last_write_time(dir_ / "out.idx") + std::chrono::seconds(5);
  std::filesystem::last_write_time(dir_ / "copy.idx", later);
  source = ReadDatasetSource(dir_ / "copy");
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE(source->has_value());
  std::string index = ReadFile(dir_ / "copy.idx");
  index[index.size() - 1] = static_cast<char>(index.back() ^ 1);
  WriteFile(dir_ / "copy.idx", index);
  std::filesystem::last_write_time(dir_ / "copy.idx", later);
  source = ReadDatasetSource(dir_ / "copy");
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_FALSE(source->has_value());
  // A description written before the checksum was kept gains it when read
  // beside its own index, and then knows that index's copies too.
  {
    nlohmann::json old = nlohmann::json::parse(ReadFile(dir_ / "out.source.json"));
    old.erase("index_checksum");
    WriteFile(dir_ / "out.source.json", old.dump());
    source = ReadDatasetSource(dir_ / "out");
    ASSERT_TRUE(source.ok() && source->has_value()) << source.status();
    EXPECT_TRUE(nlohmann::json::parse(ReadFile(dir_ / "out.source.json")).contains("index_checksum"));
  }
  // Another tool's dataset in its place: the description is of another index.
  {
    auto builder = IndexedDatasetBuilder::Create(dir_ / "out", TokenDtype::kUint16);
    ASSERT_TRUE(builder.ok()) << builder.status();
    const std::vector<int64_t> tokens = {1, 2, 3};
    for (int k = 0; k < 9; ++k) ASSERT_TRUE((*builder)->AddSequence(tokens).ok());
    ASSERT_TRUE((*builder)->EndDocument().ok());
    ASSERT_TRUE((*builder)->Finalize().ok());
  }
  source = ReadDatasetSource(dir_ / "out");
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_FALSE(source->has_value());
  WriteFile(dir_ / "out.source.json", "{\"inputs\": 3}");
  source = ReadDatasetSource(dir_ / "out");
  ASSERT_FALSE(source.ok());
  EXPECT_THAT(source.status().message(), HasSubstr("out.source.json: malformed"));
}

// Throughput with the byte-level test double (run by hand:
// --gtest_also_run_disabled_tests --gtest_filter='*Throughput*').
TEST_F(PreprocessTest, DISABLED_Throughput) {
  std::mt19937 random(3);
  constexpr size_t kBytes = size_t{64} << 20;
  WriteFile(dir_ / "big.txt", RandomText(random, kBytes));
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const int threads : {1, hardware}) {
    const auto start = std::chrono::steady_clock::now();
    const auto stats = Run({"big.txt"}, {.num_threads = threads});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::printf("preprocess: %d threads: %.1f MB/s (%lld documents, %lld tokens)\n", threads,
                static_cast<double>(stats->bytes) / 1e6 / seconds, static_cast<long long>(stats->documents),
                static_cast<long long>(stats->tokens));
  }
}

}  // namespace
}  // namespace tessera::data
