// Multi-step training against an independent PyTorch implementation
// (gpt2_train_reference.py beside this file): the same GPT-2 weights (a
// Hugging Face file written by gpt2_reference.py make-hf, loaded through
// train.load_weight), the same samples, and per iteration the same loss,
// learning rate and gradient norm from `tessera train`'s metrics.jsonl as
// torch.optim's AdamW / SGD, torch.nn.utils.clip_grad_norm_ and LiBai's
// schedules give. The layouts' agreement with one device is equivalence_test's
// business; this checks what one device computes over many steps: the
// optimizers' updates and their bias correction, which tensors weight decay
// skips (decaying the LayerNorm weights and biases too moves the losses by
// tens of percent within 25 steps), the warmup and decay of the learning
// rate iteration by iteration, the global norm and clipping.
//
// The training split holds exactly one global batch of samples, so every
// iteration reads all of them and the sampler's order cannot matter.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::ReadMetricsRows;
using ::tessera::testing::RunCommand;
using ::tessera::testing::RunTessera;
using ::tessera::testing::SourcePath;

constexpr int64_t kVocab = 256, kSeq = 32, kSamples = 8;
constexpr char kModel[] =
    R"({"vocab_size": 256, "hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "ffn_hidden_size": 256, )"
    R"("max_seq_length": 32, "seq_length": 32, "layernorm_epsilon": 1e-5})";

const fs::path& TempRoot() {
  static const fs::path root = ::tessera::testing::FreshProcessDirectory("tessera_torch_training_test");
  return root;
}
// Removes TempRoot() (the runs' files) when the tests are done.
::testing::Environment* const remove_temp_root =
    ::testing::AddGlobalTestEnvironment(new ::tessera::testing::RemoveDirectoryWhenDone(TempRoot()));

struct Inputs {
  fs::path weights;  // Hugging Face safetensors
  fs::path prefix;   // the indexed dataset
  fs::path tokens;   // its token stream as one JSON list, for the reference
};

// One document of kSamples·kSeq + 1 tokens from a sparse random Markov chain
// (something a model can learn, so the losses move), written as a Megatron
// dataset by the independent writer; and random weights of a small scale
// (the training stays smooth enough for float32 to agree over many steps).
const Inputs& MakeInputs() {
  static const Inputs inputs = [] {
    Inputs made{TempRoot() / "model.safetensors", TempRoot() / "data", TempRoot() / "tokens.json"};
    std::mt19937_64 random(5);
    std::vector<std::vector<int64_t>> next(kVocab, std::vector<int64_t>(4));
    for (auto& row : next) {
      for (int64_t& id : row) id = static_cast<int64_t>(random() % kVocab);
    }
    std::vector<int64_t> stream{0};
    while (static_cast<int64_t>(stream.size()) < kSamples * kSeq + 1) {
      const uint64_t draw = random() % 8;  // successors 0..3 with weights 4:2:1:1
      stream.push_back(next[static_cast<size_t>(stream.back())][draw < 4 ? 0 : draw < 6 ? 1 : draw < 7 ? 2 : 3]);
    }
    std::ofstream(made.tokens) << nlohmann::json(stream).dump();
    const fs::path corpus = TempRoot() / "corpus.json";
    std::ofstream(corpus) << nlohmann::json::array({nlohmann::json::array({stream})}).dump();
    const auto write =
        RunCommand("timeout 120 /usr/bin/python3 " + SourcePath("tests/data/megatron_indexed_dataset.py") + " write " +
                   made.prefix.string() + " " + std::to_string(kVocab) + " " + corpus.string() + " 2>&1");
    EXPECT_EQ(write.exit_code, 0) << write.out;
    const auto weights =
        RunCommand("timeout 120 /usr/bin/python3 " + SourcePath("tests/train/gpt2_reference.py") + " " +
                   made.weights.string() + " make-hf --seed 11 --std 0.05 --model '" + kModel + "' 2>&1");
    EXPECT_EQ(weights.exit_code, 0) << weights.out;
    return made;
  }();
  return inputs;
}

struct Row {
  double loss = 0, lr = 0, grad_norm = 0;
};

// `tessera train` of the model on the inputs with `sections` (lr_scheduler,
// optim, train keys) merged over the defaults; its metrics by iteration.
std::vector<Row> TrainTessera(const std::string& name, const nlohmann::json& sections) {
  const Inputs& inputs = MakeInputs();
  nlohmann::json model = nlohmann::json::parse(kModel);
  model["_target_"] = "models.GPT2";
  model["embedding_dropout_prob"] = model["attention_dropout_prob"] = model["output_dropout_prob"] = 0.0;
  nlohmann::json config = {
      {"_base_", {SourcePath("configs/common/train.json"), SourcePath("configs/common/optim.json")}},
      {"model", model},
      {"dataloader", {{"data_prefix", inputs.prefix.string()}, {"splits", "1,0,0"}}},
      {"train",
       {{"output_dir", (TempRoot() / name).string()},
        {"log_period", 1},
        {"load_weight", inputs.weights.string()},
        {"dist", {{"intra_op_threads", 1}}}}},
  };
  config.merge_patch(sections);
  const fs::path file = TempRoot() / (name + ".json");
  std::ofstream(file) << config.dump(2);
  const auto run = RunTessera("train " + file.string());
  EXPECT_EQ(run.exit_code, 0) << run.out;
  std::vector<Row> rows;
  for (const auto& [iter, row] : ReadMetricsRows(TempRoot() / name).train) {
    EXPECT_EQ(iter, static_cast<int64_t>(rows.size()) + 1);
    rows.push_back({row.at("loss").get<double>(), row.at("lr").get<double>(),
                    row.contains("grad_norm") ? row["grad_norm"].get<double>() : NAN});
  }
  return rows;
}

std::vector<Row> TrainTorch(const std::string& args) {
  const Inputs& inputs = MakeInputs();
  const auto run = RunCommand("timeout 300 /usr/bin/python3 " + SourcePath("tests/train/gpt2_train_reference.py") +
                              " " + inputs.weights.string() + " --model '" + kModel + "' --tokens " +
                              inputs.tokens.string() + " " + args + " 2>&1");
  EXPECT_EQ(run.exit_code, 0) << run.out;
  std::vector<Row> rows;
  std::istringstream lines(run.out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) {
      ADD_FAILURE() << "not a row of the reference: " << line;
      continue;
    }
    rows.push_back({row.at("loss").get<double>(), row.at("lr").get<double>(), row.at("grad_norm").get<double>()});
  }
  return rows;
}

double Relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// Every iteration's loss and lr within the tolerances, the gradient norm too
// where Tessera logged one; and the loss fell (the comparison is of training,
// not of a model standing still).
void ExpectSameTraining(const std::vector<Row>& tessera, const std::vector<Row>& torch, int64_t iterations,
                        double loss_rtol, double norm_rtol) {
  ASSERT_EQ(static_cast<int64_t>(tessera.size()), iterations);
  ASSERT_EQ(static_cast<int64_t>(torch.size()), iterations);
  double worst_loss = 0, worst_lr = 0, worst_norm = 0;
  for (size_t i = 0; i < tessera.size(); ++i) {
    worst_loss = std::max(worst_loss, Relative(tessera[i].loss, torch[i].loss));
    worst_lr = std::max(worst_lr, Relative(tessera[i].lr, torch[i].lr));
    if (!std::isnan(tessera[i].grad_norm)) {
      worst_norm = std::max(worst_norm, Relative(tessera[i].grad_norm, torch[i].grad_norm));
    }
    EXPECT_LE(Relative(tessera[i].loss, torch[i].loss), loss_rtol)
        << "iteration " << i + 1 << ": loss " << tessera[i].loss << " vs PyTorch " << torch[i].loss;
    EXPECT_LE(Relative(tessera[i].lr, torch[i].lr), 1e-9)
        << "iteration " << i + 1 << ": lr " << tessera[i].lr << " vs PyTorch " << torch[i].lr;
    if (!std::isnan(tessera[i].grad_norm)) {
      EXPECT_LE(Relative(tessera[i].grad_norm, torch[i].grad_norm), norm_rtol)
          << "iteration " << i + 1 << ": grad_norm " << tessera[i].grad_norm << " vs PyTorch " << torch[i].grad_norm;
    }
  }
  std::printf(
      "largest relative differences over %lld iterations: loss %.2e, lr %.2e, grad_norm %.2e; loss %.4f -> %.4f\n",
      static_cast<long long>(iterations), worst_loss, worst_lr, worst_norm, tessera.front().loss, tessera.back().loss);
  EXPECT_LT(tessera.back().loss, 0.8 * tessera.front().loss);
}

// AdamW with decoupled weight decay (not on biases and LayerNorm weights),
// a linear warmup into a cosine decay, the global 2-norm clipped, over two
// data-parallel ranks of two micro-batches each.
TEST(TorchTraining, AdamWarmupCosineAndClippingMatchPyTorch) {
  constexpr int64_t kIterations = 25;
  const std::vector<Row> tessera =
      TrainTessera("adamw", {{"train",
                              {{"train_iter", kIterations},
                               {"warmup_ratio", 0.2},
                               {"train_micro_batch_size", 2},
                               {"num_accumulation_steps", 2},
                               {"dist", {{"data_parallel_size", 2}}}}},
                             {"lr_scheduler", {{"_target_", "WarmupCosineLR"}, {"alpha", 0.01}}},
                             {"optim",
                              {{"_target_", "AdamW"},
                               {"lr", 1e-2},
                               {"weight_decay", 0.1},
                               {"betas", {0.9, 0.95}},
                               {"eps", 1e-8},
                               {"clip_grad_max_norm", 0.5}}}});
  const std::vector<Row> torch = TrainTorch(
      "--iters 25 --global-batch 8 --micro 2 --optim adamw --lr 1e-2 --weight-decay 0.1 --betas 0.9,0.95 "
      "--eps 1e-8 --clip 0.5 --schedule cosine --warmup-ratio 0.2 --alpha 0.01");
  ExpectSameTraining(tessera, torch, kIterations, 1e-5, 1e-4);
}

// SGD with Nesterov momentum and L2 weight decay (the same tensors skipped),
// a warmup into milestones, the global max-norm clipped, tensor-parallel.
// The max-norm is one element's magnitude, so it follows the rounding of the
// two sides more closely than a sum does: 1e-3 (measured: 2.4e-4 at most;
// the losses 3.9e-6). At lr 0.5 this run is unstable (its loss jumps back
// up), and the two sides' float32 roundings part after 15 iterations.
TEST(TorchTraining, SgdNesterovMilestonesAndMaxNormClippingMatchPyTorch) {
  constexpr int64_t kIterations = 25;
  const std::vector<Row> tessera = TrainTessera(
      "sgd", {{"train",
               {{"train_iter", kIterations},
                {"warmup_ratio", 0.2},
                {"train_micro_batch_size", 8},
                {"dist", {{"tensor_parallel_size", 2}}}}},
              {"lr_scheduler", {{"_target_", "WarmupMultiStepLR"}, {"milestones", {8, 15}}, {"gamma", 0.5}}},
              {"optim",
               {{"_target_", "SGD"},
                {"lr", 0.2},
                {"momentum", 0.9},
                {"nesterov", true},
                {"weight_decay", 0.05},
                {"clip_grad_max_norm", 0.2},
                {"clip_grad_norm_type", "inf"}}}});
  const std::vector<Row> torch = TrainTorch(
      "--iters 25 --global-batch 8 --optim sgd --lr 0.2 --momentum 0.9 --nesterov --weight-decay 0.05 "
      "--clip 0.2 --norm-type inf --schedule multistep --milestones 8,15 --gamma 0.5 --warmup-ratio 0.2");
  ExpectSameTraining(tessera, torch, kIterations, 2e-5, 1e-3);
}

}  // namespace
}  // namespace tessera
