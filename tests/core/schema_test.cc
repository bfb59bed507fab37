// The config schema: Resolve's checks and defaults, targets, not-implemented
// keys, derived seeds, Binding<T>, and the Markdown reference.

#include "core/schema.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace tessera::config {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

struct Inner {
  int64_t width = 8;
};

struct Settings {
  int64_t count = 3;
  std::optional<int64_t> limit;
  double rate = 0.5;
  double norm = 2.0;
  bool on = true;
  std::string mode = "fast";
  std::vector<int64_t> sizes = {1, 2};
  std::vector<double> pair = {0.1, 0.2};
  int64_t seed = 0;
  Inner inner;
};

const Binding<Settings>& SettingsKeys() {
  static const Binding<Settings>* const keys = [] {
    Binding<Inner> inner("inner");
    inner.Field("width", &Inner::width, {.min = 1, .max = 64, .doc = "a width"});
    auto* b = new Binding<Settings>("settings");
    b->Field("count", &Settings::count, {.min = 1, .max = 10, .doc = "a count"})
        .Field("limit", &Settings::limit, {.min = 0, .doc = "a limit; null: none"})
        .Field("rate", &Settings::rate, {.min = 0, .max = 1, .exclusive_max = true, .doc = "a rate | with a bar"})
        .Field("norm", &Settings::norm, {.min = 0, .exclusive_min = true, .allow_inf = true, .doc = "a p-norm"})
        .Field("on", &Settings::on, {.doc = "a switch"})
        .Field("mode", &Settings::mode, {.choices = {"fast", "slow"}, .doc = "a mode"})
        .Field("sizes", &Settings::sizes, {.min = 1, .max_length = 3, .doc = "sizes"})
        .Field("pair", &Settings::pair, {.min_length = 2, .max_length = 2, .doc = "two numbers"})
        .Field("seed", &Settings::seed, {.min = 0, .derive_seed_from = "root_seed", .doc = "a derived seed"})
        .Unbound(
            "future",
            KeySpec{.type = KeyType::kBool, .default_value = false, .not_implemented = "the future", .doc = "later"})
        .Sub("inner", &Settings::inner, inner);
    return b;
  }();
  return *keys;
}

const Section& RootSchema() {
  static const Section* const root = [] {
    auto* s = new Section();
    s->Key("root_seed", {.type = KeyType::kInt, .default_value = 42, .min = 0, .doc = "the seed"});
    s->Sub("settings", SettingsKeys().section());
    s->Sub("model", Section("the model")
                        .Target("A", Section().Key("a", {.type = KeyType::kInt, .default_value = 1}))
                        .Target("B", Section().Key("b", {.type = KeyType::kString, .default_value = "x"}))
                        .Required());
    s->Sub("later", Section("later").NotImplemented("not yet"));
    return s;
  }();
  return *root;
}

absl::StatusOr<json> R(const std::string& text) { return Resolve(RootSchema(), json::parse(text)); }
std::string Error(const std::string& text) {
  auto r = R(text);
  return r.ok() ? std::string("<ok>") : std::string(r.status().message());
}

TEST(SchemaTest, FillsDefaultsAndDerivesSeeds) {
  absl::StatusOr<json> r = R(R"({"model": {"_target_": "A"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  const json& s = (*r)["settings"];
  EXPECT_EQ(s["count"], 3);
  EXPECT_TRUE(s["limit"].is_null());
  EXPECT_EQ(s["rate"], 0.5);
  EXPECT_EQ(s["mode"], "fast");
  EXPECT_EQ(s["sizes"], json::parse("[1, 2]"));
  EXPECT_EQ(s["inner"]["width"], 8);
  EXPECT_EQ(s["future"], false);
  EXPECT_EQ(s["seed"], DeriveSeed(42, "settings.seed"));
  EXPECT_EQ((*r)["model"], json::parse(R"({"_target_": "A", "a": 1})"));
  EXPECT_FALSE(r->contains("later"));
  // Another root seed, another derived seed; an explicit seed stays.
  EXPECT_NE((*R(R"({"root_seed": 7, "model": {"_target_": "A"}})"))["settings"]["seed"], s["seed"]);
  EXPECT_EQ((*R(R"({"settings": {"seed": 5}, "model": {"_target_": "A"}})"))["settings"]["seed"], 5);
  // Resolving a resolved config gives it back.
  EXPECT_EQ(*Resolve(RootSchema(), *r), *r);
}

TEST(SchemaTest, DerivedSeedsAreDistinctAndNonNegative) {
  EXPECT_NE(DeriveSeed(1, "model.init_seed"), DeriveSeed(1, "model.dropout_seed"));
  EXPECT_NE(DeriveSeed(1, "model.init_seed"), DeriveSeed(2, "model.init_seed"));
  for (int64_t seed : {int64_t{0}, int64_t{-1}, INT64_MAX, INT64_MIN}) EXPECT_GE(DeriveSeed(seed, "x"), 0);
}

TEST(SchemaTest, EveryKindOfBadValueIsNamed) {
  const std::string m = R"("model": {"_target_": "A"})";
  EXPECT_EQ(Error(R"({"settings": {"count": 0}, )" + m + "}"), "config key 'settings.count' must be in [1, 10], got 0");
  EXPECT_EQ(Error(R"({"settings": {"count": "3"}, )" + m + "}"),
            "config key 'settings.count' expects an integer in [1, 10], got string \"3\"");
  EXPECT_EQ(Error(R"({"settings": {"count": 2.5}, )" + m + "}"),
            "config key 'settings.count' expects an integer in [1, 10], got number 2.5");
  EXPECT_EQ(Error(R"({"settings": {"count": 18446744073709551615}, )" + m + "}"),
            "config key 'settings.count' expects an integer in [1, 10], got integer 18446744073709551615, above the "
            "largest integer a key holds (9223372036854775807)");
  EXPECT_THAT(Error(R"({"settings": {"count": 1e300}, )" + m + "}"), HasSubstr("expects an integer"));
  EXPECT_EQ(Error(R"({"settings": {"rate": 1}, )" + m + "}"), "config key 'settings.rate' must be in [0, 1), got 1");
  EXPECT_EQ(Error(R"({"settings": {"on": 1}, )" + m + "}"), "config key 'settings.on' expects a boolean, got integer 1");
  EXPECT_EQ(Error(R"({"settings": {"mode": "fsat"}, )" + m + "}"),
            "config key 'settings.mode' must be one of fast, slow, got \"fsat\" (did you mean 'fast'?)");
  EXPECT_EQ(Error(R"({"settings": {"sizes": [1, 2, 3, 4]}, )" + m + "}"),
            "config key 'settings.sizes' expects at most 3 elements, got 4 ([1,2,3,4])");
  EXPECT_EQ(Error(R"({"settings": {"sizes": [1, 0]}, )" + m + "}"), "config key 'settings.sizes[1]' must be >= 1, got 0");
  EXPECT_EQ(Error(R"({"settings": {"pair": [1]}, )" + m + "}"), "config key 'settings.pair' expects exactly 2 elements, got 1 ([1])");
  EXPECT_EQ(Error(R"({"settings": {"pair": "ab"}, )" + m + "}"),
            "config key 'settings.pair' expects a list of numbers, got string \"ab\"");
  EXPECT_EQ(Error(R"({"settings": {"count": null}, )" + m + "}"),
            "config key 'settings.count' must not be null (it expects an integer in [1, 10])");
  EXPECT_EQ(Error(R"({"settings": {"mode": ""}, )" + m + "}"),
            "config key 'settings.mode' must be one of fast, slow, got \"\"");
  EXPECT_EQ(Error(R"({"settings": {"inner": 3}, )" + m + "}"), "config key 'settings.inner' expects an object, got integer 3");
  EXPECT_EQ(Error(R"({"settings": {"inner": {"width": 65}}, )" + m + "}"),
            "config key 'settings.inner.width' must be in [1, 64], got 65");
  EXPECT_EQ(Error(R"({"settings": {"future": true}, )" + m + "}"),
            "config key 'settings.future' = true is not implemented yet (the future); only false is accepted");
  EXPECT_EQ(Error(R"({"later": {"x": 1}, )" + m + "}"), "config section 'later' is not implemented yet (not yet)");
  EXPECT_EQ(Error(R"({"settings": {"coutn": 1}, )" + m + "}"),
            "unknown config key 'settings.coutn'; did you mean 'settings.count'?");
  EXPECT_EQ(Error(R"({"_base_": "x", )" + m + "}"), "unknown config key '_base_'");
  // A dotted name in a file (it said "did you mean 'settings.count'?", the
  // key itself).
  EXPECT_EQ(Error(R"({"settings.count": 1, )" + m + "}"),
            "unknown config key 'settings.count'; a file nests keys: write {\"settings\": {\"count\": ...}} (a dotted "
            "path is for overrides)");
  // (One that is no key nested either: it said only "did you mean".)
  EXPECT_EQ(Error(R"({"settings.coutn": 1, )" + m + "}"),
            "unknown config key 'settings.coutn'; a file nests keys ({\"settings\": {\"coutn\": ...}}; a dotted path "
            "is for overrides), and nested it is no key either; did you mean 'settings.count'?");
  EXPECT_EQ(Error("[1]"), "a config must be a JSON object, got array [1]");
}

// JSON has no infinity: a key that allows it takes the string "inf", keeps
// it as such when resolved, and a Binding reads it as +infinity.
TEST(SchemaTest, AnInfinityKeyTakesTheStringInf) {
  const std::string m = R"("model": {"_target_": "A"})";
  absl::StatusOr<json> r = R(R"({"settings": {"norm": "inf"}, )" + m + "}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["settings"]["norm"], "inf");
  EXPECT_EQ(*Resolve(RootSchema(), *r), *r);
  absl::StatusOr<Settings> s = SettingsKeys().Read((*r)["settings"]);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->norm, std::numeric_limits<double>::infinity());
  EXPECT_EQ(SettingsKeys().Read((*R(R"({"settings": {"norm": 3}, )" + m + "}"))["settings"])->norm, 3.0);
  EXPECT_EQ(Error(R"({"settings": {"norm": "Infinity"}, )" + m + "}"),
            "config key 'settings.norm' expects a number > 0 or \"inf\", got string \"Infinity\"");
  EXPECT_EQ(Error(R"({"settings": {"norm": "-inf"}, )" + m + "}"),
            "config key 'settings.norm' expects a number > 0 or \"inf\", got string \"-inf\"");
  EXPECT_EQ(Error(R"({"settings": {"norm": 0}, )" + m + "}"), "config key 'settings.norm' must be > 0, got 0");
  // Elsewhere "inf" is a string like any other.
  EXPECT_EQ(Error(R"({"settings": {"rate": "inf"}, )" + m + "}"),
            "config key 'settings.rate' expects a number in [0, 1), got string \"inf\"");
  EXPECT_THAT(SchemaMarkdown(RootSchema()),
              HasSubstr("| `settings.norm` | number | `2.0` | > 0; `\"inf\"` | a p-norm |"));
}

TEST(SchemaTest, TargetsSelectTheirKeys) {
  EXPECT_EQ(Error("{}"), "config has no 'model' section, which is required: set model._target_ to one of A, B");
  EXPECT_EQ(Error(R"({"model": {"a": 1}})"), "config key 'model._target_' is missing: set it to one of A, B");
  EXPECT_EQ(Error(R"({"model": {"_target_": "C"}})"), "unknown model _target_ 'C'; did you mean 'A'? (one of: A, B)");
  EXPECT_EQ(Error(R"({"model": {"_target_": 3}})"), "config key 'model._target_' expects a string (one of A, B), got integer 3");
  // A key of another target says whose it is; one of none, the closest.
  EXPECT_EQ(Error(R"({"model": {"_target_": "B", "a": 1}})"),
            "unknown config key 'model.a' (a key of model._target_ A)");
  EXPECT_EQ(Error(R"({"model": {"_target_": "B", "bb": 1}})"),
            "unknown config key 'model.bb'; did you mean 'model.b'?");
  absl::StatusOr<json> b = R(R"({"model": {"_target_": "B"}})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)["model"], json::parse(R"({"_target_": "B", "b": "x"})"));
}

TEST(SchemaTest, OriginsNameWhereAValueCameFrom) {
  Origins origins{{"settings", "in base.json"}, {"settings.count", "from override 'settings.count=0'"}, {"", "from RPC"}};
  const json config = json::parse(R"({"settings": {"count": 0, "rate": 5}, "model": {"_target_": "A"}})");
  EXPECT_EQ(Resolve(RootSchema(), config, origins).status().message(),
            "config key 'settings.count' must be in [1, 10], got 0 (from override 'settings.count=0')");
  origins.erase("settings.count");
  const json rate = json::parse(R"({"settings": {"rate": 5}, "model": {"_target_": "A"}})");
  EXPECT_EQ(Resolve(RootSchema(), rate, origins).status().message(),
            "config key 'settings.rate' must be in [0, 1), got 5 (in base.json)");
  const json model = json::parse(R"({"model": {"_target_": "Z"}})");
  EXPECT_THAT(Resolve(RootSchema(), model, origins).status().message(), HasSubstr("(from RPC)"));
}

TEST(SchemaTest, LookupAndDeclaredPathsFollowTheTarget) {
  const json config = json::parse(R"({"model": {"_target_": "B"}})");
  const std::vector<std::string> paths = DeclaredPaths(RootSchema(), config);
  EXPECT_THAT(paths, ::testing::Contains("model.b"));
  EXPECT_THAT(paths, ::testing::Not(::testing::Contains("model.a")));
  EXPECT_THAT(paths, ::testing::Contains("settings.inner.width"));
  absl::StatusOr<SchemaEntry> entry = Lookup(RootSchema(), config, "settings.inner.width");
  ASSERT_TRUE(entry.ok());
  ASSERT_NE(entry->key, nullptr);
  EXPECT_EQ(entry->key->type, KeyType::kInt);
  EXPECT_TRUE(Lookup(RootSchema(), config, "model._target_")->is_target);
  EXPECT_NE(Lookup(RootSchema(), config, "settings.inner")->section, nullptr);
  EXPECT_NE(Lookup(RootSchema(), config, "later.anything")->not_implemented, nullptr);
  EXPECT_TRUE(absl::IsNotFound(Lookup(RootSchema(), config, "model.a").status()));
  EXPECT_THAT(Lookup(RootSchema(), config, "settings.count.x").status().message(), HasSubstr("is an integer, not an object"));
}

TEST(BindingTest, ReadsEveryMemberFromAResolvedNode) {
  absl::StatusOr<json> r =
      R(R"({"settings": {"count": 7, "limit": 9, "mode": "slow", "sizes": [4], "inner": {"width": 2}}, "model": {"_target_": "A"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<Settings> s = SettingsKeys().Read((*r)["settings"]);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->count, 7);
  EXPECT_EQ(s->limit, 9);
  EXPECT_EQ(s->mode, "slow");
  EXPECT_EQ(s->sizes, std::vector<int64_t>{4});
  EXPECT_EQ(s->pair, (std::vector<double>{0.1, 0.2}));
  EXPECT_EQ(s->inner.width, 2);
  EXPECT_EQ(s->seed, DeriveSeed(42, "settings.seed"));
  // An unresolved node is an error, never a throw.
  EXPECT_FALSE(SettingsKeys().Read(json::parse(R"({"count": "x"})")).ok());
  EXPECT_FALSE(SettingsKeys().Read(json(3)).ok());
}

TEST(BindingTest, DefaultsComeFromTheStruct) {
  const Section& section = SettingsKeys().section();
  EXPECT_EQ(section.FindKey("count")->default_value, 3);
  EXPECT_TRUE(section.FindKey("limit")->nullable);
  EXPECT_TRUE(section.FindKey("seed")->nullable);
  EXPECT_TRUE(section.FindKey("seed")->default_value.is_null());
  EXPECT_EQ(section.FindKey("sizes")->type, KeyType::kIntList);
  EXPECT_EQ(section.FindKey("pair")->type, KeyType::kNumberList);
  EXPECT_EQ(section.FindKey("mode")->type, KeyType::kString);
}

TEST(SchemaMarkdownTest, TablesEveryKey) {
  const std::string md = SchemaMarkdown(RootSchema());
  EXPECT_THAT(md, HasSubstr("- `root_seed` (integer, default `42`): the seed"));
  EXPECT_THAT(md, HasSubstr("| `settings.count` | integer | `3` | in [1, 10] | a count |"));
  EXPECT_THAT(md, HasSubstr("| `settings.rate` | number | `0.5` | in [0, 1) | a rate \\| with a bar |"));
  EXPECT_THAT(md, HasSubstr("| `settings.seed` | integer | derived from `root_seed` | >= 0; `null` | a derived seed |"));
  EXPECT_THAT(md, HasSubstr("| `settings.future` | boolean | `false` | not implemented yet (the future): only the default | later |"));
  EXPECT_THAT(md, HasSubstr("### `settings.inner`"));
  EXPECT_THAT(md, HasSubstr("`model._target_` selects one of `A`, `B` (required)"));
  EXPECT_THAT(md, HasSubstr("### `model` with `_target_: B`"));
  EXPECT_THAT(md, HasSubstr("Not implemented yet (not yet): any key here is refused."));
}

}  // namespace
}  // namespace tessera::config
