#include "train/export.h"

#include <algorithm>

#include "core/file_util.h"
#include "core/registry.h"
#include "core/status.h"
#include "core/strings.h"
#include "models/model.h"
#include "train/checkpoint.h"

namespace tessera {

absl::StatusOr<ExportSummary> ExportHuggingFace(const std::filesystem::path& path,
                                                const std::filesystem::path& output) {
  ASSIGN_OR_RETURN(const std::filesystem::path dir, ResolveCheckpoint(path));
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
  // model's config.json.
  const std::optional<nlohmann::json> hf_config = (*model)->HuggingFaceConfig();
  if (!hf_config) return absl::InternalError("export: the model has Hugging Face tensors but no config");
  std::error_code ec;
  std::filesystem::create_directories(output, ec);
  if (ec || !std::filesystem::is_directory(output)) {
    return absl::InvalidArgumentError(StrCat("--output ", output.string(), ": not a directory that can be made (",
                                             ec ? ec.message() : "a file is there",
                                             "; a .safetensors path writes "
                                             "the weights alone)"));
  }
  summary.weights = output / "model.safetensors";
  RETURN_IF_ERROR(ExportSafetensors(*reader, tensors, summary.weights));
  summary.config = output / "config.json";
  RETURN_IF_ERROR(WriteFileDurably(summary.config, hf_config->dump(2) + "\n"));
  return summary;
}

}  // namespace tessera
