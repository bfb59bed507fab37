// Every key of configs/common/*.json does something: changing it either
// changes the run (each row below shows how) or is refused with a reason.
// A key added to the common files without a row here fails the test.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/storage.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "tests/train/train_runs.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  absl::Status status;
  TrainSummary summary;
  int metrics_lines = 0;
  int devices = 0;  // of the plan
  int async_tasks = 0;  // the plan's tasks with asynchronous acts
  std::set<std::string> written;  // files the run left in RunDir(), relative
};

fs::path RunDir() { return fs::temp_directory_path() / ("tessera_common_keys_" + std::to_string(::getpid())); }

// Four iterations of configs/mlp_demo.json (log_period 10) with `overrides`.
Outcome RunWith(std::vector<std::string> overrides) {
  Outcome out;
  const fs::path dir = RunDir();
  fs::remove_all(dir);
  std::vector<std::string> all = {"train.train_iter=4", "train.output_dir=" + dir.string()};
  all.insert(all.end(), overrides.begin(), overrides.end());
  auto config = LoadJobConfig(::tessera::testing::SourcePath("configs/mlp_demo.json"), all);
  if (!config.ok()) {
    out.status = config.status();
    return out;
  }
  auto plan = TrainingPlan(*config);
  if (!plan.ok()) {
    out.status = plan.status();
    return out;
  }
  out.devices = plan->memory_estimate_size();
  for (const auto& task : plan->tasks()) out.async_tasks += task.async_acts() ? 1 : 0;
  auto summary = Train(*config);
  if (!summary.ok()) {
    out.status = summary.status();
    return out;
  }
  out.summary = *summary;
  std::ifstream metrics(dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) ++out.metrics_lines;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) out.written.insert(fs::relative(entry.path(), dir).string());
  }
  fs::remove_all(dir);
  return out;
}

struct Row {
  std::string key;
  std::vector<std::string> base;     // the comparison run (plus RunWith's defaults)
  std::vector<std::string> changed;  // base + the key changed
  // "" when the change had its effect; else what went wrong.
  std::function<std::string(const Outcome& base, const Outcome& changed)> effect;
  // Keys that only the runner behind `tessera train` and the cluster acts on
  // (checkpoints, evaluation): a check of its own through the binary,
  // instead of the in-process base/changed comparison. "" when it had its
  // effect.
  std::function<std::string()> check = {};
};

// `tessera train configs/mlp_demo.json` (4 iterations, log_period 1) into
// `dir` with `overrides`; "" or the failure's output.
std::string RunCli(const fs::path& dir, const std::string& overrides) {
  const auto result = ::tessera::testing::RunTessera("train " + ::tessera::testing::SourcePath("configs/mlp_demo.json") +
                                                     " train.train_iter=4 train.log_period=1 train.output_dir=" +
                                                     dir.string() + " " + overrides);
  return result.exit_code == 0 ? "" : "exit " + std::to_string(result.exit_code) + ": " + result.out;
}

using ::tessera::testing::LoggedLosses;

std::vector<int64_t> LoggedIterations(const fs::path& dir) {
  std::vector<int64_t> out;
  for (const auto& [iteration, loss] : LoggedLosses(dir)) out.push_back(iteration);
  return out;
}

// The iterations of the complete checkpoints in `dir`/checkpoints.
std::set<std::string> Checkpoints(const fs::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir / "checkpoints", ec)) {
    if (fs::exists(entry.path() / "index.json")) out.insert(entry.path().filename().string());
  }
  return out;
}

std::string CheckpointerPeriod() {
  const fs::path base = RunDir() / "period_base", changed = RunDir() / "period_changed";
  if (std::string e = RunCli(base, ""); !e.empty()) return e;
  if (std::string e = RunCli(changed, "train.checkpointer.period=2"); !e.empty()) return e;
  // One checkpoint at the end by default; with period 2 also at iteration 2.
  if (Checkpoints(base) != std::set<std::string>{"iter_0000004"}) return "default: not one checkpoint at the end";
  if (Checkpoints(changed) != std::set<std::string>{"iter_0000002", "iter_0000004"}) return "period 2: not at 2 and 4";
  return "";
}

std::string CheckpointerMaxToKeep() {
  const fs::path dir = RunDir() / "keep";
  if (std::string e = RunCli(dir, "train.checkpointer.period=1 train.checkpointer.max_to_keep=2"); !e.empty()) return e;
  return Checkpoints(dir) == std::set<std::string>{"iter_0000003", "iter_0000004"} ? "" : "not the newest two kept";
}

std::string Resume() {
  const fs::path dir = RunDir() / "resume";
  if (std::string e = RunCli(dir, "train.checkpointer.period=2"); !e.empty()) return e;
  fs::remove_all(dir / "checkpoints" / "iter_0000004");
  if (std::string e = RunCli(dir, "train.resume=true"); !e.empty()) return e;
  // Resumed at 2: metrics.jsonl keeps the rows up to 2, then the run's own.
  return LoggedIterations(dir) == std::vector<int64_t>{1, 2, 3, 4} ? "" : "did not continue from iteration 2";
}

std::string LoadWeight() {
  const fs::path from = RunDir() / "weights", to = RunDir() / "loaded";
  if (std::string e = RunCli(from, ""); !e.empty()) return e;
  if (std::string e = RunCli(to, "train.load_weight=" + (from / "checkpoints" / "iter_0000004").string()); !e.empty()) {
    return e;
  }
  // Starts at iteration 1 (not resumed), from the trained weights: its
  // first loss is below the first run's.
  const std::map<int64_t, double> first = LoggedLosses(from), loaded = LoggedLosses(to);
  if (LoggedIterations(to) != std::vector<int64_t>{1, 2, 3, 4}) return "not a fresh run from the weights";
  return loaded.at(1) < first.at(1) ? "" : "the first loss is not below the untrained run's";
}

std::string LossesDiffer(const Outcome& base, const Outcome& changed) {
  if (!base.status.ok()) return "base run failed: " + std::string(base.status.message());
  if (!changed.status.ok()) return "changed run failed: " + std::string(changed.status.message());
  return base.summary.losses != changed.summary.losses ? "" : "the losses did not change";
}

std::function<std::string(const Outcome&, const Outcome&)> Refused(std::string reason) {
  return [reason](const Outcome&, const Outcome& changed) -> std::string {
    if (changed.status.ok()) return "accepted";
    const std::string message(changed.status.message());
    return message.find(reason) != std::string::npos ? "" : "refused with '" + message + "', expected '" + reason + "'";
  };
}

std::function<std::string(const Outcome&, const Outcome&)> Devices(int want) {
  return [want](const Outcome& base, const Outcome& changed) -> std::string {
    if (!changed.status.ok()) return "failed: " + std::string(changed.status.message());
    if (base.devices != 1 || changed.devices != want) {
      return "devices " + std::to_string(base.devices) + " -> " + std::to_string(changed.devices);
    }
    // Every layout trains the one-device losses.
    for (size_t i = 0; i < base.summary.losses.size(); ++i) {
      if (std::abs(base.summary.losses[i] - changed.summary.losses[i]) > 1e-5 * std::abs(base.summary.losses[i])) {
        return "losses differ from one device at iteration " + std::to_string(i);
      }
    }
    return "";
  };
}

// train.dist.device_type=cuda over two ranks: where this process sees two
// GPUs, the one-device losses on them; elsewhere refused naming the GPU
// the plan needs.
std::function<std::string(const Outcome&, const Outcome&)> OnTwoGpus() {
  const absl::StatusOr<int> gpus = CudaDeviceCount();
  if (gpus.ok() && *gpus >= 2) return Devices(2);
  return Refused("the plan runs on cuda:1, but ");
}

// The same losses as plain data parallelism (rtol 1e-5), with each rank
// holding a shard of the optimizer state (the runtime's counters).
std::string SameLosses(const Outcome& base, const Outcome& changed) {
  if (!base.status.ok()) return "base run failed: " + std::string(base.status.message());
  if (!changed.status.ok()) return "changed run failed: " + std::string(changed.status.message());
  if (base.summary.losses.size() != changed.summary.losses.size()) return "a different number of losses";
  for (size_t i = 0; i < base.summary.losses.size(); ++i) {
    if (std::abs(base.summary.losses[i] - changed.summary.losses[i]) > 1e-5 * std::abs(base.summary.losses[i])) {
      return "losses differ at iteration " + std::to_string(i);
    }
  }
  return "";
}

std::string ShardsOptimizerState(const Outcome& base, const Outcome& changed) {
  if (std::string same = SameLosses(base, changed); !same.empty()) return same;
  if (base.summary.arenas.size() != 2 || changed.summary.arenas.size() != 2) {
    return "not two devices: " + std::to_string(base.summary.arenas.size()) + " and " +
           std::to_string(changed.summary.arenas.size()) + " arenas";
  }
  for (size_t d = 0; d < 2; ++d) {
    const int64_t whole = base.summary.arenas[d].optimizer_state_bytes;
    const int64_t shard = changed.summary.arenas[d].optimizer_state_bytes;
    if (whole <= 0 || 2 * shard > whole + 64) {
      return "device " + std::to_string(d) + " holds " + std::to_string(shard) + " state bytes of " +
             std::to_string(whole);
    }
  }
  return "";
}

// Stage 3 gathers each variable per reader instead of once: other
// registers, another arena (on the MLP a larger one: its activations
// dominate), the same losses.
std::string ChangesTheArenas(const Outcome& base, const Outcome& changed) {
  if (std::string same = SameLosses(base, changed); !same.empty()) return same;
  int64_t before = 0, after = 0;
  for (const auto& use : base.summary.arenas) before += use.arena_bytes;
  for (const auto& use : changed.summary.arenas) after += use.arena_bytes;
  return after != before ? "" : "the arenas did not change (" + std::to_string(before) + " bytes)";
}

const std::string kNotImplemented = "is not implemented yet";

std::vector<Row> Rows() {
  return {
      {"train.output_dir",
       {},
       {"train.output_dir=" + (RunDir() / "elsewhere").string()},
       [](const Outcome& base, const Outcome& changed) -> std::string {
         const std::set<std::string> here = {"config.json", "metrics.jsonl"};
         const std::set<std::string> there = {"elsewhere/config.json", "elsewhere/metrics.jsonl"};
         return base.written == here && changed.written == there ? "" : "the outputs did not move";
       }},
      {"train.train_micro_batch_size", {}, {"train.train_micro_batch_size=16"}, LossesDiffer},
      {"train.global_batch_size",
       {},
       {"train.num_accumulation_steps=null", "train.global_batch_size=64"},
       LossesDiffer},
      {"train.num_accumulation_steps", {}, {"train.num_accumulation_steps=2"}, LossesDiffer},
      {"train.train_iter",
       {},
       {"train.train_iter=2"},
       [](const Outcome& base, const Outcome& changed) -> std::string {
         return base.summary.iterations == 4 && changed.summary.iterations == 2 ? "" : "iteration count unchanged";
       }},
      {"train.warmup_ratio", {}, {"train.warmup_ratio=0.5"}, LossesDiffer},
      {"train.log_period",
       {},
       {"train.log_period=1"},
       [](const Outcome& base, const Outcome& changed) -> std::string {
         return base.metrics_lines == 1 && changed.metrics_lines == 4 ? "" : "metrics lines unchanged";
       }},
      {"train.seed", {}, {"train.seed=99"}, LossesDiffer},
      // bf16 products: other losses (tests/train/amp_test.cc: how close).
      {"train.amp.enabled", {}, {"train.amp.enabled=true"}, LossesDiffer},
      {"train.amp.dtype", {"train.amp.enabled=true"}, {"train.amp.enabled=true", "train.amp.dtype=fp16"}, LossesDiffer},
      // On a model with transformer layers it recomputes them, same losses
      // bit for bit and a smaller arena (tests/train/memory_test.cc); an
      // MLP has nothing to recompute.
      {"train.activation_checkpoint.enabled",
       {},
       {"train.activation_checkpoint.enabled=true"},
       Refused("the model has no recomputable layers")},
      // Every stage on every layout: tests/train/zero_test.cc.
      {"train.zero_optimization.enabled",
       {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16"},
       {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16", "train.zero_optimization.enabled=true"},
       ShardsOptimizerState},
      {"train.zero_optimization.stage",
       {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16", "train.zero_optimization.enabled=true"},
       {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16", "train.zero_optimization.enabled=true",
        "train.zero_optimization.stage=3"},
       ChangesTheArenas},
      {"train.evaluation.enabled", {}, {"train.evaluation.enabled=true"}, Refused("needs text data")},
      // What evaluation does is checked on text data (text_data_test); here,
      // without evaluation, nothing would read the two numbers: an override
      // of either is refused, naming the switch.
      {"train.evaluation.eval_period",
       {},
       {"train.evaluation.eval_period=2"},
       Refused("sets a key nothing reads while train.evaluation.enabled is false")},
      {"train.evaluation.eval_iter",
       {},
       {"train.evaluation.eval_iter=2"},
       Refused("sets a key nothing reads while train.evaluation.enabled is false")},
      // save_best and the metric it compares act on evaluations, which need
      // text data (text_data_test checks them); here they are refused.
      {"train.checkpointer.save_best",
       {},
       {"train.checkpointer.save_best=true"},
       Refused("needs train.evaluation.enabled=true")},
      {"train.evaluation.eval_metric",
       {},
       {"train.evaluation.eval_metric=eval_ppl"},
       Refused("choose the best checkpoint: set train.checkpointer.save_best=true")},
      {"train.evaluation.eval_mode",
       {},
       {"train.evaluation.eval_mode=max"},
       Refused("choose the best checkpoint: set train.checkpointer.save_best=true")},
      {"train.checkpointer.period", {}, {}, nullptr, CheckpointerPeriod},
      {"train.checkpointer.max_to_keep", {}, {}, nullptr, CheckpointerMaxToKeep},
      {"train.resume", {}, {}, nullptr, Resume},
      {"train.load_weight", {}, {}, nullptr, LoadWeight},
      {"train.dist.device_type",
       {},
       {"train.dist.device_type=cuda", "train.dist.data_parallel_size=2", "train.train_micro_batch_size=16"},
       OnTwoGpus()},
      {"train.dist.data_parallel_size",
       {},
       {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16"},
       Devices(2)},
      {"train.dist.tensor_parallel_size", {}, {"train.dist.tensor_parallel_size=2"}, Devices(2)},
      {"train.dist.pipeline_parallel_size", {}, {"train.dist.pipeline_parallel_size=3"}, Devices(3)},
      {"train.dist.num_devices",
       {},
       {"train.dist.data_parallel_size=null", "train.dist.num_devices=2", "train.train_micro_batch_size=16"},
       Devices(2)},
      {"train.dist.intra_op_threads",
       {"train.dist.intra_op_threads=1"},
       {"train.dist.intra_op_threads=2"},
       [](const Outcome& base, const Outcome& changed) -> std::string {
         if (base.summary.threads_per_device != 1 || changed.summary.threads_per_device != 2)
           return "threads unchanged";
         return base.summary.losses == changed.summary.losses ? "" : "threads changed the numbers";
       }},
      {"train.dist.async_compute",
       {},
       {"train.dist.async_compute=true"},
       [](const Outcome& base, const Outcome& changed) -> std::string {
         if (base.async_tasks != 0 || changed.async_tasks == 0) return "no compute task acts asynchronously";
         return base.summary.losses == changed.summary.losses ? "" : "asynchronous acts changed the numbers";
       }},
      {"train.dist.pipeline_num_layers", {}, {"train.dist.pipeline_num_layers=4"}, Refused("!= the model's 3 layers")},
      {"lr_scheduler._target_", {}, {"lr_scheduler._target_=ConstantLR"}, LossesDiffer},
      {"lr_scheduler.warmup_factor",
       {"train.warmup_ratio=0.5"},
       {"train.warmup_ratio=0.5", "lr_scheduler.warmup_factor=0.5"},
       LossesDiffer},
      {"lr_scheduler.alpha", {}, {"lr_scheduler.alpha=0.9"}, LossesDiffer},
      {"lr_scheduler.warmup_method",
       {"train.warmup_ratio=0.5"},
       {"train.warmup_ratio=0.5", "lr_scheduler.warmup_method=constant"},
       LossesDiffer},
      {"optim._target_", {}, {"optim._target_=SGD"}, LossesDiffer},
      {"optim.lr", {}, {"optim.lr=0.05"}, LossesDiffer},
      {"optim.weight_decay", {}, {"optim.weight_decay=0.5"}, LossesDiffer},
      {"optim.betas", {}, {"optim.betas=[0.5,0.6]"}, LossesDiffer},
      {"optim.eps", {}, {"optim.eps=0.1"}, LossesDiffer},
      {"optim.clip_grad_max_norm", {}, {"optim.clip_grad_max_norm=0.01"}, LossesDiffer},
      {"optim.clip_grad_norm_type",
       {"optim.clip_grad_max_norm=0.01"},
       {"optim.clip_grad_max_norm=0.01", "optim.clip_grad_norm_type=inf"},
       LossesDiffer},
      {"optim.no_decay_norm_and_bias",
       {"optim.weight_decay=0.5"},
       {"optim.weight_decay=0.5", "optim.no_decay_norm_and_bias=false"},
       LossesDiffer},
  };
}

void CollectLeaves(const nlohmann::json& node, const std::string& path, std::set<std::string>& out) {
  if (!node.is_object()) {
    out.insert(path);
    return;
  }
  for (const auto& [key, child] : node.items()) CollectLeaves(child, path.empty() ? key : path + "." + key, out);
}

TEST(CommonKeys, EveryKeyChangesTheRunOrIsRefused) {
  std::set<std::string> keys;
  for (const char* file : {"configs/common/train.json", "configs/common/optim.json"}) {
    auto config = config::LoadConfigFiles(::tessera::testing::SourcePath(file));
    ASSERT_TRUE(config.ok()) << config.status();
    CollectLeaves(*config, "", keys);
  }
  std::set<std::string> covered;
  for (const Row& row : Rows()) {
    SCOPED_TRACE(row.key);
    covered.insert(row.key);
    if (row.check) {
      EXPECT_EQ(row.check(), "");
      continue;
    }
    const Outcome base = RunWith(row.base);
    ASSERT_TRUE(base.status.ok()) << base.status;
    const Outcome changed = RunWith(row.changed);
    EXPECT_EQ(row.effect(base, changed), "");
  }
  for (const std::string& key : keys) EXPECT_TRUE(covered.count(key)) << "configs/common key '" << key << "' has no row here";
  fs::remove_all(RunDir());
}

}  // namespace
}  // namespace tessera
