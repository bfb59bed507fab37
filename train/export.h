#pragma once
// `tessera export`: a trained model's weights in Hugging Face's layout, one
// model.safetensors that transformers (and train.load_weight) read, the
// model's Model::HuggingFaceTensors(): GPT-2's as GPT2Model's tensor names,
// c_attn as Conv1D's (C, 3C); BERT's as BertForPreTraining's, Linear
// weights (out, in), query, key and value apart, the tied decoder left out
// (transformers ties it on load). In the checkpoint's dtype, metadata
// {"format": "pt"}. Optimizer state is not exported.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

struct ExportSummary {
  std::filesystem::path checkpoint;  // the checkpoint read
  int64_t tensors = 0;               // Hugging Face tensors written
  int64_t bytes = 0;                 // of tensor data
  std::filesystem::path weights;     // the safetensors file written
  std::filesystem::path config;      // config.json, when exported to a directory
  // A directory export: the run's tokenizer written beside the model
  // (vocab.json + merges.txt, or vocab.txt, and tokenizer_config.json), or
  // why not (`tokenizer_note`: the run named none, or its files are gone).
  std::vector<std::filesystem::path> tokenizer_files;
  std::string tokenizer_note;
};

// `path`: a checkpoint or a training output directory (its latest
// checkpoint). The model is built from the checkpoint's config; a model
// without a Hugging Face counterpart (models.MLP) is FailedPrecondition.
// `output`: a path ending in .safetensors is the weights file; any other is
// a directory (made if missing) that gets model.safetensors and the model's
// transformers config.json (Model::HuggingFaceConfig()), as
// save_pretrained writes them, and the run's tokenizer as a tokenizer's
// save_pretrained writes it (GPT2Tokenizer's vocab.json + merges.txt,
// BertTokenizer's vocab.txt, tokenizer_config.json), its special ids in
// config.json (GPT-2's bos/eos_token_id: <|endoftext|>; BERT's
// pad_token_id: [PAD]). A run without a tokenizer gets none, and GPT-2's
// bos/eos ids are null when the vocabulary has no id 50256 (transformers'
// default). Files are written durably (a temporary name, fsync, rename).
[[nodiscard]] absl::StatusOr<ExportSummary> ExportHuggingFace(const std::filesystem::path& path,
                                                              const std::filesystem::path& output);

}  // namespace tessera
