#pragma once
// A job's text data (DESIGN §4, §11): the config's `tokenization` and
// `dataloader` made into the batches of a language model.
//
// The training split of the indexed dataset `dataloader.data_prefix` is read
// in windows of T + 1 tokens (data/gpt_dataset.h); global position
// p = iteration × global_batch + row picks the window through a seeded
// permutation per epoch (data/sampler.h), so the global batch of an
// iteration holds the same samples in the same order under every layout, and
// a resumed run reads on from where the checkpoint's iteration left off.
// Row j of the batch: input_ids = window[0, T), labels = window[1, T + 1).
// Evaluation reads the valid split in order.
//
// When the dataset does not exist and `dataloader.text_file` is set, Open
// builds it once with the job's tokenizer (data/preprocess.h), atomically.
//
// Immutable after Open: thread-safe.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "nlohmann/json.hpp"

namespace tessera {

class TextData {
 public:
  // (bytes done, bytes total) while a dataset is being built.
  using Progress = std::function<void(int64_t, int64_t)>;

  // Null when the config has no text data (dataloader.data_prefix null).
  // `seq_length` and `vocab_size` are the model's; errors name the config
  // key or file at fault (a missing dataset without text_file, a tokenizer
  // larger than the model's vocabulary, a split too small for one window).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TextData>> Open(const nlohmann::json& resolved_config,
                                                                      int64_t seq_length, int64_t vocab_size,
                                                                      const Progress& progress = nullptr);

  // The rows of iteration `iteration`'s global batch (`out`: i64 (rows, T),
  // rows = the global batch) for input "input_ids" or "labels".
  [[nodiscard]] absl::Status FillTrain(int64_t iteration, std::string_view input, const Tensor& out) const;
  // Evaluation batch `index` (rows = out's rows) from the valid split, in
  // order, wrapping around. FailedPrecondition when the valid split has no
  // whole window.
  [[nodiscard]] absl::Status FillEval(int64_t index, std::string_view input, const Tensor& out) const;

  int64_t train_samples() const { return train_.size(); }
  // 0 when the valid split is too small for a window.
  int64_t valid_samples() const { return valid_ ? valid_->size() : 0; }
  // The mean cross-entropy (nats per token) on the valid split's windows of
  // a unigram model counted on the train split (add-one smoothed over the
  // model's vocabulary): the baseline an evaluation is compared with.
  // nullopt without a valid split.
  std::optional<double> unigram_valid_loss() const { return unigram_valid_loss_; }
  // The tokenizer (null when the config names none).
  const data::Tokenizer* tokenizer() const { return tokenizer_.get(); }

 private:
  TextData(std::unique_ptr<data::IndexedDataset> dataset, data::GptDataset train, std::optional<data::GptDataset> valid,
           data::GlobalSampler sampler)
      : dataset_(std::move(dataset)), train_(std::move(train)), valid_(std::move(valid)), sampler_(sampler) {}
  absl::Status Fill(const data::GptDataset& split, const std::function<int64_t(int64_t)>& sample_of_row,
                    std::string_view input, const Tensor& out) const;

  std::unique_ptr<data::IndexedDataset> dataset_;
  data::GptDataset train_;
  std::optional<data::GptDataset> valid_;
  data::GlobalSampler sampler_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::optional<double> unigram_valid_loss_;
};

}  // namespace tessera
