#include "data/gpt_dataset.h"

#include "core/status.h"
#include "core/text.h"

namespace tessera::data {

GptDataset::GptDataset(const IndexedDataset* dataset, int64_t seq_length, int64_t vocab_size, DocumentRange documents,
                       int64_t first_token, int64_t num_tokens)
    : dataset_(dataset),
      seq_length_(seq_length),
      vocab_size_(vocab_size),
      documents_(documents),
      first_token_(first_token),
      num_tokens_(num_tokens),
      num_samples_(num_tokens > seq_length ? (num_tokens - 1) / seq_length : 0) {}

absl::StatusOr<GptDataset> GptDataset::Make(const IndexedDataset& dataset, const GptDatasetOptions& options) {
  if (options.seq_length < 1) {
    return absl::InvalidArgumentError(StrCat("GPT dataset: seq_length must be >= 1, got ", options.seq_length));
  }
  ASSIGN_OR_RETURN(const DocumentRange documents,
                   SplitDocuments(options.splits, dataset.num_documents(), options.split));
  const int64_t first_token = dataset.sequence_offset(dataset.document_begin(documents.begin));
  const int64_t end_token = dataset.sequence_offset(dataset.document_begin(documents.end));
  GptDataset result(&dataset, options.seq_length, options.vocab_size, documents, first_token, end_token - first_token);
  if (result.size() == 0) {
    return absl::FailedPreconditionError(
        StrCat("GPT dataset '", dataset.prefix().string(), "': split ", DatasetSplitName(options.split), " (splits '",
               options.splits, "') holds documents [", documents.begin, ", ", documents.end, ") with ",
               result.num_tokens(), " tokens, fewer than one sample of seq_length + 1 = ", options.seq_length + 1));
  }
  return result;
}

absl::Status GptDataset::Sample(int64_t index, std::span<int64_t> out) const {
  if (index < 0 || index >= num_samples_) {
    return absl::OutOfRangeError(StrCat("GPT sample ", index, " is outside [0, ", num_samples_, ")"));
  }
  if (static_cast<int64_t>(out.size()) != sample_length()) {
    return absl::InvalidArgumentError(
        StrCat("GPT sample buffer holds ", out.size(), " tokens, not seq_length + 1 = ", sample_length()));
  }
  dataset_->ReadTokens(first_token_ + index * seq_length_, out);
  if (vocab_size_ > 0) return dataset_->CheckIds(first_token_ + index * seq_length_, out, vocab_size_);
  return absl::OkStatus();
}

}  // namespace tessera::data
