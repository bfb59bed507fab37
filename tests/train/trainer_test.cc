#include "train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/proto/actor_id.h"
#include "core/config.h"
#include "core/text.h"
#include "graph/builder.h"
#include "models/model.h"
#include "nlohmann/json.hpp"
#include "ops/registry.h"
#include "tests/actors/sequential_plan.h"
#include "tests/cli_runner.h"
#include "tests/deadline.h"
#include "train/job_config.h"

namespace tessera {
namespace {

using Result = ::tessera::testing::CliResult;
using ::tessera::testing::RunTessera;
std::string Source(const std::string& rel) { return ::tessera::testing::SourcePath(rel); }

std::filesystem::path TempDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_train_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(Cli, TrainWritesMetricsAndConfig) {
  const auto dir = TempDir("cli");
  const Result t = RunTessera("train " + Source("configs/mlp_demo.json") + " train.train_iter=20 train.output_dir=" + dir.string());
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_NE(t.out.find("iter 20/20"), std::string::npos) << t.out;
  std::ifstream metrics(dir / "metrics.jsonl");
  ASSERT_TRUE(metrics.good());
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    for (const char* key : {"iter", "loss", "lr", "grad_norm", "samples_per_s"}) EXPECT_TRUE(j.contains(key)) << key << " in " << line;
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
    ++lines;
  }
  EXPECT_EQ(lines, 2);  // log_period 10
  auto saved = LoadJobConfig(dir / "config.json");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ((*saved)["train"]["train_iter"], 20);
  EXPECT_EQ((*saved)["model"]["_target_"], "models.MLP");
  std::filesystem::remove_all(dir);
}

TEST(Cli, TrainBadOverrideIsOneLineError) {
  const Result r = RunTessera("train " + Source("configs/mlp_demo.json") + " train.no_such_key=1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
  EXPECT_NE(r.out.find("no_such_key"), std::string::npos) << r.out;
  const Result bad_model = RunTessera("train " + Source("configs/mlp_demo.json") + " model._target_=models.Nope");
  EXPECT_NE(bad_model.exit_code, 0);
  EXPECT_EQ(bad_model.out.find('\n'), bad_model.out.size() - 1) << bad_model.out;
}

TEST(Cli, PlanListsActorsRegistersAndMemory) {
  const Result text = RunTessera("plan " + Source("configs/mlp_demo.json"));
  ASSERT_EQ(text.exit_code, 0) << text.out;
  for (const char* part : {"SOURCE", "COMPUTE", "PARAMETER", "SINK", "quota=2", "quota=1", "memory per device", "cpu:0"}) {
    EXPECT_NE(text.out.find(part), std::string::npos) << part;
  }
  const Result json = RunTessera("plan " + Source("configs/mlp_demo.json") + " --format json");
  ASSERT_EQ(json.exit_code, 0) << json.out;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_GT(j["actors"].size(), 10u);
  EXPECT_GT(j["registers"].size(), 10u);
  ASSERT_EQ(j["memory"].size(), 1u);
  EXPECT_GT(j["memory"][0]["bytes"].get<int64_t>(), 0);
  // Devices in numeric order (cpu:10 came before cpu:2).
  const Result twelve =
      RunTessera("plan " + Source("configs/mlp_demo.json") + " train.dist.data_parallel_size=12 --format json");
  ASSERT_EQ(twelve.exit_code, 0) << twelve.out;
  const nlohmann::json memory = nlohmann::json::parse(twelve.out)["memory"];
  ASSERT_EQ(memory.size(), 12u);
  for (size_t i = 0; i < memory.size(); ++i) EXPECT_EQ(memory[i]["device"], "cpu:" + std::to_string(i));
  const Result dot = RunTessera("plan " + Source("configs/mlp_demo.json") + " --format dot");
  ASSERT_EQ(dot.exit_code, 0) << dot.out;
  EXPECT_EQ(dot.out.rfind("digraph plan {", 0), 0u);
}

// The plan ends with what the host holds in all and what this machine can
// give now; a job that cannot fit is planned with a warning (a plan the
// run would fail for memory was printed as if it were fine). Exit 0: the
// plan is still the plan.
TEST(Cli, PlanSaysWhetherTheJobFitsThisMachine) {
  const Result fits = RunTessera("plan " + Source("configs/gpt2_nano.json") + " --format memory");
  ASSERT_EQ(fits.exit_code, 0) << fits.out;
  EXPECT_NE(fits.out.find("host memory of node 0: training "), std::string::npos) << fits.out;
  EXPECT_NE(fits.out.find(" MiB now ("), std::string::npos) << fits.out;
  EXPECT_EQ(fits.out.find("warning"), std::string::npos) << fits.out;
  // About 1.8 TiB: more than any machine running this.
  const std::string huge = "plan " + Source("configs/gpt2_nano.json") +
                           " model.hidden_size=16384 model.num_attention_heads=128 model.ffn_hidden_size=65536 "
                           "model.num_layers=30";
  for (const char* format : {"memory", "text"}) {
    const Result too_big = RunTessera(huge + " --format " + format);
    ASSERT_EQ(too_big.exit_code, 0) << too_big.out;
    EXPECT_NE(too_big.out.find("\nwarning: the job needs "), std::string::npos) << format;
    EXPECT_NE(too_big.out.find("more than this machine can give now: `tessera train` here would fail for memory"),
              std::string::npos)
        << format;
  }
  const Result json = RunTessera(huge + " --format json");
  ASSERT_EQ(json.exit_code, 0) << json.out;
  const nlohmann::json host = nlohmann::json::parse(json.out)["host_memory"];
  ASSERT_EQ(host.size(), 1u) << host;
  EXPECT_GT(host[0]["training_bytes"].get<int64_t>(), int64_t{1} << 40);
  EXPECT_EQ(host[0]["evaluation_plan_bytes"], 0);
  // On GPUs the host holds the feeds' pinned buffers; the fullest GPU's
  // part is said apart (the GPU's arena was counted as nothing).
  const Result gpu = RunTessera("plan " + Source("configs/gpt2_nano.json") + " train.dist.device_type=cuda");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.out;
  EXPECT_NE(gpu.out.find("\nGPU memory of node 0, its fullest device: training "), std::string::npos) << gpu.out;
  const Result gpu_json =
      RunTessera("plan " + Source("configs/gpt2_nano.json") + " train.dist.device_type=cuda --format json");
  ASSERT_EQ(gpu_json.exit_code, 0) << gpu_json.out;
  const nlohmann::json parsed = nlohmann::json::parse(gpu_json.out);
  EXPECT_EQ(parsed["host_memory"][0]["gpu_training_bytes"].get<int64_t>(),
            parsed["memory"][0]["bytes"].get<int64_t>() - parsed["memory"][0]["feed_buffers"].get<int64_t>());
}

// The plan checks the outputs' directory as the run does (a file there was
// planned, with --resume too, and the run refused it).
TEST(Cli, PlanChecksTheOutputDirectoryAsTheRunDoes) {
  const auto dir = TempDir("plan_output_file");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  for (const char* resume : {"", " --resume"}) {
    const Result r = RunTessera("plan " + Source("configs/gpt2_nano.json") +
                                " train.output_dir=" + (dir / "file").string() + resume);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_EQ(r.out, "tessera: train.output_dir '" + (dir / "file").string() + "': '" + (dir / "file").string() +
                         "' is not a directory\n");
  }
  std::filesystem::remove_all(dir);
}

// Every config the project ships plans on its own data (gpt2_small and
// bert_base asked for more evaluation batches than the corpus's valid split
// makes, so `train` refused them at once). The text datasets are built
// from the configs' text_file into a scratch directory, so the evaluation
// and split checks run whatever the cache holds.
TEST(Cli, EveryShippedConfigPlansOnItsOwnData) {
  const auto dir = TempDir("shipped");
  std::filesystem::create_directories(dir);
  std::map<std::string, std::string> built;  // preprocess arguments -> prefix
  int planned = 0;
  for (const auto& entry : std::filesystem::directory_iterator(Source("configs"))) {
    if (entry.path().extension() != ".json") continue;
    const std::string config = entry.path().string();
    SCOPED_TRACE(config);
    const Result resolved = RunTessera("config " + config);
    ASSERT_EQ(resolved.exit_code, 0) << resolved.out;
    const nlohmann::json j = nlohmann::json::parse(resolved.out);
    std::string overrides;
    const nlohmann::json& loader = j.at("dataloader");
    if (!loader.at("data_prefix").is_null() && !loader.at("text_file").is_null()) {
      const nlohmann::json& t = j.at("tokenization");
      const bool bert = t.at("tokenizer") == "bert";
      // (Quoted: tessera expands $TESSERA_CACHE itself, to its default when unset.)
      const auto quoted = [](const nlohmann::json& path) { return "'" + path.get<std::string>() + "'"; };
      std::string args =
          "--input " + quoted(loader.at("text_file")) + " --tokenizer " + t.at("tokenizer").get<std::string>();
      if (!t.at("vocab_file").is_null()) args += " --vocab-file " + quoted(t.at("vocab_file"));
      if (!t.at("merges_file").is_null()) args += " --merges-file " + quoted(t.at("merges_file"));
      if (bert) args += " --split-sentences";
      if (bert && t.at("lower_case") == false) args += " --keep-case";
      auto [it, fresh] = built.emplace(args, (dir / ("data" + std::to_string(built.size()))).string());
      if (fresh) {
        const Result made = RunTessera("preprocess " + args + " --output " + it->second);
        ASSERT_EQ(made.exit_code, 0) << made.out;
      }
      overrides = " dataloader.data_prefix=" + it->second + " dataloader.text_file=null";
    }
    const Result plan = RunTessera("plan " + config + overrides);
    EXPECT_EQ(plan.exit_code, 0) << plan.out.substr(0, 2000);
    ++planned;
  }
  EXPECT_GE(planned, 6);
  std::filesystem::remove_all(dir);
}

// `--format dot` renders with Graphviz (scripts/install_deps.sh installs it).
TEST(Cli, PlanDotRendersWithGraphviz) {
  if (std::system("command -v dot > /dev/null 2>&1") != 0) GTEST_SKIP() << "Graphviz `dot` is not installed";
  const auto dir = TempDir("dot");
  std::filesystem::create_directories(dir);
  const Result dot = RunTessera("plan " + Source("configs/mlp_demo.json") + " train.num_accumulation_steps=2 --format dot > " +
                                (dir / "plan.dot").string());
  ASSERT_EQ(dot.exit_code, 0) << dot.out;
  const std::string render = "dot -Tsvg " + (dir / "plan.dot").string() + " -o " + (dir / "plan.svg").string() + " 2>&1";
  ASSERT_EQ(std::system(render.c_str()), 0) << render;
  std::ifstream svg(dir / "plan.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("REPEAT"), std::string::npos);  // the accumulation actors are drawn
  std::filesystem::remove_all(dir);
}

TEST(Cli, HelpOnEveryVerb) {
  EXPECT_EQ(RunTessera("plan --help").exit_code, 0);
  EXPECT_EQ(RunTessera("train --help").exit_code, 0);
}

TEST(Trainer, MlpLossFalls) {
  auto config = LoadJobConfig(Source("configs/mlp_demo.json"),
                              {"train.train_iter=50", "train.output_dir=" + TempDir("direct").string()});
  ASSERT_TRUE(config.ok()) << config.status();
  auto summary = Train(*config);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->losses.size(), 50u);
  EXPECT_LT(summary->losses[49], 0.5 * summary->losses[0]);
  std::filesystem::remove_all(TempDir("direct"));
}

absl::StatusOr<TrainSummary> TrainMlp(const std::string& name, std::vector<std::string> overrides, PlanExecutor executor = {}) {
  overrides.push_back("train.output_dir=" + TempDir(name).string());
  auto config = LoadJobConfig(Source("configs/mlp_demo.json"), overrides);
  if (!config.ok()) return config.status();
  auto summary = Train(*config, nullptr, std::move(executor));
  std::filesystem::remove_all(TempDir(name));
  return summary;
}

// The acceptance oracle: the plan the trainer runs through the actors and
// the same plan run by a sequential interpreter give bit-identical losses.
TEST(Trainer, ActorsMatchSequentialOracleBitForBit) {
  for (const char* accumulation : {"1", "2"}) {
    SCOPED_TRACE(std::string("num_accumulation_steps=") + accumulation);
    const std::vector<std::string> overrides = {"train.train_iter=20", std::string("train.num_accumulation_steps=") + accumulation};
    auto actors = TrainMlp("actors", overrides);
    ASSERT_TRUE(actors.ok()) << actors.status();
    auto oracle = TrainMlp("oracle", overrides, [](std::string_view plan, actors::RuntimeOptions options) {
      return actors::testing::RunPlanSequentially(plan, options);
    });
    ASSERT_TRUE(oracle.ok()) << oracle.status();
    ASSERT_EQ(actors->losses.size(), 20u);
    for (size_t i = 0; i < 20; ++i) EXPECT_EQ(actors->losses[i], oracle->losses[i]) << "iteration " << i;
  }
}

// An executor that returns OK without running the plan trained nothing: an
// error, not "trained 3 iterations; final loss 0".
TEST(Trainer, AnExecutorThatRunsNothingIsAnError) {
  auto summary = TrainMlp("nothing", {"train.train_iter=3"},
                          [](std::string_view, actors::RuntimeOptions) { return absl::OkStatus(); });
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(summary.status().message())
                .find("Engine::Run: the plan executor returned OK without running every iteration (sink '"),
            std::string::npos)
      << summary.status();
  EXPECT_NE(std::string(summary.status().message()).find("' delivered 0 of 3)"), std::string::npos) << summary.status();
}

// m micro-batches accumulated = one batch m times larger.
TEST(Trainer, AccumulationEqualsOneLargerBatch) {
  auto whole = TrainMlp("whole", {"train.train_iter=6", "train.train_micro_batch_size=32", "train.num_accumulation_steps=1"});
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const char* m : {"2", "4"}) {
    auto micro = TrainMlp("micro", {"train.train_iter=6", std::string("train.train_micro_batch_size=") + std::to_string(32 / std::stoi(m)),
                                    std::string("train.num_accumulation_steps=") + m});
    ASSERT_TRUE(micro.ok()) << micro.status();
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_NEAR(micro->losses[i], whole->losses[i], 1e-6 * std::abs(whole->losses[i])) << "m=" << m << " iteration " << i;
    }
  }
}

TEST(Trainer, BadAccumulationIsAnError) {
  auto summary = TrainMlp("bad", {"train.num_accumulation_steps=0"});
  ASSERT_FALSE(summary.ok());
  EXPECT_NE(std::string(summary.status().message()).find("num_accumulation_steps"), std::string::npos) << summary.status();
}

TEST(Models, MlpIsRegisteredAndDataIsSeeded) {
  Registry<models::Model> registry("model");
  ASSERT_TRUE(models::RegisterBuiltinModels(registry).ok());
  EXPECT_FALSE(models::RegisterBuiltinModels(registry).ok());  // already there
  auto model = registry.Create({{"_target_", "models.MLP"}, {"in_features", 3}, {"hidden_sizes", {5}}, {"num_classes", 2},
                                 {"data_seed", 1}, {"init_seed", 2}});
  ASSERT_TRUE(model.ok()) << model.status();
  auto graph = (*model)->BuildGraph(4);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->losses().size(), 1u);
  auto a = Tensor::Zeros(Shape{4, 3}, DType::kF32);
  auto b = Tensor::Zeros(Shape{4, 3}, DType::kF32);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*model)->FillBatch(3, "x", *a).ok());
  ASSERT_TRUE((*model)->FillBatch(3, "x", *b).ok());
  EXPECT_EQ(a->ToVector<float>(), b->ToVector<float>());
  EXPECT_FALSE((*model)->FillBatch(3, "nope", *a).ok());
  // An input it does not own (a feed that forgot the learning rate) or a
  // tensor of another shape is an error, not a read past the shape (it
  // crashed on the scalar lr).
  auto lr = Tensor::Zeros(Shape{}, DType::kF32);
  ASSERT_TRUE(lr.ok());
  const absl::Status not_owned = (*model)->FillBatch(3, "lr", *lr);
  EXPECT_EQ(not_owned.code(), absl::StatusCode::kNotFound) << not_owned;
  EXPECT_EQ(not_owned.message(), "models.MLP has no input 'lr'");
  EXPECT_EQ((*model)->FillBatch(3, "labels", *a).message(),
            "models.MLP input 'labels' is i64 (batch,), the tensor to fill is f32(4, 3)");
  EXPECT_FALSE((*model)->FillBatch(3, "x", *lr).ok());
  EXPECT_FALSE(registry.Create({{"_target_", "models.MLPX"}}).ok());
  // Unseeded outside a whole job config: the seeds derive from train.seed.
  auto unseeded = registry.Create({{"_target_", "models.MLP"}});
  ASSERT_FALSE(unseeded.ok());
  EXPECT_NE(std::string(unseeded.status().message()).find("derives from 'train.seed'"), std::string::npos);
}

// The MLP of the Engine tests: 3 features, one hidden layer of 5, 2 classes.
absl::StatusOr<std::unique_ptr<models::Model>> SmallMlp() {
  Registry<models::Model> registry("model");
  RETURN_IF_ERROR(models::RegisterBuiltinModels(registry));
  return registry.Create({{"_target_", "models.MLP"},
                          {"in_features", 3},
                          {"hidden_sizes", {5}},
                          {"num_classes", 2},
                          {"data_seed", 1},
                          {"init_seed", 2}});
}

// A Run that fails after some data-parallel replicas finished their last
// update (the fetch of its last iteration fails, late), or at once, leaves
// the engine as it was before that Run: the next Run's losses are a fresh
// engine's.
// (Each replica's trained values were kept as it finished: the next Run
// went on from updated weights at iteration 0, replicas possibly apart.)
TEST(Engine, AFailedDataParallelRunLeavesNoUpdateBehind) {
  auto model = SmallMlp();
  ASSERT_TRUE(model.ok()) << model.status();
  const auto compile = [&] {
    auto graph = (*model)->BuildGraph(4);
    EXPECT_TRUE(graph.ok()) << graph.status();
    CompileOptions options;
    options.lower.parallel.data = 2;
    options.lower.parallel.world_size = 2;
    return Engine::Compile(std::move(*graph), options);
  };
  const Engine::FeedFn feed = [&](int64_t iteration, int64_t, std::string_view input, const Tensor& out) {
    if (input == "lr") {
      Tensor t = out;
      return t.CopyFrom(Tensor::FromVector(Shape{}, std::vector<float>{0.5f}));
    }
    return (*model)->FillBatch(iteration, input, out);
  };
  const auto losses_of = [](std::vector<float>& into) {
    return [&into](int64_t, const std::map<std::string, Tensor>& values) {
      into.push_back(values.at("loss").ToVector<float>().at(0));
      return absl::OkStatus();
    };
  };
  auto fresh = compile();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  std::vector<float> straight;
  ASSERT_TRUE((*fresh)->Run(4, feed, losses_of(straight)).ok());

  auto engine = compile();
  ASSERT_TRUE(engine.ok()) << engine.status();
  const absl::Status failed =
      (*engine)->Run(3, feed, [](int64_t iteration, const std::map<std::string, Tensor>&) -> absl::Status {
        if (iteration < 2) return absl::OkStatus();
        // Meanwhile every replica finishes its last update.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return absl::UnavailableError("the client went away");
      });
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  // A service's own deadline comes back as it was given (the runtime
  // appended its actors' states, as for its stall watchdog).
  const absl::Status late =
      (*engine)->Run(3, feed, [&](int64_t iteration, const std::map<std::string, Tensor>&) -> absl::Status {
        (*engine)->Cancel(absl::DeadlineExceededError("request budget of 300ms spent"));
        return absl::OkStatus();
      });
  EXPECT_EQ(late, absl::DeadlineExceededError("request budget of 300ms spent"));
  const absl::Status returned =
      (*engine)->Run(3, feed, [](int64_t iteration, const std::map<std::string, Tensor>&) -> absl::Status {
        return absl::DeadlineExceededError("request budget of 300ms spent");
      });
  EXPECT_EQ(returned.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(std::string(returned.message()).ends_with(": request budget of 300ms spent")) << returned;
  std::vector<float> after;
  ASSERT_TRUE((*engine)->Run(4, feed, losses_of(after)).ok());
  EXPECT_EQ(after, straight);
}

// An Engine runs one Run at a time: a Run from a callback of the Run in
// progress is FAILED_PRECONDITION and changes nothing (it returned OK and
// made the next Run skip an iteration); options the passes would take on
// trust are refused by Compile, naming them.
TEST(Engine, RunsOneRunAtATimeAndRefusesBadOptions) {
  auto model = SmallMlp();
  ASSERT_TRUE(model.ok()) << model.status();
  const auto compile = [&](const CompileOptions& options) {
    auto graph = (*model)->BuildGraph(4);
    EXPECT_TRUE(graph.ok()) << graph.status();
    return Engine::Compile(std::move(*graph), options);
  };
  auto engine = compile({});
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<int64_t> fed;  // the iterations fed x
  const Engine::FeedFn feed = [&](int64_t iteration, int64_t, std::string_view input, const Tensor& out) {
    if (input == "lr") {
      Tensor t = out;
      return t.CopyFrom(Tensor::FromVector(Shape{}, std::vector<float>{0.1f}));
    }
    if (input == "x") fed.push_back(iteration);
    return (*model)->FillBatch(iteration, input, out);
  };
  absl::Status inner;
  const Engine::FetchFn fetch = [&](int64_t iteration, const std::map<std::string, Tensor>&) {
    if (iteration == 0) inner = (*engine)->Run(1, feed, [](int64_t, const auto&) { return absl::OkStatus(); });
    return absl::OkStatus();
  };
  ASSERT_TRUE((*engine)->Run(2, feed, fetch).ok());
  EXPECT_EQ(inner.code(), absl::StatusCode::kFailedPrecondition) << inner;
  EXPECT_NE(inner.message().find("an Engine runs one Run at a time"), std::string::npos) << inner;
  ASSERT_TRUE((*engine)->Run(1, feed, fetch).ok());
  EXPECT_EQ(fed, (std::vector<int64_t>{0, 1, 2}));

  // Engine::Cancel from a callback (a service shutting down would call it
  // from another thread): the Run ends with the reason at once, and the
  // next Run continues from the last successful one.
  int64_t fetched = 0;
  const Engine::FetchFn cancel_at_5 = [&](int64_t iteration, const std::map<std::string, Tensor>&) {
    ++fetched;
    if (iteration == 5) (*engine)->Cancel(absl::CancelledError("shutting down"));
    return absl::OkStatus();
  };
  const absl::Status cancelled = (*engine)->Run(1000, feed, cancel_at_5);
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled) << cancelled;
  EXPECT_NE(cancelled.message().find("shutting down"), std::string::npos) << cancelled;
  EXPECT_LT(fetched, 100);
  fed.clear();
  ASSERT_TRUE((*engine)->Run(1, feed, fetch).ok());
  EXPECT_EQ(fed, (std::vector<int64_t>{3}));
  (*engine)->Cancel();  // no Run in progress: nothing happens
  fed.clear();
  ASSERT_TRUE((*engine)->Run(1, feed, fetch).ok());
  EXPECT_EQ(fed, (std::vector<int64_t>{4}));

  // Destroying the engine while another thread runs it cancels that Run
  // and waits for it (it hung: the Run's parameters kept finalizers into
  // the destroyed engine).
  {
    auto doomed = compile({});
    ASSERT_TRUE(doomed.ok()) << doomed.status();
    std::atomic<int64_t> fetches = 0;
    absl::Status ended;
    std::thread runner([&] {
      ended = (*doomed)->Run(1000000, feed, [&](int64_t, const std::map<std::string, Tensor>&) {
        ++fetches;
        return absl::OkStatus();
      });
    });
    while (fetches < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    {
      testing::Deadline deadline(std::chrono::seconds(30), "destroying an engine during a Run");
      doomed->reset();
      runner.join();
    }
    EXPECT_EQ(ended.code(), absl::StatusCode::kCancelled) << ended;
    EXPECT_NE(ended.message().find("the engine was destroyed during this Run"), std::string::npos) << ended;
  }

  const auto refused = [&](CompileOptions options, const std::string& text) {
    const absl::Status status = compile(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(text), std::string::npos) << status;
  };
  // A training graph whose loss reads no trainable variable would train
  // nothing: refused (it ran, returning OK).
  {
    graph::GraphBuilder b;
    const graph::Sym x = b.Input("x", {DType::kF32, Shape{2, 3}});
    const graph::Sym frozen = b.Variable("frozen", Shape{3}, graph::InitRule::Ones(), {.trainable = false});
    b.MarkLoss(graph::ReduceSum(x * frozen));
    auto graph = b.Finish();
    ASSERT_TRUE(graph.ok()) << graph.status();
    const absl::Status status = Engine::Compile(std::move(*graph), {}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(), "engine: the loss depends on no trainable variable: training would change nothing");
  }
  {  // A trainable integer variable (through a cast): named.
    graph::GraphBuilder b;
    const graph::Sym x = b.Input("x", {DType::kF32, Shape{2, 3}});
    const graph::Sym counts =
        b.Variable("counts", Shape{3}, graph::InitRule::Ones(), {.trainable = true, .dtype = DType::kI32});
    b.MarkLoss(graph::ReduceSum(x * graph::Cast(counts, DType::kF32)));
    auto graph = b.Finish();
    ASSERT_TRUE(graph.ok()) << graph.status();
    const absl::Status status = Engine::Compile(std::move(*graph), {}).status();
    EXPECT_NE(status.message().find("(variable 'counts' is i32: integers get no gradient)"), std::string::npos)
        << status;
  }
  {
    CompileOptions nan_clip;
    nan_clip.optimizer.clip_grad_max_norm = std::nan("");  // (ran as no clipping)
    refused(nan_clip, "optimizer: clip_grad_max_norm must be a positive finite number, got nan");
  }
  refused({.num_micro_batches = 0}, "engine: num_micro_batches must be in [1, 1048576], got 0");
  // (Lowering 2^40 micro-batches ran for hours, past any Cancel.)
  refused({.num_micro_batches = int64_t{1} << 40}, "engine: num_micro_batches must be in [1, 1048576]");
  refused({.intra_op_threads = -7}, "engine: intra_op_threads must be in [0, 1024]");
  refused({.intra_op_threads = 3000}, "engine: intra_op_threads must be in [0, 1024]");
  refused({.stall_timeout_s = std::nan("")}, "engine: stall_timeout_s must be a finite number of seconds >= 0");
  refused({.stall_timeout_s = -1}, "engine: stall_timeout_s must be a finite number of seconds >= 0");
  refused({.gradient_bucket_bytes = -5}, "engine: gradient_bucket_bytes must be >= 0");
  refused({.amp = DType::kI64}, "engine: amp must be f32 (off), bf16 or f16, got i64");
  refused({.optimizer = {.kind = static_cast<graph::OptimizerKind>(77)}}, "engine: optimizer.kind 77");
  // The lowering's options fail at Compile, not at each Run (they compiled).
  {
    CompileOptions options;
    options.lower.default_quota = 0;
    refused(options, "scheduler: quotas must be in [1, ");
    options = {};
    options.lower.zero_stage = 7;
    refused(options, "scheduler: zero_stage must be 0 to 3, got 7");
    options = {};
    options.lower.device_index = 300;
    refused(options, "scheduler: device_index 300 is past a node's devices (actor ids hold 256)");
  }
  // A graph's fetch named as one the engine makes is refused (a "grad_norm"
  // silently replaced the optimizer's under clipping; "loss" failed every
  // Run), and so is a scope's layer index outside the pipeline's layers.
  const auto with_fetch = [](const std::string& name, int64_t layer) {
    graph::GraphBuilder b;
    const graph::Sym x = b.Input("x", {DType::kF32, Shape{2, 3}});
    graph::Sym y;
    {
      auto scope = b.Scope("layer", layer);
      y = x * b.Variable("w", Shape{3}, graph::InitRule::Ones());
    }
    b.MarkLoss(graph::ReduceSum(y));
    b.MarkFetch(name, graph::ReduceSum(x));
    return b.Finish();
  };
  for (const std::string name : {"loss", "loss2", "grad_norm", "loss_scale", "skipped"}) {
    auto graph = with_fetch(name, 0);
    ASSERT_TRUE(graph.ok()) << graph.status();
    CompileOptions options;
    options.optimizer.clip_grad_max_norm = 1.0;
    const absl::Status status = Engine::Compile(std::move(*graph), options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << ": " << status;
    EXPECT_NE(status.message().find("engine: fetch '" + name + "' is named as one the engine makes"), std::string::npos)
        << status;
  }
  EXPECT_TRUE(with_fetch("loss_sum", 0).ok());
  {
    auto graph = with_fetch("loss_sum", 0);
    EXPECT_TRUE(Engine::Compile(std::move(*graph), {}).ok());
  }
  EXPECT_NE(with_fetch("", 0).status().message().find("a fetch needs a name"), std::string::npos);
  {
    auto graph = with_fetch("sum", 999);
    ASSERT_TRUE(graph.ok()) << graph.status();
    CompileOptions options;
    options.lower.parallel.pipeline = 2;
    options.lower.parallel.world_size = 2;
    options.lower.parallel.pipeline_num_layers = 2;
    const absl::Status status = Engine::Compile(std::move(*graph), options).status();
    EXPECT_NE(status.message().find("layer_idx 999 is outside the 2 pipeline layers"), std::string::npos) << status;
  }
}

// A variable of no pipeline layer read on two stages sits on the earliest
// and is updated where its gradients meet: the plan is refused naming it
// and what to do (it was an internal error naming the update '').
TEST(Engine, AVariableUpdatedOnAnotherStageIsNamed) {
  graph::GraphBuilder b;
  const graph::Sym x = b.Input("x", {DType::kF32, Shape{2, 3}});
  const graph::Sym shared = b.Variable("shared", Shape{3}, graph::InitRule::Ones());
  graph::Sym y;
  {
    auto scope = b.Scope("first", 0);
    y = x * shared;
  }
  {
    auto scope = b.Scope("second", 1);
    y = y * shared;
  }
  b.MarkLoss(graph::ReduceSum(y));
  auto graph = b.Finish();
  ASSERT_TRUE(graph.ok()) << graph.status();
  CompileOptions options;
  options.lower.parallel.pipeline = 2;
  options.lower.parallel.world_size = 2;
  options.lower.parallel.pipeline_num_layers = 2;
  auto engine = Engine::Compile(std::move(*graph), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const absl::Status status = (*engine)->Plan(1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("variable 'shared' is on pipeline stage 0 but its update is made on stage 1: give "
                                  "the variable the layer of the stage that updates it"),
            std::string::npos)
      << status;
}

// A residual add fused into bias_dropout_add at rate 0 draws nothing: under
// gradient accumulation the graph lowers (it was refused as feeding "a
// random op" whose micro-batch axis no signature named: the offset `p` has
// no batch axis), and trains as without accumulation.
TEST(Engine, ARateZeroFusionIsNoRandomOpUnderAccumulation) {
  const auto loss_with = [](int64_t micro) -> absl::StatusOr<float> {
    const int64_t rows = 4 / micro;
    graph::GraphBuilder b;
    const graph::Sym x = b.Input("x", {DType::kF32, Shape{rows, 3}});
    const graph::Sym p = b.Input("p", {DType::kF32, Shape{3}});
    const graph::Sym w = b.Variable("w", Shape{3, 3}, graph::InitRule::Constant(0.1));
    const graph::Sym bias = b.Variable("bias", Shape{3}, graph::InitRule::Constant(0.0));
    const graph::Sym h = x + p;
    b.MarkLoss(graph::ReduceMean(graph::BiasAdd(graph::Matmul(h, w), bias) + h));
    auto graph = b.Finish();
    if (!graph.ok()) return graph.status();
    CompileOptions options;
    options.optimizer.kind = graph::OptimizerKind::kSgd;
    options.num_micro_batches = micro;
    auto engine = Engine::Compile(std::move(*graph), options);
    if (!engine.ok()) return engine.status();
    bool fused = false;
    for (const auto& node : (*engine)->graph().nodes()) fused = fused || node.op == "bias_dropout_add";
    EXPECT_TRUE(fused) << "the residual add was not fused: the test no longer tests the fusion";
    float loss = 0;
    const absl::Status ran = (*engine)->Run(
        1,
        [](int64_t, int64_t, std::string_view input, const Tensor& out) {
          Tensor t = out;
          return t.CopyFrom(Tensor::FromVector(out.shape(), std::vector<float>(out.NumElements(), 0.5f)));
        },
        [&](int64_t, const std::map<std::string, Tensor>& values) {
          loss = values.at("loss").ToVector<float>().at(0);
          return absl::OkStatus();
        });
    if (!ran.ok()) return ran;
    return loss;
  };
  const absl::StatusOr<float> whole = loss_with(1), accumulated = loss_with(2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(accumulated.ok()) << accumulated.status();
  EXPECT_FLOAT_EQ(*accumulated, *whole);
}

// Train's progress line: the fields of `tessera train`'s (grad_norm to 4
// digits, printed with all 17 before; none without clipping, "null" before).
TEST(Trainer, ProgressLineFormatsItsNumbers) {
  EXPECT_EQ(
      FormatProgressLine(
          3, 10, {{"loss", 5.1234564}, {"lr", 3e-4}, {"grad_norm", 1.0558278560638428}, {"samples_per_s", 160.2}}),
      "iter 3/10  loss 5.123456  lr 0.0003  grad_norm 1.056  samples/s 160\n");
  EXPECT_EQ(FormatProgressLine(3, 10, {{"loss", 5.1234564}, {"lr", 3e-4}, {"samples_per_s", 160.2}}),
            "iter 3/10  loss 5.123456  lr 0.0003  samples/s 160\n");
}

// EvalMetrics of no runs names that, not a loss term it was given.
TEST(Trainer, EvalMetricsOfNoRunsIsInvalid) {
  const auto none = EvalMetrics({{"loss", 2.0}}, 0, {"loss"}, true);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << none.status();
  EXPECT_EQ(none.status().message(), "evaluation: runs must be >= 1, got 0");
  const auto two = EvalMetrics({{"loss", 3.0}}, 2, {"loss"}, true);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_DOUBLE_EQ(two->at("eval_loss"), 1.5);
}

// A loss that is not finite stops the run naming its iteration as the
// progress lines and metrics.jsonl count them, from 1 (it said 1 for the
// second).
TEST(Cli, ANonFiniteLossNamesItsIterationFromOne) {
  const Result r = RunTessera(
      "train " + Source("configs/gpt2_nano.json") +
      " optim.lr=1e308 train.train_iter=3 train.log_period=1 train.output_dir=" + TempDir("nonfinite").string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("iter 1/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at iteration 2"), std::string::npos) << r.out;
  std::filesystem::remove_all(TempDir("nonfinite"));
}

// A kernel's workspace (OpSchema::Workspace) is planned into the arena:
// gpt2_nano's embedding gradients get the CPU kernel's counting-sort arrays
// (2 V + 1 + N int64 words) there, once per task; on GPUs that kernel asks
// for none.
TEST(KernelWorkspace, EmbeddingGradientsGetTheirSortArraysFromTheArena) {
  for (const std::string device : {"cpu", "cuda"}) {
    SCOPED_TRACE(device);
    auto job = LoadJobConfig(testing::SourcePath("configs/gpt2_nano.json"), {"train.dist.device_type=" + device});
    ASSERT_TRUE(job.ok()) << job.status();
    auto plan = TrainingPlan(*job);
#ifndef TESSERA_WITH_CUDA
    if (device == "cuda") continue;  // refused: no CUDA kernels in this build
#endif
    ASSERT_TRUE(plan.ok()) << plan.status();
    int found = 0;
    for (const auto& task : plan->tasks()) {
      if (task.op() != "embedding_grad") continue;
      ++found;
      if (device == "cuda") {
        EXPECT_EQ(task.scratch_bytes(), 0) << task.name();
        continue;
      }
      // wte: V 256, N 16 x 32 ids; wpe: V 32, N 32 positions (one sequence's).
      const bool wte = task.name().find("wte") != std::string::npos;
      const int64_t rows = wte ? 256 : 32, ids = wte ? 16 * 32 : 32;
      EXPECT_EQ(task.scratch_bytes(), 8 * (2 * rows + 1 + ids)) << task.name();
      EXPECT_TRUE(task.has_scratch_offset()) << task.name();
    }
    EXPECT_EQ(found, 2);
  }
}

// train.dist.device_type=cuda plans every task on cuda:0, every task that
// runs kernels acting asynchronously (on the device's CUDA stream); an op
// without a CUDA kernel is a plan error naming it.
TEST(CudaPlan, OneGpuPlansEveryTaskOnCudaWithAsynchronousComputes) {
  auto job = LoadJobConfig(testing::SourcePath("configs/gpt2_nano.json"), {"train.dist.device_type=cuda"});
  ASSERT_TRUE(job.ok()) << job.status();
  auto plan = TrainingPlan(*job);
#ifdef TESSERA_WITH_CUDA
  ASSERT_TRUE(plan.ok()) << plan.status();
  int computes = 0;
  for (const auto& task : plan->tasks()) {
    EXPECT_EQ(comm::DecodeActorId(task.actor_id()).device(), (Device{DeviceType::kCuda, 0})) << task.name();
    const bool compute = task.kind() == proto::ACTOR_KIND_COMPUTE && !task.op().empty();
    const bool kernels = compute || task.kind() == proto::ACTOR_KIND_ACC ||
                         (task.kind() == proto::ACTOR_KIND_PARAMETER && !task.op().empty());
    EXPECT_EQ(task.async_acts(), kernels) << task.name();
    computes += compute ? 1 : 0;
  }
  EXPECT_GT(computes, 100);
  ASSERT_EQ(plan->memory_estimate_size(), 1);
  EXPECT_EQ(plan->memory_estimate(0).device(), "cuda:0");
  EXPECT_EQ(plan->mesh().rfind("cuda, 1 ranks", 0), 0u) << plan->mesh();
#else
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("has no cuda kernel"), std::string::npos) << plan.status();
#endif
  // The MLP's ops (sparse_softmax_cross_entropy included) have CUDA kernels
  // too; an op without one is refused by name (lower_test).
  auto mlp = LoadJobConfig(testing::SourcePath("configs/mlp_demo.json"), {"train.dist.device_type=cuda"});
  ASSERT_TRUE(mlp.ok());
  const auto mlp_plan = TrainingPlan(*mlp);
#ifdef TESSERA_WITH_CUDA
  EXPECT_TRUE(mlp_plan.ok()) << mlp_plan.status();
#else
  ASSERT_FALSE(mlp_plan.ok());
  EXPECT_NE(mlp_plan.status().message().find("has no cuda kernel"), std::string::npos) << mlp_plan.status();
#endif
}

// Over several GPUs the plan is the CPU one's on cuda:0 .. cuda:N-1: one
// rank per GPU, the same collectives (boxing) and pipeline transfers, which
// the runtime runs on NCCL communicators.
TEST(CudaPlan, SeveralGpusPlanTheCpuLayoutsCollectivesAndTransfers) {
  auto job = LoadJobConfig(testing::SourcePath("configs/gpt2_nano.json"),
                           {"train.dist.device_type=cuda", "train.dist.data_parallel_size=2",
                            "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2"});
  ASSERT_TRUE(job.ok()) << job.status();
  auto plan = TrainingPlan(*job);
#ifdef TESSERA_WITH_CUDA
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto cpu_job = LoadJobConfig(
      testing::SourcePath("configs/gpt2_nano.json"),
      {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2"});
  ASSERT_TRUE(cpu_job.ok()) << cpu_job.status();
  auto cpu_plan = TrainingPlan(*cpu_job);
  ASSERT_TRUE(cpu_plan.ok()) << cpu_plan.status();
  std::map<proto::ActorKind, int> kinds, cpu_kinds;
  std::map<proto::ActorKind, std::set<uint32_t>> streams, cpu_streams;
  std::set<uint32_t> gpus;
  for (const auto& task : plan->tasks()) {
    const comm::ActorId id = comm::DecodeActorId(task.actor_id());
    EXPECT_EQ(id.device().type, DeviceType::kCuda) << task.name();
    gpus.insert(id.device().index);
    ++kinds[task.kind()];
    streams[task.kind()].insert(id.stream);
  }
  for (const auto& task : cpu_plan->tasks()) {
    ++cpu_kinds[task.kind()];
    cpu_streams[task.kind()].insert(comm::DecodeActorId(task.actor_id()).stream);
  }
  // Feeds and fetches on a copy stream of their own on GPUs; the rest as on
  // CPUs: kernels on stream 0, collectives and transfers on stream 1.
  for (auto& [kind, used] : cpu_streams) {
    SCOPED_TRACE(proto::ActorKind_Name(kind));
    const bool host = kind == proto::ACTOR_KIND_SOURCE || kind == proto::ACTOR_KIND_SINK;
    EXPECT_EQ(streams[kind], host ? std::set<uint32_t>{2} : used);
    if (host) {
      EXPECT_EQ(used, std::set<uint32_t>{0});
    }
  }
  EXPECT_EQ(gpus.size(), 8u);
  EXPECT_EQ(kinds, cpu_kinds);
  EXPECT_GT(kinds[proto::ACTOR_KIND_COLLECTIVE], 0);
  EXPECT_GT(kinds[proto::ACTOR_KIND_SEND], 0);
  EXPECT_EQ(kinds[proto::ACTOR_KIND_SEND], kinds[proto::ACTOR_KIND_RECV]);
  EXPECT_EQ(plan->mesh().rfind("cuda, 8 ranks", 0), 0u) << plan->mesh();
#else
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("has no cuda kernel"), std::string::npos) << plan.status();
#endif
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// The same global batch under data, tensor and pipeline parallelism (and
// mixes, with accumulation) gives the one-device losses.
TEST(Trainer, ParallelLayoutsMatchOneDevice) {
  auto one = TrainMlp("one", {"train.train_iter=6", "train.train_micro_batch_size=32"});
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<std::vector<std::string>> layouts = {
      {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16"},
      {"train.dist.data_parallel_size=4", "train.train_micro_batch_size=8"},
      {"train.dist.tensor_parallel_size=2", "train.train_micro_batch_size=32"},
      {"train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=32"},
      {"train.dist.pipeline_parallel_size=3", "train.train_micro_batch_size=8", "train.num_accumulation_steps=4"},
      {"train.dist.data_parallel_size=2", "train.dist.pipeline_parallel_size=2", "train.train_micro_batch_size=8",
       "train.num_accumulation_steps=2"},
  };
  for (std::vector<std::string> layout : layouts) {
    SCOPED_TRACE(layout[0] + " " + layout[1]);
    layout.push_back("train.train_iter=6");
    auto run = TrainMlp("layout", layout);
    ASSERT_TRUE(run.ok()) << run.status();
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(run->losses[i], one->losses[i], 1e-5 * std::abs(one->losses[i])) << "iteration " << i;
  }
}

TEST(Trainer, BadParallelConfigIsAnError) {
  auto bad = TrainMlp("bad", {"train.dist.data_parallel_size=null"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("num_devices"), std::string::npos) << bad.status();
  // Four stages for the MLP's three layers.
  auto stages = TrainMlp("bad", {"train.dist.pipeline_parallel_size=4"});
  ASSERT_FALSE(stages.ok());
  // pipeline_num_layers must be the model's layer count.
  auto layers = TrainMlp("bad", {"train.dist.pipeline_parallel_size=2", "train.dist.pipeline_num_layers=100"});
  ASSERT_FALSE(layers.ok());
  EXPECT_EQ(layers.status().message(),
            "train.dist.pipeline_num_layers 100 != the model's 3 layers (leave it null to use the model's)");
  EXPECT_TRUE(TrainMlp("ok", {"train.train_iter=2", "train.dist.pipeline_parallel_size=2", "train.dist.pipeline_num_layers=3"}).ok());
  // More devices than one node's actor ids can address.
  auto devices = TrainMlp("bad", {"train.dist.data_parallel_size=64", "train.dist.tensor_parallel_size=8"});
  ASSERT_FALSE(devices.ok());
  EXPECT_NE(std::string(devices.status().message()).find("512 devices, but one node holds at most 256"), std::string::npos)
      << devices.status();
}

// global = micro × accumulation × data-parallel ranks, with the data-parallel
// size known before the accumulation is derived: dp 2 × micro 16 with
// global 32 is one micro-batch per iteration, the one-device job's batch.
TEST(Trainer, GlobalBatchCountsDataParallelRanks) {
  auto one = TrainMlp("one", {"train.train_iter=4", "train.train_micro_batch_size=32"});
  ASSERT_TRUE(one.ok()) << one.status();
  for (const std::vector<std::string>& batch :
       {std::vector<std::string>{"train.global_batch_size=32", "train.num_accumulation_steps=null"},
        std::vector<std::string>{"train.global_batch_size=32", "train.num_accumulation_steps=1"}}) {
    std::vector<std::string> overrides = {"train.train_iter=4", "train.dist.data_parallel_size=2", "train.train_micro_batch_size=16"};
    overrides.insert(overrides.end(), batch.begin(), batch.end());
    auto dp = TrainMlp("dp", overrides);
    ASSERT_TRUE(dp.ok()) << dp.status();
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(dp->losses[i], one->losses[i], 1e-5 * std::abs(one->losses[i])) << "iteration " << i;
  }
  // dp 2 × micro 16 × accumulation 2 = 64: two micro-batches of the 64-sample global batch.
  auto acc = TrainMlp("acc", {"train.train_iter=2", "train.dist.data_parallel_size=2", "train.train_micro_batch_size=16",
                              "train.global_batch_size=64", "train.num_accumulation_steps=null"});
  ASSERT_TRUE(acc.ok()) << acc.status();
  auto bad = TrainMlp("bad", {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16",
                              "train.global_batch_size=32", "train.num_accumulation_steps=2"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "train.global_batch_size 32 != train.train_micro_batch_size 16 x train.num_accumulation_steps 2 x 2 "
                                    "data-parallel ranks");
  auto indivisible = TrainMlp("bad", {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16", "train.global_batch_size=48",
                                      "train.num_accumulation_steps=null"});
  ASSERT_FALSE(indivisible.ok());
  EXPECT_NE(std::string(indivisible.status().message()).find("is not a multiple"), std::string::npos);
}

// A job that cannot start leaves nothing behind: no output directory, no
// half-written file, and an existing run's files untouched.
TEST(Trainer, FailedStartWritesNothing) {
  const auto dir = TempDir("nothing");
  auto config = LoadJobConfig(Source("configs/mlp_demo.json"),
                              {"train.output_dir=" + dir.string(), "model.hidden_sizes=[16777216, 16777216]"});
  ASSERT_TRUE(config.ok()) << config.status();
  auto summary = Train(*config);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kResourceExhausted) << summary.status();
  EXPECT_NE(std::string(summary.status().message()).find("but this machine has"), std::string::npos) << summary.status();
  EXPECT_FALSE(std::filesystem::exists(dir));
  // Into a file where the directory should be: refused up front.
  std::ofstream(dir.string()) << "not a directory";
  config = LoadJobConfig(Source("configs/mlp_demo.json"), {"train.output_dir=" + (dir / "sub").string()});
  ASSERT_TRUE(config.ok());
  summary = Train(*config);
  ASSERT_FALSE(summary.ok());
  EXPECT_NE(std::string(summary.status().message()).find("is not a directory"), std::string::npos) << summary.status();
  std::filesystem::remove_all(dir);
}

// train.seed seeds what the model leaves unseeded, and only that.
TEST(Trainer, TrainSeedDrivesUnseededModels) {
  auto a = TrainMlp("seed", {"train.train_iter=3", "train.seed=1"});
  auto b = TrainMlp("seed", {"train.train_iter=3", "train.seed=2"});
  auto a_again = TrainMlp("seed", {"train.train_iter=3", "train.seed=1"});
  ASSERT_TRUE(a.ok() && b.ok() && a_again.ok());
  EXPECT_NE(a->losses, b->losses);
  EXPECT_EQ(a->losses, a_again->losses);
  auto fixed1 = TrainMlp("seed", {"train.train_iter=3", "train.seed=1", "model.init_seed=7", "model.data_seed=8"});
  auto fixed2 = TrainMlp("seed", {"train.train_iter=3", "train.seed=2", "model.init_seed=7", "model.data_seed=8"});
  ASSERT_TRUE(fixed1.ok() && fixed2.ok());
  EXPECT_EQ(fixed1->losses, fixed2->losses);
}

// output_dir/config.json is the resolved config (derived seeds included):
// training from it reproduces the run.
TEST(Trainer, SavedConfigReproducesTheRun) {
  const auto dir = TempDir("saved");
  auto first = LoadJobConfig(Source("configs/gpt2_nano.json"), {"train.train_iter=3", "train.output_dir=" + dir.string()});
  ASSERT_TRUE(first.ok()) << first.status();
  auto a = Train(*first);
  ASSERT_TRUE(a.ok()) << a.status();
  const auto again_dir = TempDir("saved_again");
  auto saved = LoadJobConfig(dir / "config.json", {"train.output_dir=" + again_dir.string()});
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ((*saved)["model"]["init_seed"], (*first)["model"]["init_seed"]);
  auto b = Train(*saved);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->losses, b->losses);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(again_dir);
}

TEST(Trainer, LossesRecordedForBoundedIterations) {
  auto run = TrainMlp("bounded", {"train.train_iter=5", "train.train_micro_batch_size=2", "model.hidden_sizes=[4]"});
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->iterations, 5);
  EXPECT_EQ(run->losses.size(), 5u);
  EXPECT_EQ(run->final_loss, run->losses.back());
  EXPECT_GE(TrainSummary::kMaxRecordedLosses, 1 << 16);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Every op a GPT-2 (or BERT) training step runs, under the layouts and
// features users set (mixed precision included), has a CUDA kernel in a build with CUDA (docs/ops.md), so a GPU job
// would find no op without one; a build without CUDA has none.
TEST(CudaCoverage, EveryOpOfGpt2AndBertTrainingStepsHasACudaKernel) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"configs/gpt2_nano.json", {}},
      {"configs/gpt2_nano.json",
       {"train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2", "train.num_accumulation_steps=2"}},
      {"configs/gpt2_nano.json", {"train.dist.data_parallel_size=2"}},  // gradient buckets
      {"configs/gpt2_nano.json",
       {"train.dist.data_parallel_size=2", "train.zero_optimization.enabled=true", "train.zero_optimization.stage=3"}},
      {"configs/gpt2_nano.json",
       {"train.activation_checkpoint.enabled=true", "optim._target_=SGD", "optim.momentum=0.9"}},
      {"configs/gpt2_nano.json", {"train.amp.enabled=true", "train.amp.dtype=bf16"}},
      {"configs/gpt2_nano.json", {"train.amp.enabled=true", "train.amp.dtype=fp16"}},
      {"configs/bert_tiny.json", {}},
  };
  for (const auto& [config, overrides] : runs) {
    SCOPED_TRACE(StrCat(config, " ", Join(overrides, " ")));
    auto job = LoadJobConfig(testing::SourcePath(config), overrides);
    ASSERT_TRUE(job.ok()) << job.status();
    auto plan = TrainingPlan(*job);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::set<std::string> missing;
    for (const auto& task : plan->tasks()) {
      if (task.op().empty()) continue;
      const ops::OpSchema* schema = ops::BuiltinOps().Find(task.op());
      ASSERT_NE(schema, nullptr) << task.op();
      if (schema->FindKernel(DeviceType::kCuda) == nullptr) missing.insert(task.op());
    }
#ifdef TESSERA_WITH_CUDA
    EXPECT_TRUE(missing.empty()) << "no CUDA kernel: "
                                 << Join(std::vector<std::string>(missing.begin(), missing.end()), ", ");
#else
    EXPECT_FALSE(missing.empty());
#endif
  }
}

}  // namespace
}  // namespace tessera
