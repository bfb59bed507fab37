#include "data/tokenizer.h"

#include "core/status.h"
#include "core/text.h"
#include "data/gpt2_tokenizer.h"
#include "data/wordpiece_tokenizer.h"

namespace tessera::data {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenizerFiles& files) {
  if (files.kind == "gpt2") {
    ASSIGN_OR_RETURN(std::unique_ptr<Gpt2Tokenizer> tokenizer,
                     Gpt2Tokenizer::Load(files.vocab_file, files.merges_file));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  if (files.kind == "bert") {
    ASSIGN_OR_RETURN(std::unique_ptr<WordPieceTokenizer> tokenizer,
                     WordPieceTokenizer::Load(files.vocab_file, files.lower_case));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  return absl::InvalidArgumentError(StrCat("unknown tokenizer kind '", files.kind,
                                           "'; the kinds are 'gpt2' (encoder.json + vocab.bpe) and 'bert' "
                                           "(vocab.txt)"));
}

}  // namespace tessera::data
