#pragma once
// `tessera export`: a trained model's weights in Hugging Face's layout, one
// model.safetensors that transformers' GPT2Model / GPT2LMHeadModel (and
// train.load_weight) read: GPT2Model's tensor names, c_attn as Conv1D's
// (C, 3C), f32, metadata {"format": "pt"}. Optimizer state is not exported.

#include <filesystem>

#include <cstdint>

#include "absl/status/statusor.h"

namespace tessera {

struct ExportSummary {
  std::filesystem::path checkpoint;  // the checkpoint read
  int64_t tensors = 0;
  int64_t bytes = 0;  // of tensor data
};

// `path`: a checkpoint or a training output directory (its latest
// checkpoint). The model is built from the checkpoint's config; a model
// without a Hugging Face counterpart (models.MLP) is FailedPrecondition.
// `output` is written durably (a temporary name, fsync, rename).
[[nodiscard]] absl::StatusOr<ExportSummary> ExportHuggingFace(const std::filesystem::path& path,
                                                              const std::filesystem::path& output);

}  // namespace tessera
