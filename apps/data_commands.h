#pragma once
// The text verbs of the `tessera` binary:
//   tessera preprocess --input FILE... --tokenizer gpt2|bert|bpe:N --output PREFIX
//   tessera tokenize --tokenizer gpt2|bert [--decode] TEXT|-
//   tessera generate CHECKPOINT_OR_OUTPUT_DIR --prompt TEXT [--max-new-tokens N ...]
// Each is a few lines over data/ (data/preprocess.h, data/tokenizer.h,
// data/bpe_trainer.h) and train/generate.h; errors are one line through
// CLI::RuntimeError, as the cluster verbs do.

#include "CLI/CLI.hpp"

namespace tessera {

void AddDataCommands(CLI::App& app);

}  // namespace tessera
