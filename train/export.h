#pragma once
// `tessera export`: a trained model's weights in Hugging Face's layout, one
// model.safetensors that transformers (and train.load_weight) read, the
// model's Model::HuggingFaceTensors(): GPT-2's as GPT2Model's tensor names,
// c_attn as Conv1D's (C, 3C); BERT's as BertForPreTraining's, Linear
// weights (out, in), query, key and value apart, the tied decoder left out
// (transformers ties it on load). In the checkpoint's dtype, metadata
// {"format": "pt"}. Optimizer state is not exported.

#include <filesystem>

#include <cstdint>

#include "absl/status/statusor.h"

namespace tessera {

struct ExportSummary {
  std::filesystem::path checkpoint;  // the checkpoint read
  int64_t tensors = 0;               // Hugging Face tensors written
  int64_t bytes = 0;                 // of tensor data
  std::filesystem::path weights;     // the safetensors file written
  std::filesystem::path config;      // config.json, when exported to a directory
};

// `path`: a checkpoint or a training output directory (its latest
// checkpoint). The model is built from the checkpoint's config; a model
// without a Hugging Face counterpart (models.MLP) is FailedPrecondition.
// `output`: a path ending in .safetensors is the weights file; any other is
// a directory (made if missing) that gets model.safetensors and the model's
// transformers config.json (Model::HuggingFaceConfig()), as
// save_pretrained writes them. Files are written durably (a temporary name,
// fsync, rename).
[[nodiscard]] absl::StatusOr<ExportSummary> ExportHuggingFace(const std::filesystem::path& path,
                                                              const std::filesystem::path& output);

}  // namespace tessera
