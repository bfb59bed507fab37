#pragma once
// `tessera preprocess`: text files -> an indexed dataset (data/indexed_dataset.h).
//
// Input formats (PreprocessOptions::format; kAuto picks kJsonl for names
// ending in ".jsonl" in any case, kParagraphs otherwise):
//   - kParagraphs: a document is a paragraph, i.e. a run of non-blank lines
//     (a blank line is empty or only spaces, tabs and '\r'); its text is its
//     lines joined by '\n'.
//   - kLines: a document is one non-blank line.
//   - kJsonl: every non-blank line is a JSON object; its string field
//     `json_key` ("text") is the document.
// Lines end at '\n'; a trailing '\r' is dropped (CRLF files read like LF
// ones). Every line must be valid UTF-8.
//
// Each document is encoded with the tokenizer, as one sequence, or with
// split_sentences as one sequence per sentence (SplitSentences below), the
// form BertDataset reads. Sentences (and documents) that encode to no tokens
// are dropped, so every stored document and sequence is non-empty. With
// append_end_of_document and a tokenizer that has one, the end-of-document id
// ends each document's last sequence (Megatron's --append-eod; GPT wants it,
// BERT does not). The token dtype is Megatron's choice for the vocabulary
// size (TokenDtypeForVocabulary).
//
// Work: the calling thread reads the inputs in order, cuts them into chunks of
// about chunk_bytes at document boundaries, and hands them to num_threads
// workers that parse and encode; it writes their results in input order. The
// cutting does not depend on the thread count and each chunk's result is a
// pure function of its bytes, so the output is byte-identical for any
// num_threads. Memory is bounded by (2 · num_threads + 1) chunks in flight
// plus their tokens, whatever the input size (a single paragraph longer than
// a chunk is held whole: the tokenizer needs all of it).
//
// The output is written atomically (IndexedDatasetBuilder): on any error
// nothing appears under PREFIX.bin / PREFIX.idx. PREFIX.source.json
// (DatasetSource) follows the pair.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "data/tokenizer.h"

namespace tessera::data {

enum class InputFormat { kAuto, kParagraphs, kLines, kJsonl };

// Whether kAuto reads `input` as kJsonl: its name ends in ".jsonl", in any
// case (".JSONL" too).
bool IsJsonlName(const std::filesystem::path& input);

struct PreprocessOptions {
  std::vector<std::filesystem::path> inputs = {};  // read in this order, one stream
  std::filesystem::path output_prefix = {};        // writes PREFIX.bin and PREFIX.idx
  InputFormat format = InputFormat::kAuto;
  std::string json_key = "text";  // kJsonl: the field holding the document
  bool append_end_of_document = true;
  bool split_sentences = false;
  int num_threads = 0;                     // workers; 0: all hardware threads
  int64_t chunk_bytes = int64_t{4} << 20;  // work unit, cut at document boundaries
  // Asked before each chunk: true stops the build (Cancelled, nothing
  // written, an earlier dataset kept).
  std::function<bool()> cancelled = {};
  // Called at the end of the commit, the dataset's files in place and a
  // Ctrl-C still held back: what belongs with the dataset (bpe:N's learnt
  // vocabulary) is placed in the same commit, never half of it.
  std::function<absl::Status()> commit_also = {};
};

struct PreprocessStats {
  int64_t documents = 0;
  int64_t sequences = 0;
  int64_t tokens = 0;
  int64_t bytes = 0;  // input bytes read
};

// Called on the calling thread after each chunk is written, and once at the
// end with bytes_done == bytes_total (the inputs' sizes summed at the start).
using PreprocessProgress = std::function<void(int64_t bytes_done, int64_t bytes_total)>;

// InvalidArgument naming both when a file the dataset PREFIX writes
// (PREFIX.bin, .idx, .source.json; with `learnt_vocabulary`, bpe:N's
// PREFIX-vocab/encoder.json and vocab.bpe) is one of the inputs (through
// links too): it would overwrite it. Preprocess checks its own outputs.
[[nodiscard]] absl::Status CheckInputsAreNotOutputs(const std::vector<std::filesystem::path>& inputs,
                                                    const std::filesystem::path& output_prefix,
                                                    bool learnt_vocabulary = false);

// Errors name the input file and, where one applies, the 1-based line (for a
// paragraph, its first line): an unreadable file, invalid UTF-8 (with the
// byte's column), invalid JSON or a missing / non-string field on a .jsonl
// line, a tokenizer error. The first error in input order is returned
// whatever the thread count.
[[nodiscard]] absl::StatusOr<PreprocessStats> Preprocess(const PreprocessOptions& options, const Tokenizer& tokenizer,
                                                         const PreprocessProgress& progress = nullptr);

// What tells two vocabularies apart (a dataset's ids mean tokens of the
// vocabulary it was encoded with): the kind, the size, the special ids, the
// ids of a fixed probe text (words, cases, digits, punctuation, spacing,
// accents, CJK, emoji) and the text of every id, hashed. Equal for
// the same vocabulary loaded from anywhere; different, in practice, for
// any two that encode text differently.
std::string TokenizerFingerprint(const Tokenizer& tokenizer);
// For messages: "gpt2, 50257 tokens", "bert, 30522 tokens, uncased".
std::string TokenizerDescription(const Tokenizer& tokenizer);

// What a dataset was built from, written by Preprocess beside it as
// PREFIX.source.json: the inputs (absolute paths and sizes), the tokenizer
// (TokenizerFingerprint, and a description such as "gpt2, 50257 tokens")
// the form (split_sentences, end-of-document ids) and the sizes of the
// PREFIX.bin and PREFIX.idx it describes, the index's modification time
// and its checksum.
// Datasets written by other tools have none.
struct DatasetSource {
  std::vector<std::filesystem::path> inputs;  // absolute, as when it was built
  // The same inputs found from where the dataset is now (by their path
  // relative to its directory when it was built; empty where not known).
  std::vector<std::filesystem::path> inputs_from_dataset;
  std::vector<int64_t> input_bytes;
  std::string tokenizer;              // TokenizerFingerprint
  std::string tokenizer_description;  // for messages
  int64_t vocab_size = 0;
  bool split_sentences = false;  // one sequence per sentence (BERT's form)
  bool end_of_document = false;  // each document ends with the end-of-document id
  int64_t index_bytes = 0;
  int64_t index_mtime_ns = 0;  // Unix time, ns (older descriptions: the file clock's)
  std::string index_checksum;  // XXH3-64 of PREFIX.idx ("": not kept)
  int64_t data_bytes = 0;      // PREFIX.bin's
};

// PREFIX.source.json, where the dataset has one that describes the
// PREFIX.idx there (one left by an earlier dataset, whose index has
// another size, or another time and checksum, is ignored; a copy that did
// not keep the times is known by the index's checksum, which is added to a
// description written before it was kept); nullopt: none. A malformed one
// is InvalidArgument naming it.
[[nodiscard]] absl::StatusOr<std::optional<DatasetSource>> ReadDatasetSource(
    const std::filesystem::path& output_prefix);

// Calls `visit` with the text of every document of options.inputs, in
// order, as Preprocess reads them (format, json_key; the same errors for
// bad UTF-8, JSON or fields, and for a `visit` error, naming the file and
// line), on the calling thread. Reads only: what a vocabulary is learnt
// from (`tessera preprocess --tokenizer bpe:N`), so it sees exactly the
// documents the encoder does.
[[nodiscard]] absl::Status ForEachDocument(const PreprocessOptions& options,
                                           const std::function<absl::Status(std::string_view text)>& visit);

// The rule-based sentence splitter of split_sentences. A sentence ends after
// '.', '!' or '?' (and any closing quotes or brackets right after it) when
// whitespace follows and the next non-whitespace character is not a
// lower-case ASCII letter or a digit; it also ends at a blank line. Sentences are
// returned without surrounding whitespace; empty ones are skipped. It knows
// no abbreviations ("Dr. Smith" splits after "Dr.") and no other scripts'
// sentence marks: good enough for NSP, which only needs plausible segments.
std::vector<std::string_view> SplitSentences(std::string_view text);

}  // namespace tessera::data
