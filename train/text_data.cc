#include "train/text_data.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "data/preprocess.h"
#include "train/dataset_build.h"
#include "train/job_config.h"

namespace tessera {
namespace {

// Datasets being built from text now (BuildingDatasetFromText).
std::atomic<int> building_from_text{0};

// The tokenizer the config names, or null.
absl::StatusOr<std::unique_ptr<data::Tokenizer>> LoadConfiguredTokenizer(const TokenizationConfig& t) {
  if (!t.tokenizer) return std::unique_ptr<data::Tokenizer>();
  ASSIGN_OR_RETURN(const data::TokenizerFiles files, ConfiguredTokenizerFiles(t));
  auto tokenizer = data::LoadTokenizer(files);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(), StrCat("tokenization: ", tokenizer.status().message()));
  }
  return std::move(*tokenizer);
}

// Add-one counts of each label token (tokens 1..T of each window, what the
// model is scored on) of the train windows, and their sum. Reading every
// window, it finds an id outside the vocabulary before training does.
absl::StatusOr<std::pair<std::vector<double>, double>> UnigramCounts(const data::GptDataset& train,
                                                                     int64_t vocab_size) {
  std::vector<double> counts(static_cast<size_t>(vocab_size), 1.0);
  double total = static_cast<double>(vocab_size);
  std::vector<int64_t> window(static_cast<size_t>(train.sample_length()));
  for (int64_t s = 0; s < train.size(); ++s) {
    RETURN_IF_ERROR(train.Sample(s, window));
    for (size_t i = 1; i < window.size(); ++i) counts[static_cast<size_t>(window[i])] += 1, total += 1;
  }
  return std::pair{std::move(counts), total};
}

}  // namespace

bool BuildingDatasetFromText() { return building_from_text.load() > 0; }

absl::StatusOr<std::unique_ptr<TextData>> TextData::Open(const nlohmann::json& config,
                                                         const models::Model::TextInputs& inputs,
                                                         const Progress& progress, bool plan_only) {
  using Kind = models::Model::TextInputs::Kind;
  const bool bert = inputs.kind == Kind::kBert;
  ASSIGN_OR_RETURN(const DataloaderConfig loader, DataloaderKeys().Read(config.at("dataloader")));
  ASSIGN_OR_RETURN(const TokenizationConfig tokenization, TokenizationKeys().Read(config.at("tokenization")));
  if (!loader.data_prefix) {
    if (loader.text_file)
      return absl::InvalidArgumentError(
          "dataloader.text_file needs dataloader.data_prefix (where the dataset is written)");
    return std::unique_ptr<TextData>();
  }
  if (bert && tokenization.append_eod.value_or(false)) {
    return absl::InvalidArgumentError(
        "tokenization.append_eod: BERT's samples are sentence pairs without an end-of-document token (leave it null)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer, LoadConfiguredTokenizer(tokenization));
  if (bert && tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "tokenization.tokenizer: models.BERT needs a tokenizer with [CLS], [SEP], [MASK] and [PAD] (`bert`)");
  }
  // (Checked before a dataset is built from text_file: a vocabulary without
  // them left a built dataset behind, and `tessera plan` passed it.)
  std::optional<data::BertSpecialIds> special;
  if (bert) {
    auto ids = data::BertSpecialIds::FromTokenizer(*tokenizer);
    if (!ids.ok()) return absl::Status(ids.status().code(), StrCat("tokenization: ", ids.status().message()));
    special = *ids;
  }
  if (tokenizer != nullptr && tokenizer->vocab_size() > inputs.vocab_size) {
    return absl::InvalidArgumentError(StrCat("tokenization: the ", tokenizer->kind(), " vocabulary has ",
                                             tokenizer->vocab_size(), " tokens, model.vocab_size is only ",
                                             inputs.vocab_size));
  }
  if (tokenizer != nullptr && tokenization.append_eod.value_or(false) && !tokenizer->EndOfDocumentId()) {
    return absl::InvalidArgumentError(StrCat("tokenization.append_eod is true, but the ", tokenizer->kind(),
                                             " vocabulary has no end-of-document token"));
  }
  const std::filesystem::path prefix = ExpandPath(*loader.data_prefix);
  std::error_code ec;
  if ((prefix.extension() == ".bin" || prefix.extension() == ".idx") &&
      !std::filesystem::exists(prefix.string() + ".idx", ec)) {
    // (X.bin for the prefix X: X.bin.idx was looked for, or built.)
    return absl::InvalidArgumentError(StrCat("dataloader.data_prefix ", prefix.string(),
                                             ": give the dataset's prefix, without ", prefix.extension().string(),
                                             " (PREFIX.bin and PREFIX.idx)"));
  }
  if (!std::filesystem::exists(prefix.string() + ".idx", ec) && loader.text_file) {
    if (tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          "dataloader.text_file needs a tokenizer (tokenization.tokenizer) to be preprocessed");
    }
    if (plan_only) {
      // (A directory opens as a stream; a FIFO's open would wait.)
      const std::filesystem::path text = ExpandPath(*loader.text_file);
      std::error_code kind_error;
      std::string why;
      if (!std::filesystem::exists(text, kind_error)) {
        why = "no such file";
      } else if (!std::filesystem::is_regular_file(text, kind_error)) {
        why = "not a regular file";
      } else if (std::ifstream probe(text); !probe) {
        why = std::strerror(errno);
      }
      if (!why.empty()) {
        return absl::InvalidArgumentError(StrCat("dataloader.text_file: cannot read ", text.string(), " (", why,
                                                 ") to build the missing dataset ", prefix.string()));
      }
      return std::unique_ptr<TextData>();
    }
    data::PreprocessOptions options;
    options.inputs = {ExpandPath(*loader.text_file)};
    options.output_prefix = prefix;
    options.append_end_of_document = tokenization.append_eod.value_or(!bert);
    options.split_sentences = bert;
    options.cancelled = [] { return InterruptRequested(); };
    std::filesystem::create_directories(prefix.parent_path(), ec);
    TLOG_INFO("building the dataset {} from {}", prefix.string(), options.inputs[0].string());
    building_from_text.fetch_add(1);
    auto stats = data::Preprocess(options, *tokenizer, progress);
    building_from_text.fetch_sub(1);
    if (!stats.ok())
      return absl::Status(stats.status().code(), StrCat("dataloader.text_file: ", stats.status().message()));
  }
  // What the dataset was built from (Preprocess's PREFIX.source.json; other
  // tools' datasets have none): ids of another vocabulary would be read as
  // this one's tokens, and a text_file other than the dataset's would not
  // be read at all, both without a word.
  ASSIGN_OR_RETURN(const std::optional<data::DatasetSource> source, data::ReadDatasetSource(prefix));
  if (source && tokenizer != nullptr && source->tokenizer != data::TokenizerFingerprint(*tokenizer)) {
    const std::string ours = data::TokenizerDescription(*tokenizer);
    return absl::InvalidArgumentError(StrCat(
        "dataloader.data_prefix ", prefix.string(), " was built with another vocabulary (",
        source->tokenizer_description, ") than tokenization.tokenizer's (", ours,
        ours == source->tokenizer_description ? ": the same size, but its tokens, merges or casing differ"
        : ours + ", uncased" == source->tokenizer_description || source->tokenizer_description + ", uncased" == ours
            ? ": only the casing differs, tokenization.lower_case"
            : "",
        "): rebuild it with this tokenizer (`tessera preprocess`, or remove ", prefix.string(), ".bin and ",
        prefix.string(), ".idx and set dataloader.text_file), or set the data_prefix built with it"));
  }
  if (loader.text_file) {
    // A dataset's own file named as its text: never a text to rebuild from.
    if (absl::Status distinct = data::CheckInputsAreNotOutputs({ExpandPath(*loader.text_file)}, prefix);
        !distinct.ok()) {
      return absl::InvalidArgumentError(
          StrCat("dataloader.text_file: ", distinct.message(), ": name the text the dataset is built from"));
    }
  }
  if (source && loader.text_file) {
    std::error_code canonical_ec;
    const std::filesystem::path wanted = std::filesystem::weakly_canonical(
        std::filesystem::absolute(ExpandPath(*loader.text_file), canonical_ec), canonical_ec);
    // (Where it was, or where it now lies beside the dataset: a dataset
    // moved with its text was refused as built from another file.)
    const auto same = [&](const std::filesystem::path& input) {
      std::error_code same_ec;
      return !input.empty() && (input == wanted || std::filesystem::equivalent(input, wanted, same_ec));
    };
    const bool built_from = std::any_of(source->inputs.begin(), source->inputs.end(), same) ||
                            std::any_of(source->inputs_from_dataset.begin(), source->inputs_from_dataset.end(), same);
    if (!canonical_ec && !built_from) {
      std::vector<std::string> names;
      for (const auto& input : source->inputs) names.push_back(input.string());
      return absl::InvalidArgumentError(StrCat("dataloader.text_file ", wanted.string(), " is not what the dataset ",
                                               prefix.string(), " was built from (", absl::StrJoin(names, ", "),
                                               "): to train on the dataset as it is, set "
                                               "dataloader.text_file=null; to rebuild it from the text_file, remove ",
                                               prefix.string(), ".bin and ", prefix.string(),
                                               ".idx, or set another dataloader.data_prefix"));
    }
  }
  if (source && tokenizer == nullptr && source->vocab_size > inputs.vocab_size) {
    return absl::InvalidArgumentError(StrCat("dataloader.data_prefix ", prefix.string(), " holds ids of a ",
                                             source->tokenizer_description, " vocabulary; model.vocab_size is only ",
                                             inputs.vocab_size));
  }
  if (source && bert && !source->split_sentences) {
    return absl::InvalidArgumentError(
        StrCat("dataloader.data_prefix ", prefix.string(),
               " holds whole documents as one sequence: models.BERT pairs sentences (build it with `tessera preprocess "
               "--split-sentences`, or from dataloader.text_file under another data_prefix)"));
  }
  if (source && bert && source->end_of_document) {
    // (Its samples would read the end-of-document [SEP] as text: "... [SEP] [SEP]".)
    return absl::InvalidArgumentError(
        StrCat("dataloader.data_prefix ", prefix.string(),
               " ends each document with an end-of-document token: models.BERT pairs sentences without one (build it "
               "again with `tessera preprocess --split-sentences`, or from dataloader.text_file under another "
               "data_prefix)"));
  }
  // append_eod only shapes a dataset being built: one that says otherwise
  // of an existing dataset would be a key doing nothing.
  if (source && tokenization.append_eod && *tokenization.append_eod != source->end_of_document) {
    return absl::InvalidArgumentError(StrCat("tokenization.append_eod is ", *tokenization.append_eod ? "true" : "false",
                                             ", but the dataset ", prefix.string(), " was built ",
                                             source->end_of_document ? "with" : "without",
                                             " end-of-document tokens (it only applies when a dataset is built: "
                                             "rebuild it, or leave the key null)"));
  }
  if (loader.text_file) {
    // text_file only builds a missing dataset: one edited (or replaced)
    // since is not read, which a user changing it would not expect unsaid.
    const std::filesystem::path text = ExpandPath(*loader.text_file);
    std::error_code text_ec, idx_ec;
    const auto text_time = std::filesystem::last_write_time(text, text_ec);
    const auto idx_time = std::filesystem::last_write_time(prefix.string() + ".idx", idx_ec);
    // Once per process (a job opens its data for the master's checks, the
    // training and the evaluation).
    static absl::Mutex warned_mu;
    static auto* warned = new std::set<std::string>();
    const auto first_time = [&] {
      absl::MutexLock lock(&warned_mu);
      return warned->insert(prefix.string()).second;
    };
    if (!text_ec && !idx_ec && text_time > idx_time && first_time()) {
      TLOG_WARN(
          "dataloader.text_file {} is newer than the dataset {}: training on the dataset as it is (if the text "
          "changed since it was built, remove {}.bin and {}.idx to rebuild it)",
          text.string(), prefix.string(), prefix.string(), prefix.string());
    }
  }
  auto dataset = data::IndexedDataset::Open(prefix);
  if (!dataset.ok()) {
    if (dataset.status().code() == absl::StatusCode::kNotFound && !loader.text_file) {
      return absl::NotFoundError(StrCat("dataloader.data_prefix: ", dataset.status().message(),
                                        " (build it with `tessera preprocess`, or set dataloader.text_file)"));
    }
    return absl::Status(dataset.status().code(), StrCat("dataloader.data_prefix: ", dataset.status().message()));
  }
  std::unique_ptr<TextData> text(new TextData);
  text->inputs_ = inputs;
  text->dataset_ = *std::move(dataset);
  const data::IndexedDataset& indexed = *text->dataset_;
  const auto in_dataloader = [](const absl::Status& status) {
    return absl::Status(status.code(), StrCat("dataloader: ", status.message()));
  };
  int64_t train_size = 0;
  if (bert) {
    data::BertDatasetOptions options{.max_seq_length = inputs.seq_length,
                                     .short_seq_prob = inputs.short_seq_prob,
                                     .masked_lm_prob = inputs.masked_lm_prob,
                                     .max_predictions_per_seq = inputs.max_predictions_per_seq,
                                     .seed = static_cast<uint64_t>(loader.seed),
                                     .splits = loader.splits,
                                     .split = data::DatasetSplit::kTrain,
                                     .special_ids = *special,
                                     .vocab_size = tokenizer->vocab_size(),
                                     .next_sentence = inputs.next_sentence};
    auto train = data::BertDataset::Make(indexed, options);
    if (!train.ok()) return in_dataloader(train.status());
    text->bert_train_ = *std::move(train);
    options.split = data::DatasetSplit::kValid;
    if (auto made = data::BertDataset::Make(indexed, options); made.ok()) text->bert_valid_ = *std::move(made);
    train_size = text->bert_train_->size();
    // Every id inside the tokenizer's vocabulary, checked once at the start
    // (a sample reads a few sentences of the corpus, drawn at random: one
    // bad sentence was met by chance, or never).
    if (absl::Status ids =
            plan_only ? absl::OkStatus() : indexed.CheckIdsIn(0, indexed.num_tokens(), tokenizer->vocab_size());
        !ids.ok()) {
      return in_dataloader(ids);
    }
  } else {
    data::GptDatasetOptions options{.seq_length = inputs.seq_length,
                                    .splits = loader.splits,
                                    .split = data::DatasetSplit::kTrain,
                                    .vocab_size = inputs.vocab_size};
    auto train = data::GptDataset::Make(indexed, options);
    if (!train.ok()) return in_dataloader(train.status());
    text->gpt_train_ = *std::move(train);
    options.split = data::DatasetSplit::kValid;
    if (auto made = data::GptDataset::Make(indexed, options); made.ok()) text->gpt_valid_ = *std::move(made);
    train_size = text->gpt_train_->size();
    if (text->gpt_valid_ && !plan_only) {
      auto counts = UnigramCounts(*text->gpt_train_, inputs.vocab_size);
      if (!counts.ok()) return in_dataloader(counts.status());
      // And the valid split's (an evaluation met them after training).
      const data::DocumentRange valid = text->gpt_valid_->documents();
      if (absl::Status ids =
              indexed.CheckIdsIn(indexed.sequence_offset(indexed.document_begin(valid.begin)),
                                 indexed.sequence_offset(indexed.document_begin(valid.end)), inputs.vocab_size);
          !ids.ok()) {
        return in_dataloader(ids);
      }
      std::tie(text->unigram_counts_, text->unigram_total_) = *std::move(counts);
    }
  }
  text->sampler_.emplace(train_size, static_cast<uint64_t>(loader.seed), /*shuffle=*/true);
  text->tokenizer_ = std::move(tokenizer);
  return text;
}

std::optional<double> TextData::unigram_valid_loss(int64_t samples) const {
  if (!gpt_valid_ || unigram_counts_.empty()) return std::nullopt;
  absl::MutexLock lock(&unigram_mu_);
  if (auto known = unigram_losses_.find(samples); known != unigram_losses_.end()) return known->second;
  // (As Fill: a dataset truncated under the run is not read, where the
  // read would kill the process. The baseline is then left out.)
  if (!dataset_->CheckFilesWhole().ok()) return std::nullopt;
  const int64_t vocab_size = static_cast<int64_t>(unigram_counts_.size());
  std::vector<int64_t> window(static_cast<size_t>(gpt_valid_->sample_length()));
  double loss = 0;
  int64_t n = 0;
  for (int64_t s = 0; s < std::min(samples, gpt_valid_->size()); ++s) {
    if (!gpt_valid_->Sample(s, window).ok()) continue;
    for (size_t i = 1; i < window.size(); ++i) {
      const double c = window[i] >= 0 && window[i] < vocab_size ? unigram_counts_[static_cast<size_t>(window[i])] : 1.0;
      loss -= std::log(c / unigram_total_);
      ++n;
    }
  }
  return unigram_losses_[samples] = n > 0 ? std::optional<double>(loss / static_cast<double>(n)) : std::nullopt;
}

int64_t TextData::train_samples() const { return gpt_train_ ? gpt_train_->size() : bert_train_->size(); }

int64_t TextData::valid_samples() const {
  if (gpt_valid_) return gpt_valid_->size();
  return bert_valid_ ? bert_valid_->size() : 0;
}

absl::Status TextData::Fill(bool train, const std::function<int64_t(int64_t)>& sample_of_row, std::string_view input,
                            const Tensor& out) const {
  // (A dataset truncated under the run: said, where reading it would have
  // killed the process, a cluster's worker with it.)
  if (absl::Status whole = dataset_->CheckFilesWhole(); !whole.ok()) {
    return absl::Status(whole.code(), StrCat("dataloader.data_prefix: ", whole.message()));
  }
  if (gpt_train_) return FillGpt(train ? *gpt_train_ : *gpt_valid_, sample_of_row, input, out);
  return FillBert(train ? *bert_train_ : *bert_valid_, sample_of_row, input, out);
}

absl::Status TextData::FillGpt(const data::GptDataset& split, const std::function<int64_t(int64_t)>& sample_of_row,
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

absl::Status TextData::FillBert(const data::BertDataset& split, const std::function<int64_t(int64_t)>& sample_of_row,
                                std::string_view input, const Tensor& out) const {
  const int64_t T = inputs_.seq_length, P = inputs_.max_predictions_per_seq;
  // What each input is: its dtype and shape after the rows.
  struct Layout {
    std::string_view name;
    DType dtype;
    std::vector<int64_t> dims;
  };
  const Layout layouts[] = {{"input_ids", DType::kI64, {T}},           {"token_type_ids", DType::kI64, {T}},
                            {"attention_mask", DType::kI64, {T}},      {"masked_lm_positions", DType::kF32, {P, T}},
                            {"masked_lm_labels", DType::kI64, {P}},    {"masked_lm_weights", DType::kF32, {P}},
                            {"masked_lm_mean_count", DType::kF32, {}}, {"next_sentence_labels", DType::kI64, {}}};
  const Layout* layout = nullptr;
  for (const Layout& l : layouts) {
    if (l.name == input) layout = &l;
  }
  if (layout == nullptr) return absl::NotFoundError(StrCat("BERT text data has no input '", input, "'"));
  std::vector<int64_t> want = {out.shape().rank() > 0 ? out.shape()[0] : 0};
  want.insert(want.end(), layout->dims.begin(), layout->dims.end());
  if (out.dtype() != layout->dtype || out.shape() != Shape(want)) {
    return absl::InvalidArgumentError(StrCat("BERT text data: input '", input, "' must be ", DTypeName(layout->dtype),
                                             " ", Shape(want).ToString(), ", got ", out.meta().ToString()));
  }
  const int64_t rows = want[0];
  int64_t row_size = 1;
  for (int64_t d : layout->dims) row_size *= d;
  if (layout->dtype == DType::kF32) {
    std::fill_n(out.data<float>(), rows * row_size, 0.0f);
  } else {
    std::fill_n(out.data<int64_t>(), rows * row_size, int64_t{0});
  }
  // The used slots of a sample: its masked positions, at most P (the
  // dataset was told max_predictions_per_seq = P).
  const auto slots = [&](const data::BertSample& sample) {
    int64_t used = 0;
    for (int64_t t = 0; t < T && used < P; ++t) used += sample.labels[static_cast<size_t>(t)] != data::kBertIgnoreLabel;
    return used;
  };
  data::BertSample sample;
  if (input == "masked_lm_mean_count") {
    // `out` holds the whole batch (every micro-batch's rows): each row gets
    // the batch's used slots over its rows.
    int64_t used = 0;
    for (int64_t row = 0; row < rows; ++row) {
      RETURN_IF_ERROR(split.Sample(sample_of_row(row), &sample));
      used += slots(sample);
    }
    std::fill_n(out.data<float>(), rows, static_cast<float>(static_cast<double>(used) / static_cast<double>(rows)));
    return absl::OkStatus();
  }
  for (int64_t row = 0; row < rows; ++row) {
    RETURN_IF_ERROR(split.Sample(sample_of_row(row), &sample));
    const size_t first = static_cast<size_t>(row * row_size);
    if (input == "input_ids" || input == "token_type_ids" || input == "attention_mask") {
      const std::vector<int64_t>& v = input == "input_ids"        ? sample.tokens
                                      : input == "token_type_ids" ? sample.token_types
                                                                  : sample.padding_mask;
      std::copy(v.begin(), v.end(), out.data<int64_t>() + first);
    } else if (input == "next_sentence_labels") {
      out.data<int64_t>()[row] = sample.nsp_label;
    } else {
      // The masked positions in order fill slots 0, 1, ... (at most P: the
      // dataset was told max_predictions_per_seq = P).
      int64_t slot = 0;
      for (int64_t t = 0; t < T && slot < P; ++t) {
        const int64_t label = sample.labels[static_cast<size_t>(t)];
        if (label == data::kBertIgnoreLabel) continue;
        if (input == "masked_lm_positions") {
          out.data<float>()[first + static_cast<size_t>(slot * T + t)] = 1.0f;
        } else if (input == "masked_lm_labels") {
          out.data<int64_t>()[first + static_cast<size_t>(slot)] = label;
        } else {
          out.data<float>()[first + static_cast<size_t>(slot)] = 1.0f;
        }
        ++slot;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TextData::FillTrain(int64_t iteration, std::string_view input, const Tensor& out) const {
  const int64_t rows = out.shape().rank() > 0 ? out.shape()[0] : 0;
  return Fill(
      /*train=*/true, [&](int64_t row) { return sampler_->SampleAt(iteration * rows + row); }, input, out);
}

absl::Status TextData::FillEval(int64_t first, std::string_view input, const Tensor& out) const {
  const int64_t n = valid_samples();
  if (n == 0)
    return absl::FailedPreconditionError("evaluation: the valid split of dataloader.splits holds no whole sample");
  return Fill(
      /*train=*/false, [&](int64_t row) { return (first % n + row) % n; }, input, out);
}

}  // namespace tessera
