#include "core/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/json_text.h"
#include "core/registry.h"
#include "core/schema.h"
#include "core/status.h"
#include "core/strings.h"

namespace tessera::config {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

// Each test gets a fresh directory of config files, removed afterwards.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tessera_config_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path Write(const fs::path& relative, const std::string& contents) {
    const fs::path path = dir_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << contents;
    return path;
  }

  fs::path dir_;
};

// A schema with one key of each type, a targeted section and a section that
// is not implemented, for override tests.
const Section& TestSchema() {
  static const Section* const schema = [] {
    auto* root = new Section();
    root->Sub("train",
              Section("training")
                  .Key("train_iter", {.type = KeyType::kInt, .default_value = 100, .min = 1})
                  .Key("lr", {.type = KeyType::kNumber, .default_value = 0.5})
                  .Key("name", {.type = KeyType::kString, .default_value = "run"})
                  .Key("betas", {.type = KeyType::kNumberList, .default_value = json::array({0.9, 0.999})})
                  .Key("global_batch_size", {.type = KeyType::kInt, .nullable = true, .min = 1})
                  .Sub("amp", Section()
                                  .Key("enabled", {.type = KeyType::kBool, .default_value = false})
                                  .Key("dtype", {.type = KeyType::kString, .default_value = "bf16", .choices = {"bf16", "fp16"}}))
                  .Sub("dist", Section()
                                   .Key("tensor_parallel_size", {.type = KeyType::kInt, .default_value = 1, .min = 1})
                                   .Key("data_parallel_size", {.type = KeyType::kInt, .default_value = 1, .min = 1})));
    root->Sub("optim", Section("optimizer")
                           .Target("AdamW", Section()
                                                .Key("lr", {.type = KeyType::kNumber, .default_value = 1e-3})
                                                .Key("eps", {.type = KeyType::kNumber, .default_value = 1e-8}))
                           .Target("SGD", Section()
                                              .Key("lr", {.type = KeyType::kNumber, .default_value = 0.1})
                                              .Key("momentum", {.type = KeyType::kNumber, .default_value = 0.0}))
                           .DefaultTarget("AdamW"));
    root->Sub("dataloader", Section().NotImplemented("datasets"));
    return root;
  }();
  return *schema;
}

// A config of TestSchema's keys, as a file would give it.
json TypedConfig() {
  return json::parse(R"({
    "train": {
      "train_iter": 100, "lr": 0.5, "amp": {"enabled": false, "dtype": "bf16"},
      "name": "run", "betas": [0.9, 0.999], "global_batch_size": null,
      "dist": {"tensor_parallel_size": 1, "data_parallel_size": 1}
    },
    "optim": {"_target_": "AdamW", "lr": 0.01}
  })");
}

// Overrides applied, then the config resolved against TestSchema.
absl::StatusOr<json> Overridden(const std::vector<std::string>& overrides) {
  json config = TypedConfig();
  Origins origins;
  RETURN_IF_ERROR(ApplyOverrides(config, overrides, TestSchema(), &origins));
  return Resolve(TestSchema(), config, origins);
}

// ---------------------------------------------------------------- _base_

TEST_F(ConfigTest, BaseChainOfThreeLevelsResolvesPathsFromEachFilesDirectory) {
  Write("common/base.json", R"({"train": {"seed": 1, "iters": 10, "log": 5}, "level": "base"})");
  Write("models/gpt.json",
        R"({"_base_": "../common/base.json", "train": {"iters": 20}, "level": "model"})");
  const fs::path job = Write("jobs/gpt/job.json", R"({
    "_base_": ["../../models/gpt.json"],
    "train": {"log": 7},
    "model_only": true
  })");

  absl::StatusOr<json> config = LoadConfigFiles(job);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["train"]["seed"], 1);    // from the grandparent
  EXPECT_EQ((*config)["train"]["iters"], 20);  // parent over grandparent
  EXPECT_EQ((*config)["train"]["log"], 7);     // the job over both
  EXPECT_EQ((*config)["level"], "model");
  EXPECT_EQ((*config)["model_only"], true);
  EXPECT_FALSE(config->contains("_base_"));
}

TEST_F(ConfigTest, MultipleBasesMergeInListOrderThenTheFileItself) {
  Write("first.json", R"({"a": 1, "b": 1, "only_first": 1})");
  Write("second.json", R"({"b": 2, "c": 2})");
  const fs::path job = Write("job.json", R"({"_base_": ["first.json", "second.json"], "c": 3})");

  absl::StatusOr<json> config = LoadConfigFiles(job);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, json::parse(R"({"a": 1, "b": 2, "c": 3, "only_first": 1})"));

  // Reversing the list reverses who wins.
  const fs::path reversed = Write("reversed.json", R"({"_base_": ["second.json", "first.json"]})");
  config = LoadConfigFiles(reversed);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["b"], 1);
}

TEST_F(ConfigTest, FileDeepMergesIntoItsBase) {
  Write("base.json",
        R"({"train": {"dist": {"tp": 1, "pp": 1}, "betas": [1, 2, 3], "x": {"k": 1}}})");
  const fs::path job = Write("job.json", R"({
    "_base_": "base.json",
    "train": {"dist": {"tp": 2}, "betas": [9], "x": 5}
  })");
  absl::StatusOr<json> config = LoadConfigFiles(job);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["train"]["dist"], json::parse(R"({"tp": 2, "pp": 1})"));
  EXPECT_EQ((*config)["train"]["betas"], json::parse("[9]"));  // arrays replace
  EXPECT_EQ((*config)["train"]["x"], 5);                       // scalar replaces object
}

TEST(DeepMergeTest, ObjectsMergeKeyByKeyAndEverythingElseReplaces) {
  json base = json::parse(R"({"o": {"a": 1, "b": {"c": 1, "d": 1}}, "arr": [1, 2], "s": 1,
                              "n": 1, "to_object": 3})");
  DeepMerge(base, json::parse(R"({"o": {"b": {"c": 2}, "e": 3}, "arr": [3], "s": "x",
                                 "n": null, "to_object": {"k": 1}})"));
  EXPECT_EQ(base, json::parse(R"({"o": {"a": 1, "b": {"c": 2, "d": 1}, "e": 3}, "arr": [3],
                                  "s": "x", "n": null, "to_object": {"k": 1}})"));
}

TEST_F(ConfigTest, CommentsAreAllowed) {
  const fs::path path = Write("c.json", R"(// line comment
  {
    /* block
       comment */
    "a": 1, // trailing
    "b": /* inline */ 2
  })");
  absl::StatusOr<json> config = LoadConfigFiles(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, json::parse(R"({"a": 1, "b": 2})"));
}

TEST_F(ConfigTest, BaseCycleIsAnErrorNamingTheChain) {
  const fs::path a = Write("a.json", R"({"_base_": "b.json"})");
  const fs::path b = Write("b.json", R"({"_base_": ["a.json"]})");
  absl::StatusOr<json> config = LoadConfigFiles(a);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr(a.string() + " -> " + b.string() + " -> " + a.string()));

  const fs::path self = Write("self.json", R"({"_base_": "./self.json"})");
  config = LoadConfigFiles(self);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr(self.string() + " -> " + self.string()));
}

TEST_F(ConfigTest, SharedBaseIsNotACycle) {
  Write("common.json", R"({"x": 1})");
  Write("left.json", R"({"_base_": "common.json", "l": 1})");
  Write("right.json", R"({"_base_": "common.json", "r": 1})");
  const fs::path job = Write("job.json", R"({"_base_": ["left.json", "right.json"]})");
  absl::StatusOr<json> config = LoadConfigFiles(job);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, json::parse(R"({"x": 1, "l": 1, "r": 1})"));
}

TEST_F(ConfigTest, MissingBaseNamesTheIncludingFileAndThePath) {
  const fs::path job = Write("jobs/job.json", R"({"_base_": ["../common/trian.json"]})");
  absl::StatusOr<json> config = LoadConfigFiles(job);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr(job.string()));
  EXPECT_THAT(config.status().message(), HasSubstr("../common/trian.json"));
  EXPECT_THAT(config.status().message(), HasSubstr((dir_ / "common/trian.json").string()));
}

// A name with control characters is quoted escaped: the error stays one line.
TEST_F(ConfigTest, MissingBaseWithANewlineInItsNameIsOneLine) {
  const fs::path job = Write("jobs/job.json", R"({"_base_": ["a\nb\u0001.json"]})");
  absl::StatusOr<json> config = LoadConfigFiles(job);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(std::string(config.status().message()).find('\n'), std::string::npos) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr("names base 'a\\nb\\x01.json'"));
}

TEST_F(ConfigTest, MissingFileAndBadBaseValueAreErrors) {
  absl::StatusOr<json> config = LoadConfigFiles(dir_ / "nope.json");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("nope.json"));

  config = LoadConfigFiles(Write("bad_base.json", R"({"_base_": 3})"));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("bad_base.json"));
  EXPECT_THAT(config.status().message(), HasSubstr("_base_"));

  config = LoadConfigFiles(Write("array.json", "[1, 2]"));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("must hold a JSON object"));
}

TEST_F(ConfigTest, SyntaxErrorNamesFileLineAndColumn) {
  Write("base.json", "{\n  \"a\": 1,\n  \"b\": tru\n}\n");
  const fs::path job = Write("job.json", R"({"_base_": "base.json"})");
  absl::StatusOr<json> config = LoadConfigFiles(job);
  ASSERT_FALSE(config.ok());
  const std::string message(config.status().message());
  // The error is in the base, so that is the file named; "tru" ends line 3.
  EXPECT_THAT(message, HasSubstr((dir_ / "base.json").string() + ":3:"));
  EXPECT_THAT(message, HasSubstr("JSON syntax error"));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// A number past a double's range: the parser's error has no position, the
// message still names the line and column of the number (not of a longer
// one that contains its digits).
TEST_F(ConfigTest, ANumberOutOfRangeNamesItsLineAndColumn) {
  const fs::path file = Write("big.json", "{\n  \"a\": 11e400,\n  \"b\": 1e400\n}\n");
  const absl::StatusOr<json> config = LoadConfigFiles(file);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(), file.string() + ":2:8: invalid JSON: number overflow parsing '11e400'");
}

// A nonzero number below a double's smallest: the parser reads it as 0
// without a word (`"weight_decay": 1e-400` would be no decay); refused with
// its line and column. Zeros, subnormals and the same text inside strings
// and comments are no error.
TEST_F(ConfigTest, ANumberThatWouldReadAsZeroIsAnError) {
  const fs::path file =
      Write("tiny.json", "{\n  \"s\": \"1e-400\", // 1e-400\n  \"z\": 0e-999, \"d\": 1e-310,\n  \"t\": -1.5e-400\n}\n");
  const absl::StatusOr<json> config = LoadConfigFiles(file);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(), file.string() +
                                           ":4:8: number -1.5e-400 is nonzero but below the smallest a number holds "
                                           "(it would read as 0)");
  EXPECT_FALSE(FirstUnderflowingNumber(R"({"a": [0.0, 0e-400, -0.000e5, 1e-323], /* 1e-999 */ "b": "2e-999"})"));
  const std::optional<NumberAt> tiny = FirstUnderflowingNumber("[0.00001e-320]");
  ASSERT_TRUE(tiny);
  EXPECT_EQ(tiny->offset, 1u);
  EXPECT_EQ(tiny->text, "0.00001e-320");
  const absl::StatusOr<Override> parsed = ParseOverride("optim.weight_decay=1e-400");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "override 'optim.weight_decay=1e-400': 1e-400 is nonzero but below the smallest a number holds (it would "
            "read as 0)");
}

TEST_F(ConfigTest, ErrorsNameTheFileThatSetTheKey) {
  Write("base.json", R"({"train": {"train_iter": "many", "lr": 0.1}})");
  const fs::path job = Write("job.json", R"({"_base_": "base.json", "train": {"trian_iter": 3}})");
  absl::StatusOr<json> config = LoadConfig(job, {}, TestSchema());
  ASSERT_FALSE(config.ok());
  // The unknown key is found first (keys are checked before values), named
  // with its file's line and column (the file alone before).
  EXPECT_EQ(config.status().message(),
            "unknown config key 'train.trian_iter' (in " + job.string() + ":1:35); did you mean 'train.train_iter'?");
  const fs::path fixed = Write("fixed.json", R"({"_base_": "base.json", "train": {"lr": 2}})");
  config = LoadConfig(fixed, {}, TestSchema());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            "config key 'train.train_iter' expects an integer >= 1, got string \"many\" (in " +
                (dir_ / "base.json").string() + ":1:12)");
  // Comments and strings holding quotes and braces do not throw the
  // positions off.
  const fs::path commented = Write("commented.json",
                                   "{\n  // a \"comment\" {\n  /* \"x\": { */ \"train\": {\"name\": "
                                   "\"a\\\"{b\", \"list\": [{\"lr\": 1}],\n    \"lr\": -3}}\n");
  config = LoadConfig(commented, {}, TestSchema());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            "unknown config key 'train.list' (in " + commented.string() + ":3:43); did you mean 'train.dist'?");
  // Set right by a later file or an override, the base's value no longer counts.
  EXPECT_TRUE(LoadConfig(fixed, {"train.train_iter=7"}, TestSchema()).ok());
}

TEST_F(ConfigTest, AnotherTargetInAFileReplacesTheBasesSection) {
  Write("base.json", R"({"optim": {"_target_": "AdamW", "lr": 0.5, "eps": 1e-6}})");
  const fs::path job = Write("job.json", R"({"_base_": "base.json", "optim": {"_target_": "SGD", "momentum": 0.9}})");
  absl::StatusOr<json> config = LoadConfig(job, {}, TestSchema());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["optim"], json::parse(R"({"_target_": "SGD", "lr": 0.1, "momentum": 0.9})"));
  // The same target merges key by key.
  const fs::path same = Write("same.json", R"({"_base_": "base.json", "optim": {"_target_": "AdamW", "lr": 0.25}})");
  config = LoadConfig(same, {}, TestSchema());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["optim"], json::parse(R"({"_target_": "AdamW", "lr": 0.25, "eps": 1e-6})"));
}

TEST_F(ConfigTest, LimitsKeepHostileFilesCheap) {
  // Nesting.
  const fs::path deep = Write("deep.json", "{\"a\": " + std::string(200, '[') + std::string(200, ']') + "}");
  EXPECT_THAT(LoadConfigFiles(deep).status().message(), HasSubstr("deeper than"));
  // Size.
  const fs::path big = Write("big.json", "{\"a\": \"" + std::string(kMaxConfigFileBytes, 'x') + "\"}");
  EXPECT_THAT(LoadConfigFiles(big).status().message(), HasSubstr("bytes"));
  // A chain of bases longer than kMaxBaseDepth.
  for (int i = 0; i < kMaxBaseDepth + 2; ++i) {
    Write("chain" + std::to_string(i) + ".json", "{\"_base_\": \"chain" + std::to_string(i + 1) + ".json\"}");
  }
  Write("chain" + std::to_string(kMaxBaseDepth + 2) + ".json", "{}");
  EXPECT_THAT(LoadConfigFiles(dir_ / "chain0.json").status().message(), HasSubstr("chain deeper than"));
  // A lattice: every level includes the next one twice, 2^10 reads unbounded.
  for (int i = 0; i < 10; ++i) {
    const std::string next = "lattice" + std::to_string(i + 1) + ".json";
    Write("lattice" + std::to_string(i) + ".json", "{\"_base_\": [\"" + next + "\", \"" + next + "\"]}");
  }
  Write("lattice10.json", "{}");
  const auto started = std::chrono::steady_clock::now();
  EXPECT_THAT(LoadConfigFiles(dir_ / "lattice0.json").status().message(), HasSubstr("reads more than"));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
  // Not a regular file, also as a base (the including file named).
  EXPECT_THAT(LoadConfigFiles(dir_).status().message(), HasSubstr("is not a regular file"));
  const fs::path includes_dir = Write("includes_dir.json", "{\"_base_\": \".\"}");
  EXPECT_EQ(LoadConfigFiles(includes_dir).status().message(),
            "config file '" + includes_dir.string() + "' names base '.', which is not a regular file");
  // A symlink loop is said to be one, not "not found".
  fs::create_symlink(dir_ / "loop_b.json", dir_ / "loop_a.json");
  fs::create_symlink(dir_ / "loop_a.json", dir_ / "loop_b.json");
  EXPECT_THAT(LoadConfigFiles(dir_ / "loop_a.json").status().message(),
              HasSubstr("cannot be read: Too many levels of symbolic links"));
  const fs::path includes_loop = Write("includes_loop.json", "{\"_base_\": \"loop_a.json\"}");
  EXPECT_EQ(LoadConfigFiles(includes_loop).status().message(),
            "config file '" + includes_loop.string() +
                "' names base 'loop_a.json', which cannot be read: Too many levels of symbolic links");
  // A NUL in a base's path (the OS would read another file) is refused.
  const fs::path nul_base = Write("nul_base.json", "{\"_base_\": \"chain1.json\\u0000zz\"}");
  EXPECT_THAT(LoadConfigFiles(nul_base).status().message(), HasSubstr("holds a NUL character"));
  // Invalid UTF-8 inside a string.
  const fs::path bad_utf8 = Write("utf8.json", "{\"a\": \"\xff\"}");
  EXPECT_THAT(LoadConfigFiles(bad_utf8).status().message(), HasSubstr("JSON syntax error"));
}

// ---------------------------------------------------------------- overrides

TEST(ParseOverrideTest, ValueIsJsonIfItParsesElseAString) {
  const auto value_of = [](const std::string& text) {
    absl::StatusOr<Override> parsed = ParseOverride(text);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return parsed.ok() ? parsed->value : json("<error>");
  };
  EXPECT_EQ(value_of("x=2"), json(2));
  EXPECT_TRUE(value_of("x=2").is_number_integer());
  EXPECT_TRUE(value_of("x=2.5").is_number_float());
  EXPECT_EQ(value_of("x=true"), json(true));
  EXPECT_EQ(value_of("x=[1,2]"), json::parse("[1,2]"));
  EXPECT_EQ(value_of("x=hello"), json("hello"));
  EXPECT_EQ(value_of("x=\"2\""), json("2"));
  EXPECT_EQ(value_of("x=null"), json(nullptr));
  EXPECT_EQ(value_of("x="), json(""));
  EXPECT_EQ(value_of("x=a=b"), json("a=b"));  // split at the first '='

  absl::StatusOr<Override> parsed = ParseOverride("train.dist.tensor_parallel_size=2");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->key, "train.dist.tensor_parallel_size");
  EXPECT_EQ(parsed->raw_value, "2");
  EXPECT_EQ(parsed->text, "train.dist.tensor_parallel_size=2");
}

TEST(ParseOverrideTest, MalformedOverridesAreErrorsNamingThem) {
  for (const std::string text : {"train.seed", "=3", "a..b=1", ".a=1", "a.=1"}) {
    absl::StatusOr<Override> parsed = ParseOverride(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("malformed override '" + text + "'"));
  }
  json config = TypedConfig();
  const absl::Status status = ApplyOverrides(config, {"train.train_iter"}, TestSchema());
  EXPECT_THAT(status.message(), HasSubstr("malformed override 'train.train_iter'"));
}

TEST(ParseOverrideTest, InvalidUtf8AndDeepNestingAreErrors) {
  for (const std::string& text : {std::string("train.name=\xff"), std::string("train.na\xc3me=1"),
                                 std::string("train.name=\xed\xa0\x80"),   // a UTF-16 surrogate
                                 std::string("train.name=\xc0\xaf")}) {     // an overlong '/'
    absl::StatusOr<Override> parsed = ParseOverride(text);
    ASSERT_FALSE(parsed.ok());
    EXPECT_THAT(parsed.status().message(), HasSubstr("not valid UTF-8"));
    // The message itself is printable ASCII, whatever the input was.
    for (const char c : parsed.status().message()) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << parsed.status().message();
  }
  EXPECT_TRUE(ParseOverride("train.name=caf\xc3\xa9 \xf0\x9f\x9a\x80").ok());
  const std::string deep = "train.betas=" + std::string(100, '[') + std::string(100, ']');
  EXPECT_THAT(ParseOverride(deep).status().message(), HasSubstr("nests deeper than"));
  const std::string shallow = "train.betas=" + std::string(5, '[') + std::string(5, ']');
  EXPECT_TRUE(ParseOverride(shallow).ok());
}

TEST(ApplyOverridesTest, SetsValuesOfEveryType) {
  absl::StatusOr<json> config = Overridden({
      "train.train_iter=500",
      "train.amp.enabled=true",
      "train.name=hello",
      "train.betas=[0.8,0.9]",
      "train.global_batch_size=64",
  });
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["train"]["train_iter"], 500);
  EXPECT_EQ((*config)["train"]["amp"]["enabled"], true);
  EXPECT_EQ((*config)["train"]["name"], "hello");
  EXPECT_EQ((*config)["train"]["betas"], json::parse("[0.8, 0.9]"));
  EXPECT_EQ((*config)["train"]["global_batch_size"], 64);
  ASSERT_TRUE(Overridden({"train.global_batch_size=null"}).ok());
  EXPECT_TRUE((*Overridden({"train.global_batch_size=null"}))["train"]["global_batch_size"].is_null());
}

TEST(ApplyOverridesTest, NumericConversionsFollowTheSchema) {
  absl::StatusOr<json> config = Overridden({"train.lr=1", "train.train_iter=2.0"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE((*config)["train"]["lr"].is_number_float());  // a number key stores a float
  EXPECT_EQ((*config)["train"]["lr"], 1.0);
  EXPECT_TRUE((*config)["train"]["train_iter"].is_number_integer());  // an integral float
  EXPECT_EQ((*config)["train"]["train_iter"], 2);
  ASSERT_TRUE(Overridden({"train.train_iter=1e5"}).ok());
  EXPECT_EQ((*Overridden({"train.train_iter=1e5"}))["train"]["train_iter"], 100000);
}

TEST(ApplyOverridesTest, StringKeyTakesTheRawTextOfANumberOrBool) {
  absl::StatusOr<json> config = Overridden({"train.name=2024"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["train"]["name"], "2024");
  EXPECT_EQ((*Overridden({"train.name=\"007\""}))["train"]["name"], "007");
  EXPECT_EQ((*Overridden({"train.name=true"}))["train"]["name"], "true");
}

TEST(ApplyOverridesTest, LaterOverrideWins) {
  absl::StatusOr<json> config = Overridden({"train.train_iter=1", "train.train_iter=2"});
  ASSERT_TRUE(config.ok());
  EXPECT_EQ((*config)["train"]["train_iter"], 2);
}

TEST(ApplyOverridesTest, KeysAbsentFromTheFileCanBeSetIfDeclared) {
  json config = json::parse(R"({"train": {}})");
  ASSERT_TRUE(ApplyOverrides(config, {"train.dist.data_parallel_size=4", "optim.momentum=0.5", "optim._target_=SGD"},
                             TestSchema())
                  .ok());
  absl::StatusOr<json> resolved = Resolve(TestSchema(), config);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)["train"]["dist"]["data_parallel_size"], 4);
  EXPECT_EQ((*resolved)["optim"], json::parse(R"({"_target_": "SGD", "lr": 0.1, "momentum": 0.5})"));
  // A whole section naming its _target_ sets it first too (it was applied
  // in its turn: optim.momentum before it was unknown under AdamW); its
  // other keys keep their turn, so a later override still wins.
  config = json::parse(R"({"train": {}})");
  ASSERT_TRUE(ApplyOverrides(config, {"optim.momentum=0.5", R"(optim={"_target_": "SGD"})"}, TestSchema()).ok());
  resolved = Resolve(TestSchema(), config);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)["optim"], json::parse(R"({"_target_": "SGD", "lr": 0.1, "momentum": 0.5})"));
  config = json::parse(R"({"train": {}})");
  ASSERT_TRUE(ApplyOverrides(config, {"optim.lr=0.5", R"(optim={"_target_": "SGD", "lr": 0.25})"}, TestSchema()).ok());
  resolved = Resolve(TestSchema(), config);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)["optim"]["lr"], 0.25);
  config = json::parse(R"({"train": {}})");
  ASSERT_TRUE(ApplyOverrides(config, {R"(optim={"_target_": "SGD", "lr": 0.25})", "optim.lr=0.5"}, TestSchema()).ok());
  resolved = Resolve(TestSchema(), config);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)["optim"]["lr"], 0.5);
}

// Each section's target is set once, to the last one given: a target
// changed and changed back kept only the defaults (the file's lr and eps
// went), and a section's object naming a target beat a later _target_.
TEST(ApplyOverridesTest, TheLastTargetGivenWinsAndKeepsTheFilesKeys) {
  const json file = json::parse(R"({"optim": {"_target_": "AdamW", "lr": 0.01, "eps": 1e-6}})");
  json config = file;
  ASSERT_TRUE(ApplyOverrides(config, {"optim._target_=SGD", "optim._target_=AdamW"}, TestSchema()).ok());
  EXPECT_EQ(config, file);
  config = file;
  ASSERT_TRUE(
      ApplyOverrides(config, {R"(optim={"_target_": "SGD", "lr": 0.25})", "optim._target_=AdamW"}, TestSchema()).ok());
  EXPECT_EQ(config["optim"], json::parse(R"({"_target_": "AdamW", "lr": 0.25, "eps": 1e-6})"));
  config = file;
  ASSERT_TRUE(
      ApplyOverrides(config, {"optim._target_=AdamW", R"(optim={"_target_": "SGD", "momentum": 0.5})"}, TestSchema())
          .ok());
  EXPECT_EQ(config["optim"], json::parse(R"({"_target_": "SGD", "momentum": 0.5})"));
}

TEST(ApplyOverridesTest, ChangingTheTargetDropsTheOldTargetsKeys) {
  // The file's AdamW lr must not leak into SGD; eps is not an SGD key.
  json config = TypedConfig();
  config["optim"]["eps"] = 1e-6;
  Origins origins;
  ASSERT_TRUE(ApplyOverrides(config, {"optim._target_=SGD", "optim.momentum=0.9"}, TestSchema(), &origins).ok());
  absl::StatusOr<json> resolved = Resolve(TestSchema(), config, origins);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ((*resolved)["optim"], json::parse(R"({"_target_": "SGD", "lr": 0.1, "momentum": 0.9})"));
  // Keys of another target are unknown under this one, and say whose they are.
  EXPECT_EQ(Overridden({"optim.momentum=0.9"}).status().message(),
            "unknown config key 'optim.momentum' (from override 'optim.momentum=0.9') (a key of optim._target_ SGD)");
  json in_file = TypedConfig();
  in_file["optim"]["momentum"] = 0.9;
  EXPECT_EQ(Resolve(TestSchema(), in_file, {{"optim.momentum", "in job.json"}}).status().message(),
            "unknown config key 'optim.momentum' (in job.json) (a key of optim._target_ SGD)");
}

TEST(ApplyOverridesTest, UnknownKeySuggestsTheClosestFullPath) {
  json config = TypedConfig();
  const absl::Status status = ApplyOverrides(config, {"train.dist.tensor_paralel_size=2"}, TestSchema());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "unknown config key 'train.dist.tensor_paralel_size' (from override "
            "'train.dist.tensor_paralel_size=2'); did you mean "
            "'train.dist.tensor_parallel_size'?");

  // A typo in a parent segment is matched over the whole path too.
  const absl::Status parent = ApplyOverrides(config, {"trian.dist.data_parallel_size=2"}, TestSchema());
  EXPECT_THAT(parent.message(), HasSubstr("did you mean 'train.dist.data_parallel_size'?"));

  // Nothing close: no misleading hint.
  const absl::Status far = ApplyOverrides(config, {"completely_unrelated_setting=1"}, TestSchema());
  EXPECT_THAT(far.message(), HasSubstr("unknown config key 'completely_unrelated_setting'"));
  EXPECT_THAT(far.message(), ::testing::Not(HasSubstr("did you mean")));

  // A key below a section that is not implemented names the reason.
  EXPECT_THAT(ApplyOverrides(config, {"dataloader.train.path=x"}, TestSchema()).message(),
              HasSubstr("not implemented yet (datasets)"));
}

TEST(ApplyOverridesTest, TypeMismatchesAreErrorsNamingTheOverride) {
  EXPECT_EQ(Overridden({"train.train_iter=5", "train.train_iter=abc"}).status().message(),
            "config key 'train.train_iter' expects an integer >= 1, got string \"abc\" "
            "(from override 'train.train_iter=abc')");
  EXPECT_THAT(Overridden({"train.train_iter=2.5"}).status().message(), HasSubstr("expects an integer >= 1, got number 2.5"));
  EXPECT_THAT(Overridden({"train.train_iter=0"}).status().message(), HasSubstr("must be >= 1, got 0"));
  EXPECT_THAT(Overridden({"train.amp.enabled=yes"}).status().message(),
              HasSubstr("'train.amp.enabled' expects a boolean, got string \"yes\""));
  EXPECT_THAT(Overridden({"train.amp.dtype=fp32"}).status().message(),
              HasSubstr("'train.amp.dtype' must be one of bf16, fp16, got \"fp32\""));
  EXPECT_THAT(Overridden({"train.lr=fast"}).status().message(), HasSubstr("'train.lr' expects a number"));
  EXPECT_THAT(Overridden({"train.betas=0.9"}).status().message(), HasSubstr("'train.betas' expects a list of numbers"));
  EXPECT_THAT(Overridden({"train.amp=1"}).status().message(), HasSubstr("'train.amp' expects an object"));
  EXPECT_THAT(Overridden({"train.lr=null"}).status().message(), HasSubstr("'train.lr' must not be null"));
  json config = TypedConfig();
  const json original = config;
  EXPECT_THAT(ApplyOverrides(config, {"train.train_iter=5", "train.train_iter.x=1"}, TestSchema()).message(),
              HasSubstr("'train.train_iter' is an integer, not an object"));
  EXPECT_EQ(config, original);  // the first, valid override was not applied either
}

TEST(ApplyOverridesTest, ObjectValueMergesWithPerLeafChecks) {
  absl::StatusOr<json> config = Overridden({R"(train.dist={"tensor_parallel_size": 4})"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)["train"]["dist"]["tensor_parallel_size"], 4);
  EXPECT_EQ((*config)["train"]["dist"]["data_parallel_size"], 1);  // untouched sibling kept

  EXPECT_THAT(Overridden({R"(train.dist={"tensor_paralel_size": 4})"}).status().message(),
              HasSubstr("unknown config key 'train.dist.tensor_paralel_size' (from override"));
  EXPECT_THAT(Overridden({R"(train.dist={"data_parallel_size": "two"})"}).status().message(),
              HasSubstr("'train.dist.data_parallel_size' expects an integer"));
}

// ------------------------------------------------------------ accessors

TEST(AccessorTest, TypedReadsAndTheirErrors) {
  json config = TypedConfig();
  config["train"]["eval_iter"] = 1e5;
  EXPECT_EQ(*GetInt(config, "train.train_iter"), 100);
  EXPECT_EQ(*GetInt(config, "train.eval_iter"), 100000);
  EXPECT_EQ(*GetDouble(config, "train.lr"), 0.5);
  EXPECT_EQ(*GetDouble(config, "train.train_iter"), 100.0);
  EXPECT_EQ(*GetBool(config, "train.amp.enabled"), false);
  EXPECT_EQ(*GetString(config, "train.amp.dtype"), "bf16");
  absl::StatusOr<const json*> node = GetNode(config, "train.global_batch_size");
  ASSERT_TRUE(node.ok());
  EXPECT_TRUE((*node)->is_null());

  EXPECT_EQ(GetInt(config, "train.lr").status().message(),
            "config key 'train.lr' expects an integer, got number 0.5");
  EXPECT_THAT(GetString(config, "train.train_iter").status().message(),
              HasSubstr("'train.train_iter' expects a string"));
  EXPECT_THAT(GetBool(config, "train.global_batch_size").status().message(),
              HasSubstr("expects a boolean, got null"));
  EXPECT_EQ(GetBool(config, "train.global_batch_size").status().message(),
            "config key 'train.global_batch_size' expects a boolean, got null");
  const absl::Status missing = GetInt(config, "train.trainiter").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("did you mean 'train.train_iter'?"));
  EXPECT_FALSE(GetInt(config, "train..x").ok());
}

// ------------------------------------------------------------ SaveConfig

TEST_F(ConfigTest, SaveConfigRoundTripsAtomicallyWithoutLeftovers) {
  const json config = TypedConfig();
  const fs::path path = dir_ / "config.json";
  Write("config.json", "old contents");
  ASSERT_TRUE(SaveConfig(config, path).ok());

  absl::StatusOr<json> loaded = LoadConfigFiles(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, config);
  EXPECT_TRUE((*loaded)["train"]["lr"].is_number_float());
  // The saved file loads back through the schema unchanged.
  ASSERT_TRUE(ApplyOverrides(*loaded, {"train.name=again"}, TestSchema()).ok());

  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"config.json"});

  const absl::Status no_dir = SaveConfig(config, dir_ / "missing_dir" / "config.json");
  EXPECT_FALSE(no_dir.ok());
  EXPECT_THAT(no_dir.message(), HasSubstr("missing_dir"));
}

// ------------------------------------------------------------ Registry

struct Optimizer {
  virtual ~Optimizer() = default;
  double lr = 0;
};

Registry<Optimizer> MakeRegistry() {
  Registry<Optimizer> registry("optimizer");
  const auto factory = [](const json& args) -> absl::StatusOr<std::unique_ptr<Optimizer>> {
    auto optimizer = std::make_unique<Optimizer>();
    optimizer->lr = args.at("lr").get<double>();
    return optimizer;
  };
  EXPECT_TRUE(registry.Register("AdamW", factory).ok());
  EXPECT_TRUE(registry.Register("SGD", factory).ok());
  return registry;
}

TEST(RegistryTest, CreatesFromTarget) {
  const Registry<Optimizer> registry = MakeRegistry();
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      registry.Create(json::parse(R"({"_target_": "AdamW", "lr": 0.25})"));
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  EXPECT_EQ((*optimizer)->lr, 0.25);
  EXPECT_EQ(registry.Names(), (std::vector<std::string>{"AdamW", "SGD"}));
}

TEST(RegistryTest, UnknownTargetNamesItAndTheClosestName) {
  const Registry<Optimizer> registry = MakeRegistry();
  const absl::Status status =
      registry.Create(json::parse(R"({"_target_": "AdamX", "lr": 1})")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("'AdamX'"));
  EXPECT_THAT(status.message(), HasSubstr("did you mean 'AdamW'?"));
}

TEST(RegistryTest, DuplicateAndBadNodesAreErrors) {
  Registry<Optimizer> registry = MakeRegistry();
  const absl::Status duplicate =
      registry.Register("SGD", [](const json&) -> absl::StatusOr<std::unique_ptr<Optimizer>> {
        return std::make_unique<Optimizer>();
      });
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(duplicate.message(), HasSubstr("'SGD'"));

  EXPECT_FALSE(registry.Create(json::parse(R"({"lr": 1})")).ok());
  EXPECT_FALSE(registry.Create(json::parse(R"({"_target_": 3})")).ok());
  // A factory's nlohmann exception (missing "lr") comes back as a status.
  const absl::Status bad_args = registry.Create(json::parse(R"({"_target_": "SGD"})")).status();
  EXPECT_EQ(bad_args.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_args.message(), HasSubstr("'SGD'"));
}

TEST(StringsTest, EditDistanceAndClosestMatch) {
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("paralel", "parallel"), 1u);
  EXPECT_EQ(EditDistance("ab", "ba"), 1u);  // a swap is one edit
  EXPECT_EQ(ClosestMatch("tp_sise", {"dp_size", "tp_size", "pp_size"}), "tp_size");
  EXPECT_EQ(ClosestMatch("xyz", {}), std::nullopt);
  EXPECT_EQ(ClosestMatch("learning_rate", {"seed"}), std::nullopt);
  // Another case, or the name without its dotted prefix (no hint before).
  EXPECT_EQ(ClosestMatch("sgd", {"AdamW", "SGD"}), "SGD");
  EXPECT_EQ(ClosestMatch("GPT2", {"models.BERT", "models.GPT2", "models.MLP"}), "models.GPT2");
  EXPECT_EQ(ClosestMatch("lr", {"train.seed", "optim.lr"}), "optim.lr");
  EXPECT_EQ(ClosestMatch("", {"a.b"}), std::nullopt);
  // An unknown key's own section is no suggestion (it was for "model.x").
  EXPECT_EQ(ClosestMatch("model.x", {"model", "train"}), std::nullopt);
  EXPECT_EQ(ClosestMatch("train.dist.foo", {"train", "train.dist", "train.dist.fo"}), "train.dist.fo");
}

TEST(StringsTest, EscapeControlCharsKeepsUtf8AndEscapesTheRest) {
  EXPECT_EQ(EscapeControlChars("plain/path.json"), "plain/path.json");
  EXPECT_EQ(EscapeControlChars("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(EscapeControlChars(std::string("x\0y\x7f", 4)), "x\\x00y\\x7f");
  EXPECT_EQ(EscapeControlChars("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(EscapeControlChars("\xc3\xa9\n", /*non_ascii=*/true), "\\xc3\\xa9\\n");
}

TEST(StringsTest, OneLineEscapesWhatIsNotUtf8) {
  EXPECT_EQ(OneLine("a\nb\r\tc"), "a b \tc");
  EXPECT_EQ(OneLine("caf\xc3\xa9 \xc3\x97 2"), "caf\xc3\xa9 \xc3\x97 2");
  EXPECT_EQ(OneLine("dir_\xff_/x \xc3"), "dir_\\xff_/x \\xc3");
  EXPECT_EQ(OneLine(std::string("\x1b[31mred\0", 9)), "\\x1b[31mred\\x00");
  EXPECT_EQ(OneLine("\xed\xa0\x80ok"), "\\xed\\xa0\\x80ok");  // a surrogate
  EXPECT_EQ(OneLine(""), "");
}

}  // namespace
}  // namespace tessera::config
