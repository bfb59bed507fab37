#include "train/text_data.h"

#include <cmath>
#include <vector>

#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "data/preprocess.h"
#include "train/job_config.h"

namespace tessera {
namespace {

// The tokenizer the config names, or null.
absl::StatusOr<std::unique_ptr<data::Tokenizer>> LoadConfiguredTokenizer(const TokenizationConfig& t) {
  if (!t.tokenizer) return std::unique_ptr<data::Tokenizer>();
  data::TokenizerFiles files;
  files.kind = *t.tokenizer;
  if (!t.vocab_file)
    return absl::InvalidArgumentError(StrCat("tokenization.vocab_file must be set for tokenizer '", files.kind, "'"));
  files.vocab_file = ExpandPath(*t.vocab_file);
  if (files.kind == "gpt2") {
    if (!t.merges_file) return absl::InvalidArgumentError("tokenization.merges_file must be set for tokenizer 'gpt2'");
    files.merges_file = ExpandPath(*t.merges_file);
  }
  files.lower_case = t.lower_case;
  auto tokenizer = data::LoadTokenizer(files);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(), StrCat("tokenization: ", tokenizer.status().message()));
  }
  return std::move(*tokenizer);
}

// Mean -log p(token) over the valid windows' labels (tokens 1..T of each
// window, what the model is scored on), p counted on the train windows.
double UnigramLoss(const data::GptDataset& train, const data::GptDataset& valid, int64_t vocab_size) {
  std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);  // add-one
  double total = static_cast<double>(vocab_size);
  std::vector<int64_t> window(static_cast<size_t>(train.sample_length()));
  for (int64_t s = 0; s < train.size(); ++s) {
    if (!train.Sample(s, window).ok()) continue;
    for (size_t i = 1; i < window.size(); ++i) {
      if (window[i] >= 0 && window[i] < vocab_size) counts[static_cast<size_t>(window[i])] += 1, total += 1;
    }
  }
  double loss = 0;
  int64_t n = 0;
  for (int64_t s = 0; s < valid.size(); ++s) {
    if (!valid.Sample(s, window).ok()) continue;
    for (size_t i = 1; i < window.size(); ++i) {
      const double c = window[i] >= 0 && window[i] < vocab_size ? counts[static_cast<size_t>(window[i])] : 1.0;
      loss -= std::log(c / total);
      ++n;
    }
  }
  return n > 0 ? loss / static_cast<double>(n) : 0.0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TextData>> TextData::Open(const nlohmann::json& config, int64_t seq_length,
                                                         int64_t vocab_size, const Progress& progress) {
  ASSIGN_OR_RETURN(const DataloaderConfig loader, DataloaderKeys().Read(config.at("dataloader")));
  ASSIGN_OR_RETURN(const TokenizationConfig tokenization, TokenizationKeys().Read(config.at("tokenization")));
  if (!loader.data_prefix) {
    if (loader.text_file)
      return absl::InvalidArgumentError(
          "dataloader.text_file needs dataloader.data_prefix (where the dataset is written)");
    return std::unique_ptr<TextData>();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer, LoadConfiguredTokenizer(tokenization));
  if (tokenizer != nullptr && tokenizer->vocab_size() > vocab_size) {
    return absl::InvalidArgumentError(StrCat("tokenization: the ", tokenizer->kind(), " vocabulary has ",
                                             tokenizer->vocab_size(), " tokens, model.vocab_size is only ",
                                             vocab_size));
  }
  const std::filesystem::path prefix = ExpandPath(*loader.data_prefix);
  std::error_code ec;
  if (!std::filesystem::exists(prefix.string() + ".idx", ec) && loader.text_file) {
    if (tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          "dataloader.text_file needs a tokenizer (tokenization.tokenizer) to be preprocessed");
    }
    data::PreprocessOptions options;
    options.inputs = {ExpandPath(*loader.text_file)};
    options.output_prefix = prefix;
    options.append_end_of_document = tokenization.append_eod;
    std::filesystem::create_directories(prefix.parent_path(), ec);
    TLOG_INFO("building the dataset {} from {}", prefix.string(), options.inputs[0].string());
    auto stats = data::Preprocess(options, *tokenizer, progress);
    if (!stats.ok())
      return absl::Status(stats.status().code(), StrCat("dataloader.text_file: ", stats.status().message()));
  }
  auto dataset = data::IndexedDataset::Open(prefix);
  if (!dataset.ok()) {
    if (dataset.status().code() == absl::StatusCode::kNotFound && !loader.text_file) {
      return absl::NotFoundError(StrCat("dataloader.data_prefix: ", dataset.status().message(),
                                        " (build it with `tessera preprocess`, or set dataloader.text_file)"));
    }
    return absl::Status(dataset.status().code(), StrCat("dataloader.data_prefix: ", dataset.status().message()));
  }
  data::GptDatasetOptions options{
      .seq_length = seq_length, .splits = loader.splits, .split = data::DatasetSplit::kTrain};
  auto train = data::GptDataset::Make(**dataset, options);
  if (!train.ok()) return absl::Status(train.status().code(), StrCat("dataloader: ", train.status().message()));
  std::optional<data::GptDataset> valid;
  options.split = data::DatasetSplit::kValid;
  if (auto made = data::GptDataset::Make(**dataset, options); made.ok()) valid = *std::move(made);
  const data::GlobalSampler sampler(train->size(), static_cast<uint64_t>(loader.seed), /*shuffle=*/true);
  std::unique_ptr<TextData> text(new TextData(*std::move(dataset), *std::move(train), std::move(valid), sampler));
  if (text->valid_) text->unigram_valid_loss_ = UnigramLoss(text->train_, *text->valid_, vocab_size);
  text->tokenizer_ = std::move(tokenizer);
  return text;
}

absl::Status TextData::Fill(const data::GptDataset& split, const std::function<int64_t(int64_t)>& sample_of_row,
                            std::string_view input, const Tensor& out) const {
  int64_t offset = 0;
  if (input == "labels") {
    offset = 1;
  } else if (input != "input_ids") {
    return absl::NotFoundError(StrCat("text data has no input '", input, "' (it feeds input_ids and labels)"));
  }
  const int64_t T = split.seq_length();
  if (out.dtype() != DType::kI64 || out.shape().rank() != 2 || out.shape()[1] != T) {
    return absl::InvalidArgumentError(
        StrCat("text data: input '", input, "' must be i64 (rows, ", T, "), got ", out.meta().ToString()));
  }
  std::vector<int64_t> window(static_cast<size_t>(split.sample_length()));
  int64_t* data = out.data<int64_t>();
  for (int64_t row = 0; row < out.shape()[0]; ++row) {
    RETURN_IF_ERROR(split.Sample(sample_of_row(row), window));
    std::copy(window.begin() + offset, window.begin() + offset + T, data + row * T);
  }
  return absl::OkStatus();
}

absl::Status TextData::FillTrain(int64_t iteration, std::string_view input, const Tensor& out) const {
  const int64_t rows = out.shape().rank() > 0 ? out.shape()[0] : 0;
  return Fill(
      train_, [&](int64_t row) { return sampler_.SampleAt(iteration * rows + row); }, input, out);
}

absl::Status TextData::FillEval(int64_t index, std::string_view input, const Tensor& out) const {
  if (!valid_)
    return absl::FailedPreconditionError("evaluation: the valid split of dataloader.splits holds no whole window");
  const int64_t rows = out.shape().rank() > 0 ? out.shape()[0] : 0;
  const int64_t n = valid_->size();
  return Fill(
      *valid_, [&](int64_t row) { return (index * rows + row) % n; }, input, out);
}

}  // namespace tessera
