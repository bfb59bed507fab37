#include "core/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/registry.h"
#include "core/strings.h"

#ifndef TESSERA_SOURCE_DIR
#error "compile with -DTESSERA_SOURCE_DIR=\"<repository root>\" to locate configs/common"
#endif

namespace tessera::config {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

const fs::path kSourceDir = TESSERA_SOURCE_DIR;

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

// A config with one value of each type, for override tests.
json TypedConfig() {
  return json::parse(R"({
    "train": {
      "train_iter": 100, "lr": 0.5, "amp": {"enabled": false, "dtype": "bf16"},
      "name": "run", "betas": [0.9, 0.999], "global_batch_size": null,
      "dist": {"tensor_parallel_size": 1, "data_parallel_size": 1}
    },
    "model": {"kwargs": {"_free_form_": true, "hidden": 64}}
  })");
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

  absl::StatusOr<json> config = LoadConfig(job);
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

  absl::StatusOr<json> config = LoadConfig(job);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, json::parse(R"({"a": 1, "b": 2, "c": 3, "only_first": 1})"));

  // Reversing the list reverses who wins.
  const fs::path reversed = Write("reversed.json", R"({"_base_": ["second.json", "first.json"]})");
  config = LoadConfig(reversed);
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
  absl::StatusOr<json> config = LoadConfig(job);
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
  absl::StatusOr<json> config = LoadConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, json::parse(R"({"a": 1, "b": 2})"));
}

TEST_F(ConfigTest, BaseCycleIsAnErrorNamingTheChain) {
  const fs::path a = Write("a.json", R"({"_base_": "b.json"})");
  const fs::path b = Write("b.json", R"({"_base_": ["a.json"]})");
  absl::StatusOr<json> config = LoadConfig(a);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr(a.string() + " -> " + b.string() + " -> " + a.string()));

  const fs::path self = Write("self.json", R"({"_base_": "./self.json"})");
  config = LoadConfig(self);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr(self.string() + " -> " + self.string()));
}

TEST_F(ConfigTest, SharedBaseIsNotACycle) {
  Write("common.json", R"({"x": 1})");
  Write("left.json", R"({"_base_": "common.json", "l": 1})");
  Write("right.json", R"({"_base_": "common.json", "r": 1})");
  const fs::path job = Write("job.json", R"({"_base_": ["left.json", "right.json"]})");
  absl::StatusOr<json> config = LoadConfig(job);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, json::parse(R"({"x": 1, "l": 1, "r": 1})"));
}

TEST_F(ConfigTest, MissingBaseNamesTheIncludingFileAndThePath) {
  const fs::path job = Write("jobs/job.json", R"({"_base_": ["../common/trian.json"]})");
  absl::StatusOr<json> config = LoadConfig(job);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr(job.string()));
  EXPECT_THAT(config.status().message(), HasSubstr("../common/trian.json"));
  EXPECT_THAT(config.status().message(), HasSubstr((dir_ / "common/trian.json").string()));
}

TEST_F(ConfigTest, MissingFileAndBadBaseValueAreErrors) {
  absl::StatusOr<json> config = LoadConfig(dir_ / "nope.json");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("nope.json"));

  config = LoadConfig(Write("bad_base.json", R"({"_base_": 3})"));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("bad_base.json"));
  EXPECT_THAT(config.status().message(), HasSubstr("_base_"));

  config = LoadConfig(Write("array.json", "[1, 2]"));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("must hold a JSON object"));
}

TEST_F(ConfigTest, SyntaxErrorNamesFileLineAndColumn) {
  Write("base.json", "{\n  \"a\": 1,\n  \"b\": tru\n}\n");
  const fs::path job = Write("job.json", R"({"_base_": "base.json"})");
  absl::StatusOr<json> config = LoadConfig(job);
  ASSERT_FALSE(config.ok());
  const std::string message(config.status().message());
  // The error is in the base, so that is the file named; "tru" ends line 3.
  EXPECT_THAT(message, HasSubstr((dir_ / "base.json").string() + ":3:"));
  EXPECT_THAT(message, HasSubstr("JSON syntax error"));
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
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
  const absl::Status status = ApplyOverrides(config, {"train.train_iter"});
  EXPECT_THAT(status.message(), HasSubstr("malformed override 'train.train_iter'"));
}

TEST(ApplyOverridesTest, SetsValuesOfEveryType) {
  json config = TypedConfig();
  ASSERT_TRUE(ApplyOverrides(config,
                             {
                                 "train.train_iter=500",
                                 "train.amp.enabled=true",
                                 "train.name=hello",
                                 "train.betas=[0.8,0.9]",
                                 "train.lr=null",
                                 "train.global_batch_size=64",
                             })
                  .ok());
  EXPECT_EQ(config["train"]["train_iter"], 500);
  EXPECT_EQ(config["train"]["amp"]["enabled"], true);
  EXPECT_EQ(config["train"]["name"], "hello");
  EXPECT_EQ(config["train"]["betas"], json::parse("[0.8, 0.9]"));
  EXPECT_TRUE(config["train"]["lr"].is_null());
  EXPECT_EQ(config["train"]["global_batch_size"], 64);  // null accepts anything
}

TEST(ApplyOverridesTest, NumericConversionsKeepTheKeysType) {
  json config = TypedConfig();
  ASSERT_TRUE(ApplyOverrides(config, {"train.lr=1", "train.train_iter=2.0"}).ok());
  EXPECT_TRUE(config["train"]["lr"].is_number_float());  // integer where a float was
  EXPECT_EQ(config["train"]["lr"], 1.0);
  EXPECT_TRUE(config["train"]["train_iter"].is_number_integer());  // integral float
  EXPECT_EQ(config["train"]["train_iter"], 2);
}

TEST(ApplyOverridesTest, StringKeyTakesTheRawTextOfANumberOrBool) {
  json config = TypedConfig();
  ASSERT_TRUE(ApplyOverrides(config, {"train.name=2024"}).ok());
  EXPECT_EQ(config["train"]["name"], "2024");
  ASSERT_TRUE(ApplyOverrides(config, {"train.name=\"007\""}).ok());
  EXPECT_EQ(config["train"]["name"], "007");
}

TEST(ApplyOverridesTest, LaterOverrideWins) {
  json config = TypedConfig();
  ASSERT_TRUE(ApplyOverrides(config, {"train.train_iter=1", "train.train_iter=2"}).ok());
  EXPECT_EQ(config["train"]["train_iter"], 2);
}

TEST(ApplyOverridesTest, FreeFormMapAcceptsNewKeysAndKeepsItsMarker) {
  json config = TypedConfig();
  ASSERT_TRUE(ApplyOverrides(config, {"model.kwargs.dropout=0.1", "model.kwargs.act.name=gelu",
                                      "model.kwargs.hidden=128"})
                  .ok());
  EXPECT_EQ(config["model"]["kwargs"]["dropout"], 0.1);
  EXPECT_EQ(config["model"]["kwargs"]["act"]["name"], "gelu");
  EXPECT_EQ(config["model"]["kwargs"]["hidden"], 128);
  EXPECT_EQ(config["model"]["kwargs"]["_free_form_"], true);

  // Existing keys in a free-form map are still type-checked, and the freedom
  // does not leak to ordinary siblings.
  EXPECT_FALSE(ApplyOverrides(config, {"model.kwargs.hidden=wide"}).ok());
  EXPECT_FALSE(ApplyOverrides(config, {"model.new_key=1"}).ok());
}

TEST(ApplyOverridesTest, UnknownKeySuggestsTheClosestFullPath) {
  json config = TypedConfig();
  const absl::Status status = ApplyOverrides(config, {"train.dist.tensor_paralel_size=2"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "unknown config key 'train.dist.tensor_paralel_size' (from override "
            "'train.dist.tensor_paralel_size=2'); did you mean "
            "'train.dist.tensor_parallel_size'?");

  // A typo in a parent segment is matched over the whole path too.
  const absl::Status parent = ApplyOverrides(config, {"trian.dist.data_parallel_size=2"});
  EXPECT_THAT(parent.message(), HasSubstr("did you mean 'train.dist.data_parallel_size'?"));

  // Nothing close: no misleading hint.
  const absl::Status far = ApplyOverrides(config, {"completely_unrelated_setting=1"});
  EXPECT_THAT(far.message(), HasSubstr("unknown config key 'completely_unrelated_setting'"));
  EXPECT_THAT(far.message(), ::testing::Not(HasSubstr("did you mean")));
}

TEST(ApplyOverridesTest, TypeMismatchesAreErrorsAndLeaveTheConfigUnchanged) {
  const json original = TypedConfig();
  json config = original;
  absl::Status status = ApplyOverrides(config, {"train.seed_unused=1"});
  EXPECT_FALSE(status.ok());

  status = ApplyOverrides(config, {"train.train_iter=5", "train.train_iter=abc"});
  EXPECT_EQ(status.message(),
            "config key 'train.train_iter' expects an integer, got string \"abc\" "
            "(from override 'train.train_iter=abc')");
  EXPECT_EQ(config, original);  // the first, valid override was not applied either

  EXPECT_THAT(ApplyOverrides(config, {"train.train_iter=2.5"}).message(),
              HasSubstr("expects an integer, got number 2.5"));
  EXPECT_THAT(ApplyOverrides(config, {"train.amp.enabled=yes"}).message(),
              HasSubstr("'train.amp.enabled' expects a boolean, got string \"yes\""));
  EXPECT_THAT(ApplyOverrides(config, {"train.lr=fast"}).message(),
              HasSubstr("'train.lr' expects a number"));
  EXPECT_THAT(ApplyOverrides(config, {"train.betas=0.9"}).message(),
              HasSubstr("'train.betas' expects an array"));
  EXPECT_THAT(ApplyOverrides(config, {"train.amp=1"}).message(),
              HasSubstr("'train.amp' expects an object"));
  EXPECT_THAT(ApplyOverrides(config, {"train.train_iter.x=1"}).message(),
              HasSubstr("'train.train_iter' is an integer, not an object"));
  EXPECT_EQ(config, original);
}

TEST(ApplyOverridesTest, ObjectValueMergesWithPerLeafChecks) {
  json config = TypedConfig();
  ASSERT_TRUE(ApplyOverrides(config, {R"(train.dist={"tensor_parallel_size": 4})"}).ok());
  EXPECT_EQ(config["train"]["dist"]["tensor_parallel_size"], 4);
  EXPECT_EQ(config["train"]["dist"]["data_parallel_size"], 1);  // untouched sibling kept

  EXPECT_THAT(ApplyOverrides(config, {R"(train.dist={"tensor_paralel_size": 4})"}).message(),
              HasSubstr("unknown config key 'train.dist.tensor_paralel_size'"));
  EXPECT_THAT(ApplyOverrides(config, {R"(train.dist={"data_parallel_size": "two"})"}).message(),
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

  absl::StatusOr<json> loaded = LoadConfig(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, config);
  EXPECT_TRUE((*loaded)["train"]["lr"].is_number_float());
  // The saved file is itself overridable, free-form marker included.
  ASSERT_TRUE(ApplyOverrides(*loaded, {"model.kwargs.extra=1"}).ok());

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
}

// ------------------------------------------------- the real common configs

TEST(CommonConfigTest, TensorParallelOverrideOnTrainJson) {
  const fs::path train = kSourceDir / "configs/common/train.json";
  absl::StatusOr<json> config = LoadConfig(train, {"train.dist.tensor_parallel_size=2"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*GetInt(*config, "train.dist.tensor_parallel_size"), 2);

  config = LoadConfig(train, {"train.dist.tensor_paralel_size=2"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("train.dist.tensor_parallel_size"));
}

TEST_F(ConfigTest, CommonConfigsHoldLibaiDefaults) {
  const fs::path job = Write(
      "job.json", "{\"_base_\": [\"" + (kSourceDir / "configs/common/train.json").string() +
                      "\", \"" + (kSourceDir / "configs/common/optim.json").string() + "\"]}");
  absl::StatusOr<json> config = LoadConfig(job);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*GetString(*config, "train.output_dir"), "./output");
  EXPECT_EQ(*GetInt(*config, "train.train_micro_batch_size"), 32);
  EXPECT_EQ(*GetInt(*config, "train.train_iter"), 10000);
  EXPECT_EQ(*GetInt(*config, "train.seed"), 1234);
  EXPECT_EQ(*GetInt(*config, "train.checkpointer.period"), 5000);
  EXPECT_EQ(*GetInt(*config, "train.evaluation.eval_iter"), 100000);
  EXPECT_EQ(*GetString(*config, "lr_scheduler._target_"), "WarmupCosineLR");
  EXPECT_EQ(*GetString(*config, "optim._target_"), "AdamW");
  EXPECT_EQ(*GetDouble(*config, "optim.lr"), 1e-4);
  EXPECT_EQ((*config)["optim"]["betas"], json::parse("[0.9, 0.999]"));
  EXPECT_TRUE((*config)["train"]["global_batch_size"].is_null());
  // Ratios and norms are floats so that fractional overrides type-check.
  EXPECT_TRUE(ApplyOverrides(*config, {"train.warmup_ratio=0.01", "optim.clip_grad_max_norm=0.5",
                                       "train.global_batch_size=256"})
                  .ok());
}

}  // namespace
}  // namespace tessera::config
