// Training on text through `tessera train` (train/text_data.h): a corpus is
// tokenised into an indexed dataset on first use, a GPT trains on it with
// periodic evaluation beside the unigram baseline, the run's outputs
// (metrics.jsonl, TensorBoard events, loss.svg) are written, the data order
// is the same under every layout, and bad data configs are one-line errors.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "tests/train/sentence_corpus.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::ExpectOneLineError;
using ::tessera::testing::ReadMetricsRows;
using ::tessera::testing::RunTessera;
using ::tessera::testing::SourcePath;
using ::tessera::testing::WriteSentenceCorpus;

class TextDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tessera_text_data_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    WriteSentenceCorpus(root_ / "corpus.txt", /*paragraphs=*/240, /*seed=*/12345);
    // A byte-level BPE vocabulary of 320 tokens learnt from the corpus.
    const auto made = RunTessera("preprocess --input " + (root_ / "corpus.txt").string() +
                                 " --tokenizer bpe:320 --output " + (root_ / "warmup").string());
    ASSERT_EQ(made.exit_code, 0) << made.out;
    vocab_ = root_ / "warmup-vocab";
  }
  void TearDown() override { fs::remove_all(root_); }

  // gpt2_nano on the corpus (the dataset built from it on first use), with
  // the test vocabulary unless `extra` nulls the tokenizer; a line each
  // iteration when it trains (--eval-only refuses the key).
  std::string Train(const fs::path& out, const std::string& extra) const {
    const bool trains = extra.find("--eval-only") == std::string::npos;
    const std::string tokenizer =
        extra.find("tokenization.tokenizer=null") != std::string::npos
            ? ""
            : " tokenization.tokenizer=gpt2 tokenization.vocab_file=" + (vocab_ / "encoder.json").string() +
                  " tokenization.merges_file=" + (vocab_ / "vocab.bpe").string();
    return "train " + SourcePath("configs/gpt2_nano.json") + " model.vocab_size=320" + tokenizer +
           " dataloader.data_prefix=" + (root_ / "data" / "corpus").string() +
           " dataloader.text_file=" + (root_ / "corpus.txt").string() +
           " dataloader.splits=80,20,0 model.embedding_dropout_prob=0 model.attention_dropout_prob=0"
           " model.output_dropout_prob=0" +
           (trains ? " train.log_period=1" : "") + " train.output_dir=" + out.string() + " " + extra;
  }

  // Trains with `extra` into root_/name; the eval_loss of each evaluation.
  std::vector<double> EvalLosses(const std::string& name, const std::string& extra) const {
    const auto run = RunTessera(Train(root_ / name, extra));
    EXPECT_EQ(run.exit_code, 0) << run.out;
    std::vector<double> losses;
    for (const auto& [iteration, row] : ReadMetricsRows(root_ / name).eval) {
      losses.push_back(row["eval_loss"].get<double>());
    }
    return losses;
  }

  // The loss an evaluation printed ("eval iter 4/4  loss 5.123456 ...";
  // --eval-only's "eval (weights of iteration 4)  loss ...").
  static double PrintedLoss(const std::string& out, const std::string& head) {
    const size_t at = out.find(head + "  loss ");
    EXPECT_NE(at, std::string::npos) << out;
    return at == std::string::npos ? 0.0 : std::stod(out.substr(at + head.size() + 7));
  }

  fs::path root_, vocab_;
};

// `tessera plan` checks the data as the run opens it (it planned jobs the
// run then refused at once: a bad splits string, eval_iter past the valid
// split, a vocabulary larger than the model's), and builds no dataset.
TEST_F(TextDataTest, PlanChecksTheDataAsTheRunWouldAndBuildsNothing) {
  const auto plan = [&](const std::string& extra) {
    return RunTessera("plan" + Train(root_ / "plan", extra).substr(5));
  };
  auto run = plan("");
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_FALSE(fs::exists(root_ / "data" / "corpus.idx"));
  ExpectOneLineError(plan("dataloader.text_file=" + (root_ / "none.txt").string()),
                     "dataloader.text_file: cannot read " + (root_ / "none.txt").string() + " (no such file)");
  run = RunTessera(Train(root_ / "built", "train.train_iter=1"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  ASSERT_TRUE(fs::exists(root_ / "data" / "corpus.idx"));
  EXPECT_EQ(plan("").exit_code, 0);
  ExpectOneLineError(plan("dataloader.splits=a,b"), "splits 'a,b'");
  ExpectOneLineError(plan("train.evaluation.enabled=true train.evaluation.eval_iter=100000000"),
                     "train.evaluation.eval_iter 100000000 is more than the ");
  ExpectOneLineError(plan("model.vocab_size=100"), "vocabulary has 320 tokens, model.vocab_size is only 100");
  // A file's name for the prefix (it looked for corpus.bin.idx, or built it).
  ExpectOneLineError(plan("dataloader.data_prefix=" + (root_ / "data" / "corpus.bin").string()),
                     "give the dataset's prefix, without .bin");
  EXPECT_FALSE(fs::exists(root_ / "plan"));
}

// With train.evaluation the plan shows the evaluation's own plan (a copy of
// the weights, no optimizer state), which a run loads between segments
// while it keeps the trained parameters and optimizer state: the host's
// memory during an evaluation is both (it showed neither).
TEST_F(TextDataTest, PlanShowsTheEvaluationBesideTheKeptValues) {
  const std::string plan = "plan" + Train(root_ / "plan", "train.evaluation.enabled=true").substr(5);
  const auto text = RunTessera(plan + " --format memory");
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("evaluation (train.evaluation): its own plan, loaded between training segments while the "
                          "trained values are kept for the next segment\n"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("; during an evaluation "), std::string::npos) << text.out;
  const auto json = RunTessera(plan + " --format json");
  ASSERT_EQ(json.exit_code, 0) << json.out;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["memory"].size(), 1u);
  ASSERT_EQ(j["evaluation_memory"].size(), 1u);
  const nlohmann::json& training = j["memory"][0];
  const nlohmann::json& evaluation = j["evaluation_memory"][0];
  // (The same weights; training has a few bytes more: its scalar state.)
  EXPECT_LE(evaluation["parameters"].get<int64_t>(), training["parameters"].get<int64_t>());
  EXPECT_GE(evaluation["parameters"].get<int64_t>(), training["parameters"].get<int64_t>() - 64);
  EXPECT_EQ(evaluation["optimizer_state"], 0);
  EXPECT_EQ(evaluation["gradients"], 0);
  ASSERT_EQ(j["host_memory"].size(), 1u);
  EXPECT_EQ(j["host_memory"][0]["kept_bytes"],
            training["parameters"].get<int64_t>() + training["optimizer_state"].get<int64_t>());
  EXPECT_EQ(j["host_memory"][0]["evaluation_plan_bytes"], evaluation["bytes"]);
  EXPECT_EQ(j["host_memory"][0]["evaluation_peak_bytes"],
            j["host_memory"][0]["kept_bytes"].get<int64_t>() + evaluation["bytes"].get<int64_t>());
  EXPECT_EQ(j["host_memory"][0]["training_bytes"], training["bytes"]);
  const auto without = RunTessera("plan" + Train(root_ / "plan", "").substr(5) + " --format json");
  ASSERT_EQ(without.exit_code, 0) << without.out;
  EXPECT_TRUE(nlohmann::json::parse(without.out)["evaluation_memory"].is_null());
}

// A resume with splits that give the training split other documents is
// refused: the position the checkpoint counted would be another text's (it
// went on silently). Weights that cut the same training split resume.
TEST_F(TextDataTest, AResumeWithAnotherTrainingSplitIsRefused) {
  auto run = RunTessera(Train(root_ / "split", "train.train_iter=1"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  ExpectOneLineError(RunTessera(Train(root_ / "split", "train.train_iter=2 dataloader.splits=70,30,0 --resume")),
                     "of the dataset (dataloader.splits \"80,20,0\"), this run's splits \"70,30,0\" make the "
                     "training split [0, ");
  run = RunTessera(Train(root_ / "split", "train.train_iter=2 dataloader.splits=8,2,0 --resume"));
  EXPECT_EQ(run.exit_code, 0) << run.out;
}

TEST_F(TextDataTest, TrainsWithEvaluationAndWritesEveryOutput) {
  const fs::path out = root_ / "run";
  const auto run = RunTessera(Train(out,
                                    "train.train_iter=30 train.evaluation.enabled=true train.evaluation.eval_period=10"
                                    " train.evaluation.eval_iter=4"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  // The dataset was built on first use, from the text file.
  EXPECT_TRUE(fs::exists(root_ / "data" / "corpus.bin"));
  EXPECT_TRUE(fs::exists(root_ / "data" / "corpus.idx"));
  const testing::MetricsRows rows = ReadMetricsRows(out);
  ASSERT_EQ(rows.train.size(), 30u);
  for (const auto& [iteration, row] : rows.train) {
    EXPECT_GT(row.value("tokens_per_s", 0.0), 0.0) << row.dump();
  }
  ASSERT_EQ(rows.eval.size(), 3u) << run.out;
  for (const auto& [iteration, row] : rows.eval) {
    EXPECT_TRUE(iteration == 10 || iteration == 20 || iteration == 30) << iteration;
    EXPECT_NEAR(row["eval_ppl"].get<double>(), std::exp(row["eval_loss"].get<double>()),
                1e-6 * row["eval_ppl"].get<double>());
    EXPECT_GT(row["unigram_ppl"].get<double>(), 1.0);
  }
  // The model learns the corpus: its held-out loss falls, below the
  // unigram baseline's by the end.
  EXPECT_LT(rows.eval.at(30)["eval_loss"].get<double>(), rows.eval.at(10)["eval_loss"].get<double>());
  EXPECT_LT(rows.eval.at(30)["eval_ppl"].get<double>(), rows.eval.at(30)["unigram_ppl"].get<double>());
  // The progress shows the evaluations.
  EXPECT_NE(run.out.find("eval iter 10/30"), std::string::npos) << run.out;
  // TensorBoard events and the loss curve beside metrics.jsonl.
  bool events = false;
  for (const auto& entry : fs::directory_iterator(out)) {
    events = events || entry.path().filename().string().starts_with("events.out.tfevents.");
  }
  EXPECT_TRUE(events);
  std::ifstream svg(out / "loss.svg");
  const std::string plot((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(plot.find("<svg"), std::string::npos);
  EXPECT_NE(plot.find("polyline"), std::string::npos);
}

// Evaluation reads the trained variables where training left them: under
// ZeRO-3 (variables sharded over the data-parallel ranks) the held-out
// losses are plain data parallelism's, and with fp16 mixed precision too
// the run evaluates.
TEST_F(TextDataTest, EvaluatesUnderZeroAndMixedPrecision) {
  const std::string common =
      "train.train_iter=4 train.dist.data_parallel_size=2 train.train_micro_batch_size=4 "
      "train.evaluation.enabled=true train.evaluation.eval_period=2 train.evaluation.eval_iter=2";
  const auto eval_losses = [&](const std::string& name, const std::string& extra) {
    return EvalLosses(name, common + " " + extra);
  };
  const std::vector<double> plain = eval_losses("plain", "");
  const std::vector<double> zero = eval_losses("zero3", "train.zero_optimization.enabled=true "
                                                        "train.zero_optimization.stage=3");
  const std::vector<double> fp16 =
      eval_losses("fp16", "train.zero_optimization.enabled=true train.amp.enabled=true train.amp.dtype=fp16");
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(zero.size(), 2u);
  ASSERT_EQ(fp16.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(zero[i], plain[i], 1e-5 * plain[i]) << i;
    EXPECT_NEAR(fp16[i], plain[i], 1e-2 * plain[i]) << i;
  }
}

TEST_F(TextDataTest, TheDataOrderIsTheSameUnderEveryLayout) {
  const fs::path one = root_ / "one", two = root_ / "two";
  auto run = RunTessera(Train(one, "train.train_iter=6"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  run = RunTessera(Train(two, "train.train_iter=6 train.dist.data_parallel_size=2 train.train_micro_batch_size=8"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const testing::MetricsRows a = ReadMetricsRows(one), b = ReadMetricsRows(two);
  ASSERT_EQ(a.train.size(), 6u);
  ASSERT_EQ(b.train.size(), 6u);
  for (const auto& [iteration, row] : a.train) {
    const double x = row["loss"].get<double>(), y = b.train.at(iteration)["loss"].get<double>();
    EXPECT_NEAR(x, y, 1e-5 * std::abs(x)) << "iteration " << iteration;
  }
}

// Evaluation batches are global batches: however the global batch is cut
// (micro-batches, accumulation, data-parallel ranks) the same samples are
// evaluated, here the whole valid split, whose last batch wraps around, and
// the held-out losses agree.
TEST_F(TextDataTest, EvaluationIsTheSameWhateverTheMicroBatches) {
  const std::string common = "train.train_iter=4 train.evaluation.enabled=true train.evaluation.eval_period=2 ";
  const auto eval_losses = [&](const std::string& name, const std::string& layout) {
    return EvalLosses(name, common + layout);
  };
  const std::vector<double> one = eval_losses("one", "train.train_micro_batch_size=16");
  ASSERT_EQ(one.size(), 2u);
  for (const auto& [name, layout] : std::vector<std::pair<std::string, std::string>>{
           {"acc4", "train.train_micro_batch_size=4 train.num_accumulation_steps=4"},
           {"dp2acc2", "train.train_micro_batch_size=4 train.num_accumulation_steps=2 train.dist.data_parallel_size=2"},
           {"pp2acc8",
            "train.train_micro_batch_size=2 train.num_accumulation_steps=8 "
            "train.dist.pipeline_parallel_size=2"}}) {
    const std::vector<double> losses = eval_losses(name, layout);
    ASSERT_EQ(losses.size(), 2u) << name;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(losses[i], one[i], 1e-5 * one[i]) << name << " evaluation " << i;
  }
}

// An evaluation of the whole valid split counts each sample once: the last
// micro-batch is padded with rows of weight 0 (models/model.h), so the
// held-out loss of the same weights is the same whatever the global batch,
// and is that of one sample at a time.
TEST_F(TextDataTest, WholeSplitEvaluationCountsEachSampleOnceWhateverTheGlobalBatch) {
  const fs::path dir = root_ / "trained";
  const std::string eval = "train.evaluation.enabled=true train.evaluation.eval_period=2 ";
  auto run = RunTessera(Train(dir, eval + "train.train_iter=2 train.checkpointer.period=2"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const double trained = ReadMetricsRows(dir).eval.at(2)["eval_loss"].get<double>();
  run = RunTessera(Train(dir, eval + "train.train_iter=2 train.train_micro_batch_size=1 --eval-only"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const double one = PrintedLoss(run.out, "eval (weights of iteration 2)");
  EXPECT_NEAR(trained, one, 2e-6 * one);
  for (const std::string layout :
       {"train.train_micro_batch_size=7", "train.train_micro_batch_size=5 train.dist.data_parallel_size=2",
        "train.train_micro_batch_size=3 train.num_accumulation_steps=3 "
        "train.dist.pipeline_parallel_size=2"}) {
    run = RunTessera(Train(dir, eval + "train.train_iter=2 " + layout + " --eval-only"));
    ASSERT_EQ(run.exit_code, 0) << layout << "\n" << run.out;
    EXPECT_NEAR(PrintedLoss(run.out, "eval (weights of iteration 2)"), one, 2e-6 * one) << layout;
  }
  // eval_iter at the most it allows, the batches the split makes (the last
  // one reaching past the split's end): the whole split, each sample once,
  // not the last batch wrapped round to the first samples again.
  const std::string seven = eval + "train.train_iter=2 train.train_micro_batch_size=7 ";
  run = RunTessera(Train(dir, seven + "train.evaluation.eval_iter=4294967295 --eval-only"));
  const size_t at = run.out.find("is more than the ");
  ASSERT_NE(at, std::string::npos) << run.out;
  const int64_t whole = std::stoll(run.out.substr(at + 17));
  const size_t samples_at = run.out.find("that the valid split's ");
  ASSERT_NE(samples_at, std::string::npos) << run.out;
  ASSERT_NE(std::stoll(run.out.substr(samples_at + 23)) % 7, 0) << "the split fills its last batch: " << run.out;
  const auto unigram = [](const std::string& out) {
    const size_t at = out.find("unigram_ppl ");
    EXPECT_NE(at, std::string::npos) << out;
    return at == std::string::npos ? 0.0 : std::stod(out.substr(at + 12));
  };
  run = RunTessera(Train(dir, seven + " --eval-only"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const double unigram_whole = unigram(run.out);
  run = RunTessera(Train(dir, seven + "train.evaluation.eval_iter=" + std::to_string(whole) + " --eval-only"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NEAR(PrintedLoss(run.out, "eval (weights of iteration 2)"), one, 2e-6 * one);
  EXPECT_EQ(unigram(run.out), unigram_whole);
  // The unigram baseline is scored on the samples evaluated (it was the
  // whole split's beside an evaluation of one batch).
  run = RunTessera(Train(dir, seven + "train.evaluation.eval_iter=1 --eval-only"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(unigram(run.out), unigram_whole);
}

// train.checkpointer.save_best (LiBai's BestCheckpointer): after each
// evaluation whose eval_metric beats every earlier one, its weights go to
// checkpoints/best, with the metric in index.json's train_state.best; the
// regular checkpoints' pruning leaves it. eval_mode max on eval_loss keeps
// the worst evaluation (the first here), min the best (the last), so the
// choice is the mode's and not the latest; --eval-only of checkpoints/best
// evaluates those weights again. A resumed run compares with the best
// checkpoint, so later, lower evaluations do not replace the kept maximum.
// Asked for without evaluation, for an unknown metric, or eval_metric /
// eval_mode without save_best: one-line errors.
TEST_F(TextDataTest, SaveBestKeepsTheBestEvaluationsWeights) {
  const std::string eval =
      "train.evaluation.enabled=true train.evaluation.eval_period=1 train.evaluation.eval_iter=2 "
      "train.checkpointer.period=2 train.checkpointer.max_to_keep=1 train.checkpointer.save_best=true ";
  const auto best_of = [](const fs::path& dir) {
    std::ifstream in(dir / "checkpoints" / "best" / "index.json");
    const nlohmann::json index = nlohmann::json::parse(in, nullptr, false);
    EXPECT_TRUE(index.is_object()) << dir;
    return index.is_object() ? index : nlohmann::json::object();
  };
  for (const std::string mode : {"min", "max"}) {
    SCOPED_TRACE(mode);
    const fs::path dir = root_ / mode;
    const auto run = RunTessera(Train(dir, eval + "train.train_iter=4 train.evaluation.eval_mode=" + mode));
    ASSERT_EQ(run.exit_code, 0) << run.out;
    const testing::MetricsRows rows = ReadMetricsRows(dir);
    ASSERT_EQ(rows.eval.size(), 4u);
    int64_t want = 0;
    double want_loss = 0;
    for (const auto& [iteration, row] : rows.eval) {
      const double loss = row["eval_loss"].get<double>();
      if (want == 0 || (mode == "min" ? loss < want_loss : loss > want_loss)) {
        want = iteration;
        want_loss = loss;
      }
    }
    EXPECT_EQ(want, mode == "min" ? 4 : 1) << "the losses did not fall: the test shows nothing";
    const nlohmann::json index = best_of(dir);
    EXPECT_EQ(index.value("iteration", int64_t{-1}), want);
    EXPECT_EQ(index["train_state"]["best"],
              (nlohmann::json{{"metric", "eval_loss"}, {"mode", mode}, {"value", want_loss}}));
    EXPECT_TRUE(fs::exists(dir / "checkpoints" / "iter_0000004"));
    EXPECT_FALSE(fs::exists(dir / "checkpoints" / "iter_0000002"));  // pruned: max_to_keep 1
    EXPECT_NE(run.out.find("saved best checkpoint"), std::string::npos) << run.out;
    const auto again = RunTessera(Train(root_ / "elsewhere",
                                        "train.evaluation.enabled=true train.evaluation.eval_iter=2 "
                                        "train.train_iter=4 --eval-only train.load_weight=" +
                                            (dir / "checkpoints" / "best").string()));
    ASSERT_EQ(again.exit_code, 0) << again.out;
    EXPECT_NEAR(PrintedLoss(again.out, "eval (weights of iteration " + std::to_string(want) + ")"), want_loss,
                2e-6 * want_loss + 1e-6);
  }
  // Resumed: the kept maximum (iteration 1) stays.
  const auto resumed =
      RunTessera(Train(root_ / "max", eval + "train.train_iter=6 train.evaluation.eval_mode=max --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_EQ(ReadMetricsRows(root_ / "max").eval.size(), 6u);
  EXPECT_EQ(best_of(root_ / "max").value("iteration", int64_t{-1}), 1);
  ExpectOneLineError(RunTessera(Train(root_ / "bad", "train.checkpointer.save_best=true")),
                     "train.checkpointer.save_best keeps the best evaluation's weights, so it needs "
                     "train.evaluation.enabled=true");
  ExpectOneLineError(RunTessera(Train(root_ / "bad", eval + "train.evaluation.eval_metric=eval_mlm_accuracy")),
                     "train.evaluation.eval_metric 'eval_mlm_accuracy' is not a metric of models.GPT2's evaluation "
                     "(eval_loss, eval_ppl)");
  ExpectOneLineError(RunTessera(Train(root_ / "bad", "train.evaluation.enabled=true train.evaluation.eval_mode=max")),
                     "train.evaluation.eval_metric and eval_mode choose the best checkpoint");
}

// train.eval_only (--eval-only, LiBai's): one evaluation of saved weights
// (the latest checkpoint in output_dir, or train.load_weight's), training
// nothing and writing nothing there; the held-out loss is the one training
// reported at that checkpoint, under another layout too. Nothing to
// evaluate, or evaluation off, is a one-line error.
TEST_F(TextDataTest, EvalOnlyEvaluatesSavedWeightsAndWritesNothing) {
  const fs::path dir = root_ / "trained";
  const std::string eval = "train.evaluation.enabled=true train.evaluation.eval_period=2 train.evaluation.eval_iter=3 ";
  auto run = RunTessera(Train(dir, eval + "train.train_iter=4 train.checkpointer.period=2"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const testing::MetricsRows trained = ReadMetricsRows(dir);
  ASSERT_EQ(trained.eval.size(), 2u);
  const auto file = [](const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string metrics = file(dir / "metrics.jsonl"), config = file(dir / "config.json");
  // (train_iter below the checkpoint's iteration: the weights are what counts.)
  run = RunTessera(Train(dir, eval + "train.train_iter=2 --eval-only"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.out.find("\niter "), std::string::npos) << "it trained: " << run.out;
  const double latest = trained.eval.at(4)["eval_loss"].get<double>();
  EXPECT_NEAR(PrintedLoss(run.out, "eval (weights of iteration 4)"), latest, 2e-6 * latest + 1e-6);
  EXPECT_EQ(file(dir / "metrics.jsonl"), metrics);
  EXPECT_EQ(file(dir / "config.json"), config);
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "iter_0000005"));
  run = RunTessera(Train(root_ / "elsewhere", eval +
                                                  "train.train_iter=4 train.dist.data_parallel_size=2 "
                                                  "train.train_micro_batch_size=8 --eval-only train.load_weight=" +
                                                  (dir / "checkpoints" / "iter_0000002").string()));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const double second = trained.eval.at(2)["eval_loss"].get<double>();
  EXPECT_NEAR(PrintedLoss(run.out, "eval (weights of iteration 2)"), second, 2e-6 * second + 1e-6);
  EXPECT_FALSE(fs::exists(root_ / "elsewhere"));
  ExpectOneLineError(RunTessera(Train(root_ / "empty", eval + "--eval-only")),
                     "train.eval_only evaluates saved weights: train.output_dir '" + (root_ / "empty").string() +
                         "' holds no checkpoint, and train.load_weight is not set");
  ExpectOneLineError(RunTessera(Train(dir, "--eval-only")),
                     "train.eval_only evaluates, so it needs train.evaluation.enabled=true");
}

// train.train_epoch (LiBai's rule): train_iter becomes the larger of itself
// and ceil(epochs × training samples / global batch); the run trains that
// many iterations and config.json records them. A train_iter above the
// epochs' stays.
TEST_F(TextDataTest, TrainEpochsRaiseTrainIterToPassesOverTheTrainingSplit) {
  const auto run_epochs = [&](const std::string& name, const std::string& extra) {
    const fs::path out = root_ / name;
    const auto run =
        RunTessera("--log-level debug " + Train(out, "train.train_epoch=2 train.log_period=1000 " + extra));
    EXPECT_EQ(run.exit_code, 0) << run.out;
    // "train.train_epoch 2: N training samples at a global batch of G take K iterations; ..."
    const size_t at = run.out.find("train.train_epoch 2: ");
    EXPECT_NE(at, std::string::npos) << run.out;
    int64_t samples = 0, global = 0, iterations = 0;
    if (at != std::string::npos) {
      EXPECT_EQ(std::sscanf(run.out.c_str() + at,
                            "train.train_epoch 2: %" SCNd64 " training samples at a global batch of %" SCNd64
                            " take %" SCNd64,
                            &samples, &global, &iterations),
                3)
          << run.out.substr(at, 200);
    }
    std::ifstream in(out / "config.json");
    const nlohmann::json config = nlohmann::json::parse(in, nullptr, false, /*ignore_comments=*/true);
    const int64_t trained = static_cast<int64_t>(ReadMetricsRows(out).train.rbegin()->first);
    return std::tuple{samples, global, iterations, config["train"]["train_iter"].get<int64_t>(), trained};
  };
  const auto [samples, global, iterations, recorded, trained] =
      run_epochs("epochs", "train.train_iter=1 train.train_micro_batch_size=64");
  ASSERT_GT(samples, 64);
  EXPECT_EQ(global, 64);
  EXPECT_EQ(iterations, (2 * samples + 63) / 64);
  EXPECT_EQ(recorded, iterations);
  EXPECT_EQ(trained, iterations);
  // Half the batch, twice the iterations (rounded up); over the same samples.
  const auto [samples2, global2, iterations2, recorded2, trained2] =
      run_epochs("epochs_half", "train.train_iter=1 train.train_micro_batch_size=32");
  EXPECT_EQ(samples2, samples);
  EXPECT_EQ(iterations2, (2 * samples + 31) / 32);
  EXPECT_EQ(trained2, iterations2);
  // train_iter already larger: it stays.
  const int64_t more = iterations + 3;
  const auto [samples3, global3, iterations3, recorded3, trained3] =
      run_epochs("epochs_fewer", "train.train_micro_batch_size=64 train.train_iter=" + std::to_string(more));
  EXPECT_EQ(recorded3, more);
  EXPECT_EQ(trained3, more);
}

// SIGTERM while the last evaluation runs: it stops there (an evaluation
// changes nothing), and the run ends at the iteration it had trained, with
// a checkpoint there, instead of evaluating to the end first (the stop used
// to wait for the evaluation, however long, and then wrote none).
TEST_F(TextDataTest, ASignalDuringTheEvaluationStopsItAndSavesTheTrainedIteration) {
  const fs::path out = root_ / "stopped";
  const fs::path log = root_ / "stopped.log";
  // Nearly all the corpus is the valid split, evaluated a sample at a time
  // by a wider model: seconds of evaluation after 2 iterations.
  const std::string args = Train(out,
                                 "train.train_iter=2 dataloader.splits=2,98,0 train.train_micro_batch_size=1 "
                                 "model.hidden_size=256 model.num_layers=4 train.evaluation.enabled=true "
                                 "train.checkpointer.save_best=true");
  const pid_t child = ::tessera::testing::SpawnTessera(args, log);
  ASSERT_GE(child, 0);
  // Once iteration 2 is logged, the evaluation runs (the final checkpoint
  // comes after it).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  const auto logged_two = [&] {
    std::ifstream metrics(out / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);  // a line may be half-written
      if (row.is_object() && row.value("iter", 0) == 2) return true;
    }
    return false;
  };
  while (std::chrono::steady_clock::now() < deadline && !logged_two()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto signalled = std::chrono::steady_clock::now();
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << text;
  EXPECT_NE(text.find("interrupted at iteration 2; checkpoint "), std::string::npos) << text;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "iter_0000002" / "index.json")) << text;
  EXPECT_TRUE(ReadMetricsRows(out).eval.empty()) << text;  // no evaluation finished
  EXPECT_LT(seconds, 30) << text;
  // Unstopped, the same run evaluates the whole split: what the stop saved.
  const auto started = std::chrono::steady_clock::now();
  const auto whole = RunTessera(Train(root_ / "whole",
                                      "train.train_iter=2 dataloader.splits=2,98,0 train.train_micro_batch_size=1 "
                                      "model.hidden_size=256 model.num_layers=4 train.evaluation.enabled=true"));
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  EXPECT_EQ(ReadMetricsRows(root_ / "whole").eval.size(), 1u);
  // The checkpoint says its evaluation was cut short; a resume runs it first,
  // on the checkpoint's weights: the unstopped run's held-out loss.
  const nlohmann::json index =
      nlohmann::json::parse(std::ifstream(out / "checkpoints" / "iter_0000002" / "index.json"));
  EXPECT_EQ(index["train_state"].value("evaluation_pending", false), true) << index["train_state"];
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "best")) << text;
  // It was the run's last: a resume of the same run runs that evaluation
  // and trains nothing (it refused: every iteration trained), and save_best
  // weighs it (the best checkpoint is the one evaluated); the checkpoint's
  // mark goes, so another resume refuses as after any finished run.
  const std::string same_run =
      "train.train_iter=2 dataloader.splits=2,98,0 train.train_micro_batch_size=1 model.hidden_size=256 "
      "model.num_layers=4 train.evaluation.enabled=true train.checkpointer.save_best=true --resume";
  const auto evaluated = RunTessera(Train(out, same_run));
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.out;
  const double expected = ReadMetricsRows(root_ / "whole").eval.at(2)["eval_loss"].get<double>();
  ASSERT_TRUE(ReadMetricsRows(out).eval.contains(2)) << evaluated.out;
  EXPECT_NEAR(ReadMetricsRows(out).eval.at(2)["eval_loss"].get<double>(), expected, 2e-6 * expected);
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "iter_0000003")) << evaluated.out;
  const nlohmann::json after =
      nlohmann::json::parse(std::ifstream(out / "checkpoints" / "iter_0000002" / "index.json"));
  EXPECT_FALSE(after["train_state"].contains("evaluation_pending")) << after["train_state"];
  const nlohmann::json best = nlohmann::json::parse(std::ifstream(out / "checkpoints" / "best" / "index.json"));
  EXPECT_EQ(best["iteration"], 2) << best["train_state"];
  EXPECT_NEAR(best["train_state"]["best"]["value"].get<double>(), expected, 2e-6 * expected) << best["train_state"];
  EXPECT_EQ(best["tensors"], after["tensors"]);  // the same weights, shards and checksums
  const auto again = RunTessera(Train(out, same_run));
  EXPECT_EQ(again.exit_code, 1) << again.out;
  EXPECT_NE(again.out.find("has trained 2 iterations already"), std::string::npos) << again.out;
  // The best checkpoint is whole: it evaluates to the same loss.
  const auto best_eval = RunTessera(Train(root_ / "best_eval",
                                          "train.train_iter=2 dataloader.splits=2,98,0 train.train_micro_batch_size=1 "
                                          "model.hidden_size=256 model.num_layers=4 train.evaluation.enabled=true "
                                          "--eval-only train.load_weight=" +
                                              (out / "checkpoints" / "best").string()));
  ASSERT_EQ(best_eval.exit_code, 0) << best_eval.out;
  EXPECT_NE(best_eval.out.find("weights of iteration 2"), std::string::npos) << best_eval.out;
  // A longer run resumed from there trains on, without evaluating 2 again.
  const auto resumed = RunTessera(Train(out,
                                        "train.train_iter=3 dataloader.splits=2,98,0 train.train_micro_batch_size=1 "
                                        "model.hidden_size=256 model.num_layers=4 train.evaluation.enabled=true "
                                        "train.checkpointer.save_best=true train.evaluation.eval_period=10 --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  const testing::MetricsRows rows = ReadMetricsRows(out);
  ASSERT_TRUE(rows.eval.contains(2)) << resumed.out;
  EXPECT_NEAR(rows.eval.at(2)["eval_loss"].get<double>(), expected, 2e-6 * expected);
  EXPECT_TRUE(rows.eval.contains(3)) << resumed.out;
  int rows_of_two = 0;
  std::ifstream metrics(out / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    rows_of_two += row.is_object() && row.value("iter", 0) == 2 && row.contains("eval_loss");
  }
  EXPECT_EQ(rows_of_two, 1) << resumed.out;
  std::printf("stopped %.2f s after the signal; the whole run took %.2f s\n", seconds,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}

// A Ctrl-C while the job's dataset is built from dataloader.text_file
// stops the build at its next chunk (it used to tokenise the whole corpus
// first), says that is what it stops (it said "after this iteration and
// writing a checkpoint"), and leaves no dataset and no temporary file.
TEST_F(TextDataTest, ACtrlCWhileTheDatasetIsBuiltStopsTheBuild) {
  {
    std::ofstream big(root_ / "big.txt");
    const std::string sentence = "the quick brown fox jumps over the lazy dog and runs far away. ";
    // (50 MB: a second or more to tokenise, where the signal comes within
    // milliseconds of the build's start.)
    for (int i = 0; i < 80000; ++i) {
      big << "paragraph " << i << ": ";
      for (int k = 0; k < 10; ++k) big << sentence;
      big << "\n\n";
    }
  }
  const fs::path data = root_ / "big";
  const std::string args =
      Train(root_ / "big_out", "train.train_iter=2 dataloader.text_file=" + (root_ / "big.txt").string() +
                                   " dataloader.data_prefix=" + (data / "big").string());
  const fs::path log = root_ / "big.log";
  const pid_t child = ::tessera::testing::SpawnTessera(args, log);
  ASSERT_GT(child, 0);
  // The build has started once its temporary file is there.
  const auto building = [&] {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(data, ec)) {
      if (entry.path().filename().string().find(".tmp-") != std::string::npos) return true;
    }
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && !building()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(building()) << "no dataset build seen";
  ::kill(child, SIGINT);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << text;
  EXPECT_NE(text.find("tessera: interrupted: stopping the dataset being built from dataloader.text_file (again to "
                      "stop at once)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("writing a checkpoint"), std::string::npos) << text;
  for (const auto& entry : fs::directory_iterator(data)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
  EXPECT_FALSE(fs::exists(data / "big.bin"));
  EXPECT_FALSE(fs::exists(data / "big.idx"));
}

// A dataset is read only with the vocabulary it was encoded with and, where
// the job names a text_file, only if it was built from that file
// (PREFIX.source.json): anything else would train on misread tokens, or
// not on the text named.
TEST_F(TextDataTest, ADatasetIsReadOnlyWithItsOwnVocabularyAndText) {
  const fs::path out = root_ / "mismatch";
  const auto other = RunTessera("preprocess --input " + (root_ / "corpus.txt").string() +
                                " --tokenizer bpe:300 --output " + (root_ / "other").string());
  ASSERT_EQ(other.exit_code, 0) << other.out;
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 dataloader.text_file=null dataloader.data_prefix=" +
                                               (root_ / "other").string())),
                     "was built with another vocabulary (gpt2, 300 tokens) than tokenization.tokenizer's (gpt2, "
                     "320 tokens)");
  fs::copy_file(root_ / "corpus.txt", root_ / "copy.txt");
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 dataloader.data_prefix=" + (root_ / "warmup").string() +
                                               " dataloader.text_file=" + (root_ / "copy.txt").string())),
                     "copy.txt is not what the dataset " + (root_ / "warmup").string() + " was built from (" +
                         fs::weakly_canonical(root_ / "corpus.txt").string() + ")");
  // The same file by another name (a hard link) is the same text.
  fs::create_hard_link(root_ / "corpus.txt", root_ / "linked.txt");
  // Without a tokenizer, a model vocabulary smaller than the dataset's.
  ExpectOneLineError(RunTessera(Train(out,
                                      "train.train_iter=2 tokenization.tokenizer=null dataloader.text_file=null "
                                      "model.vocab_size=300 dataloader.data_prefix=" +
                                          (root_ / "warmup").string())),
                     "holds ids of a gpt2, 320 tokens vocabulary; model.vocab_size is only 300");
  // append_eod contradicting the dataset (it only shapes one being built).
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 tokenization.append_eod=false dataloader.data_prefix=" +
                                               (root_ / "warmup").string())),
                     "tokenization.append_eod is false, but the dataset " + (root_ / "warmup").string() +
                         " was built with end-of-document tokens");
  EXPECT_FALSE(fs::exists(out));
  // Its own vocabulary and text (by a hard link): it trains.
  const auto run = RunTessera(Train(out, "train.train_iter=1 dataloader.data_prefix=" + (root_ / "warmup").string() +
                                             " dataloader.text_file=" + (root_ / "linked.txt").string()));
  EXPECT_EQ(run.exit_code, 0) << run.out;
  // A dataset moved with its text (a project's directory copied
  // elsewhere) is still built from it: where the text lies from the
  // dataset is recorded too (it was refused as built from another file).
  const fs::path moved = root_ / "moved";
  fs::create_directories(moved);
  fs::copy_file(root_ / "corpus.txt", moved / "corpus.txt");
  for (const char* extension : {".bin", ".idx", ".source.json"}) {
    fs::copy_file(root_ / (std::string("warmup") + extension), moved / (std::string("warmup") + extension));
  }
  const auto run_moved =
      RunTessera(Train(root_ / "moved_out", "train.train_iter=1 dataloader.data_prefix=" + (moved / "warmup").string() +
                                                " dataloader.text_file=" + (moved / "corpus.txt").string()));
  EXPECT_EQ(run_moved.exit_code, 0) << run_moved.out;
}

TEST_F(TextDataTest, BadDataConfigsAreOneLineErrors) {
  const fs::path out = root_ / "bad";
  // A dataset that does not exist, with no text to build it from.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 dataloader.text_file=null dataloader.data_prefix=" +
                                     (root_ / "nowhere").string())),
           "tessera preprocess");
  // A vocabulary larger than the model's.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 model.vocab_size=100")), "model.vocab_size");
  // A missing vocabulary file.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 tokenization.vocab_file=" + (root_ / "no.json").string())),
           "no.json");
  // Evaluation without a valid split.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 train.evaluation.enabled=true dataloader.splits=100,0,0")),
           "dataloader.splits");
  // Text data for a model that reads none.
  ExpectOneLineError(
      RunTessera("train " + SourcePath("configs/mlp_demo.json") + " dataloader.data_prefix=" + (root_ / "x").string()),
      "reads no text");
  // Epochs without text data to count them in.
  ExpectOneLineError(RunTessera("train " + SourcePath("configs/mlp_demo.json") + " train.train_epoch=2"),
                     "train.train_epoch 2 needs text data (dataloader.data_prefix)");
  // Epochs beyond the iterations' limit.
  ExpectOneLineError(RunTessera(Train(out, "train.train_epoch=4294967295 train.train_micro_batch_size=1")),
                     "needs more than the 2^32 - 1 iterations train.train_iter allows");
  // Evaluation batches beyond the valid split (they would count samples
  // twice, and keep a run evaluating for hours).
  ExpectOneLineError(RunTessera(Train(out,
                                      "train.evaluation.enabled=true train.evaluation.eval_iter=4294967295 "
                                      "train.num_accumulation_steps=2 train.train_micro_batch_size=8")),
                     "train.evaluation.eval_iter 4294967295 is more than the ");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace tessera
