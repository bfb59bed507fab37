#pragma once
// A job's text data (DESIGN §4, §11): the config's `tokenization` and
// `dataloader` made into the batches of a language model
// (models::Model::TextInputs says which kind).
//
// GPT: the training split of the indexed dataset `dataloader.data_prefix`
// is read in windows of T + 1 tokens (data/gpt_dataset.h). Row j of the
// batch: input_ids = window[0, T), labels = window[1, T + 1).
// BERT: samples of data/bert_dataset.h (sentence pairs, masked LM) with the
// model's masking options and the tokenizer's special ids; each sample
// fills input_ids, token_type_ids, attention_mask, masked_lm_positions (a
// one-hot row per masked position, in position order), masked_lm_labels,
// masked_lm_weights and next_sentence_labels (models/bert.h);
// masked_lm_mean_count is, in every row, the used masked-LM slots of all
// the rows filled at once (the iteration's whole batch) over their number.
//
// Either way, global position p = iteration × global_batch + row picks the
// sample through a seeded permutation per epoch (data/sampler.h), so the
// global batch of an iteration holds the same samples in the same order
// under every layout, and a resumed run reads on from where the
// checkpoint's iteration left off. Evaluation reads the valid split in
// order.
//
// When the dataset does not exist and `dataloader.text_file` is set, Open
// builds it once with the job's tokenizer (data/preprocess.h), atomically:
// for BERT one sequence per sentence and no end-of-document token.
//
// Immutable after Open: thread-safe.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/tensor.h"
#include "data/bert_dataset.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "models/model.h"
#include "nlohmann/json.hpp"

namespace tessera {

class TextData {
 public:
  // (bytes done, bytes total) while a dataset is being built.
  using Progress = std::function<void(int64_t, int64_t)>;

  // Null when the config has no text data (dataloader.data_prefix null).
  // `inputs` are the model's; errors name the config key or file at fault
  // (a missing dataset without text_file, a tokenizer larger than the
  // model's vocabulary, a split too small for one sample).
  // `plan_only` (`tessera plan`): a missing dataset dataloader.text_file
  // would build is not built (null, once the text file is found to be a
  // readable file), and no token is read (the run's checks of every id and
  // the unigram baseline's counts): its metadata, splits and sizes only.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TextData>> Open(const nlohmann::json& resolved_config,
                                                                      const models::Model::TextInputs& inputs,
                                                                      const Progress& progress = nullptr,
                                                                      bool plan_only = false);

  // The rows of iteration `iteration`'s global batch (`out`'s first axis:
  // rows = the global batch) for input `input`.
  [[nodiscard]] absl::Status FillTrain(int64_t iteration, std::string_view input, const Tensor& out) const;
  // Rows of the valid split, in order from sample `first` (out's row r is
  // sample (first + r) mod the split's samples: the last batch wraps
  // around). FailedPrecondition when the valid split has no sample.
  [[nodiscard]] absl::Status FillEval(int64_t first, std::string_view input, const Tensor& out) const;

  int64_t train_samples() const;
  // 0 when the valid split is too small for a sample.
  int64_t valid_samples() const;
  // GPT: the mean cross-entropy (nats per token) on the first `samples`
  // windows of the valid split (all of it at most) of a unigram model
  // counted on the train split (add-one smoothed over the model's
  // vocabulary): the baseline an evaluation of those samples is compared
  // with. nullopt without a valid split, and for BERT.
  std::optional<double> unigram_valid_loss(int64_t samples) const;
  // The tokenizer (null when the config names none).
  const data::Tokenizer* tokenizer() const { return tokenizer_.get(); }

 private:
  TextData() = default;
  // Fills `out` row by row with the sample `sample_of_row(row)` of the
  // train or valid split.
  absl::Status Fill(bool train, const std::function<int64_t(int64_t)>& sample_of_row, std::string_view input,
                    const Tensor& out) const;
  absl::Status FillGpt(const data::GptDataset& split, const std::function<int64_t(int64_t)>& sample_of_row,
                       std::string_view input, const Tensor& out) const;
  absl::Status FillBert(const data::BertDataset& split, const std::function<int64_t(int64_t)>& sample_of_row,
                        std::string_view input, const Tensor& out) const;

  models::Model::TextInputs inputs_;
  std::unique_ptr<data::IndexedDataset> dataset_;
  // GPT's splits or BERT's: one pair is set.
  std::optional<data::GptDataset> gpt_train_, gpt_valid_;
  std::optional<data::BertDataset> bert_train_, bert_valid_;
  std::optional<data::GlobalSampler> sampler_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  // The unigram model's add-one counts over the vocabulary, and their sum.
  std::vector<double> unigram_counts_;
  double unigram_total_ = 0;
  // unigram_valid_loss's answers by sample count (every evaluation of a
  // job asks for the same one).
  mutable absl::Mutex unigram_mu_;
  mutable std::map<int64_t, std::optional<double>> unigram_losses_ ABSL_GUARDED_BY(unigram_mu_);
};

}  // namespace tessera
