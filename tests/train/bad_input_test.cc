// Bad input of every class the hardening issue names, each expecting its own
// error: config files, `_base_` graphs, overrides, and settings that only the
// model and the mesh can judge. Every case goes config -> model -> graph ->
// plan in-process and must end in an error naming the problem, never a crash.
// A sample also goes through the `tessera` binary as a user would: exit code
// 1, exactly one line on stderr, and no output directory left behind.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "core/storage.h"
#include "core/text.h"
#include "nlohmann/json.hpp"
#include "tests/cli_runner.h"
#include "train/checkpoint.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct BadInput {
  std::string name;
  std::string config;                  // a file of configs/, or "file:" + contents of a temporary file
  std::vector<std::string> overrides;
  std::string error;                   // a substring the error must contain
};

const std::string kMlp = "configs/mlp_demo.json";
const std::string kGpt = "configs/gpt2_nano.json";
std::string Base() { return ::tessera::testing::SourcePath(kMlp); }
std::string GptBase() { return ::tessera::testing::SourcePath(kGpt); }

// A temporary config file holding `contents` on top of the MLP demo.
std::string OnMlp(const std::string& body) { return "file:{\"_base_\": \"" + Base() + "\", " + body + "}"; }
std::string OnGpt(const std::string& body) { return "file:{\"_base_\": \"" + GptBase() + "\", " + body + "}"; }

std::vector<BadInput> Cases() {
  // One case per line, as a table (clang-format would spread each over four).
  // clang-format off
  std::vector<BadInput> c = {
      // ---- the JSON boundary: values whose type no code expected, bytes that are not text
      {"betas of strings", kMlp, {R"(optim.betas=["a","b"])"}, "'optim.betas[0]' expects a number in [0, 1), got string \"a\""},
      {"betas of nulls", kMlp, {"optim.betas=[null,null]"}, "'optim.betas[0]' expects a number"},
      {"betas as object", kMlp, {R"(optim.betas={"a":1})"}, "'optim.betas' expects a list of numbers"},
      {"hidden sizes of strings", kMlp, {R"(model.hidden_sizes=["64"])"}, "'model.hidden_sizes[0]' expects an integer"},
      {"hidden sizes nested", kMlp, {"model.hidden_sizes=[[64]]"}, "'model.hidden_sizes[0]' expects an integer"},
      {"invalid UTF-8 value", kMlp, {"train.output_dir=\xff\xfe"}, "not valid UTF-8"},
      {"invalid UTF-8 key", kMlp, {"train.outp\xc3t_dir=x"}, "not valid UTF-8"},
      {"surrogate in value", kMlp, {"train.output_dir=\xed\xa0\x80"}, "not valid UTF-8"},
      {"truncated UTF-8", kMlp, {"train.output_dir=caf\xc3"}, "not valid UTF-8"},
      {"deep override value", kMlp, {"model.hidden_sizes=" + std::string(5000, '[') + std::string(5000, ']')}, "nests deeper than"},
      {"target not a string", kMlp, {"model._target_=3"}, "'model._target_' expects a string"},
      {"target null", kMlp, {"optim._target_=null"}, "'optim._target_' expects a string"},
      {"section replaced by a number", kMlp, {"train.dist=3"}, "'train.dist' expects an object, got integer 3"},
      {"section nulled", kMlp, {"train.train_iter=2", "train=null"}, "'train' expects an object, got null"},
      {"sub-section nulled", kMlp, {"train.dist=null"}, "'train.dist' expects an object, got null"},
      {"section nulled in a file", OnMlp("\"optim\": null"), {}, "'optim' expects an object, got null"},
      {"file with a key twice", OnMlp("\"train\": {\"train_iter\": 2, \"train_iter\": 5}"), {}, "gives key 'train.train_iter' twice in one object"},
      {"file with a section twice", OnMlp("\"optim\": {}, \"optim\": {}"), {}, "gives key 'optim' twice in one object"},
      {"override value with a key twice", kMlp, {R"(train.dist={"data_parallel_size":1,"data_parallel_size":2})"}, "gives key 'data_parallel_size' twice"},
      {"section replaced by a string", kMlp, {"optim=adam"}, "'optim' expects an object, got string \"adam\""},
      {"model replaced by an array", kMlp, {"model=[1]"}, "'model' expects an object, got array [1]"},
      {"key below a leaf", kMlp, {"train.train_iter.x=1"}, "'train.train_iter' is an integer, not an object"},
      {"key below a list", kMlp, {"optim.betas.0=0.5"}, "'optim.betas' is a list of numbers, not an object"},
      {"file with invalid UTF-8", "file:{\"train\": {\"output_dir\": \"\xff\"}}", {}, "ill-formed UTF-8 byte; last read: '\"\\xff'"},
      {"file nesting 10000 deep", "file:{\"a\": " + std::string(10000, '[') + std::string(10000, ']') + "}", {}, "deeper than 32 levels"},
      {"file not an object", "file:[1, 2, 3]", {}, "must hold a JSON object, not an array"},
      {"file empty", "file:", {}, "' is empty"},
      {"file truncated", "file:{\"train\": {\"train_iter\": ", {}, "JSON syntax error"},
      {"file with a NUL", std::string("file:{\"a\": 1}\0{\"b\": 2}", 22), {}, "contains a NUL byte at offset 8"},
      {"base not a string", "file:{\"_base_\": 3}", {}, "_base_ must be a non-empty string or an array of non-empty strings"},
      {"base empty", "file:{\"_base_\": [\"\"]}", {}, "_base_ must be a non-empty string"},
      {"base missing", "file:{\"_base_\": \"no_such_base.json\"}", {}, "names base 'no_such_base.json', which does not exist"},
      {"base is a directory", "file:{\"_base_\": \"/tmp\"}", {}, "is not a regular file"},
      {"base is itself", "file:{\"_base_\": \"self.json\"}", {}, "cycle"},
      // (A file that cannot be read says why: it said only "cannot read".)
      {"file of whitespace", "file:  \n", {}, "' is empty"},
      {"number past a double", kGpt, {"optim.lr=1e309"}, "config key 'optim.lr' (from override 'optim.lr=1e309'): 1e309 is beyond the range of a number"},
      {"number below a double", kGpt, {"optim.weight_decay=1e-400"}, "override 'optim.weight_decay=1e-400': 1e-400 is nonzero but below the smallest a number holds (it would read as 0)"},
      {"number below a double in a file", "file:{\"train\": {\"seed\": 1e-400}}", {}, ":1:20: number 1e-400 is nonzero but below the smallest a number holds"},
      {"base unreadable", "file:{\"_base_\": \"/proc/self/mem\"}", {},
       "config file '/proc/self/mem': cannot read: Input/output error"},
      {"base nested below the top", OnMlp(R"("train": {"_base_": "x.json"})"), {}, "unknown config key 'train._base_'"},

      // ---- sizes that overflow or exceed what one node can hold
      {"seq length 2^62", kGpt, {"model.max_seq_length=4611686018427387904", "model.seq_length=4611686018427387904"},
       "'model.max_seq_length' must be in [1, 16777216], got 4611686018427387904"},
      {"embedding past 2^50 elements", kGpt, {"model.vocab_size=2147483647", "model.hidden_size=1048576"},
       "variable 'wte.weight': f32 tensor: shape (2147483647, 1048576) has more than 2^50 elements"},
      {"tokens past 2^50", kGpt, {"model.max_seq_length=16777216", "model.seq_length=16777216", "train.train_micro_batch_size=2147483647"},
       "graph input 'input_ids': i64 tensor: shape (2147483647, 16777216) has more than 2^50 elements"},
      {"seq length beyond max", kGpt, {"model.seq_length=33"}, "seq_length 33 must be in [1, max_seq_length = 32]"},
      {"vocab 2^63", kGpt, {"model.vocab_size=9223372036854775807"}, "'model.vocab_size' must be in [2, 2147483647]"},
      {"vocab beyond int64", kGpt, {"model.vocab_size=18446744073709551615"}, "'model.vocab_size' expects an integer"},
      {"vocab 1e300", kGpt, {"model.vocab_size=1e300"}, "'model.vocab_size' expects an integer"},
      {"negative hidden", kGpt, {"model.hidden_size=-64"}, "'model.hidden_size' must be in [1, 1048576], got -64"},
      {"zero heads", kGpt, {"model.num_attention_heads=0"}, "'model.num_attention_heads' must be in [1, 1048576], got 0"},
      {"heads not dividing", kGpt, {"model.num_attention_heads=3"}, "hidden_size 64 is not a multiple of num_attention_heads 3"},
      {"fused attention not a bool", kGpt, {"model.fused_attention=1"}, "'model.fused_attention' expects a boolean"},
      {"layers 10^6", kGpt, {"model.num_layers=1000000"}, "'model.num_layers' must be in [1, 1024]"},
      {"successors past vocab", kGpt, {"model.vocab_size=3", "model.markov_successors=4"}, "markov_successors must be in [1, min(vocab_size, 30)]"},
      {"data order without text", kGpt, {"dataloader.seed=5"}, "override 'dataloader.seed=5' sets a key nothing reads without dataloader.data_prefix"},
      {"splits without text", kGpt, {"dataloader.splits=1,1,1"}, "override 'dataloader.splits=1,1,1' sets a key nothing reads without dataloader.data_prefix"},
      {"synthetic data on text", kGpt, {"dataloader.data_prefix=/tmp/x", "model.markov_successors=2"}, "sets a key of the synthetic data, which a run on dataloader.data_prefix does not read"},
      {"huge MLP centres", kMlp, {"model.num_classes=16777216", "model.in_features=16777216"}, "cluster-centre coordinates"},
      {"MLP width 2^40", kMlp, {"model.hidden_sizes=[1099511627776]"}, "'model.hidden_sizes[0]' must be in [1, 16777216]"},
      {"MLP 1000 layers", kMlp, {"model.hidden_sizes=[" + [] {
         std::string s = "1";
         for (int i = 1; i < 1000; ++i) s += ",1";
         return s;
       }() + "]"}, "'model.hidden_sizes' expects at most 256 elements, got 1000"},
      {"micro batch 2^40", kMlp, {"train.train_micro_batch_size=1099511627776"}, "'train.train_micro_batch_size' must be in [1, 2147483647]"},
      {"accumulation 2^40", kMlp, {"train.num_accumulation_steps=1099511627776"}, "'train.num_accumulation_steps' must be in [1, 1048576]"},
      {"global batch negative", kMlp, {"train.num_accumulation_steps=null", "train.global_batch_size=-32"}, "'train.global_batch_size' must be in [1, 2147483647]"},
      {"threads 10^6", kMlp, {"train.dist.intra_op_threads=1000000"}, "'train.dist.intra_op_threads' must be in [1, 1024]"},

      // ---- limits that were aborts (TESSERA_CHECK) reachable from input
      {"1000 data-parallel ranks", kMlp, {"train.dist.data_parallel_size=1000"}, "'train.dist.data_parallel_size' must be in [1, 256], got 1000"},
      {"512 devices", kMlp, {"train.dist.data_parallel_size=32", "train.dist.tensor_parallel_size=16"}, "512 devices, but one node holds at most 256"},
      {"65536 devices", kMlp, {"train.dist.data_parallel_size=256", "train.dist.tensor_parallel_size=256"}, "65536 devices, but one node holds at most 256"},
      {"num_devices 1000", kMlp, {"train.dist.data_parallel_size=null", "train.dist.num_devices=1000"}, "'train.dist.num_devices' must be in [1, 256]"},
      {"more stages than layers", kMlp, {"train.dist.pipeline_parallel_size=4"}, "stages"},

      // ---- storage that grew with a count the user gives
      {"train_iter 10^12", kMlp, {"train.train_iter=1000000000000"}, "'train.train_iter' must be in [1, 4294967295], got 1000000000000"},
      {"train_iter zero", kMlp, {"train.train_iter=0"}, "'train.train_iter' must be in [1, 4294967295], got 0"},
      {"log period zero", kMlp, {"train.log_period=0"}, "'train.log_period' must be >= 1, got 0"},

      // ---- keys in files are checked like overrides
      {"misspelled train key in a file", OnMlp(R"("train": {"train_iters": 1})"), {}, "unknown config key 'train.train_iters' (in "},
      {"misspelled model key in a file", OnMlp(R"("model": {"num_clases": 3})"), {}, "did you mean 'model.num_classes'?"},
      {"misspelled dist key in a file", OnMlp(R"("train": {"dist": {"tensor_paralel_size": 2}})"), {},
       "did you mean 'train.dist.tensor_parallel_size'?"},
      {"misspelled namespace in a file", OnMlp(R"("optimizer": {"lr": 1})"), {}, "unknown config key 'optimizer'"},
      {"key of another model", OnMlp(R"("model": {"num_layers": 2})"), {}, "unknown config key 'model.num_layers'"},
      {"key of another optimizer", OnMlp(R"("optim": {"momentum": 0.9})"), {}, "unknown config key 'optim.momentum'"},
      {"GPT key misspelled", OnGpt(R"("model": {"hiden_size": 32})"), {}, "did you mean 'model.hidden_size'?"},
      {"unknown key override", kMlp, {"train.no_such_key=1"}, "unknown config key 'train.no_such_key' (from override"},
      {"unknown top-level override", kMlp, {"trian.train_iter=1"}, "did you mean 'train.train_iter'?"},
      {"unknown model target", kMlp, {"model._target_=models.Nope"}, "unknown model _target_ 'models.Nope'"},
      {"unknown optimizer", kMlp, {"optim._target_=Adam"}, "did you mean 'AdamW'?"},
      {"unknown schedule", kMlp, {"lr_scheduler._target_=Cosine"}, "unknown lr_scheduler _target_ 'Cosine'"},
      {"no model at all", "file:{\"train\": {}}", {}, "config has no 'model' section, which is required"},
      {"model without target", "file:{\"model\": {\"in_features\": 3}}", {}, "'model._target_' is missing"},

      // ---- wrong types are errors, never the default
      {"weight decay a string in a file", OnMlp(R"("optim": {"weight_decay": "big"})"), {},
       "'optim.weight_decay' expects a number >= 0, got string \"big\" (in "},
      {"weight decay a string", kMlp, {"optim.weight_decay=big"}, "'optim.weight_decay' expects a number >= 0, got string \"big\""},
      {"one beta", kMlp, {"optim.betas=[0.5]"}, "'optim.betas' expects exactly 2 elements, got 1"},
      {"three betas", kMlp, {"optim.betas=[0.5,0.6,0.7]"}, "'optim.betas' expects exactly 2 elements, got 3"},
      {"lr a string", kMlp, {"optim.lr=fast"}, "'optim.lr' expects a number > 0"},
      {"lr a bool", kMlp, {"optim.lr=true"}, "'optim.lr' expects a number > 0, got boolean true"},
      {"iterations a float", kMlp, {"train.train_iter=2.5"}, "'train.train_iter' expects an integer in [1, 4294967295], got number 2.5"},
      {"iterations a string", kMlp, {"train.train_iter=ten"}, "got string \"ten\""},
      {"bool from a number", kGpt, {"model.use_scaled_init_for_output_weights=1"}, "expects a boolean, got integer 1"},
      {"clip a string", kMlp, {"optim.clip_grad_max_norm=none"}, "'optim.clip_grad_max_norm' expects a number > 0 or null"},
      {"not-null key set null", kMlp, {"train.train_micro_batch_size=null"}, "'train.train_micro_batch_size' must not be null"},
      {"output dir empty", kMlp, {"train.output_dir=\"\""}, "'train.output_dir' must not be an empty string"},
      {"device type misspelled", kMlp, {"train.dist.device_type=gpu"}, "must be one of cpu, cuda, got \"gpu\""},
      {"warmup method misspelled", kMlp, {"lr_scheduler.warmup_method=liner"}, "did you mean 'linear'?"},
      {"type error in a base", "file:{\"_base_\": \"" + Base() + "\", \"train\": {\"seed\": \"x\"}}", {}, "'train.seed' expects an integer >= 0"},

      // ---- ranges
      {"negative lr", kMlp, {"optim.lr=-0.01"}, "'optim.lr' must be > 0, got -0.01"},
      {"zero lr", kMlp, {"optim.lr=0"}, "'optim.lr' must be > 0, got 0"},
      {"negative warmup", kMlp, {"train.warmup_ratio=-0.5"}, "'train.warmup_ratio' must be in [0, 1], got -0.5"},
      {"warmup past the end", kMlp, {"train.warmup_ratio=1.5"}, "'train.warmup_ratio' must be in [0, 1], got 1.5"},
      {"beta of one", kMlp, {"optim.betas=[0.9,1.0]"}, "'optim.betas[1]' must be in [0, 1), got 1"},
      {"negative eps", kMlp, {"optim.eps=-1e-8"}, "'optim.eps' must be > 0"},
      {"negative weight decay", kMlp, {"optim.weight_decay=-1"}, "'optim.weight_decay' must be >= 0, got -1"},
      {"zero clip", kMlp, {"optim.clip_grad_max_norm=0"}, "'optim.clip_grad_max_norm' must be > 0"},
      {"momentum one", kMlp, {"optim._target_=SGD", "optim.momentum=1"}, "'optim.momentum' must be in [0, 1), got 1"},
      {"dropout one", kGpt, {"model.output_dropout_prob=1.0"}, "'model.output_dropout_prob' must be in [0, 1), got 1"},
      {"dropout negative", kGpt, {"model.attention_dropout_prob=-0.1"}, "must be in [0, 1), got -0.1"},
      {"epsilon zero", kGpt, {"model.layernorm_epsilon=0"}, "'model.layernorm_epsilon' must be in (0, 1], got 0"},
      {"hidden size fractional", kMlp, {"model.hidden_sizes=[1.5]"}, "'model.hidden_sizes[0]' expects an integer in [1, 16777216], got number 1.5"},
      {"hidden size zero", kMlp, {"model.hidden_sizes=[0]"}, "'model.hidden_sizes[0]' must be in [1, 16777216], got 0"},
      {"one class", kMlp, {"model.num_classes=1"}, "'model.num_classes' must be in [2, 16777216], got 1"},
      {"zero std", kMlp, {"model.cluster_std=0"}, "'model.cluster_std' must be in (0, 1000000], got 0"},
      {"negative seed", kMlp, {"train.seed=-1"}, "'train.seed' must be >= 0, got -1"},
      {"negative model seed", kMlp, {"model.init_seed=-5"}, "'model.init_seed' must be >= 0, got -5"},
      {"warmup factor two", kMlp, {"lr_scheduler.warmup_factor=2"}, "'lr_scheduler.warmup_factor' must be in [0, 1], got 2"},
      {"zero tensor parallel", kMlp, {"train.dist.tensor_parallel_size=0"}, "'train.dist.tensor_parallel_size' must be in [1, 256], got 0"},
      {"zero pipeline", kMlp, {"train.dist.pipeline_parallel_size=-1"}, "'train.dist.pipeline_parallel_size' must be in [1, 256], got -1"},
      {"ZeRO stage 4", kMlp, {"train.zero_optimization.stage=4"}, "'train.zero_optimization.stage' must be in [1, 3], got 4"},
      {"ZeRO stage 0", kMlp, {"train.zero_optimization.stage=0"}, "'train.zero_optimization.stage' must be in [1, 3], got 0"},
      {"ZeRO enabled a string", kMlp, {"train.zero_optimization.enabled=\"yes\""}, "'train.zero_optimization.enabled' expects a boolean"},

      // ---- features that do not exist yet
      {"AMP dtype", kMlp, {"train.amp.dtype=f32"}, "train.amp.dtype"},
      {"AMP zero loss scale", kMlp, {"train.amp.initial_loss_scale=0"}, "'train.amp.initial_loss_scale' must be"},
      {"AMP NaN-like loss scale", kMlp, {"train.amp.initial_loss_scale=1e39"}, "'train.amp.initial_loss_scale' must be"},
      {"AMP growth interval", kMlp, {"train.amp.loss_scale_growth_interval=0"}, "'train.amp.loss_scale_growth_interval' must be"},
      {"activation checkpointing without layers", kMlp, {"train.activation_checkpoint.enabled=true"}, "has no recomputable layers"},
      {"checkpoint period", kMlp, {"train.checkpointer.period=0"}, "train.checkpointer.period"},
      {"checkpoints kept", kMlp, {"train.checkpointer.max_to_keep=0"}, "train.checkpointer.max_to_keep"},
      {"missing weights", kMlp, {"train.load_weight=/nonexistent/iter_0000001"}, "train.load_weight: checkpoint /nonexistent"},
      {"weights from a device", kMlp, {"train.load_weight=/dev/null"},
       "train.load_weight: checkpoint /dev/null: neither a checkpoint directory nor a regular file of weights"},
      {"weights from the root", kMlp, {"train.load_weight=/"}, "train.load_weight: checkpoint /: no index.json"},
      {"evaluation without text", kMlp, {"train.evaluation.enabled=true"}, "train.evaluation.enabled needs text data"},
      {"eval period", kMlp, {"train.evaluation.eval_period=0"}, "train.evaluation.eval_period"},
      {"evaluation only, evaluation off", kMlp, {"train.eval_only=true"}, "train.eval_only evaluates, so it needs train.evaluation.enabled=true"},
      {"evaluation only, a string", kMlp, {"train.eval_only=yes"}, "config key 'train.eval_only' expects a boolean"},
      {"epochs without text", kMlp, {"train.train_epoch=2"}, "train.train_epoch 2 needs text data"},
      {"negative epochs", kMlp, {"train.train_epoch=-1"}, "train.train_epoch"},
      {"start iteration", kMlp, {"train.start_iter=7"}, "is not implemented yet (set train.resume to continue from a checkpoint)"},
      {"negative start iteration", kMlp, {"train.start_iter=-7"}, "is not implemented yet"},
      {"custom stages, too few", kMlp, {"train.dist.custom_pipeline_stage_id=[0,0]"}, "custom_pipeline_stage_id has 2 entries, one per layer is needed: the model has 3 layers"},
      {"custom stages going back", kMlp, {"train.dist.pipeline_parallel_size=2", "train.dist.custom_pipeline_stage_id=[0,1,0]", "train.num_accumulation_steps=2", "train.train_micro_batch_size=8"}, "custom_pipeline_stage_id[2] = 0 comes after stage 1"},
      {"custom stages, a stage empty", kMlp, {"train.dist.pipeline_parallel_size=2", "train.dist.custom_pipeline_stage_id=[0,0,0]", "train.num_accumulation_steps=2", "train.train_micro_batch_size=8"}, "custom_pipeline_stage_id gives stage 1 no layer"},
      {"custom stages, a negative one", kMlp, {"train.dist.custom_pipeline_stage_id=[0,-1,0]"}, "train.dist.custom_pipeline_stage_id"},
      {"custom stages, not a list", kMlp, {"train.dist.custom_pipeline_stage_id=1"}, "train.dist.custom_pipeline_stage_id"},
      {"clipping's 0-norm", kMlp, {"optim.clip_grad_norm_type=0"}, "config key 'optim.clip_grad_norm_type' must be > 0, got 0"},
      {"clipping's negative norm", kMlp, {"optim.clip_grad_norm_type=-2"}, "config key 'optim.clip_grad_norm_type' must be > 0, got -2"},
      {"clipping's norm spelled Infinity", kMlp, {"optim.clip_grad_norm_type=Infinity"}, "config key 'optim.clip_grad_norm_type' expects a number > 0 or \"inf\", got string \"Infinity\""},
      {"clipping's minus infinity", kMlp, {"optim.clip_grad_norm_type=-inf"}, "expects a number > 0 or \"inf\", got string \"-inf\""},
      {"a clipping norm without clipping", kMlp, {"optim.clip_grad_max_norm=null", "optim.clip_grad_norm_type=inf"}, "optim.clip_grad_norm_type inf chooses the norm clipping bounds, but optim.clip_grad_max_norm is null (no clipping)"},
      {"clipping's norm null", kMlp, {"optim.clip_grad_norm_type=null"}, "config key 'optim.clip_grad_norm_type' must not be null"},
      {"dataloader", kMlp, {"dataloader.train=x"}, "unknown config key 'dataloader.train'"},
      {"text data for the MLP", kMlp, {"dataloader.data_prefix=/tmp/x"}, "reads no text data"},
      {"tokenization in a file", OnMlp(R"("tokenization": {"tokenizer": "gpt2"})"), {}, "tokenization.tokenizer: the job has no text data"},
      {"AMP dtype in a file", OnMlp(R"("train": {"amp": {"enabled": true, "dtype": "f8"}})"), {}, "train.amp.dtype"},

      // ---- inconsistent settings
      {"global != micro x acc x dp", kMlp,
       {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16", "train.global_batch_size=32", "train.num_accumulation_steps=2"},
       "train.global_batch_size 32 != train.train_micro_batch_size 16 x train.num_accumulation_steps 2 x 2 data-parallel ranks"},
      {"global batch past 2^31", kGpt, {"train.train_micro_batch_size=100000", "train.num_accumulation_steps=1048576"},
       "train.train_micro_batch_size 100000 x train.num_accumulation_steps 1048576 x 1 data-parallel ranks is more than 2147483647 samples an iteration"},
      {"global not a multiple", kMlp,
       {"train.dist.data_parallel_size=2", "train.train_micro_batch_size=16", "train.global_batch_size=40", "train.num_accumulation_steps=null"},
       "train.global_batch_size 40 is not a multiple of train.train_micro_batch_size 16 x 2 data-parallel ranks"},
      {"pipeline layers wrong", kGpt, {"train.dist.pipeline_parallel_size=2", "train.dist.pipeline_num_layers=100"},
       "train.dist.pipeline_num_layers 100 != the model's 2 layers"},
      {"pipeline layers wrong, one stage", kMlp, {"train.dist.pipeline_num_layers=100"}, "!= the model's 3 layers"},
      {"num_devices contradicts", kMlp, {"train.dist.num_devices=3"}, "train.dist.num_devices 3 != data 1 x tensor 1 x pipeline 1"},
      {"no device count", kMlp, {"train.dist.data_parallel_size=null"}, "set it or train.dist.num_devices"},
      {"amp key with amp off", kMlp, {"train.amp.dtype=fp16"}, "override 'train.amp.dtype=fp16' sets a key nothing reads while train.amp.enabled is false"},
      {"loss scale with bf16", kMlp, {"train.amp.enabled=true", "train.amp.loss_scale_growth_interval=9"}, "read only with train.amp.dtype fp16 (loss scaling), not bf16"},
      {"zero stage with zero off", kMlp, {"train.zero_optimization.stage=2"}, "while train.zero_optimization.enabled is false"},
      {"nesterov without momentum", kMlp, {"optim._target_=SGD", "optim.nesterov=true"},
       "optim.nesterov is true but optim.momentum is 0"},
      {"warmup with a constant lr", kMlp, {"lr_scheduler._target_=ConstantLR", "train.warmup_ratio=0.5"},
       "override 'train.warmup_ratio=0.5' sets a key nothing reads with lr_scheduler._target_ ConstantLR"},
      {"data seed on text", kGpt, {"dataloader.data_prefix=/tmp/x", "model.data_seed=5"}, "override 'model.data_seed=5' sets a key of the synthetic data"},
      {"dropout seed without dropout", kGpt, {"model.embedding_dropout_prob=0", "model.attention_dropout_prob=0", "model.output_dropout_prob=0", "model.dropout_seed=5"},
       "override 'model.dropout_seed=5' sets a key nothing reads: every model.*dropout_prob is 0"},
      {"no-decay mask without decay", kMlp, {"optim.weight_decay=0", "optim.no_decay_norm_and_bias=false"}, "sets a key nothing reads while optim.weight_decay is 0"},
      {"vocabulary without text", kGpt, {"tokenization.vocab_file=/nonexistent"}, "sets a key nothing reads while tokenization.tokenizer is null"},
      {"lower_case for gpt2", kGpt, {"dataloader.data_prefix=/tmp/x", "tokenization.tokenizer=gpt2", "tokenization.lower_case=false"},
       "sets a key nothing reads with tokenization.tokenizer gpt2 (tokenization.lower_case is bert's)"},
      {"warmup shape without warmup", kMlp, {"train.warmup_ratio=0", "lr_scheduler.warmup_factor=0.5"}, "sets a key nothing reads while train.warmup_ratio is 0"},
      {"gamma without milestones", kMlp, {"lr_scheduler._target_=WarmupMultiStepLR", "lr_scheduler.gamma=0.5"}, "sets a key nothing reads while lr_scheduler.milestones is empty"},
      {"optimizer key when evaluating", kGpt, {"train.eval_only=true", "optim.lr=5"}, "override 'optim.lr=5' sets a key nothing reads with train.eval_only"},
      {"optimizer object when evaluating", kGpt, {"train.eval_only=true", R"(optim={"lr": 5})"}, "sets a key nothing reads with train.eval_only"},
      {"activation checkpointing when evaluating", kGpt, {"train.eval_only=true", "train.activation_checkpoint.enabled=true"}, "override 'train.activation_checkpoint.enabled=true' sets a key nothing reads with train.eval_only"},
      {"resume when evaluating", kGpt, {"train.eval_only=true", "train.resume=true"}, "--resume (train.resume) means nothing with train.eval_only"},
      {"loss scale when evaluating", kGpt, {"train.eval_only=true", "train.amp.enabled=true", "train.amp.dtype=fp16", "train.amp.initial_loss_scale=8"},
       "override 'train.amp.initial_loss_scale=8' sets a key nothing reads with train.eval_only"},
      {"init spread with loaded weights", kGpt, {"train.load_weight=/tmp/x", "model.initializer_range=5"},
       "override 'model.initializer_range=5' sets a key nothing reads with train.load_weight"},
      {"scaled init when evaluating", kGpt, {"train.eval_only=true", "model.use_scaled_init_for_output_weights=false"},
       "sets a key nothing reads with train.eval_only (every weight comes from the checkpoint)"},
      {"async compute on cuda", kGpt, {"train.dist.device_type=cuda", "train.dist.async_compute=false"},
       "override 'train.dist.async_compute=false' sets a key nothing reads with train.dist.device_type cuda"},
      {"text file without a dataset", kMlp, {"dataloader.text_file=/nonexistent"}, "dataloader.text_file needs dataloader.data_prefix"},
      {"derived accumulation past its bound", kMlp, {"train.num_accumulation_steps=null", "train.global_batch_size=1073741824", "train.train_micro_batch_size=16"},
       "train.global_batch_size 1073741824 is 67108864 micro-batches of train.train_micro_batch_size 16 x 1 data-parallel ranks, more than the 1048576 train.num_accumulation_steps allows"},
      {"a path longer than any", kMlp, {"train.output_dir=/tmp/" + std::string(5000, 'a')}, "config key 'train.output_dir' is 5005 bytes long, more than 4096 (a path's limit)"},
      {"init seed with loaded weights", kGpt, {"train.load_weight=/tmp/x", "model.init_seed=5"},
       "override 'model.init_seed=5' sets a key nothing reads with train.load_weight (every weight comes from the checkpoint)"},
      {"amp object with amp off", kMlp, {R"(train.amp={"dtype": "fp16"})"}, "sets a key nothing reads while train.amp.enabled is false"},
      {"buckets on one rank", kMlp, {"train.dist.gradient_bucket_mb=5"}, "nothing reads with one data-parallel rank"},
      {"buckets with tensor parallelism", kGpt, {"train.dist.data_parallel_size=2", "train.dist.tensor_parallel_size=2", "train.dist.gradient_bucket_mb=5"},
       "nothing reads with train.dist.tensor_parallel_size > 1"},
      {"buckets with ZeRO", kGpt, {"train.dist.data_parallel_size=2", "train.zero_optimization.enabled=true", "train.dist.gradient_bucket_mb=5"},
       "nothing reads with train.zero_optimization.enabled"},
      {"buckets on derived ranks", kMlp, {"train.dist.data_parallel_size=null", "train.dist.num_devices=2", "train.dist.tensor_parallel_size=2", "train.dist.gradient_bucket_mb=5"},
       "tensor_parallel_size > 1"},
      {"sizes over the devices", kMlp, {"train.dist.data_parallel_size=null", "train.dist.num_devices=4", "train.dist.tensor_parallel_size=8"},
       "parallel sizes data (derived), tensor 8, pipeline 1 do not fit in the world size 4 (train.dist.data_parallel_size, tensor_parallel_size, pipeline_parallel_size, num_devices)"},
      {"more stages than layers", kMlp, {"train.dist.pipeline_parallel_size=4"}, "than layers (3): lower train.dist.pipeline_parallel_size"},
      {"custom stages empty", kMlp, {"train.dist.pipeline_parallel_size=2", "train.dist.custom_pipeline_stage_id=[]"},
       "train.dist.custom_pipeline_stage_id is empty: give one stage per layer (3), or null"},
      {"devices not divisible", kMlp, {"train.dist.data_parallel_size=null", "train.dist.num_devices=3", "train.dist.tensor_parallel_size=2"},
       "3"},
  };
  // clang-format on
  return c;
}

fs::path CaseDir() { return fs::temp_directory_path() / ("tessera_bad_input_" + std::to_string(::getpid())); }

// The config path for a case (writing the temporary file if it has one).
std::string ConfigPath(const BadInput& input) {
  if (input.config.rfind("file:", 0) != 0) return ::tessera::testing::SourcePath(input.config);
  fs::create_directories(CaseDir());
  const fs::path path = CaseDir() / "self.json";  // "self.json" so the self-base case cycles
  std::ofstream(path, std::ios::binary) << input.config.substr(5);
  return path.string();
}

absl::Status RunCase(const BadInput& input) {
  auto config = LoadJobConfig(ConfigPath(input), input.overrides);
  if (!config.ok()) return config.status();
  auto plan = TrainingPlan(*config);
  return plan.status();
}

TEST(BadInput, EveryCaseIsANamedError) {
  const std::vector<BadInput> cases = Cases();
  EXPECT_GE(cases.size(), 100u);
  for (const BadInput& input : cases) {
    SCOPED_TRACE(input.name);
    const absl::Status status = RunCase(input);
    ASSERT_FALSE(status.ok()) << "accepted";
    const std::string message(status.message());
    EXPECT_NE(message.find(input.error), std::string::npos) << "error: " << message << "\nexpected: " << input.error;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "a multi-line error: " << message;
  }
  fs::remove_all(CaseDir());
}

struct Captured {
  int exit_code = -1;
  std::string out, err;
};

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs `tessera train CONFIG OVERRIDES...` without a shell (the overrides
// hold bytes a shell would mangle), stdout and stderr apart.
Captured RunTrain(const std::string& config, const std::vector<std::string>& overrides) {
  fs::create_directories(CaseDir());
  const fs::path out = CaseDir() / "stdout", err = CaseDir() / "stderr";
  std::vector<std::string> args = {TESSERA_BINARY, "train", config};
  args.insert(args.end(), overrides.begin(), overrides.end());
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) std::_Exit(127);
    ::alarm(120);  // a hang fails the case instead of blocking the test
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Captured c;
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.out = Slurp(out);
  c.err = Slurp(err);
  return c;
}

TEST(BadInput, TheCliExitsOneWithOneLineAndNoOutputDirectory) {
  const std::vector<BadInput> cases = Cases();
  int sampled = 0;
  for (size_t i = 0; i < cases.size(); i += 4) {  // every fourth case
    const BadInput& input = cases[i];
    SCOPED_TRACE(input.name);
    const fs::path output_dir = CaseDir() / "output";
    std::vector<std::string> overrides = {"train.output_dir=" + output_dir.string()};
    overrides.insert(overrides.end(), input.overrides.begin(), input.overrides.end());
    const std::string config = ConfigPath(input);
    const Captured r = RunTrain(config, overrides);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
    EXPECT_EQ(r.err.rfind("tessera: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(input.error), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(output_dir)) << "left " << output_dir;
    ++sampled;
  }
  EXPECT_GE(sampled, 25);
  fs::remove_all(CaseDir());
}

// A run that fails once running, before it reports anything (a loss that
// is not finite at its second iteration, 4), resuming in the output_dir of an
// earlier run: that run's config.json, metrics.jsonl and log.txt stay as
// they were (they used to be replaced, the metrics emptied); into a new
// one: nothing. A run from scratch there is refused before it starts (its
// checkpoints would be pruned as older than the earlier run's).
TEST(BadInput, ARunFailingBeforeItsFirstReportLeavesTheOutputDirAsItWas) {
  const fs::path earlier = CaseDir() / "earlier";
  const std::string nano = GptBase();
  const Captured first = RunTrain(nano, {"train.train_iter=2", "train.output_dir=" + earlier.string()});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::map<std::string, std::string> before;
  for (const char* name : {"config.json", "metrics.jsonl", "log.txt"}) before[name] = Slurp(earlier / name);
  ASSERT_FALSE(before["metrics.jsonl"].empty());
  const size_t entries = std::distance(fs::directory_iterator(earlier), fs::directory_iterator());
  const Captured failed = RunTrain(
      nano, {"train.train_iter=4", "train.resume=true", "optim.lr=1e308", "train.output_dir=" + earlier.string()});
  EXPECT_EQ(failed.exit_code, 1) << failed.err;
  // (Counted from 1, as the progress lines: it said 3.)
  EXPECT_NE(failed.err.find("nan at iteration 4"), std::string::npos) << failed.err;
  const Captured afresh = RunTrain(nano, {"train.train_iter=4", "train.output_dir=" + earlier.string()});
  EXPECT_EQ(afresh.exit_code, 1) << afresh.err;
  EXPECT_EQ(afresh.err, "tessera: train.output_dir '" + earlier.string() +
                            "' holds the checkpoints of an earlier run (the newest: iter_0000002): --resume continues "
                            "it; to start afresh, set train.overwrite_output_dir=true (it removes them), or choose "
                            "another train.output_dir\n");
  for (const auto& [name, text] : before) EXPECT_EQ(Slurp(earlier / name), text) << name;
  EXPECT_EQ(std::distance(fs::directory_iterator(earlier), fs::directory_iterator()), entries);  // no events file
  // Told to: it removes them, and its own checkpoints are the ones left.
  const Captured overwriting =
      RunTrain(nano, {"train.train_iter=1", "train.overwrite_output_dir=true", "train.output_dir=" + earlier.string()});
  EXPECT_EQ(overwriting.exit_code, 0) << overwriting.err;
  EXPECT_FALSE(fs::exists(earlier / "checkpoints" / "iter_0000002"));
  EXPECT_TRUE(fs::exists(earlier / "checkpoints" / "iter_0000001" / "index.json"));
  // One that fails before its first checkpoint leaves the earlier ones,
  // set aside: a --resume finds none to mix with the new run's config and
  // metrics (it continued the earlier checkpoint under them), and starts
  // from scratch.
  const Captured failing = RunTrain(nano, {"train.train_iter=3", "train.overwrite_output_dir=true", "optim.lr=1e308",
                                           "train.output_dir=" + earlier.string()});
  EXPECT_EQ(failing.exit_code, 1) << failing.err;
  EXPECT_FALSE(fs::exists(earlier / "checkpoints" / "iter_0000001"));
  EXPECT_TRUE(fs::exists(earlier / "checkpoints" / ".overwritten" / "iter_0000001" / "index.json"));
  const Captured resumed = RunTrain(
      nano, {"train.train_iter=2", "train.log_period=1", "train.resume=true", "train.output_dir=" + earlier.string()});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  {
    std::vector<int64_t> iterations;
    std::istringstream rows(Slurp(earlier / "metrics.jsonl"));
    for (std::string row; std::getline(rows, row);) {
      iterations.push_back(nlohmann::json::parse(row).at("iter").get<int64_t>());
    }
    EXPECT_EQ(iterations, (std::vector<int64_t>{1, 2})) << "the resumed run's rows, from scratch";
  }
  // Moved back by hand, they are checkpoints again.
  fs::rename(earlier / "checkpoints" / ".overwritten" / "iter_0000001", earlier / "checkpoints" / "iter_0000001");
  const Captured from_itself =
      RunTrain(nano, {"train.train_iter=1", "train.overwrite_output_dir=true", "train.output_dir=" + earlier.string(),
                      "train.load_weight=" + (earlier / "checkpoints" / "iter_0000001").string()});
  EXPECT_EQ(from_itself.exit_code, 1) << from_itself.err;
  EXPECT_NE(from_itself.err.find("is among the checkpoints train.overwrite_output_dir removes"), std::string::npos)
      << from_itself.err;
  const Captured contradiction = RunTrain(nano, {"train.train_iter=4", "train.overwrite_output_dir=true",
                                                 "train.resume=true", "train.output_dir=" + earlier.string()});
  EXPECT_EQ(contradiction.exit_code, 1) << contradiction.err;
  EXPECT_NE(contradiction.err.find("train.overwrite_output_dir removes the checkpoints in train.output_dir that "
                                   "train.resume continues from: set one of them"),
            std::string::npos)
      << contradiction.err;
  EXPECT_TRUE(fs::exists(earlier / "checkpoints" / "iter_0000001" / "index.json"));

  const fs::path fresh = CaseDir() / "fresh";
  const Captured failed_fresh =
      RunTrain(nano, {"train.train_iter=2", "optim.lr=1e308", "train.output_dir=" + fresh.string()});
  EXPECT_EQ(failed_fresh.exit_code, 1) << failed_fresh.err;
  EXPECT_FALSE(fs::exists(fresh));
  // Its checkpoints/ unwritable (here: a file): refused before training,
  // not after it.
  const fs::path blocked = CaseDir() / "blocked";
  fs::create_directories(blocked);
  std::ofstream(blocked / "checkpoints") << "a file";
  const Captured refused = RunTrain(nano, {"train.train_iter=2", "train.output_dir=" + blocked.string()});
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("is not a directory"), std::string::npos) << refused.err;
  EXPECT_EQ(refused.out, "");  // no iteration trained
  // An earlier run's best checkpoint alone is as much an earlier run's.
  const fs::path best_only = CaseDir() / "best_only";
  fs::create_directories(best_only / "checkpoints");
  fs::copy(earlier / "checkpoints" / "iter_0000001", best_only / "checkpoints" / "best", fs::copy_options::recursive);
  const Captured over_best = RunTrain(nano, {"train.train_iter=1", "train.output_dir=" + best_only.string()});
  EXPECT_EQ(over_best.exit_code, 1) << over_best.err;
  EXPECT_NE(over_best.err.find("holds the best checkpoint of an earlier run"), std::string::npos) << over_best.err;
  EXPECT_TRUE(fs::exists(best_only / "checkpoints" / "best" / "index.json"));
  // So with --resume, which finds nothing to continue (it was told only
  // that the directory held the best checkpoint).
  const Captured resume_best =
      RunTrain(nano, {"train.train_iter=1", "train.output_dir=" + best_only.string(), "train.resume=true"});
  EXPECT_EQ(resume_best.exit_code, 1) << resume_best.err;
  EXPECT_NE(resume_best.err.find("train.resume: no checkpoints/iter_* to continue, and train.output_dir"),
            std::string::npos)
      << resume_best.err;
  EXPECT_TRUE(fs::exists(best_only / "checkpoints" / "best" / "index.json"));
  fs::remove_all(CaseDir());
}

// A directory another run writes (here: claimed by this process, as a
// running `tessera train` or master claims its job's) is refused, whatever
// the run would do there, and left as it was; once free, it is used.
TEST(BadInput, AnOutputDirInUseByAnotherRunIsRefused) {
  const std::string nano = ::tessera::testing::SourcePath("configs/gpt2_nano.json");
  const fs::path busy = CaseDir() / "busy";
  {
    absl::StatusOr<DirectoryClaim> claim = DirectoryClaim::Acquire(busy);
    ASSERT_TRUE(claim.ok()) << claim.status();
    for (const std::vector<std::string>& extra :
         {std::vector<std::string>{}, {"train.resume=true"}, {"train.overwrite_output_dir=true"}}) {
      std::vector<std::string> overrides = {"train.train_iter=1", "train.output_dir=" + busy.string()};
      overrides.insert(overrides.end(), extra.begin(), extra.end());
      const Captured r = RunTrain(nano, overrides);
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_EQ(r.err, "tessera: train.output_dir: directory '" + busy.string() +
                           "' is in use by another run (a `tessera train`, or a master's job)\n");
      EXPECT_TRUE(fs::is_empty(busy));
    }
  }
  const Captured free = RunTrain(nano, {"train.train_iter=1", "train.output_dir=" + busy.string()});
  EXPECT_EQ(free.exit_code, 0) << free.err;
  // Its checkpoints are the running run's: that is what is said (not "an
  // earlier run's", to resume or replace).
  absl::StatusOr<DirectoryClaim> claim = DirectoryClaim::Acquire(busy);
  ASSERT_TRUE(claim.ok()) << claim.status();
  for (const char* extra : {"train.train_iter=1", "train.resume=true"}) {
    const Captured r = RunTrain(nano, {extra, "train.output_dir=" + busy.string()});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("is in use by another run"), std::string::npos) << r.err;
  }
  claim->Release();
  fs::remove_all(CaseDir());
}

// A node of an earlier run still writing output_dir/checkpoints (a worker
// that lost its master, here: its claim taken by this process) keeps a new
// run out, which would remove its temporary checkpoints or have its own
// pruned; once it has stopped, the run resumes.
TEST(BadInput, CheckpointsANodeOfAnEarlierRunStillWritesAreLeftAlone) {
  const std::string nano = ::tessera::testing::SourcePath("configs/gpt2_nano.json");
  const fs::path out = CaseDir() / "orphaned";
  const Captured earlier = RunTrain(nano, {"train.train_iter=1", "train.output_dir=" + out.string()});
  ASSERT_EQ(earlier.exit_code, 0) << earlier.err;
  const fs::path temp = CheckpointTempPath(out, 2, "job-000007-1");
  {
    absl::StatusOr<DirectoryClaim> node = ClaimCheckpointsDir(out);
    ASSERT_TRUE(node.ok()) << node.status();
    fs::create_directories(temp);
    for (const char* more : {"train.train_iter=2", "train.train_iter=3"}) {
      const Captured r = RunTrain(nano, {more, "train.resume=true", "train.output_dir=" + out.string()});
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_EQ(r.err, "tessera: train.output_dir: '" + CheckpointsDir(out).string() +
                           "' is still written by a node of an earlier run (a worker that lost its master stops its "
                           "job within seconds): try again once it has stopped\n");
      EXPECT_TRUE(fs::is_directory(temp));
    }
    fs::remove_all(temp);
  }
  const Captured resumed =
      RunTrain(nano, {"train.train_iter=2", "train.resume=true", "train.output_dir=" + out.string()});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_TRUE(fs::exists(CheckpointPath(out, 2) / "index.json"));
  // Its nodes' claims went with it.
  EXPECT_TRUE(DirectoryClaim::CheckUnclaimed(CheckpointsDir(out)).ok());
  fs::remove_all(CaseDir());
}

// A GPU job on a machine without one (on one GPU or over several): one
// line, nothing written.
TEST(BadInput, CudaWithoutAGpuIsOneLineAndLeavesNothing) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "this machine has a GPU";
  const fs::path output_dir = CaseDir() / "output";
  for (const std::string layout : {"train.dist.data_parallel_size=1", "train.dist.tensor_parallel_size=2"}) {
    SCOPED_TRACE(layout);
    const Captured r = RunTrain(::tessera::testing::SourcePath("configs/gpt2_nano.json"),
                                {"train.output_dir=" + output_dir.string(), "train.dist.device_type=cuda", layout});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
    EXPECT_EQ(r.err.rfind("tessera: train.dist.device_type=cuda: ", 0), 0u) << r.err;
    EXPECT_FALSE(fs::exists(output_dir));
  }
  fs::remove_all(CaseDir());
}

}  // namespace
}  // namespace tessera
