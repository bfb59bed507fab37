// TESSERA_PROFILE_OPS (actors/op_profile.h): `tessera train` appends a
// per-op table of the Compute acts' kernel times after the run, the first
// iteration left out, with the synchronous acts and with asynchronous ones
// (kernels on the device's stream, timed there); a path it cannot write is
// a one-line error before anything trains.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/text.h"
#include "tests/cli_runner.h"

namespace tessera {
namespace {

using ::tessera::testing::RunCommand;
using ::tessera::testing::SourcePath;

struct Row {
  int64_t acts = 0;
  double total_ms = 0, share = 0;
};

// The tables of `path`: their "# " titles and, per table, op -> row.
std::vector<std::pair<std::string, std::map<std::string, Row>>> ReadTables(const std::filesystem::path& path) {
  std::vector<std::pair<std::string, std::map<std::string, Row>>> tables;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# ")) {
      tables.push_back({line.substr(2), {}});
      continue;
    }
    if (line.starts_with("op\t") || tables.empty()) continue;
    std::istringstream fields(line);
    std::string op, device;
    Row row;
    double mean_us = 0;
    fields >> op >> device >> row.acts >> row.total_ms >> mean_us >> row.share;
    EXPECT_TRUE(fields) << line;
    EXPECT_EQ(device, "cpu:0") << line;
    tables.back().second[op] = row;
  }
  return tables;
}

class OpProfile : public ::testing::TestWithParam<bool> {};

TEST_P(OpProfile, TablesTheKernelsOfEveryIterationButTheFirst) {
  const auto dir = std::filesystem::temp_directory_path() / StrCat("tessera_profile_", ::getpid(), "_", GetParam());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto train = [&](int iterations) {
    const auto path = dir / StrCat("ops_", iterations, ".tsv");
    const auto result = RunCommand(StrCat("TESSERA_PROFILE_OPS=", path.string(), " timeout 120 ", TESSERA_BINARY,
                                          " train ", SourcePath("configs/gpt2_nano.json"),
                                          " model.num_layers=2 train.log_period=1 train.train_iter=", iterations,
                                          " train.dist.async_compute=", GetParam() ? "true" : "false",
                                          " train.output_dir=", (dir / "out").string(), StrCat(iterations), " 2>&1"));
    EXPECT_EQ(result.exit_code, 0) << result.out;
    return ReadTables(path);
  };
  const auto two = train(2), three = train(3);
  ASSERT_EQ(two.size(), 1u);
  ASSERT_EQ(three.size(), 1u);
  EXPECT_NE(three[0].first.find("node 0, iterations 0 to 3 (the first not timed)"), std::string::npos)
      << three[0].first;
  const std::map<std::string, Row>& one_timed = two[0].second;
  const std::map<std::string, Row>& two_timed = three[0].second;
  for (const char* op : {"matmul", "layer_norm", "layer_norm_grad", "adamw_update", "embedding"}) {
    ASSERT_TRUE(one_timed.contains(op)) << op;
    ASSERT_TRUE(two_timed.contains(op)) << op;
    // One timed iteration against two: the same acts per iteration.
    EXPECT_GT(one_timed.at(op).acts, 0) << op;
    EXPECT_EQ(two_timed.at(op).acts, 2 * one_timed.at(op).acts) << op;
    EXPECT_GT(two_timed.at(op).total_ms, 0) << op;
  }
  double shares = 0;
  for (const auto& [op, row] : two_timed) shares += row.share;
  EXPECT_NEAR(shares, 1.0, 0.01);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Acts, OpProfile, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Asynchronous" : "Synchronous"; });

TEST(OpProfileErrors, AnUnwritablePathIsAOneLineErrorBeforeTraining) {
  const auto result = RunCommand(
      StrCat("TESSERA_PROFILE_OPS=/nonexistent/tessera/ops.tsv timeout 120 ", TESSERA_BINARY, " train ",
             SourcePath("configs/gpt2_nano.json"), " train.train_iter=2 train.output_dir=",
             (std::filesystem::temp_directory_path() / StrCat("tessera_profile_bad_", ::getpid())).string(), " 2>&1"));
  ::tessera::testing::ExpectOneLineError(result,
                                         "TESSERA_PROFILE_OPS: cannot write the op profile to "
                                         "'/nonexistent/tessera/ops.tsv'");
  EXPECT_EQ(result.out.find("iter 1"), std::string::npos) << result.out;
}

}  // namespace
}  // namespace tessera
