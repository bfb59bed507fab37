// End-to-end tests of the `tessera` binary: runs it as a user would.

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"

namespace {

using Result = ::tessera::testing::CliResult;
using ::tessera::testing::RunTessera;
std::string Source(const std::string& rel) { return ::tessera::testing::SourcePath(rel); }

TEST(Cli, OpsJsonListsAtLeast40OpsWithCpuKernels) {
  const Result r = RunTessera("ops --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["count"].get<int>(), 40);
  ASSERT_EQ(j["ops"].size(), j["count"].get<size_t>());
  for (const auto& op : j["ops"]) {
    bool cpu = false;
    for (const auto& k : op["kernels"]) cpu |= k == "cpu";
    EXPECT_TRUE(cpu) << op["name"];
    EXPECT_FALSE(op["sbp"]["signatures"].empty()) << op["name"] << " shows no SBP signature";
  }
}

TEST(Cli, OpsTextAndBadFormat) {
  const Result text = RunTessera("ops");
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("matmul(a, b) -> (y)"), std::string::npos);
  const Result bad = RunTessera("ops --format xml");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--format"), std::string::npos) << bad.out;
}

TEST(Cli, ConfigPrintsResolvedJsonWithOverride) {
  const Result r = RunTessera("config " + Source("configs/common/train.json") +
                              " train.dist.tensor_parallel_size=2 model._target_=models.MLP");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["train"]["dist"]["tensor_parallel_size"], 2);
  EXPECT_EQ(j["train"]["seed"], 1234);
  // Every declared key is there, the defaults filled in.
  EXPECT_EQ(j["optim"]["_target_"], "AdamW");
  EXPECT_EQ(j["model"]["in_features"], 16);
  EXPECT_TRUE(j["model"]["init_seed"].is_number_integer());
  // Without a model the config is incomplete, and the error says what to set.
  const Result no_model = RunTessera("config " + Source("configs/common/train.json"));
  EXPECT_EQ(no_model.exit_code, 1);
  EXPECT_NE(no_model.out.find("set model._target_ to one of models.GPT2, models.MLP"), std::string::npos) << no_model.out;
}

TEST(Cli, ConfigMisspelledKeyNamesTheLikelyKey) {
  const Result r = RunTessera("config " + Source("configs/common/train.json") + " train.dist.tensor_paralel_size=2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("train.dist.tensor_parallel_size"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "expected a one-line error: " << r.out;
}

TEST(Cli, ConfigMissingFileIsOneLineError) {
  const Result r = RunTessera("config /nonexistent/x.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("/nonexistent/x.json"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST(Cli, HelpOnEveryVerb) {
  for (const char* args : {"--help", "ops --help", "config --help"}) {
    const Result r = RunTessera(args);
    EXPECT_EQ(r.exit_code, 0) << args;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << args << ": " << r.out;
  }
  EXPECT_NE(RunTessera("").exit_code, 0);
  EXPECT_NE(RunTessera("frobnicate").exit_code, 0);
}

}  // namespace
