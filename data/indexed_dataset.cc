#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/file_util.h"
#include "core/status.h"
#include "core/text.h"

namespace tessera::data {
namespace fs = std::filesystem;

// The format is little-endian and we read it with plain memcpy.
static_assert(std::endian::native == std::endian::little, "indexed datasets assume a little-endian host");

namespace {

constexpr std::array<char, 9> kMagic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
// Write buffers and read-back blocks: large enough that syscalls are rare.
constexpr size_t kBufferBytes = size_t{1} << 20;

fs::path WithSuffix(const fs::path& prefix, std::string_view suffix) {
  fs::path path = prefix;
  path += std::string(suffix);
  return path;
}

// Fields of the index start at odd offsets (34 + 4n is not 8-aligned), so
// every read goes through memcpy.
template <typename T>
T Load(const uint8_t* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

absl::Status ErrnoError(int error_number, std::string_view action, const fs::path& path) {
  return absl::ErrnoToStatus(error_number, StrCat("cannot ", action, " '", path.string(), "'"));
}

bool IsTokenDtypeCode(uint8_t code) { return (code >= 1 && code <= 5) || code == 8; }

// Stores `tokens` in `dtype` into `out`; the first token that does not fit is
// reported by its index.
absl::Status EncodeTokens(std::span<const int64_t> tokens, TokenDtype dtype, std::vector<uint8_t>& out) {
  const int64_t item = TokenDtypeSize(dtype);
  out.resize(tokens.size() * static_cast<size_t>(item));
  const auto store = [&]<typename T>(T /*tag*/) -> absl::Status {
    for (size_t k = 0; k < tokens.size(); ++k) {
      const int64_t token = tokens[k];
      if (token < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          token > static_cast<int64_t>(std::numeric_limits<T>::max())) {
        return absl::InvalidArgumentError(
            StrCat("token ", token, " (position ", k, " of its sequence) does not fit ", TokenDtypeName(dtype)));
      }
      const T value = static_cast<T>(token);
      std::memcpy(out.data() + k * sizeof(T), &value, sizeof(T));
    }
    return absl::OkStatus();
  };
  switch (dtype) {
    case TokenDtype::kUint8:
      return store(uint8_t{});
    case TokenDtype::kInt8:
      return store(int8_t{});
    case TokenDtype::kInt16:
      return store(int16_t{});
    case TokenDtype::kInt32:
      return store(int32_t{});
    case TokenDtype::kInt64:
      return store(int64_t{});
    case TokenDtype::kUint16:
      return store(uint16_t{});
  }
  TESSERA_CHECK(false, "unknown token dtype ", static_cast<int>(dtype));
  return absl::OkStatus();
}

}  // namespace

std::string_view TokenDtypeName(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return "uint8";
    case TokenDtype::kInt8:
      return "int8";
    case TokenDtype::kInt16:
      return "int16";
    case TokenDtype::kInt32:
      return "int32";
    case TokenDtype::kInt64:
      return "int64";
    case TokenDtype::kUint16:
      return "uint16";
  }
  return "unknown";
}

int64_t TokenDtypeSize(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8:
    case TokenDtype::kInt8:
      return 1;
    case TokenDtype::kInt16:
    case TokenDtype::kUint16:
      return 2;
    case TokenDtype::kInt32:
      return 4;
    case TokenDtype::kInt64:
      return 8;
  }
  TESSERA_CHECK(false, "unknown token dtype ", static_cast<int>(dtype));
  return 0;
}

TokenDtype TokenDtypeForVocabulary(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32;
}

// ---------------------------------------------------------------------------
// Reader

// A read-only private mapping of a whole file; empty files map to nothing.
struct IndexedDataset::Mapping {
  const uint8_t* data = nullptr;
  int64_t size = 0;
  fs::path path;
  // Kept open to see the file shrink under the mapping (IsWhole).
  int fd = -1;

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), static_cast<size_t>(size));
    if (fd >= 0) ::close(fd);
  }

  // OK while the file is at least as long as when it was mapped: a read of
  // a page past a shrunk file's end is SIGBUS, the process killed.
  absl::Status IsWhole() const {
    struct stat info {};
    if (fd < 0 || ::fstat(fd, &info) != 0 || info.st_size >= size) return absl::OkStatus();
    return absl::DataLossError(StrCat("indexed dataset file '", path.string(), "' shrank to ", info.st_size,
                                      " bytes from ", size,
                                      " while it was read (truncated or rewritten in place: "
                                      "replace a dataset by renaming a new one over it, as preprocess does)"));
  }

  static absl::StatusOr<std::unique_ptr<Mapping>> Map(const fs::path& path) {
    // O_NONBLOCK: a FIFO would block the open (it is refused below).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ErrnoError(errno, "open indexed dataset file", path);
    auto mapping = std::make_unique<Mapping>();
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      const int error_number = errno;
      ::close(fd);
      return ErrnoError(error_number, "stat", path);
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(StrCat("indexed dataset file '", path.string(), "' is not a regular file"));
    }
    mapping->size = info.st_size;
    if (mapping->size > 0) {
      void* address = ::mmap(nullptr, static_cast<size_t>(mapping->size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (address == MAP_FAILED) {
        const int error_number = errno;
        ::close(fd);
        return ErrnoError(error_number, "mmap", path);
      }
      mapping->data = static_cast<const uint8_t*>(address);
    }
    mapping->path = path;
    mapping->fd = fd;
    return mapping;
  }
};

IndexedDataset::~IndexedDataset() = default;

absl::Status IndexedDataset::CheckFilesWhole() const {
  RETURN_IF_ERROR(index_->IsWhole());
  return data_->IsWhole();
}

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::Open(const fs::path& prefix) {
  const fs::path idx_path = WithSuffix(prefix, ".idx");
  const fs::path bin_path = WithSuffix(prefix, ".bin");
  std::unique_ptr<IndexedDataset> dataset(new IndexedDataset());
  dataset->prefix_ = prefix;
  if (absl::StatusOr<std::unique_ptr<Mapping>> index = Mapping::Map(idx_path); index.ok()) {
    dataset->index_ = *std::move(index);
  } else if (absl::IsNotFound(index.status()) && (prefix.extension() == ".bin" || prefix.extension() == ".idx")) {
    // (X.bin for the prefix X: it looked for X.bin.idx.)
    return absl::NotFoundError(StrCat(index.status().message(), " (a dataset is named by its prefix, without ",
                                      prefix.extension().string(), ")"));
  } else {
    return index.status();
  }
  ASSIGN_OR_RETURN(dataset->data_, Mapping::Map(bin_path));
  const uint8_t* idx = dataset->index_->data;
  const int64_t idx_size = dataset->index_->size;
  const std::string idx_name = StrCat("index '", idx_path.string(), "'");
  const auto corrupt = [&](const auto&... what) { return absl::DataLossError(StrCat(idx_name, ": ", what...)); };

  if (idx_size < kHeaderBytes) {
    return corrupt("truncated: ", idx_size, " bytes, less than the ", kHeaderBytes, "-byte header");
  }
  if (std::memcmp(idx, kMagic.data(), kMagic.size()) != 0) {
    return corrupt("bad magic: not a Megatron MMIDIDX index");
  }
  const uint64_t version = Load<uint64_t>(idx + 9);
  if (version != kVersion) return corrupt("version ", version, " is not supported (only ", kVersion, ")");
  const uint8_t code = idx[17];
  if (code == 6 || code == 7) {
    return corrupt("dtype code ", code, " is a floating-point type, not a token type");
  }
  if (!IsTokenDtypeCode(code)) return corrupt("unknown dtype code ", code, " (Megatron's codes are 1..8)");
  dataset->dtype_ = static_cast<TokenDtype>(code);
  const uint64_t n = Load<uint64_t>(idx + 18);
  const uint64_t m = Load<uint64_t>(idx + 26);
  // Compare counts with the file size before multiplying, so absurd counts in
  // a corrupt header cannot overflow.
  const uint64_t body = static_cast<uint64_t>(idx_size - kHeaderBytes);
  if (n > body / 12 || m > body / 8 || 12 * n + 8 * m != body) {
    const bool fits = n <= body / 12 && m <= body / 8;
    const uint64_t extra = fits && 12 * n + 8 * m < body ? body - 12 * n - 8 * m : 0;
    // (A multimodal index adds one byte per sequence; 8 bytes too many are
    // one document-index entry the header does not count: its leading 0.)
    return corrupt(idx_size, " bytes do not match its header's ", n, " sequences and ", m, " document-index entries",
                   extra > 0 && extra == n       ? " (a byte more per sequence: multimodal indexes are not supported)"
                   : extra > 0 && extra % 8 == 0 ? StrCat(" (", extra / 8,
                                                          " document-index entries more than the header "
                                                          "counts; the count includes the leading 0)")
                   : extra > 0                   ? StrCat(" (", extra, " bytes more than they take)")
                                                 : std::string());
  }
  if (m == 0) return corrupt("no document-index entries (it needs at least the leading 0)");
  dataset->num_sequences_ = static_cast<int64_t>(n);
  dataset->num_documents_ = static_cast<int64_t>(m) - 1;

  const int64_t item = TokenDtypeSize(dataset->dtype_);
  const uint8_t* sizes = idx + kHeaderBytes;
  const uint8_t* pointers = sizes + 4 * n;
  const uint8_t* documents = pointers + 8 * n;
  const int64_t bin_size = dataset->data_->size;
  int64_t expected_pointer = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t length = Load<int32_t>(sizes + 4 * i);
    if (length < 0) return corrupt("sequence ", i, " has negative length ", length);
    const int64_t pointer = Load<int64_t>(pointers + 8 * i);
    if (pointer != expected_pointer) {
      return corrupt("sequence ", i, " starts at byte ", pointer, ", expected ", expected_pointer,
                     " (sequences are stored back to back)");
    }
    const int64_t bytes = int64_t{length} * item;
    if (expected_pointer > bin_size - bytes) {
      return absl::DataLossError(StrCat("data '", bin_path.string(), "': ", bin_size, " bytes, but index '",
                                        idx_path.string(), "' places sequence ", i, " at bytes [", expected_pointer,
                                        ", ", expected_pointer + bytes, ")"));
    }
    expected_pointer += bytes;
  }
  if (expected_pointer != bin_size) {
    return absl::DataLossError(StrCat("data '", bin_path.string(), "': ", bin_size, " bytes, but index '",
                                      idx_path.string(), "' describes ", expected_pointer, " (",
                                      expected_pointer / item, " ", TokenDtypeName(dataset->dtype_), " tokens)"));
  }
  dataset->num_tokens_ = expected_pointer / item;

  int64_t previous = 0;
  for (uint64_t d = 0; d < m; ++d) {
    const int64_t begin = Load<int64_t>(documents + 8 * d);
    if (d == 0 && begin != 0) return corrupt("document index starts at ", begin, ", not 0");
    if (begin < previous) {
      return corrupt("document index decreases at entry ", d, " (", previous, " then ", begin, ")");
    }
    if (begin > static_cast<int64_t>(n)) {
      return corrupt("document index entry ", d, " is ", begin, ", past the ", n, " sequences");
    }
    previous = begin;
  }
  if (previous != static_cast<int64_t>(n)) {
    return corrupt("document index ends at ", previous, ", not at the sequence count ", n);
  }
  return dataset;
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  TESSERA_CHECK(i >= 0 && i < num_sequences_, "sequence ", i, " of ", num_sequences_);
  return Load<int32_t>(index_->data + kHeaderBytes + 4 * i);
}

int64_t IndexedDataset::sequence_offset(int64_t i) const {
  TESSERA_CHECK(i >= 0 && i <= num_sequences_, "sequence ", i, " of ", num_sequences_);
  if (i == num_sequences_) return num_tokens_;
  return Load<int64_t>(index_->data + kHeaderBytes + 4 * num_sequences_ + 8 * i) / TokenDtypeSize(dtype_);
}

int64_t IndexedDataset::document_begin(int64_t d) const {
  TESSERA_CHECK(d >= 0 && d <= num_documents_, "document ", d, " of ", num_documents_);
  return Load<int64_t>(index_->data + kHeaderBytes + 12 * num_sequences_ + 8 * d);
}

void IndexedDataset::ReadTokens(int64_t first, std::span<int64_t> out) const {
  const int64_t count = static_cast<int64_t>(out.size());
  TESSERA_CHECK(first >= 0 && count <= num_tokens_ - first, "tokens [", first, ", ", first + count, ") of ",
                num_tokens_);
  const auto copy = [&]<typename T>(T /*tag*/) {
    const uint8_t* bytes = data_->data + first * static_cast<int64_t>(sizeof(T));
    for (int64_t k = 0; k < count; ++k) out[k] = static_cast<int64_t>(Load<T>(bytes + k * sizeof(T)));
  };
  switch (dtype_) {
    case TokenDtype::kUint8:
      return copy(uint8_t{});
    case TokenDtype::kInt8:
      return copy(int8_t{});
    case TokenDtype::kInt16:
      return copy(int16_t{});
    case TokenDtype::kInt32:
      return copy(int32_t{});
    case TokenDtype::kInt64:
      return copy(int64_t{});
    case TokenDtype::kUint16:
      return copy(uint16_t{});
  }
}

absl::Status IndexedDataset::CheckIds(int64_t first, std::span<const int64_t> ids, int64_t vocab_size) const {
  const auto bad = std::find_if(ids.begin(), ids.end(), [&](int64_t id) { return id < 0 || id >= vocab_size; });
  if (bad == ids.end()) return absl::OkStatus();
  const int64_t token = first + (bad - ids.begin());
  // The document holding it: the last whose first token is at or before it.
  int64_t low = 0, high = num_documents_;  // document_begin(low) <= token
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    (sequence_offset(document_begin(mid)) <= token ? low : high) = mid;
  }
  return absl::InvalidArgumentError(StrCat(prefix_.string(), ".bin: token ", token, " (document ", low, ") is id ",
                                           *bad, ", outside the vocabulary [0, ", vocab_size,
                                           ") (a dataset built with another tokenizer?)"));
}

absl::Status IndexedDataset::CheckIdsIn(int64_t first, int64_t end, int64_t vocab_size) const {
  std::vector<int64_t> block(static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(end - first, 0), 1 << 20)));
  for (int64_t at = first; at < end;) {
    const std::span<int64_t> ids(block.data(), static_cast<size_t>(std::min<int64_t>(end - at, 1 << 20)));
    ReadTokens(at, ids);
    RETURN_IF_ERROR(CheckIds(at, ids, vocab_size));
    at += static_cast<int64_t>(ids.size());
  }
  return absl::OkStatus();
}

std::vector<int64_t> IndexedDataset::Sequence(int64_t i) const {
  std::vector<int64_t> tokens(static_cast<size_t>(sequence_length(i)));
  ReadTokens(sequence_offset(i), tokens);
  return tokens;
}

// ---------------------------------------------------------------------------
// Builder

// An append-only file with a write buffer: a named temporary (the future
// PREFIX.bin / PREFIX.idx) or, when `anonymous`, one unlinked at once so
// nothing is left behind whatever happens.
class IndexedDatasetBuilder::SpoolFile {
 public:
  static absl::StatusOr<std::unique_ptr<SpoolFile>> Create(const fs::path& name_prefix, bool anonymous) {
    // mkostemp makes the file before its name is known: a Ctrl-C waits
    // until it is registered (or unlinked), or it stayed behind (a
    // "c.bin.tmp-ZVQm5K" after an interrupted preprocess, one run in many).
    const DeferTemporarySignals creating;
    std::string pattern = name_prefix.string() + "XXXXXX";
    const int fd = ::mkostemp(pattern.data(), O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      // The usual cause named: the dataset's directory.
      std::error_code ec;
      const fs::path dir = name_prefix.parent_path().empty() ? fs::path(".") : name_prefix.parent_path();
      if (error == ENOENT && !fs::exists(dir, ec)) {
        return absl::NotFoundError(
            StrCat("cannot create '", pattern, "': its directory '", dir.string(), "' does not exist"));
      }
      return ErrnoError(error, "create temporary file", pattern);
    }
    std::unique_ptr<SpoolFile> file(new SpoolFile(fd, pattern));
    if (!anonymous) file->registered_ = std::make_unique<TemporaryFile>(pattern);
    // mkostemp makes it 0600; the dataset it becomes is read by whoever
    // reads the directory (other users, the nodes of a cluster), as any
    // file created under the umask.
    if (!anonymous && ::fchmod(fd, 0666 & ~CurrentUmask()) != 0) {
      const int error = errno;
      ::unlink(pattern.c_str());  // (returned to no one, who would remove it)
      return ErrnoError(error, "chmod", pattern);
    }
    if (anonymous) {
      if (::unlink(pattern.c_str()) != 0) return ErrnoError(errno, "unlink temporary file", pattern);
      file->path_.clear();
      // (Named in errors by the place it was made: "(unlinked spool)"
      // told a full disk's user nothing.)
      file->shown_ =
          StrCat("a temporary file (deleted) beside ",
                 name_prefix.parent_path().empty() ? fs::path(".").string() : name_prefix.parent_path().string(), "/");
    }
    file->buffer_.reserve(kBufferBytes);
    return file;
  }

  ~SpoolFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  SpoolFile(const SpoolFile&) = delete;
  SpoolFile& operator=(const SpoolFile&) = delete;

  // Empty for an anonymous file.
  const fs::path& path() const { return path_; }
  int64_t size() const { return size_; }

  absl::Status Append(const void* data, size_t bytes) {
    const auto* begin = static_cast<const uint8_t*>(data);
    if (buffer_.size() + bytes > kBufferBytes) RETURN_IF_ERROR(Flush());
    if (bytes >= kBufferBytes) return WriteAll(begin, bytes);
    buffer_.insert(buffer_.end(), begin, begin + bytes);
    return absl::OkStatus();
  }

  absl::Status Flush() {
    RETURN_IF_ERROR(WriteAll(buffer_.data(), buffer_.size()));
    buffer_.clear();
    return absl::OkStatus();
  }

  // Flushes, fsyncs (without it a crash after the rename can leave an empty
  // file under the final name on some filesystems) and closes.
  absl::Status SyncAndClose() {
    RETURN_IF_ERROR(Flush());
    if (::fsync(fd_) != 0) return ErrnoError(errno, "fsync", path_);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return ErrnoError(errno, "close", path_);
    return absl::OkStatus();
  }

  // Reads back bytes [offset, offset + bytes) of what was appended and flushed.
  absl::Status ReadAt(int64_t offset, void* data, size_t bytes) const {
    auto* out = static_cast<uint8_t*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, out, bytes, offset);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ErrnoError(n < 0 ? errno : EIO, "read back temporary file", Describe());
      out += n;
      offset += n;
      bytes -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

 private:
  SpoolFile(int fd, fs::path path) : fd_(fd), path_(std::move(path)) {}

  fs::path Describe() const { return path_.empty() ? fs::path(shown_) : path_; }

  absl::Status WriteAll(const uint8_t* data, size_t bytes) {
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, data, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError(errno, "write", Describe());
      data += n;
      bytes -= static_cast<size_t>(n);
      size_ += n;
    }
    return absl::OkStatus();
  }

  int fd_;
  fs::path path_;
  std::string shown_;                          // an unlinked one's name in errors
  std::unique_ptr<TemporaryFile> registered_;  // a named one, for a Ctrl-C to remove
  std::vector<uint8_t> buffer_;
  int64_t size_ = 0;  // bytes written to the file (the buffer not included)
};

absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>> IndexedDatasetBuilder::Create(const fs::path& prefix,
                                                                                     TokenDtype dtype) {
  if (prefix.empty()) return absl::InvalidArgumentError("the output prefix is empty (PREFIX.bin and PREFIX.idx)");
  if (!prefix.has_filename()) {
    return absl::InvalidArgumentError(StrCat("output prefix '", prefix.string(), "' names a directory, not files"));
  }
  std::unique_ptr<IndexedDatasetBuilder> builder(new IndexedDatasetBuilder());
  builder->prefix_ = prefix;
  builder->dtype_ = dtype;
  ASSIGN_OR_RETURN(builder->bin_, SpoolFile::Create(WithSuffix(prefix, ".bin.tmp-"), /*anonymous=*/false));
  builder->bin_temp_path_ = builder->bin_->path();
  ASSIGN_OR_RETURN(builder->sizes_, SpoolFile::Create(WithSuffix(prefix, ".idx.sizes-"), /*anonymous=*/true));
  ASSIGN_OR_RETURN(builder->doc_idx_, SpoolFile::Create(WithSuffix(prefix, ".idx.docs-"), /*anonymous=*/true));
  const int64_t first_entry = 0;
  RETURN_IF_ERROR(builder->doc_idx_->Append(&first_entry, sizeof(first_entry)));
  return builder;
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() { RemoveTemporaries(); }

void IndexedDatasetBuilder::RemoveTemporaries() {
  if (finished_ && status_.ok()) return;  // published: the temporaries were renamed
  bin_.reset();
  if (!bin_temp_path_.empty()) ::unlink(bin_temp_path_.c_str());
  if (!idx_temp_path_.empty()) ::unlink(idx_temp_path_.c_str());
  bin_temp_path_.clear();
  idx_temp_path_.clear();
}

absl::Status IndexedDatasetBuilder::Fail(absl::Status status) {
  if (status_.ok()) status_ = status;
  finished_ = true;
  RemoveTemporaries();
  return status;
}

absl::Status IndexedDatasetBuilder::AddSequence(std::span<const int64_t> tokens) {
  if (!status_.ok()) return status_;
  if (finished_) return absl::FailedPreconditionError("AddSequence after Finalize");
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(StrCat("sequence ", num_sequences_, " of '", prefix_.string(), "' has ",
                                             tokens.size(), " tokens; the index stores int32 lengths"));
  }
  const absl::Status encoded = EncodeTokens(tokens, dtype_, encode_buffer_);
  if (!encoded.ok()) {
    return absl::InvalidArgumentError(
        StrCat("sequence ", num_sequences_, " of '", prefix_.string(), "': ", encoded.message()));
  }
  absl::Status status = bin_->Append(encode_buffer_.data(), encode_buffer_.size());
  const int32_t length = static_cast<int32_t>(tokens.size());
  if (status.ok()) status = sizes_->Append(&length, sizeof(length));
  if (!status.ok()) return Fail(status);
  ++num_sequences_;
  num_tokens_ += length;
  return absl::OkStatus();
}

absl::Status IndexedDatasetBuilder::EndDocument() {
  if (!status_.ok()) return status_;
  if (finished_) return absl::FailedPreconditionError("EndDocument after Finalize");
  const int64_t entry = num_sequences_;
  const absl::Status status = doc_idx_->Append(&entry, sizeof(entry));
  if (!status.ok()) return Fail(status);
  ++num_document_entries_;
  num_sequences_at_document_start_ = num_sequences_;
  return absl::OkStatus();
}

absl::Status IndexedDatasetBuilder::WriteIndex() {
  RETURN_IF_ERROR(sizes_->Flush());
  RETURN_IF_ERROR(doc_idx_->Flush());
  ASSIGN_OR_RETURN(std::unique_ptr<SpoolFile> idx, SpoolFile::Create(WithSuffix(prefix_, ".idx.tmp-"), false));
  idx_temp_path_ = idx->path();

  RETURN_IF_ERROR(idx->Append(kMagic.data(), kMagic.size()));
  RETURN_IF_ERROR(idx->Append(&kVersion, sizeof(kVersion)));
  const uint8_t code = static_cast<uint8_t>(dtype_);
  RETURN_IF_ERROR(idx->Append(&code, sizeof(code)));
  const uint64_t n = static_cast<uint64_t>(num_sequences_);
  const uint64_t m = static_cast<uint64_t>(num_document_entries_);
  RETURN_IF_ERROR(idx->Append(&n, sizeof(n)));
  RETURN_IF_ERROR(idx->Append(&m, sizeof(m)));

  // sizes, then pointers computed from a second pass over the same sizes,
  // then doc_idx: all streamed in blocks.
  std::vector<uint8_t> block(kBufferBytes);
  const auto copy_spool = [&](const SpoolFile& spool) -> absl::Status {
    for (int64_t offset = 0; offset < spool.size();) {
      const size_t bytes = static_cast<size_t>(std::min<int64_t>(spool.size() - offset, kBufferBytes));
      RETURN_IF_ERROR(spool.ReadAt(offset, block.data(), bytes));
      RETURN_IF_ERROR(idx->Append(block.data(), bytes));
      offset += static_cast<int64_t>(bytes);
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(copy_spool(*sizes_));
  const int64_t item = TokenDtypeSize(dtype_);
  int64_t pointer = 0;
  constexpr int64_t kSizesPerBlock = static_cast<int64_t>(kBufferBytes / sizeof(int32_t));
  std::vector<int32_t> lengths(static_cast<size_t>(kSizesPerBlock));
  for (int64_t first = 0; first < num_sequences_; first += kSizesPerBlock) {
    const int64_t count = std::min(kSizesPerBlock, num_sequences_ - first);
    RETURN_IF_ERROR(sizes_->ReadAt(first * 4, lengths.data(), static_cast<size_t>(count) * 4));
    for (int64_t k = 0; k < count; ++k) {
      RETURN_IF_ERROR(idx->Append(&pointer, sizeof(pointer)));
      pointer += int64_t{lengths[k]} * item;
    }
  }
  RETURN_IF_ERROR(copy_spool(*doc_idx_));
  return idx->SyncAndClose();
}

absl::Status IndexedDatasetBuilder::Finalize() {
  if (!status_.ok()) return status_;
  if (finished_) return absl::FailedPreconditionError("Finalize called twice");
  if (num_sequences_ > num_sequences_at_document_start_) RETURN_IF_ERROR(EndDocument());
  absl::Status status = bin_->SyncAndClose();
  if (status.ok()) status = WriteIndex();
  if (!status.ok()) return Fail(status);

  const fs::path bin_path = WithSuffix(prefix_, ".bin");
  const fs::path idx_path = WithSuffix(prefix_, ".idx");
  // Old index first: from here until the last rename, a reader finds no
  // index (an error) rather than an old index over a new .bin.
  if (::unlink(idx_path.c_str()) != 0 && errno != ENOENT) return Fail(ErrnoError(errno, "remove old", idx_path));
  if (::rename(bin_temp_path_.c_str(), bin_path.c_str()) != 0) {
    return Fail(ErrnoError(errno, StrCat("rename '", bin_temp_path_.string(), "' to"), bin_path));
  }
  bin_temp_path_.clear();
  if (::rename(idx_temp_path_.c_str(), idx_path.c_str()) != 0) {
    return Fail(ErrnoError(errno, StrCat("rename '", idx_temp_path_.string(), "' to"), idx_path));
  }
  idx_temp_path_.clear();
  finished_ = true;
  // The renames are durable only once the directory itself is synced.
  const fs::path directory = prefix_.has_parent_path() ? prefix_.parent_path() : fs::path(".");
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, "open directory", directory);
  const int synced = ::fsync(dir_fd);
  const int error_number = errno;
  ::close(dir_fd);
  if (synced != 0) return ErrnoError(error_number, "fsync directory", directory);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Splits

std::string_view DatasetSplitName(DatasetSplit split) {
  switch (split) {
    case DatasetSplit::kTrain:
      return "train";
    case DatasetSplit::kValid:
      return "valid";
    case DatasetSplit::kTest:
      return "test";
  }
  return "unknown";
}

absl::StatusOr<DocumentRange> SplitDocuments(std::string_view splits, int64_t num_documents, DatasetSplit split) {
  const auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("splits '", splits, "': ", why));
  };
  const char separator = splits.find(',') != std::string_view::npos ? ',' : '/';
  const std::vector<std::string_view> parts = Split(splits, separator);
  if (parts.size() > 3) {
    // ("969,30,1," is three weights and an empty fourth: a trailing separator.)
    return invalid(
        parts.size() == 4 && StripWhitespace(parts[3]).empty()
            ? StrCat("a trailing '", std::string(1, separator), "' (three weights at most: train, valid, test)")
            : std::string("more than three weights (train, valid, test)"));
  }
  std::array<double, 3> weights = {0.0, 0.0, 0.0};
  double sum = 0.0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::string_view part = StripWhitespace(parts[k]);
    double weight = 0.0;
    const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), weight);
    if (part.empty() || error != std::errc() || end != part.data() + part.size()) {
      return invalid(StrCat("'", part, "' is not a number"));
    }
    if (!std::isfinite(weight) || weight < 0) return invalid(StrCat("weight ", part, " is not a finite number >= 0"));
    weights[k] = weight;
    sum += weight;  // left to right, as Python's sum()
  }
  if (!(sum > 0)) return invalid("the weights sum to 0");
  if (!std::isfinite(sum)) return invalid("the weights' sum overflows (scale them down)");

  // Megatron's arithmetic, in doubles like Python's floats; nearbyint in the
  // default rounding mode rounds half to even, as Python's round().
  std::array<int64_t, 4> bounds = {0, 0, 0, 0};
  for (int k = 0; k < 3; ++k) {
    bounds[k + 1] =
        bounds[k] + static_cast<int64_t>(std::nearbyint(weights[k] / sum * static_cast<double>(num_documents)));
  }
  const int64_t excess = bounds[3] - num_documents;
  for (int k = 1; k < 4; ++k) bounds[k] -= excess;
  for (int k = 1; k < 4; ++k) bounds[k] = std::clamp(bounds[k], bounds[k - 1], num_documents);
  const int which = static_cast<int>(split);
  return DocumentRange{bounds[which], bounds[which + 1]};
}

}  // namespace tessera::data
