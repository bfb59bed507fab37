#pragma once
// Megatron-LM's memory-mapped indexed dataset (DESIGN §11), byte-exact, so
// files move both ways between Megatron's tools and ours.
//
// PREFIX.idx, all integers little-endian, packed (no alignment padding):
//   offset 0   magic     9 bytes  "MMIDIDX\0\0"
//   offset 9   version   u64      1
//   offset 17  dtype     u8       Megatron's code for the token type (below)
//   offset 18  n         u64      number of sequences
//   offset 26  m         u64      number of document-index entries
//   offset 34  sizes     i32[n]   tokens per sequence
//              pointers  i64[n]   byte offset of each sequence in PREFIX.bin
//              doc_idx   i64[m]   first sequence of each document, then n:
//                                 document d is sequences [doc_idx[d], doc_idx[d+1])
// PREFIX.bin: the sequences' tokens back to back, in order, nothing else.
//
// What we rely on, checked against megatron/core/datasets/indexed_dataset.py
// (class DType, _IndexWriter, _IndexReader):
//   - dtype codes 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//     7 float32, 8 uint16. Only the integer codes are token types; 6 and 7 are
//     refused (older Megatron, megatron/data/indexed_dataset.py, even mapped 7
//     to float64, so a float code is ambiguous besides being meaningless here).
//   - The writer's pointers are the running byte sum of sizes · itemsize, so
//     sequences are contiguous and PREFIX.bin is exactly sum(sizes) · itemsize
//     bytes. We require both: then the token stream of any run of sequences is
//     one slice of PREFIX.bin (GptDataset reads windows straight from it).
//   - doc_idx starts at 0 and ends at n (the builder starts it with 0 and
//     appends the sequence count at each document end); m = documents + 1.
//     Empty documents (repeated entries) are legal.
//   - Multimodal indexes (an i8 mode per sequence after doc_idx) are not
//     supported: their extra bytes fail the size check.
//   - The writer picks uint16 for vocabularies below 65500 tokens, else int32.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::data {

// Megatron's dtype codes for token types (the integer ones).
enum class TokenDtype : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUint16 = 8,
};

// "uint16", "int32", ...
std::string_view TokenDtypeName(TokenDtype dtype);
int64_t TokenDtypeSize(TokenDtype dtype);
// Megatron's choice for a vocabulary of `vocab_size` ids: uint16 below 65500,
// else int32.
TokenDtype TokenDtypeForVocabulary(int64_t vocab_size);

// A read-only view of PREFIX.idx + PREFIX.bin, both memory-mapped. Open checks
// the whole index (magic, version, dtype, counts against both file sizes,
// sizes >= 0, contiguous pointers, doc_idx monotone from 0 to n), so no
// accessor can then read outside the files; an index out of the documented
// range is a caller bug (TESSERA_CHECK). As with any mmap, a file truncated
// by someone else while open raises SIGBUS.
//
// Thread-safe: immutable after Open. Owns its mappings; datasets built on it
// borrow it and must not outlive it.
class IndexedDataset {
 public:
  // Errors are one line naming the file and what is wrong with it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(const std::filesystem::path& prefix);

  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::filesystem::path& prefix() const { return prefix_; }
  TokenDtype dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }

  // Tokens in sequence i, i in [0, num_sequences()).
  int64_t sequence_length(int64_t i) const;
  // Position of sequence i's first token in the token stream (all sequences
  // back to back); i == num_sequences() gives num_tokens().
  int64_t sequence_offset(int64_t i) const;
  // First sequence of document d; d == num_documents() gives num_sequences().
  // Document d is sequences [document_begin(d), document_begin(d + 1)).
  int64_t document_begin(int64_t d) const;

  // Tokens [first, first + out.size()) of the token stream, as int64 whatever
  // the stored dtype. The range must lie inside [0, num_tokens()).
  void ReadTokens(int64_t first, std::span<int64_t> out) const;
  // The tokens of sequence i.
  std::vector<int64_t> Sequence(int64_t i) const;
  // OK when `ids`, tokens [first, first + ids.size()) as ReadTokens gave
  // them, all lie in [0, vocab_size); else an error naming PREFIX.bin, the
  // token, its document and the id (a dataset of another vocabulary: Open
  // cannot tell, the ids are the dataset's business).
  [[nodiscard]] absl::Status CheckIds(int64_t first, std::span<const int64_t> ids, int64_t vocab_size) const;
  // CheckIds over tokens [first, end) of the stream, read in blocks.
  [[nodiscard]] absl::Status CheckIdsIn(int64_t first, int64_t end, int64_t vocab_size) const;
  // DataLoss naming the file when PREFIX.bin or PREFIX.idx is shorter now
  // than when it was opened (truncated, or rewritten in place): reading the
  // mapping past its new end would kill the process (SIGBUS). One fstat
  // each; a reader calls it before each batch.
  [[nodiscard]] absl::Status CheckFilesWhole() const;

 private:
  struct Mapping;
  IndexedDataset() = default;

  std::filesystem::path prefix_;
  std::unique_ptr<Mapping> index_;
  std::unique_ptr<Mapping> data_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  int64_t num_sequences_ = 0;
  int64_t num_documents_ = 0;
  int64_t num_tokens_ = 0;
};

// Writes PREFIX.bin + PREFIX.idx. Tokens go to a temporary file beside
// PREFIX.bin as they come; the per-sequence and per-document index entries are
// spooled to unlinked temporary files, so memory stays bounded (a few buffers)
// whatever the corpus size. Finalize writes the index under a temporary name,
// fsyncs both, removes any old PREFIX.idx, renames PREFIX.bin then PREFIX.idx
// into place and fsyncs the directory: a crash at any point leaves the old
// pair, or a .bin without .idx (which Open rejects), or the new pair, never a
// half-written file under a final name. A builder destroyed before a
// successful Finalize, or after any error, removes its temporary files.
//
// Not thread-safe. Usage: (AddSequence* EndDocument)* Finalize.
class IndexedDatasetBuilder {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>> Create(
      const std::filesystem::path& prefix, TokenDtype dtype);

  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Appends one sequence to the current document. Every token must fit the
  // dtype (otherwise InvalidArgument naming it, and nothing is written: the
  // builder stays usable); a sequence holds at most 2^31 - 1 tokens (the
  // index stores int32 sizes).
  [[nodiscard]] absl::Status AddSequence(std::span<const int64_t> tokens);
  // Closes the current document (an empty one if no sequence was added since
  // the last EndDocument, as Megatron's builder allows).
  [[nodiscard]] absl::Status EndDocument();
  // Closes a document still open, then publishes the files as described
  // above. After it, and after any error, the builder accepts no more calls.
  [[nodiscard]] absl::Status Finalize();

  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_document_entries_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  class SpoolFile;
  IndexedDatasetBuilder() = default;
  absl::Status Fail(absl::Status status);
  absl::Status WriteIndex();
  void RemoveTemporaries();

  std::filesystem::path prefix_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  std::filesystem::path bin_temp_path_;
  std::filesystem::path idx_temp_path_;
  std::unique_ptr<SpoolFile> bin_;
  std::unique_ptr<SpoolFile> sizes_;    // int32 per sequence (unlinked file)
  std::unique_ptr<SpoolFile> doc_idx_;  // int64 per document-index entry (unlinked file)
  std::vector<uint8_t> encode_buffer_;  // one sequence in the dtype, reused
  int64_t num_sequences_ = 0;
  int64_t num_sequences_at_document_start_ = 0;
  int64_t num_document_entries_ = 1;  // the leading 0
  int64_t num_tokens_ = 0;
  absl::Status status_;  // first error; sticky
  bool finished_ = false;
};

// Train / validation / test, in Megatron's order of the `splits` weights.
enum class DatasetSplit { kTrain = 0, kValid = 1, kTest = 2 };
std::string_view DatasetSplitName(DatasetSplit split);

// Documents [begin, end) of an indexed dataset.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The documents of `split` under Megatron's `splits` string ("949,50,1", or
// with '/'; up to three non-negative weights, missing ones 0, sum > 0): the
// boundaries are Megatron's get_train_valid_test_split_ (weights normalised,
// each range round(w · num_documents) with Python's round-half-to-even, the
// rounding excess taken off every boundary), clamped to stay monotone inside
// [0, num_documents]. A malformed string is InvalidArgument quoting it.
[[nodiscard]] absl::StatusOr<DocumentRange> SplitDocuments(std::string_view splits, int64_t num_documents,
                                                           DatasetSplit split);

}  // namespace tessera::data
