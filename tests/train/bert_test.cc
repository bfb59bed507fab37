// BERT pre-training through `tessera train` (models/bert.h, the BERT path of
// train/text_data.h): every layout gives the one-device losses, dropout
// included; configs/bert_tiny.json learns the masked LM on the default
// corpus; the batch the data path builds is what BERT's recipe says; bad
// BERT configs are one-line errors.

#include "models/bert.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/text.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "tests/train/sentence_corpus.h"
#include "train/job_config.h"
#include "train/safetensors.h"
#include "train/text_data.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::tessera::testing::ExpectOneLineError;
using ::tessera::testing::ReadMetricsRows;
using ::tessera::testing::RunTessera;
using ::tessera::testing::SourcePath;

// The specials, then every lower-cased word of the corpus and its marks.
std::vector<std::string> Vocabulary() {
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  const std::vector<std::string>& extra = testing::SentenceCorpusExtraTokens();
  vocab.insert(vocab.end(), extra.begin(), extra.end());
  std::set<std::string> seen(vocab.begin(), vocab.end());
  for (const std::vector<std::string>& list : testing::SentenceCorpusPhrases()) {
    for (const std::string& phrase : list) {
      std::istringstream words(phrase);
      for (std::string w; words >> w;) {
        for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (seen.insert(w).second) vocab.push_back(w);
      }
    }
  }
  return vocab;
}

// The training losses of `rows` are `reference`'s (relative 1e-5).
void ExpectTheLosses(const testing::MetricsRows& rows, const testing::MetricsRows& reference) {
  ASSERT_EQ(rows.train.size(), reference.train.size());
  for (const auto& [iteration, row] : reference.train) {
    for (const char* key : {"loss", "mlm_loss", "nsp_loss"}) {
      ASSERT_EQ(row.contains(key), rows.train.at(iteration).contains(key)) << key;
      if (!row.contains(key)) continue;  // no nsp_loss without the next-sentence head
      const double x = row.at(key).get<double>(), y = rows.train.at(iteration).at(key).get<double>();
      EXPECT_NEAR(x, y, 1e-5 * std::abs(x)) << key << " at iteration " << iteration;
    }
  }
}

class BertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tessera_bert_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    testing::WriteSentenceCorpus(root_ / "corpus.txt", /*paragraphs=*/200, /*seed=*/777);
    std::ofstream vocab(root_ / "vocab.txt");
    for (const std::string& token : Vocabulary()) vocab << token << "\n";
  }
  void TearDown() override { fs::remove_all(root_); }

  // A small BERT (2 layers, hidden 32, 4 heads, 32 tokens, 5 masked slots)
  // from configs/bert_tiny.json on the corpus, built on first use; its
  // evaluations over 2 batches unless `extra` turns them off (eval_iter is
  // then a key nothing reads, refused), the test vocabulary unless `extra`
  // nulls the tokenizer; a line each iteration and checkpoints at the end
  // when it trains (--eval-only refuses those keys).
  std::string Train(const fs::path& out, const std::string& extra) const {
    const bool evaluates = extra.find("train.evaluation.enabled=false") == std::string::npos;
    const bool trains = extra.find("--eval-only") == std::string::npos;
    return "train " + SourcePath("configs/bert_tiny.json") +
           " model.vocab_size=64 model.hidden_size=32 model.num_attention_heads=4 model.ffn_hidden_size=64"
           " model.max_seq_length=40 model.seq_length=32 model.max_predictions_per_seq=5" +
           (extra.find("tokenization.tokenizer=null") == std::string::npos
                ? " tokenization.vocab_file=" + (root_ / "vocab.txt").string()
                : std::string()) +
           " dataloader.data_prefix=" + (root_ / "data" / "corpus").string() +
           " dataloader.text_file=" + (root_ / "corpus.txt").string() + " dataloader.splits=80,20,0" +
           (trains ? " train.log_period=1 train.checkpointer.period=null" : "") +
           (evaluates ? " train.evaluation.eval_iter=2" : "") +
           " train.train_micro_batch_size=8 train.output_dir=" + out.string() + " " + extra;
  }

  // The model's inputs for iteration `iteration` of the Train() model's
  // data (model.max_seq_length 40, seq_length 32, 5 slots), `rows` rows.
  struct Batch {
    std::unique_ptr<TextData> text;
    std::vector<std::pair<std::string, Tensor>> ordered;
    std::map<std::string, Tensor> tensors;
  };
  Batch FillBatch(int64_t iteration, int64_t rows) const {
    Batch batch;
    absl::StatusOr<nlohmann::json> config =
        LoadJobConfig(SourcePath("configs/bert_tiny.json"),
                      {"model.vocab_size=64", "model.hidden_size=32", "model.num_attention_heads=4",
                       "model.ffn_hidden_size=64", "model.max_seq_length=40", "model.seq_length=32",
                       "model.max_predictions_per_seq=5", "tokenization.vocab_file=" + (root_ / "vocab.txt").string(),
                       "dataloader.data_prefix=" + (root_ / "data" / "corpus").string(),
                       "dataloader.text_file=" + (root_ / "corpus.txt").string(), "dataloader.splits=80,20,0"});
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return batch;
    absl::StatusOr<std::unique_ptr<models::Model>> model = models::Bert::FromJson((*config)["model"]);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return batch;
    absl::StatusOr<std::unique_ptr<TextData>> text = TextData::Open(*config, *(*model)->text_inputs());
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok() || *text == nullptr) return batch;
    const int64_t T = 32, P = 5;
    for (const auto& [name, dtype, shape] :
         std::vector<std::tuple<std::string, DType, Shape>>{{"input_ids", DType::kI64, Shape{rows, T}},
                                                            {"token_type_ids", DType::kI64, Shape{rows, T}},
                                                            {"attention_mask", DType::kI64, Shape{rows, T}},
                                                            {"masked_lm_positions", DType::kF32, Shape{rows, P, T}},
                                                            {"masked_lm_labels", DType::kI64, Shape{rows, P}},
                                                            {"masked_lm_weights", DType::kF32, Shape{rows, P}},
                                                            {"masked_lm_mean_count", DType::kF32, Shape{rows}},
                                                            {"next_sentence_labels", DType::kI64, Shape{rows}}}) {
      absl::StatusOr<Tensor> t = Tensor::Zeros(shape, dtype);
      EXPECT_TRUE(t.ok());
      if (!t.ok()) return batch;
      const absl::Status filled = (*text)->FillTrain(iteration, name, *t);
      EXPECT_TRUE(filled.ok()) << name << ": " << filled;
      batch.ordered.emplace_back(name, *t);
      batch.tensors[name] = *t;
    }
    batch.text = *std::move(text);
    return batch;
  }

  // Trains `common` on one device for `iterations` into *rows (the
  // reference the layouts are compared with).
  void TrainOneDevice(const std::string& common, size_t iterations, testing::MetricsRows* rows) const {
    const fs::path one = root_ / "one";
    fs::remove_all(one);  // a reference of another config may be there
    const auto run = RunTessera(Train(one, common));
    ASSERT_EQ(run.exit_code, 0) << run.out;
    *rows = ReadMetricsRows(one);
    ASSERT_EQ(rows->train.size(), iterations);
  }

  // Trains `common` plus each of `layouts` in turn and expects `reference`'s
  // training losses; `check` (if set) sees each layout's rows too.
  void ExpectLayoutsGive(const testing::MetricsRows& reference, const std::string& common,
                         const std::vector<std::string>& layouts,
                         const std::function<void(const testing::MetricsRows&)>& check = nullptr) const {
    const fs::path dir = root_ / "layout";
    for (const std::string& layout : layouts) {
      SCOPED_TRACE(layout);
      fs::remove_all(dir);
      const auto run = RunTessera(Train(dir, common + " " + layout));
      ASSERT_EQ(run.exit_code, 0) << run.out;
      const testing::MetricsRows rows = ReadMetricsRows(dir);
      ExpectTheLosses(rows, reference);
      if (check) check(rows);
    }
  }

  // `rows`' evaluation at `iteration` is `reference`'s.
  static void ExpectTheEvaluation(const testing::MetricsRows& reference, const testing::MetricsRows& rows,
                                  int64_t iteration) {
    ASSERT_TRUE(rows.eval.contains(iteration) && reference.eval.contains(iteration))
        << "no evaluation at " << iteration;
    for (const char* key : {"eval_loss", "eval_mlm_loss", "eval_mlm_accuracy", "eval_nsp_accuracy"}) {
      const double x = reference.eval.at(iteration).at(key).get<double>();
      const double y = rows.eval.at(iteration).at(key).get<double>();
      EXPECT_NEAR(x, y, 1e-5 * std::abs(x) + 1e-12) << key;
    }
  }

  fs::path root_;
};

// Tensor, pipeline and data parallelism give the one-device losses (the
// masked-LM and NSP parts too) and evaluations, with dropout on: its masks
// are the same under every layout. So does model.bias_gelu_fusion (the
// MLPs' and the MLM transform's dense + bias + GELU as matmul_bias_gelu), on
// one device and under tensor parallelism.
TEST_F(BertTest, EveryLayoutGivesTheOneDeviceLosses) {
  const std::string common =
      "train.train_iter=5 train.evaluation.eval_period=5 model.hidden_dropout_prob=0.1"
      " model.attention_dropout_prob=0.1";
  testing::MetricsRows reference;
  ASSERT_NO_FATAL_FAILURE(TrainOneDevice(common, 5, &reference));
  ASSERT_EQ(reference.eval.size(), 1u);
  ExpectLayoutsGive(reference, common,
                    {"train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2",
                     "train.dist.data_parallel_size=2 train.train_micro_batch_size=4",
                     "train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2 "
                     "train.train_micro_batch_size=4",
                     "model.bias_gelu_fusion=true", "model.bias_gelu_fusion=true train.dist.tensor_parallel_size=2"},
                    [&](const testing::MetricsRows& rows) { ExpectTheEvaluation(reference, rows, 5); });
}

// Gradient accumulation and pipelines of several micro-batches give the
// one batch's losses, dropout on: the masked-LM loss divides each
// micro-batch by its rows' share of the whole batch's count of masked
// tokens (masked_lm_mean_count; Megatron-LM and LiBai divide by the
// micro-batch's own count, which differs), and the dropout gradients draw
// their forwards' masks although that loss gives them no layout over the
// micro-batches (scheduler/lowering/graph_facts.cc). The evaluations are
// one batch's too: their batches are global batches, fed as micro-batches
// with the global batch's masked-LM normaliser.
TEST_F(BertTest, GradientAccumulationGivesTheOneBatchLosses) {
  const std::string common =
      "train.train_iter=4 train.evaluation.eval_period=4 train.evaluation.eval_iter=3 model.hidden_dropout_prob=0.1"
      " model.attention_dropout_prob=0.1";
  testing::MetricsRows batch;
  ASSERT_NO_FATAL_FAILURE(TrainOneDevice(common, 4, &batch));
  ExpectLayoutsGive(
      batch, common,
      {"train.num_accumulation_steps=2 train.train_micro_batch_size=4",
       "train.num_accumulation_steps=4 train.train_micro_batch_size=2 train.dist.pipeline_parallel_size=2",
       "train.num_accumulation_steps=2 train.train_micro_batch_size=4 train.dist.tensor_parallel_size=2 "
       "train.dist.pipeline_parallel_size=2",
       "train.num_accumulation_steps=2 train.train_micro_batch_size=2 train.dist.data_parallel_size=2",
       "train.num_accumulation_steps=8 train.train_micro_batch_size=1"},
      [&](const testing::MetricsRows& rows) { ExpectTheEvaluation(batch, rows, 4); });
}

// Hugging Face BertForPreTraining weights (random ones from the reference
// script: torch Linear weights (out, in), query / key / value apart, the MLM
// decoder tied) load through train.load_weight, on one device and under
// tensor parallelism (the converted c_attn (C, 3, C) cut on its heads): the
// first iteration's losses are PyTorch's on those weights, with the fused
// attention and bias-GELU options and on two pipeline stages too. Old files' names
// (no "bert.", LayerNorm gamma / beta, an int64 buffer) load too. `tessera
// export` writes BertForPreTraining's layout back, which PyTorch reads as
// the checkpoint it came from. A file lacking a tensor, with an untied
// decoder, or of other sizes is a one-line error naming the tensor.
TEST_F(BertTest, HuggingFaceWeightsLoadAndExport) {
  const std::string sizes = "model.num_layers=2 model.num_tokentypes=2 model.layernorm_epsilon=1e-12";
  const std::string model_json =
      R"({"vocab_size": 64, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "ffn_hidden_size": 64,)"
      R"( "max_seq_length": 40, "num_tokentypes": 2, "layernorm_epsilon": 1e-12, "add_binary_head": true})";
  const std::string script = "timeout 120 /usr/bin/python3 " + SourcePath("tests/train/bert_reference.py") + " ";
  const auto python = [&](const std::string& args) {
    const testing::CliResult result = testing::RunCommand(script + args + " 2>&1");
    EXPECT_EQ(result.exit_code, 0) << args << "\n" << result.out;
    return result.out;
  };
  const fs::path hf = root_ / "hf", legacy = root_ / "legacy";
  fs::create_directories(hf);
  fs::create_directories(legacy);
  python((hf / "model.safetensors").string() + " make-hf --seed 11 --model '" + model_json + "'");
  python((legacy / "model.safetensors").string() + " make-hf --seed 11 --legacy --model '" + model_json + "'");
  const Batch batch = FillBatch(/*iteration=*/0, /*rows=*/8);
  ASSERT_NE(batch.text, nullptr);
  const fs::path batch_file = root_ / "batch.safetensors";
  ASSERT_TRUE(WriteSafetensors(batch_file, batch.ordered).ok());
  const auto reference = [&](const fs::path& weights, bool hf_file) {
    const std::string out = python(weights.string() + " " + batch_file.string() +
                                   (hf_file ? " --model '" + model_json + "'" : std::string()));
    const nlohmann::json json = nlohmann::json::parse(out, nullptr, false);
    EXPECT_TRUE(json.is_object()) << out;
    return json;
  };
  const nlohmann::json torch = reference(hf / "model.safetensors", true);
  ASSERT_TRUE(torch.is_object());
  const std::string probe =
      "train.train_iter=1 train.evaluation.enabled=false model.hidden_dropout_prob=0 "
      "model.attention_dropout_prob=0 " +
      sizes + " ";
  const auto expect_losses = [&](const fs::path& out, const nlohmann::json& want) {
    const nlohmann::json got = ReadMetricsRows(out).train.at(1);
    for (const char* key : {"loss", "mlm_loss", "nsp_loss"}) {
      const double x = want.at(key).get<double>(), y = got.at(key).get<double>();
      EXPECT_NEAR(y, x, 1e-4 * std::abs(x)) << key;
    }
  };
  for (const auto& [name, extra] : std::vector<std::pair<std::string, std::string>>{
           {"one", "train.load_weight=" + hf.string()},
           {"tp2", "train.dist.tensor_parallel_size=2 train.load_weight=" + (hf / "model.safetensors").string()},
           {"legacy", "train.load_weight=" + legacy.string()},
           {"fused_pp2",
            "model.fused_attention=true model.bias_gelu_fusion=true train.dist.pipeline_parallel_size=2 "
            "train.load_weight=" +
                hf.string()}}) {
    SCOPED_TRACE(name);
    const auto run = RunTessera(Train(root_ / name, probe + extra));
    ASSERT_EQ(run.exit_code, 0) << run.out;
    expect_losses(root_ / name, torch);
  }
  // Export: BertForPreTraining's names and layout.
  const fs::path exported = root_ / "exported.safetensors";
  const auto run = RunTessera("export " + (root_ / "one").string() + " --output " + exported.string());
  ASSERT_EQ(run.exit_code, 0) << run.out;
  {
    auto file = SafetensorsFile::Open(exported);
    ASSERT_TRUE(file.ok()) << file.status();
    const SafetensorsFile::Entry* query = (*file)->Find("bert.encoder.layer.1.attention.self.query.weight");
    ASSERT_NE(query, nullptr);
    EXPECT_EQ(query->shape, (Shape{32, 32}));
    const SafetensorsFile::Entry* fc = (*file)->Find("bert.encoder.layer.0.intermediate.dense.weight");
    ASSERT_NE(fc, nullptr);
    EXPECT_EQ(fc->shape, (Shape{64, 32}));  // (out, in)
  }
  // To a directory: the same weights beside BertForPreTraining's config.json.
  const fs::path directory = root_ / "exported_dir";
  const auto to_dir = RunTessera("export " + (root_ / "one").string() + " --output " + directory.string());
  ASSERT_EQ(to_dir.exit_code, 0) << to_dir.out;
  {
    std::ifstream in(directory / "config.json");
    const nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
    ASSERT_TRUE(config.is_object()) << to_dir.out;
    const nlohmann::json want = nlohmann::json::parse(model_json);
    EXPECT_EQ(config["model_type"], "bert");
    EXPECT_EQ(config["architectures"], nlohmann::json::array({"BertForPreTraining"}));
    EXPECT_EQ(config["hidden_size"], want["hidden_size"]);
    EXPECT_EQ(config["num_hidden_layers"], want["num_layers"]);
    EXPECT_EQ(config["num_attention_heads"], want["num_attention_heads"]);
    EXPECT_EQ(config["intermediate_size"], want["ffn_hidden_size"]);
    EXPECT_EQ(config["max_position_embeddings"], want["max_seq_length"]);
    EXPECT_EQ(config["type_vocab_size"], want["num_tokentypes"]);
    EXPECT_EQ(config["vocab_size"], want["vocab_size"]);
    EXPECT_EQ(config["layer_norm_eps"], want["layernorm_epsilon"]);
    EXPECT_EQ(config["hidden_act"], "gelu");
    std::ifstream a(exported, std::ios::binary), b(directory / "model.safetensors", std::ios::binary);
    EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b), {}));
    // The run's WordPiece vocabulary beside it, as BertTokenizer's
    // save_pretrained writes it, and [PAD]'s id in config.json.
    std::ifstream vocab(root_ / "vocab.txt"), copied(directory / "vocab.txt");
    std::vector<std::string> lines, copied_lines;
    for (std::string line; std::getline(vocab, line);) lines.push_back(line);
    for (std::string line; std::getline(copied, line);) copied_lines.push_back(line);
    EXPECT_EQ(copied_lines, lines);
    const auto pad = std::find(lines.begin(), lines.end(), "[PAD]");
    ASSERT_NE(pad, lines.end());
    EXPECT_EQ(config["pad_token_id"], pad - lines.begin());
    std::ifstream tokenizer_in(directory / "tokenizer_config.json");
    const nlohmann::json tokenizer_config = nlohmann::json::parse(tokenizer_in, nullptr, false);
    EXPECT_EQ(tokenizer_config["tokenizer_class"], "BertTokenizer");
    EXPECT_EQ(tokenizer_config["do_lower_case"], true);
    EXPECT_NE(to_dir.out.find("the run's tokenizer: vocab.txt, tokenizer_config.json\n"), std::string::npos)
        << to_dir.out;
  }
  const nlohmann::json from_checkpoint = reference(root_ / "one", false);
  const nlohmann::json from_export = reference(exported, true);
  for (const char* key : {"loss", "mlm_loss", "nsp_loss"}) {
    EXPECT_EQ(from_export.at(key).get<double>(), from_checkpoint.at(key).get<double>()) << key;
  }
  // Bad files: a tensor missing, the decoder untied, other sizes.
  const auto rewrite = [&](const fs::path& out, const std::string& drop, const std::string& perturb) {
    auto file = SafetensorsFile::Open(hf / "model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, entry] : (*file)->tensors()) {
      if (name == drop) continue;
      auto t = (*file)->Load(name);
      ASSERT_TRUE(t.ok()) << t.status();
      if (name == perturb) t->data<float>()[0] += 1.0f;
      tensors.emplace_back(name, *t);
    }
    ASSERT_TRUE(WriteSafetensors(out, tensors).ok());
  };
  const fs::path missing = root_ / "missing.safetensors", untied = root_ / "untied.safetensors";
  ASSERT_NO_FATAL_FAILURE(rewrite(missing, "bert.encoder.layer.1.attention.self.value.weight", ""));
  ASSERT_NO_FATAL_FAILURE(rewrite(untied, "", "cls.predictions.decoder.weight"));
  ExpectOneLineError(RunTessera(Train(root_ / "bad", probe + "train.load_weight=" + missing.string())),
                     "no tensor 'bert.encoder.layer.1.attention.self.value.weight' (the model's "
                     "encoder.layer.1.attn.c_attn.weight)");
  ExpectOneLineError(RunTessera(Train(root_ / "bad", probe + "train.load_weight=" + untied.string())),
                     "'cls.predictions.decoder.weight' is not 'bert.embeddings.word_embeddings.weight'");
  ExpectOneLineError(
      RunTessera(Train(root_ / "bad",
                       probe + "model.hidden_size=16 model.num_attention_heads=2 train.load_weight=" + hf.string())),
      "'bert.encoder.layer.0.attention.self.query.weight' is (32, 32), the model's "
      "encoder.layer.0.attn.c_attn.weight needs (16, 16) (its transpose)");
}

// An evaluation of the whole valid split counts each sample once (its last
// micro-batch padded with rows of weight 0): the same weights evaluated
// (--eval-only) under any global batch give what one sample at a time gives,
// the losses as per-token (masked LM) and per-sample (NSP) means over the
// split, and the accuracies.
TEST_F(BertTest, WholeSplitEvaluationIsTheSameWhateverTheGlobalBatch) {
  const fs::path dir = root_ / "trained";
  const std::string whole = "train.evaluation.eval_iter=null train.train_iter=1 ";
  auto run = RunTessera(Train(dir, whole + "train.checkpointer.period=1"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  // The evaluation's printed metrics, "eval (weights of iteration 1)  loss 9.877 mlm_loss ...".
  const auto evaluate = [&](const std::string& layout) {
    run = RunTessera(Train(dir, whole + layout + " --eval-only"));
    EXPECT_EQ(run.exit_code, 0) << run.out;
    std::map<std::string, double> printed;
    const std::string head = "eval (weights of iteration 1)";
    const size_t at = run.out.find(head);
    EXPECT_NE(at, std::string::npos) << run.out;
    if (at == std::string::npos) return printed;
    std::istringstream line(run.out.substr(at + head.size(), run.out.find('\n', at) - at - head.size()));
    std::string name;
    for (double value; line >> name >> value;) printed[name] = value;
    return printed;
  };
  const std::map<std::string, double> one = evaluate("train.train_micro_batch_size=1");
  for (const char* key : {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"}) {
    EXPECT_TRUE(one.contains(key)) << key << " not printed: " << run.out;
  }
  if (one.contains("mlm_loss") && one.contains("nsp_loss")) {
    EXPECT_NEAR(one.at("loss"), one.at("mlm_loss") + one.at("nsp_loss"), 2e-6);
  }
  for (const std::string layout :
       {"train.train_micro_batch_size=7", "train.train_micro_batch_size=3 train.dist.data_parallel_size=2",
        "train.train_micro_batch_size=2 train.num_accumulation_steps=3 "
        "train.dist.pipeline_parallel_size=2 train.dist.tensor_parallel_size=2"}) {
    SCOPED_TRACE(layout);
    const std::map<std::string, double> printed = evaluate(layout);
    EXPECT_EQ(printed.size(), one.size());
    for (const auto& [key, value] : one) {
      ASSERT_TRUE(printed.contains(key)) << key;
      // printed to 6 decimals
      EXPECT_NEAR(printed.at(key), value, 2e-6 + 2e-6 * value) << key;
    }
  }
}

// Without the next-sentence head (model.add_binary_head=false) the loss is
// the masked LM's, fetched also as mlm_loss; no NSP metrics. Under
// accumulation and tensor parallelism the losses are one batch's, and on
// 2 x 2 x 2 devices with activation checkpointing (where the recomputation's
// depend on the masked-LM bias's gradient once read it as P(max), which no
// boxing reaches from P: an error at run time).
TEST_F(BertTest, WithoutTheNextSentenceHeadTheLossIsTheMaskedLm) {
  const std::string common =
      "train.train_iter=3 train.evaluation.eval_period=3 model.add_binary_head=false model.hidden_dropout_prob=0.1";
  testing::MetricsRows batch;
  ASSERT_NO_FATAL_FAILURE(TrainOneDevice(common, 3, &batch));
  for (const auto& [iteration, row] : batch.train) {
    EXPECT_EQ(row.at("loss").get<double>(), row.at("mlm_loss").get<double>()) << "iteration " << iteration;
    EXPECT_FALSE(row.contains("nsp_loss"));
  }
  ASSERT_EQ(batch.eval.size(), 1u);
  // Exported as BertForMaskedLM: no pooler, no seq_relationship (it said
  // BertForPreTraining, whose missing heads transformers fills at random).
  const fs::path exported = root_ / "mlm_only";
  const auto export_run = RunTessera("export " + (root_ / "one").string() + " --output " + exported.string());
  ASSERT_EQ(export_run.exit_code, 0) << export_run.out;
  const nlohmann::json hf_config = nlohmann::json::parse(std::ifstream(exported / "config.json"));
  EXPECT_EQ(hf_config["architectures"], nlohmann::json::array({"BertForMaskedLM"})) << hf_config;
  // Its samples are single segments: one document is data enough (two
  // were asked for, for the next sentences nothing reads).
  {
    std::ifstream corpus(root_ / "corpus.txt");
    std::string text((std::istreambuf_iterator<char>(corpus)), std::istreambuf_iterator<char>());
    std::string one_document;
    for (char c : text) one_document += c == '\n' ? ' ' : c;  // paragraphs are documents
    std::ofstream(root_ / "one_document.txt") << one_document << "\n";
  }
  const std::string single = " dataloader.splits=1 train.evaluation.enabled=false dataloader.text_file=" +
                             (root_ / "one_document.txt").string() +
                             " dataloader.data_prefix=" + (root_ / "data" / "one_document").string();
  const auto one_document =
      RunTessera(Train(root_ / "single", "train.train_iter=2 model.add_binary_head=false" + single));
  EXPECT_EQ(one_document.exit_code, 0) << one_document.out;
  ExpectOneLineError(RunTessera(Train(root_ / "single_nsp", "train.train_iter=2" + single)),
                     "has 1 documents with sentences; next-sentence prediction needs at least 2");
  // The metrics an evaluation reports (metrics.jsonl's eval_* fields), with
  // and without the next-sentence head, are those train.evaluation.eval_metric
  // may name for save_best (the refusal lists them).
  const auto eval_keys = [](const nlohmann::json& row) {
    std::vector<std::string> keys;
    for (const auto& [key, value] : row.items()) {
      if (key.starts_with("eval_")) keys.push_back(key);
    }
    return keys;
  };
  const std::vector<std::string> mlm_only = {"eval_loss", "eval_mlm_accuracy", "eval_mlm_loss"};
  const std::vector<std::string> both = {"eval_loss", "eval_mlm_accuracy", "eval_mlm_loss", "eval_nsp_accuracy",
                                         "eval_nsp_loss"};
  EXPECT_EQ(eval_keys(batch.eval.at(3)), mlm_only);
  testing::MetricsRows with_head;
  ASSERT_NO_FATAL_FAILURE(TrainOneDevice("train.train_iter=1 train.evaluation.eval_period=1", 1, &with_head));
  EXPECT_EQ(eval_keys(with_head.eval.at(1)), both);
  const std::string best_ppl = " train.checkpointer.save_best=true train.evaluation.eval_metric=eval_ppl";
  ExpectOneLineError(RunTessera(Train(root_ / "bad", common + best_ppl)),
                     "train.evaluation.eval_metric 'eval_ppl' is not a metric of models.BERT's evaluation (" +
                         Join(mlm_only, ", ") + ")");
  ExpectOneLineError(
      RunTessera(Train(root_ / "bad", "model.add_binary_head=true" + best_ppl)),
      "train.evaluation.eval_metric 'eval_ppl' is not a metric of models.BERT's evaluation (" + Join(both, ", ") + ")");
  ExpectLayoutsGive(batch, common + " train.train_micro_batch_size=4",
                    {"train.num_accumulation_steps=2 train.dist.tensor_parallel_size=2",
                     "train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2 "
                     "train.dist.pipeline_parallel_size=2 train.activation_checkpoint.enabled=true"});
}

// The batch of the data path, checked against BERT's recipe sample by
// sample: [CLS] A [SEP] B [SEP] then padding, segment ids, the mask, and
// masked-LM slots that point at chosen positions in order.
TEST_F(BertTest, TheBatchFollowsBertsRecipe) {
  const int64_t rows = 16, T = 32, P = 5;
  const Batch batch = FillBatch(/*iteration=*/3, rows);
  ASSERT_NE(batch.text, nullptr);
  const data::Tokenizer& tok = *batch.text->tokenizer();
  const int64_t cls = *tok.SpecialId("[CLS]"), sep = *tok.SpecialId("[SEP]"), mask = *tok.SpecialId("[MASK]"),
                pad = *tok.SpecialId("[PAD]");
  const int64_t* ids = batch.tensors.at("input_ids").data<int64_t>();
  const int64_t* types = batch.tensors.at("token_type_ids").data<int64_t>();
  const int64_t* attention = batch.tensors.at("attention_mask").data<int64_t>();
  const float* positions = batch.tensors.at("masked_lm_positions").data<float>();
  const int64_t* labels = batch.tensors.at("masked_lm_labels").data<int64_t>();
  const float* weights = batch.tensors.at("masked_lm_weights").data<float>();
  int64_t masked = 0, replaced_by_mask = 0, random_next = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* row = ids + r * T;
    ASSERT_EQ(row[0], cls);
    int64_t used = 0;
    while (used < T && attention[r * T + used] == 1) ++used;
    for (int64_t t = used; t < T; ++t) {
      EXPECT_EQ(attention[r * T + t], 0);
      EXPECT_EQ(row[t], pad);
      EXPECT_EQ(types[r * T + t], 0);
    }
    ASSERT_GE(used, 5);
    EXPECT_EQ(row[used - 1], sep);
    // One [SEP] inside: where segment B (type 1) starts.
    int64_t first_b = -1;
    for (int64_t t = 1; t < used; ++t) {
      if (types[r * T + t] == 1 && first_b < 0) first_b = t;
      if (first_b >= 0) {
        EXPECT_EQ(types[r * T + t], 1) << "row " << r;
      }
    }
    ASSERT_GT(first_b, 1);
    EXPECT_EQ(row[first_b - 1], sep);
    // Slots: one-hot rows at increasing non-special positions, then empty.
    int64_t last = -1, used_slots = 0;
    for (int64_t p = 0; p < P; ++p) {
      const float* one_hot = positions + (r * P + p) * T;
      int64_t hot = -1, ones = 0;
      for (int64_t t = 0; t < T; ++t) {
        if (one_hot[t] != 0.0f) {
          EXPECT_EQ(one_hot[t], 1.0f);
          hot = t;
          ++ones;
        }
      }
      if (weights[r * P + p] == 0.0f) {
        EXPECT_EQ(ones, 0);
        EXPECT_EQ(labels[r * P + p], 0);
        continue;
      }
      ++used_slots;
      ASSERT_EQ(ones, 1);
      EXPECT_GT(hot, last);
      last = hot;
      EXPECT_TRUE(hot > 0 && hot < used - 1 && hot != first_b - 1) << "a special token chosen at " << hot;
      const int64_t label = labels[r * P + p];
      EXPECT_TRUE(label >= 5 && label < tok.vocab_size()) << label;  // a word, never a special token
      ++masked;
      replaced_by_mask += row[hot] == mask;
    }
    // round(0.15 × tokens), at least one, at most P.
    const int64_t candidates = used - 3;
    EXPECT_EQ(used_slots, std::min<int64_t>(P, std::max<int64_t>(1, std::llround(0.15 * candidates)))) << "row " << r;
    random_next += batch.tensors.at("next_sentence_labels").data<int64_t>()[r];
  }
  // Every row holds the batch's used slots over its rows.
  const float* mean_count = batch.tensors.at("masked_lm_mean_count").data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(mean_count[r], static_cast<float>(static_cast<double>(masked) / rows)) << "row " << r;
  }
  // 80 % of the chosen tokens become [MASK] (loosely: few samples).
  EXPECT_GT(replaced_by_mask, masked / 2);
  EXPECT_GT(random_next, 0);
  EXPECT_LT(random_next, rows);
}

// The model against an independent PyTorch BERT (bert_reference.py beside
// this file, written from the model's definition): a checkpoint trained
// under tensor parallelism, then one step from its weights, whose logged
// losses are the forward at those weights on iteration 0's batch; the
// script computes the same batch's losses from the checkpoint's files.
TEST_F(BertTest, MatchesPyTorchOnTheSameBatch) {
  const fs::path trained = root_ / "trained", probe = root_ / "probe";
  // Weights drawn 15× wider than BERT's init so every part of the model
  // moves the losses well past the tolerance (at BERT's 0.02 the logits are
  // nearly uniform and, e.g., a tanh GELU for the erf one would pass).
  // (The second run's weights all come from the checkpoint: it sets no
  // init key, which nothing would read.)
  const std::string no_dropout = " model.hidden_dropout_prob=0 model.attention_dropout_prob=0";
  auto run = RunTessera(Train(trained,
                              "train.train_iter=3 train.evaluation.enabled=false "
                              "train.dist.tensor_parallel_size=2 model.initializer_range=0.3" +
                                  no_dropout));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  run = RunTessera(Train(probe, "train.train_iter=1 train.evaluation.enabled=false train.load_weight=" +
                                    (trained / "checkpoints" / "iter_0000003").string() + no_dropout));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const nlohmann::json tessera = ReadMetricsRows(probe).train.at(1);
  const Batch batch = FillBatch(/*iteration=*/0, /*rows=*/8);
  ASSERT_NE(batch.text, nullptr);
  const fs::path file = root_ / "batch.safetensors";
  ASSERT_TRUE(WriteSafetensors(file, batch.ordered).ok());
  const std::string cmd = "timeout 120 /usr/bin/python3 " + SourcePath("tests/train/bert_reference.py") + " " +
                          (trained / "checkpoints" / "iter_0000003").string() + " " + file.string() + " 2>&1";
  const testing::CliResult reference = testing::RunCommand(cmd);
  ASSERT_EQ(reference.exit_code, 0) << cmd << "\n" << reference.out;
  const std::string& out = reference.out;
  const nlohmann::json torch = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(torch.is_object()) << out;
  for (const char* key : {"loss", "mlm_loss", "nsp_loss"}) {
    const double x = torch.at(key).get<double>(), y = tessera.at(key).get<double>();
    EXPECT_NEAR(y, x, 1e-4 * std::abs(x)) << key;
    std::cout << key << ": PyTorch " << x << ", Tessera " << y << "\n";
  }
  EXPECT_EQ(torch.at("nsp_count").get<double>(), 8.0);
  EXPECT_GT(torch.at("mlm_count").get<double>(), 8.0);
}

// configs/bert_tiny.json on the default corpus (the King James Bible with
// BERT's uncased vocabulary, scripts/setup_data.sh): over 200 steps the
// masked-LM loss falls well below where it starts, and the held-out
// masked-LM accuracy rises.
TEST_F(BertTest, BertTinyLearnsTheMaskedLanguageModel) {
  const fs::path out = root_ / "tiny";
  const auto run = RunTessera("train " + SourcePath("configs/bert_tiny.json") + " train.train_iter=200" +
                              " train.evaluation.eval_period=100 train.checkpointer.period=null"
                              " train.train_micro_batch_size=8 train.log_period=1 dataloader.data_prefix=" +
                              (root_ / "kjv_bert").string() + " train.output_dir=" + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const testing::MetricsRows rows = ReadMetricsRows(out);
  ASSERT_EQ(rows.train.size(), 200u);
  const auto mean_mlm = [&](int64_t first, int64_t last) {
    double sum = 0;
    for (int64_t i = first; i <= last; ++i) sum += rows.train.at(i).at("mlm_loss").get<double>();
    return sum / static_cast<double>(last - first + 1);
  };
  const double start = mean_mlm(1, 10), end = mean_mlm(191, 200);
  // ln(30522) = 10.3 at the start; the unigram entropy of the corpus's
  // tokens is about 6.
  EXPECT_GT(start, 9.5);
  EXPECT_LT(end, 7.0) << "start " << start;
  std::cout << "mlm_loss over iterations 1-10: " << start << ", 191-200: " << end << "; eval_mlm_accuracy "
            << rows.eval.at(100).at("eval_mlm_accuracy") << " at 100, " << rows.eval.at(200).at("eval_mlm_accuracy")
            << " at 200\n";
  ASSERT_EQ(rows.eval.size(), 2u);
  EXPECT_GT(rows.eval.at(200).at("eval_mlm_accuracy").get<double>(), 0.05);
  EXPECT_LT(rows.eval.at(200).at("eval_mlm_loss").get<double>(), rows.eval.at(100).at("eval_mlm_loss").get<double>());
  EXPECT_NE(run.out.find("mlm_accuracy"), std::string::npos) << run.out;
}

TEST_F(BertTest, BadBertConfigsAreOneLineErrors) {
  const fs::path out = root_ / "bad";
  // No text: BERT has no data of its own.
  ExpectOneLineError(RunTessera(Train(out,
                                      "train.train_iter=2 dataloader.data_prefix=null dataloader.text_file=null "
                                      "tokenization.tokenizer=null")),
                     "models.BERT trains on text only");
  // A tokenizer without BERT's special tokens.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 tokenization.tokenizer=null")),
                     "tokenization.tokenizer");
  // An end-of-document token inside sentence pairs.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 tokenization.append_eod=true")),
                     "tokenization.append_eod");
  // More masked slots than maskable tokens.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 model.max_predictions_per_seq=30")),
                     "max_predictions_per_seq");
  // A vocabulary larger than the model's.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 model.vocab_size=10")), "model.vocab_size");
  // A vocabulary without [MASK]: refused before the dataset is built from
  // the text (it was built, and left, first), and by `tessera plan` too.
  {
    std::ifstream in(root_ / "vocab.txt");
    std::ofstream no_mask(root_ / "no_mask.txt");
    for (std::string token; std::getline(in, token);) {
      if (token != "[MASK]") no_mask << token << "\n";
    }
  }
  const std::string no_mask = "train.train_iter=2 tokenization.vocab_file=" + (root_ / "no_mask.txt").string() +
                              " dataloader.data_prefix=" + (root_ / "data" / "no_mask").string();
  ExpectOneLineError(RunTessera(Train(out, no_mask)), "no [MASK] token");
  EXPECT_FALSE(fs::exists(root_ / "data" / "no_mask.idx"));
  EXPECT_FALSE(fs::exists(root_ / "data" / "no_mask.bin"));
  const std::string plan = Train(out, no_mask);
  ExpectOneLineError(RunTessera("plan" + plan.substr(std::string("train").size())), "no [MASK] token");
  // A missing vocabulary file.
  ExpectOneLineError(
      RunTessera(Train(out, "train.train_iter=2 tokenization.vocab_file=" + (root_ / "no.txt").string())), "no.txt");
  // Heads that do not divide the hidden size.
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 model.num_attention_heads=3")), "num_attention_heads");
  // A dataset of whole documents (no sentence splitting): nothing to pair.
  const auto whole =
      RunTessera("preprocess --input " + (root_ / "corpus.txt").string() + " --tokenizer bert --no-eod --vocab-file " +
                 (root_ / "vocab.txt").string() + " --output " + (root_ / "whole").string());
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 dataloader.text_file=null dataloader.data_prefix=" +
                                               (root_ / "whole").string())),
                     "holds whole documents as one sequence: models.BERT pairs sentences");
  // Sentences with end-of-document tokens (what --split-sentences wrote
  // until it implied none; a dataset whose source.json says so): each
  // document's last pair read "... [SEP] [SEP]".
  const auto with_eod = RunTessera("preprocess --input " + (root_ / "corpus.txt").string() +
                                   " --tokenizer bert --split-sentences --vocab-file " +
                                   (root_ / "vocab.txt").string() + " --output " + (root_ / "with_eod").string());
  ASSERT_EQ(with_eod.exit_code, 0) << with_eod.out;
  const fs::path source = root_ / "with_eod.source.json";
  nlohmann::json described = nlohmann::json::parse(std::ifstream(source));
  EXPECT_EQ(described["end_of_document"], false);
  described["end_of_document"] = true;
  std::ofstream(source) << described.dump(2);
  ExpectOneLineError(RunTessera(Train(out, "train.train_iter=2 dataloader.text_file=null dataloader.data_prefix=" +
                                               (root_ / "with_eod").string())),
                     "ends each document with an end-of-document token: models.BERT pairs sentences without one");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace tessera
