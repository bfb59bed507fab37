#include "train/export.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "core/file_util.h"
#include "core/registry.h"
#include "core/status.h"
#include "core/strings.h"
#include "data/tokenizer.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "train/job_config.h"

namespace tessera {

namespace {

struct ExportedTokenizer {
  std::unique_ptr<data::Tokenizer> tokenizer;
  // Its files and the names save_pretrained gives them.
  std::vector<std::pair<std::filesystem::path, std::string>> files;
  bool lower_case = true;
};

// The run's tokenizer, loaded (so its files are checked); nullopt with
// `note` saying why there is none to export. A malformed tokenization
// section is an error.
absl::StatusOr<std::optional<ExportedTokenizer>> ReadRunTokenizer(const nlohmann::json& config, std::string& note) {
  if (!config.contains("tokenization") || !config["tokenization"].is_object() ||
      config["tokenization"].value("tokenizer", nlohmann::json()).is_null()) {
    note = "no tokenizer: the run named none (tokenization.tokenizer)";
    return std::optional<ExportedTokenizer>();
  }
  absl::StatusOr<TokenizationConfig> t = TokenizationKeys().Read(config["tokenization"]);
  if (!t.ok()) return absl::InvalidArgumentError(StrCat("the run's tokenization: ", t.status().message()));
  absl::StatusOr<data::TokenizerFiles> configured = ConfiguredTokenizerFiles(*t);
  if (!configured.ok()) return absl::InvalidArgumentError(StrCat("the run's ", configured.status().message()));
  const data::TokenizerFiles& files = *configured;
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> loaded = data::LoadTokenizer(files);
  if (!loaded.ok()) {
    note = StrCat("no tokenizer: the run's cannot be read (", loaded.status().message(), ")");
    return std::optional<ExportedTokenizer>();
  }
  ExportedTokenizer out;
  out.tokenizer = *std::move(loaded);
  out.lower_case = files.lower_case;
  if (files.kind == "gpt2") {
    out.files = {{files.vocab_file, "vocab.json"}, {files.merges_file, "merges.txt"}};
  } else {
    out.files = {{files.vocab_file, "vocab.txt"}};
  }
  return std::optional<ExportedTokenizer>(std::move(out));
}

}  // namespace

absl::StatusOr<ExportSummary> ExportHuggingFace(const std::filesystem::path& path,
                                                const std::filesystem::path& output) {
  absl::StatusOr<std::filesystem::path> resolved = ResolveCheckpoint(path);
  if (!resolved.ok()) {
    // (Its hint offers Hugging Face weights, which export does not take.)
    std::string message(resolved.status().message());
    constexpr std::string_view kHint = ", a training output directory or Hugging Face weights (a .safetensors file)";
    if (const size_t at = message.find(kHint); at != std::string::npos) {
      message.replace(at, kHint.size(),
                      " or a training output directory (export writes Hugging Face weights; it "
                      "reads Tessera's checkpoints)");
    }
    return absl::Status(resolved.status().code(), message);
  }
  const std::filesystem::path dir = *resolved;
  ASSIGN_OR_RETURN(const std::shared_ptr<const CheckpointReader> reader, CheckpointReader::Open(dir));
  if (reader->huggingface()) {
    return absl::InvalidArgumentError(StrCat(dir.string(), " already holds Hugging Face weights"));
  }
  const nlohmann::json& config = reader->config();
  if (!config.is_object() || !config.contains("model") || !config["model"].is_object()) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", dir.string(), ": its config has no model section"));
  }
  Registry<models::Model> registry("model");
  RETURN_IF_ERROR(models::RegisterBuiltinModels(registry));
  auto model = registry.Create(config["model"]);
  if (!model.ok()) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", dir.string(), ": ", model.status().message()));
  }
  const std::vector<models::Model::HfTensor> tensors = (*model)->HuggingFaceTensors();
  if (tensors.empty()) {
    return absl::FailedPreconditionError(StrCat("checkpoint ", dir.string(), ": ",
                                                config["model"].value("_target_", std::string("its model")),
                                                " has no Hugging Face layout (models.GPT2 and models.BERT have)"));
  }
  // Every weight of the checkpoint is among them: an index whose config
  // says fewer layers than its tensors hold exported a model cut short,
  // silently. (Its optimizer's states are "<weight>.<state>", the fp16
  // loss scale's "amp.*".)
  {
    std::set<std::string> exported;
    for (const auto& t : tensors) exported.insert(t.name);
    const std::vector<std::string> names = reader->TensorNames();
    const std::set<std::string> all(names.begin(), names.end());
    for (const std::string& name : names) {
      if (exported.contains(name) || name.starts_with("amp.")) continue;
      const size_t dot = name.rfind('.');
      if (dot != std::string::npos && all.contains(name.substr(0, dot))) continue;
      return absl::InvalidArgumentError(StrCat("checkpoint ", dir.string(), ": tensor '", name,
                                               "' is no weight of the model that its index.json's config "
                                               "describes (the two disagree: edited or damaged?)"));
    }
  }
  // Into the checkpoints it comes from (over a rank file or an index), or
  // over its run's config.json (a directory export writes one): the run
  // would be broken by its own export.
  {
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::weakly_canonical(output, ec);
    std::filesystem::path source = std::filesystem::weakly_canonical(dir, ec);
    const bool in_run = source.parent_path().filename() == "checkpoints";
    if (in_run) source = source.parent_path();  // every checkpoint of the run
    const auto inside = [&](const std::filesystem::path& base) {
      return std::mismatch(base.begin(), base.end(), target.begin(), target.end()).first == base.end();
    };
    if (!ec && inside(source)) {
      return absl::InvalidArgumentError(
          StrCat("--output ", output.string(), " is inside the checkpoints of ", dir.string(), ": write it elsewhere"));
    }
    if (!ec && in_run && output.extension() != ".safetensors" && target == source.parent_path()) {
      return absl::InvalidArgumentError(StrCat("--output ", output.string(), " is the training run's own directory (",
                                               "its config.json would be replaced): write it elsewhere"));
    }
  }
  // Inside another training run's checkpoints: files among its
  // checkpoints, which resume, generate and pruning read as theirs.
  {
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::weakly_canonical(output, ec);
    for (std::filesystem::path at = target; !ec && at.has_relative_path(); at = at.parent_path()) {
      std::error_code run_ec;
      if (at.filename() == "checkpoints" && std::filesystem::is_directory(at, run_ec) &&
          std::filesystem::exists(at.parent_path() / "config.json", run_ec)) {
        return absl::InvalidArgumentError(StrCat("--output ", output.string(),
                                                 " is inside the checkpoints of the training run ",
                                                 at.parent_path().string(), ": write the export elsewhere"));
      }
    }
  }
  // Another training run's directory: its config.json would be replaced by
  // a transformers one, which neither --resume nor generate reads.
  if (output.extension() != ".safetensors") {
    std::error_code run_ec;
    if (std::filesystem::is_directory(output / "checkpoints", run_ec)) {
      return absl::InvalidArgumentError(StrCat("--output ", output.string(),
                                               " is a training run's directory (it holds checkpoints/): its "
                                               "config.json would be replaced; write the export elsewhere"));
    }
  }
  ExportSummary summary;
  summary.checkpoint = dir;
  for (const auto& t : tensors) {
    ASSIGN_OR_RETURN(const TensorMeta meta, reader->Meta(t.name));
    summary.bytes += meta.shape.NumElements() * static_cast<int64_t>(DTypeSize(meta.dtype));
  }
  for (const auto& t : tensors) summary.tensors += 1 + static_cast<int64_t>(t.more_parts.size());
  if (output.extension() == ".safetensors") {
    RETURN_IF_ERROR(ExportSafetensors(*reader, tensors, output));
    summary.weights = output;
    return summary;
  }
  // A directory transformers' from_pretrained reads: the weights and the
  // model's config.json, and the run's tokenizer (read first: a run whose
  // tokenization section is malformed writes nothing).
  const std::optional<nlohmann::json> hf_config = (*model)->HuggingFaceConfig();
  if (!hf_config) return absl::InternalError("export: the model has Hugging Face tensors but no config");
  absl::StatusOr<std::optional<ExportedTokenizer>> read_tokenizer = ReadRunTokenizer(config, summary.tokenizer_note);
  if (!read_tokenizer.ok()) {
    return absl::Status(read_tokenizer.status().code(),
                        StrCat("checkpoint ", dir.string(), ": ", read_tokenizer.status().message()));
  }
  const std::optional<ExportedTokenizer> tokenizer = *std::move(read_tokenizer);
  std::error_code ec;
  // The directories this export makes, innermost first (all go again when
  // it fails: `--output a/b/c` left a/b behind).
  std::vector<std::filesystem::path> made;
  for (std::filesystem::path p = output; !p.empty() && !std::filesystem::exists(p, ec); p = p.parent_path()) {
    made.push_back(p);
    if (p == p.parent_path()) break;
  }
  std::filesystem::create_directories(output, ec);
  if (ec || !std::filesystem::is_directory(output)) {
    return absl::InvalidArgumentError(StrCat("--output ", output.string(), ": not a directory that can be made (",
                                             ec ? ec.message() : "a file is there",
                                             "; a .safetensors path writes "
                                             "the weights alone)"));
  }
  // Every file it writes must be writable there before the first is: a
  // failure half-way would leave new weights beside an old config.
  std::vector<std::string> targets = {"model.safetensors", "config.json"};
  if (tokenizer) {
    for (const auto& file : tokenizer->files) targets.push_back(file.second);
    targets.push_back("tokenizer_config.json");
  }
  for (const std::string& name : targets) {
    std::error_code target_ec;
    const std::filesystem::file_status status = std::filesystem::symlink_status(output / name, target_ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
        !std::filesystem::is_symlink(status)) {
      return absl::InvalidArgumentError(
          StrCat("--output ", output.string(), ": ", name, " there is not a file (a directory?): nothing was written"));
    }
  }
  // The files are written into a directory of their own inside `output`,
  // then renamed in: one that cannot be written (a full disk) leaves
  // `output` as it was (it kept new weights beside no config), and a
  // directory this export made goes again.
  const std::filesystem::path staging = output / StrCat(".export.tmp-", ::getpid());
  // A killed export's staging (its process gone) is removed, not left
  // beside the files.
  for (const auto& entry : std::filesystem::directory_iterator(output, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t pid = 0;
    if (name.starts_with(".export.tmp-") && absl::SimpleAtoi(name.substr(12), &pid) && pid > 0 &&
        ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code stale_ec;
      std::filesystem::remove_all(entry.path(), stale_ec);
    }
  }
  std::filesystem::remove_all(staging, ec);
  if (!std::filesystem::create_directory(staging, ec) || ec) {
    return absl::InvalidArgumentError(
        StrCat("--output ", output.string(), ": cannot write into it (", ec ? ec.message() : "exists", ")"));
  }
  const TemporaryFile staging_registered(staging, /*directory=*/true);
  bool committed = false;
  const absl::Cleanup discard = [&] {
    std::error_code cleanup_ec;
    std::filesystem::remove_all(staging, cleanup_ec);
    if (!committed) {
      for (const std::filesystem::path& dir : made) std::filesystem::remove(dir, cleanup_ec);  // (only when empty)
    }
  };
  std::vector<std::string> staged;  // file names, in staging
  // (Each a temporary until renamed in: a Ctrl-C removes them, then the
  // staging directory.)
  std::vector<std::unique_ptr<TemporaryFile>> staged_files;
  const auto stage = [&](const std::string& name) {
    staged.push_back(name);
    staged_files.push_back(std::make_unique<TemporaryFile>(staging / name));
  };
  // Errors name the file as it would have been, not its staging place.
  const auto named = [&](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrReplaceAll(status.message(), {{(staging / "").string(), (output / "").string()}}));
  };
  RETURN_IF_ERROR(named(ExportSafetensors(*reader, tensors, staging / "model.safetensors")));
  stage("model.safetensors");
  summary.weights = output / "model.safetensors";
  nlohmann::json model_config = *hf_config;
  const bool gpt2 = model_config.value("model_type", "") == "gpt2";
  if (tokenizer) {
    // The ids the model's generation config names.
    if (gpt2) {
      const std::optional<int64_t> end = tokenizer->tokenizer->EndOfDocumentId();
      model_config["bos_token_id"] = end ? nlohmann::json(*end) : nlohmann::json();
      model_config["eos_token_id"] = model_config["bos_token_id"];
    } else if (const std::optional<int64_t> pad = tokenizer->tokenizer->SpecialId("[PAD]")) {
      model_config["pad_token_id"] = *pad;
    }
    const int64_t max_length =
        model_config.value(gpt2 ? "n_positions" : "max_position_embeddings", int64_t{gpt2 ? 1024 : 512});
    nlohmann::json tokenizer_config;
    // Special tokens named only where the vocabulary has them (transformers
    // would add a missing one past the model's embedding).
    const auto special = [&](const char* key, const char* token) {
      if (tokenizer->tokenizer->SpecialId(token)) tokenizer_config[key] = token;
    };
    if (tokenizer->tokenizer->kind() == "gpt2") {
      tokenizer_config = {
          {"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", max_length}, {"add_prefix_space", false}};
      for (const char* key : {"bos_token", "eos_token", "unk_token"}) special(key, "<|endoftext|>");
    } else {
      tokenizer_config = {{"tokenizer_class", "BertTokenizer"},
                          {"do_lower_case", tokenizer->lower_case},
                          {"model_max_length", max_length}};
      special("unk_token", "[UNK]");
      special("sep_token", "[SEP]");
      special("pad_token", "[PAD]");
      special("cls_token", "[CLS]");
      special("mask_token", "[MASK]");
    }
    for (const auto& [from, to] : tokenizer->files) {
      ASSIGN_OR_RETURN(const std::string bytes, ReadWholeFile(from));
      RETURN_IF_ERROR(named(WriteFileDurably(staging / to, bytes)));
      stage(to);
      summary.tokenizer_files.push_back(output / to);
    }
    RETURN_IF_ERROR(named(WriteFileDurably(staging / "tokenizer_config.json", tokenizer_config.dump(2) + "\n")));
    stage("tokenizer_config.json");
    summary.tokenizer_files.push_back(output / "tokenizer_config.json");
  }
  if (!tokenizer && gpt2) {
    // transformers' GPT-2 default (50256) names a token only in a
    // vocabulary that has it.
    const nlohmann::json end =
        model_config.value("vocab_size", int64_t{0}) > 50256 ? nlohmann::json(50256) : nlohmann::json();
    model_config["bos_token_id"] = end;
    model_config["eos_token_id"] = end;
  }
  RETURN_IF_ERROR(named(WriteFileDurably(staging / "config.json", model_config.dump(2) + "\n")));
  stage("config.json");
  summary.config = output / "config.json";
  {
    // Every file written: renamed in as one (a signal waits for the last).
    // The files they replace are moved into the staging directory first,
    // and back if any step fails, so a failure leaves `output` as it was
    // (a config.json that could not be replaced stood beside the new
    // weights).
    const DeferTemporarySignals whole;
    std::vector<std::string> set_aside, moved_in;
    const auto old_name = [](const std::string& name) { return StrCat(".old-", name); };
    const auto undo = [&](const std::string& failed, const std::error_code& error) {
      std::error_code undo_ec;
      for (const std::string& name : moved_in) std::filesystem::remove(output / name, undo_ec);
      for (const std::string& name : set_aside)
        std::filesystem::rename(staging / old_name(name), output / name, undo_ec);
      return absl::InternalError(StrCat("cannot move ", failed, " into ", output.string(), ": ", error.message(),
                                        " (nothing there was changed)"));
    };
    for (const std::string& name : staged) {
      std::error_code exists_ec;
      if (!std::filesystem::exists(std::filesystem::symlink_status(output / name, exists_ec))) continue;
      std::filesystem::rename(output / name, staging / old_name(name), ec);
      if (ec) return undo(name, ec);
      set_aside.push_back(name);
    }
    for (const std::string& name : staged) {
      std::filesystem::rename(staging / name, output / name, ec);
      if (ec) return undo(name, ec);
      moved_in.push_back(name);
    }
    committed = true;
    staged_files.clear();
  }
  RETURN_IF_ERROR(SyncPath(output));
  // An earlier export's (or save_pretrained's) tokenizer files this one does
  // not replace would be read as this model's.
  for (const char* name : {"vocab.json", "merges.txt", "vocab.txt", "tokenizer_config.json", "tokenizer.json",
                           "special_tokens_map.json", "added_tokens.json"}) {
    const std::filesystem::path stale = output / name;
    if (std::find(summary.tokenizer_files.begin(), summary.tokenizer_files.end(), stale) !=
        summary.tokenizer_files.end()) {
      continue;
    }
    std::error_code remove_ec;
    if (std::filesystem::is_regular_file(std::filesystem::symlink_status(stale, remove_ec))) {
      std::filesystem::remove(stale, remove_ec);
      if (remove_ec)
        return absl::InternalError(StrCat("cannot remove the stale ", stale.string(), ": ", remove_ec.message()));
    }
  }
  return summary;
}

}  // namespace tessera
