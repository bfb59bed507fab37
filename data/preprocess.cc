#include "data/preprocess.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "core/checksum.h"
#include "core/file_util.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "data/indexed_dataset.h"

namespace tessera::data {
namespace fs = std::filesystem;
namespace {

// Bytes per read(2) of an input.
constexpr size_t kReadBytes = size_t{1} << 20;

// A piece of one input holding whole documents.
struct Chunk {
  int64_t ordinal = 0;     // position in the output order
  size_t input = 0;        // index into PreprocessOptions::inputs
  int64_t first_line = 1;  // 1-based line number of bytes[0]
  std::string bytes;
};

// What a chunk's documents became, ready to append to the builder.
struct ChunkResult {
  absl::Status status;
  std::vector<int64_t> tokens;            // all sequences back to back
  std::vector<int64_t> sequence_lengths;  // per sequence
  std::vector<int64_t> document_sizes;    // sequences per document
  int64_t input_bytes = 0;
};

// What every worker needs; read-only while workers run.
struct EncodeContext {
  const Tokenizer* tokenizer;
  std::vector<InputFormat> formats;  // per input, kAuto resolved
  std::vector<std::string> names;    // per input, for messages
  std::string json_key;
  std::optional<int64_t> end_of_document;
  bool split_sentences;
  // ForEachDocument: each document's text goes here instead of the
  // tokenizer (which is then null).
  const std::function<absl::Status(std::string_view)>* visit = nullptr;
};

bool IsBlank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// True when no byte has its high bit set. Most corpora are mostly ASCII, and
// this word-at-a-time test is far cheaper than a full UTF-8 decode.
bool IsAscii(std::string_view text) {
  uint64_t any_high = 0;
  size_t k = 0;
  for (; k + 8 <= text.size(); k += 8) {
    uint64_t word;
    std::memcpy(&word, text.data() + k, sizeof(word));
    any_high |= word;
  }
  for (; k < text.size(); ++k) any_high |= static_cast<unsigned char>(text[k]);
  return (any_high & 0x8080808080808080ull) == 0;
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

InputFormat ResolveFormat(InputFormat format, const fs::path& input) {
  if (format != InputFormat::kAuto) return format;
  return IsJsonlName(input) ? InputFormat::kJsonl : InputFormat::kParagraphs;
}

absl::Status LineError(const EncodeContext& context, const Chunk& chunk, int64_t line, std::string_view what) {
  return absl::InvalidArgumentError(StrCat(context.names[chunk.input], ":", line, ": ", what));
}

// Encodes one document (its text starts at `line`) into `result`.
absl::Status EncodeDocument(const EncodeContext& context, const Chunk& chunk, int64_t line, std::string_view text,
                            ChunkResult& result) {
  if (context.visit != nullptr) {
    const absl::Status visited = (*context.visit)(text);
    return visited.ok() ? visited : LineError(context, chunk, line, std::string(visited.message()));
  }
  const size_t sequences_before = result.sequence_lengths.size();
  const auto encode = [&](std::string_view piece) -> absl::Status {
    absl::StatusOr<std::vector<int64_t>> ids = context.tokenizer->Encode(piece);
    if (!ids.ok()) return LineError(context, chunk, line, StrCat("cannot tokenize: ", ids.status().message()));
    if (ids->empty()) return absl::OkStatus();
    result.tokens.insert(result.tokens.end(), ids->begin(), ids->end());
    result.sequence_lengths.push_back(static_cast<int64_t>(ids->size()));
    return absl::OkStatus();
  };
  if (context.split_sentences) {
    for (std::string_view sentence : SplitSentences(text)) RETURN_IF_ERROR(encode(sentence));
  } else {
    RETURN_IF_ERROR(encode(text));
  }
  const size_t sequences = result.sequence_lengths.size() - sequences_before;
  if (sequences == 0) return absl::OkStatus();
  if (context.end_of_document) {
    result.tokens.push_back(*context.end_of_document);
    ++result.sequence_lengths.back();
  }
  result.document_sizes.push_back(static_cast<int64_t>(sequences));
  return absl::OkStatus();
}

absl::Status EncodeJsonLine(const EncodeContext& context, const Chunk& chunk, int64_t line_number,
                            std::string_view line, ChunkResult& result) {
  nlohmann::json value;
  // The field read is named once: with two, which one a reader takes is a
  // choice of its own (nlohmann and Python take the last; RFC 8259 leaves
  // it open), so such a line is refused.
  int key_count = 0;
  const auto count_key = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed == context.json_key) ++key_count;
    return true;
  };
  try {
    value = nlohmann::json::parse(line.begin(), line.end(), count_key);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's "[json.exception.parse_error.101] parse error at line 1,
    // column 10: ...": its line is always 1 (the line alone is parsed).
    std::string_view what = e.what();
    if (const size_t column = what.find("column "); column != std::string_view::npos) {
      what.remove_prefix(column);
      return LineError(context, chunk, line_number, StrCat("invalid JSON at ", what));
    }
    if (const size_t id = what.find("] "); what.starts_with("[json.exception.") && id != std::string_view::npos) {
      what.remove_prefix(id + 2);
    }
    return LineError(context, chunk, line_number, StrCat("invalid JSON: ", what));
  }
  if (!value.is_object()) return LineError(context, chunk, line_number, "expected a JSON object");
  if (key_count > 1) {
    return LineError(context, chunk, line_number,
                     StrCat("field \"", context.json_key, "\" appears ", key_count, " times (which one is meant?)"));
  }
  const auto field = value.find(context.json_key);
  if (field == value.end()) {
    return LineError(context, chunk, line_number, StrCat("no field \"", context.json_key, "\""));
  }
  if (!field->is_string()) {
    return LineError(context, chunk, line_number, StrCat("field \"", context.json_key, "\" is not a string"));
  }
  return EncodeDocument(context, chunk, line_number, field->get_ref<const std::string&>(), result);
}

ChunkResult ProcessChunk(const EncodeContext& context, const Chunk& chunk) {
  ChunkResult result;
  result.input_bytes = static_cast<int64_t>(chunk.bytes.size());
  const InputFormat format = context.formats[chunk.input];
  std::string paragraph;
  int64_t paragraph_line = 0;
  const auto flush_paragraph = [&]() -> absl::Status {
    if (paragraph.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(EncodeDocument(context, chunk, paragraph_line, paragraph, result));
    paragraph.clear();
    return absl::OkStatus();
  };
  const auto process = [&]() -> absl::Status {
    const std::string_view bytes = chunk.bytes;
    int64_t line_number = chunk.first_line;
    for (size_t start = 0; start < bytes.size(); ++line_number) {
      const size_t newline = bytes.find('\n', start);
      const size_t end = newline == std::string_view::npos ? bytes.size() : newline;
      std::string_view line = bytes.substr(start, end - start);
      // A file's byte-order mark (editors on Windows write one) is no
      // text: it became three tokens at the start of the first document.
      if (start == 0 && chunk.first_line == 1) ConsumePrefix(&line, "\xEF\xBB\xBF");
      start = end + 1;
      if (!IsAscii(line)) {
        if (const std::optional<size_t> bad = FirstInvalidUtf8(line)) {
          return LineError(context, chunk, line_number, StrCat("invalid UTF-8 at byte column ", *bad + 1));
        }
      }
      ConsumeSuffix(&line, "\r");
      if (IsBlank(line)) {
        if (format == InputFormat::kParagraphs) RETURN_IF_ERROR(flush_paragraph());
        continue;
      }
      switch (format) {
        case InputFormat::kParagraphs:
          if (paragraph.empty()) {
            paragraph_line = line_number;
          } else {
            paragraph += '\n';
          }
          paragraph.append(line);
          break;
        case InputFormat::kLines:
          RETURN_IF_ERROR(EncodeDocument(context, chunk, line_number, line, result));
          break;
        case InputFormat::kJsonl:
          RETURN_IF_ERROR(EncodeJsonLine(context, chunk, line_number, line, result));
          break;
        case InputFormat::kAuto:
          TESSERA_CHECK(false, "input format left unresolved");
      }
    }
    return flush_paragraph();
  };
  result.status = process();
  if (!result.status.ok()) {
    // Nothing of a failed chunk is written; free its tokens early.
    result.tokens = {};
    result.sequence_lengths = {};
    result.document_sizes = {};
  }
  return result;
}

// Workers that turn chunks into results; results are collected by ordinal so
// the caller can write them in input order.
//
// Thread-safe: Push and Take are called by one thread (the producer), the
// workers run ProcessChunk. The destructor drops queued chunks and joins.
class ChunkWorkers {
 public:
  ChunkWorkers(const EncodeContext& context, int num_threads) : context_(context) {
    for (int k = 0; k < num_threads; ++k) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~ChunkWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      queue_.clear();
    }
    work_cv_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }
  ChunkWorkers(const ChunkWorkers&) = delete;
  ChunkWorkers& operator=(const ChunkWorkers&) = delete;

  void Push(Chunk chunk) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(chunk));
    }
    work_cv_.notify_one();
  }

  // Waits for the result of chunk `ordinal` (pushed before) and removes it.
  ChunkResult Take(int64_t ordinal) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return results_.count(ordinal) > 0; });
    ChunkResult result = std::move(results_[ordinal]);
    results_.erase(ordinal);
    return result;
  }

 private:
  void WorkerLoop() {
    while (true) {
      Chunk chunk;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      ChunkResult result = ProcessChunk(context_, chunk);
      {
        std::lock_guard<std::mutex> lock(mu_);
        results_.emplace(chunk.ordinal, std::move(result));
      }
      done_cv_.notify_all();
    }
  }

  const EncodeContext& context_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Chunk> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, ChunkResult> results_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// Reads `path` in blocks and calls emit(bytes, first_line) with pieces that
// end at the first document boundary (the end of any line, or for paragraphs
// of a blank line) at or after `chunk_bytes`; the last piece takes the rest.
absl::Status ReadChunks(const fs::path& path, std::string_view name, InputFormat format, int64_t chunk_bytes,
                        const std::function<absl::Status(std::string bytes, int64_t first_line)>& emit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, StrCat("cannot read input '", name, "'"));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  std::string pending;  // pending[begin, size) is read but not yet emitted
  size_t begin = 0;
  size_t scanned = 0;       // pending[begin, scanned) is split into whole lines
  int64_t first_line = 1;   // line number of pending[begin]
  int64_t lines_ended = 0;  // lines ended in pending[begin, scanned)
  std::vector<char> block(kReadBytes);
  while (true) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, StrCat("cannot read input '", name, "'"));
    if (n == 0) break;
    pending.append(block.data(), static_cast<size_t>(n));
    for (size_t newline; (newline = pending.find('\n', scanned)) != std::string::npos;) {
      const std::string_view line(pending.data() + scanned, newline - scanned);
      scanned = newline + 1;
      ++lines_ended;
      const bool boundary = format != InputFormat::kParagraphs || IsBlank(line);
      if (boundary && static_cast<int64_t>(scanned - begin) >= chunk_bytes) {
        RETURN_IF_ERROR(emit(pending.substr(begin, scanned - begin), first_line));
        begin = scanned;
        first_line += lines_ended;
        lines_ended = 0;
      }
    }
    // Drop the emitted prefix once per block, not once per chunk.
    pending.erase(0, begin);
    scanned -= begin;
    begin = 0;
  }
  if (!pending.empty()) RETURN_IF_ERROR(emit(std::move(pending), first_line));
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string_view> SplitSentences(std::string_view text) {
  std::vector<std::string_view> sentences;
  size_t start = 0;
  const auto emit = [&](size_t end) {
    if (end <= start) return;
    const std::string_view sentence = StripWhitespace(text.substr(start, end - start));
    if (!sentence.empty()) sentences.push_back(sentence);
  };
  const auto is_terminal = [](char c) { return c == '.' || c == '!' || c == '?'; };
  const auto closing_length = [&](size_t i) -> size_t {
    constexpr std::string_view kAsciiClosing = "\"')]}";
    if (kAsciiClosing.find(text[i]) != std::string_view::npos) return 1;
    // ’ (U+2019) and ” (U+201D).
    if (text.substr(i, 3) == "\xE2\x80\x99" || text.substr(i, 3) == "\xE2\x80\x9D") return 3;
    return 0;
  };
  size_t i = 0;
  while (i < text.size()) {
    if (is_terminal(text[i])) {
      size_t j = i + 1;
      while (j < text.size() && is_terminal(text[j])) ++j;
      while (j < text.size()) {
        const size_t closing = closing_length(j);
        if (closing == 0) break;
        j += closing;
      }
      size_t k = j;
      while (k < text.size() && IsSpace(text[k])) ++k;
      const bool continues =
          k < text.size() && ((text[k] >= 'a' && text[k] <= 'z') || (text[k] >= '0' && text[k] <= '9'));
      if (k > j && !continues) {
        emit(j);
        // (Past the whitespace: a blank line in it, seen again from j,
        // emitted the text from j as a sentence a second time.)
        start = i = k;
        continue;
      }
      i = std::max(j, i + 1);
      continue;
    }
    if (text[i] == '\n') {
      size_t k = i + 1;
      while (k < text.size() && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r')) ++k;
      if (k < text.size() && text[k] == '\n') {
        emit(i);
        start = k + 1;
        i = k + 1;
        continue;
      }
    }
    ++i;
  }
  emit(text.size());
  return sentences;
}

absl::Status ForEachDocument(const PreprocessOptions& options,
                             const std::function<absl::Status(std::string_view text)>& visit) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("preprocess: no input files");
  EncodeContext context{nullptr, {}, {}, options.json_key, std::nullopt, false, &visit};
  for (const fs::path& input : options.inputs) {
    context.names.push_back(input.string());
    context.formats.push_back(ResolveFormat(options.format, input));
  }
  for (size_t k = 0; k < options.inputs.size(); ++k) {
    RETURN_IF_ERROR(
        ReadChunks(options.inputs[k], context.names[k], context.formats[k], std::max<int64_t>(1, options.chunk_bytes),
                   [&](std::string bytes, int64_t first_line) -> absl::Status {
                     const Chunk chunk{.ordinal = 0, .input = k, .first_line = first_line, .bytes = std::move(bytes)};
                     return ProcessChunk(context, chunk).status;
                   }));
  }
  return absl::OkStatus();
}

namespace {

fs::path SourceFile(const fs::path& output_prefix) { return output_prefix.string() + ".source.json"; }

// PREFIX.idx's modification time in ns: with its size, what tells the index
// a description was written for from one put there later.
// PREFIX.idx's modification time in nanoseconds since the Unix epoch
// (`legacy`: in the file clock's own epoch, as descriptions before it was
// Unix time hold it).
int64_t IndexTime(const fs::path& index, std::error_code& ec, bool legacy = false) {
  const auto time = fs::last_write_time(index, ec);
  if (ec) return 0;
  const auto since = legacy ? time.time_since_epoch() : std::chrono::file_clock::to_sys(time).time_since_epoch();
  return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(since).count());
}

// PREFIX.idx's checksum (XXH3-64 of its bytes), which a copy keeps when its
// time is not kept (`cp`, a restore); "" for an index that cannot be read
// or is over 1 GiB (then the time alone tells).
std::string IndexChecksum(const fs::path& index) {
  const absl::StatusOr<std::string> bytes = ReadWholeFile(index, std::uintmax_t{1} << 30);
  return bytes.ok() ? Checksum(*bytes) : std::string();
}

absl::Status WriteDatasetSource(const PreprocessOptions& options, const Tokenizer& tokenizer, const fs::path& path) {
  nlohmann::json inputs = nlohmann::json::array();
  std::error_code ec;
  std::error_code dir_ec;
  const fs::path dataset_dir = fs::weakly_canonical(fs::absolute(options.output_prefix, dir_ec), dir_ec).parent_path();
  for (const fs::path& input : options.inputs) {
    const fs::path absolute = fs::weakly_canonical(fs::absolute(input, ec), ec);
    nlohmann::json entry = {{"path", (ec ? input : absolute).string()},
                            {"bytes", static_cast<int64_t>(fs::file_size(input, ec))}};
    // Also where it lies from the dataset, so a dataset moved with its
    // text (a project's directory, a cache copied to another machine) is
    // still known to be built from it.
    if (!ec && !dir_ec) {
      const fs::path beside = absolute.lexically_relative(dataset_dir);
      if (!beside.empty()) entry["path_from_dataset"] = beside.string();
    }
    inputs.push_back(std::move(entry));
  }
  const fs::path index = options.output_prefix.string() + ".idx";
  const auto index_bytes = fs::file_size(index, ec);
  const int64_t index_time = ec ? 0 : IndexTime(index, ec);
  const auto data_bytes = ec ? 0 : fs::file_size(options.output_prefix.string() + ".bin", ec);
  if (ec) return absl::InternalError(StrCat("the dataset written cannot be read back: ", ec.message()));
  const nlohmann::json source = {
      {"inputs", inputs},
      {"tokenizer",
       {{"fingerprint", TokenizerFingerprint(tokenizer)},
        {"description", TokenizerDescription(tokenizer)},
        {"vocab_size", tokenizer.vocab_size()}}},
      {"split_sentences", options.split_sentences},
      {"end_of_document", options.append_end_of_document && tokenizer.EndOfDocumentId().has_value()},
      {"index_bytes", static_cast<int64_t>(index_bytes)},
      {"index_mtime_ns", index_time},
      {"index_checksum", IndexChecksum(index)},
      {"data_bytes", static_cast<int64_t>(data_bytes)}};
  const absl::Status written =
      WriteFileDurably(path, source.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (!written.ok()) {
    return absl::Status(written.code(),
                        StrCat("the dataset is written, but not what it was built from: ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsJsonlName(const fs::path& input) { return absl::EqualsIgnoreCase(input.extension().string(), ".jsonl"); }

absl::Status CheckInputsAreNotOutputs(const std::vector<fs::path>& inputs, const fs::path& output_prefix,
                                      bool learnt_vocabulary) {
  std::vector<fs::path> outputs;
  for (const char* extension : {".bin", ".idx", ".source.json"})
    outputs.emplace_back(output_prefix.string() + extension);
  if (learnt_vocabulary) {
    const fs::path vocab_dir = output_prefix.string() + "-vocab";
    outputs.insert(outputs.end(), {vocab_dir / "encoder.json", vocab_dir / "vocab.bpe"});
  }
  for (const fs::path& input : inputs) {
    for (const fs::path& output : outputs) {
      std::error_code ec;
      if (fs::equivalent(input, output, ec)) {
        return absl::InvalidArgumentError(StrCat("the dataset ", output_prefix.string(), " would write ",
                                                 output.string(), ", which is the input ", input.string()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PreprocessStats> Preprocess(const PreprocessOptions& options, const Tokenizer& tokenizer,
                                           const PreprocessProgress& progress) {
  if (options.inputs.empty()) return absl::InvalidArgumentError("preprocess: no input files");
  RETURN_IF_ERROR(CheckInputsAreNotOutputs(options.inputs, options.output_prefix));
  if (options.chunk_bytes < 1) {
    return absl::InvalidArgumentError(StrCat("preprocess: chunk_bytes must be >= 1, got ", options.chunk_bytes));
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(StrCat("preprocess: num_threads must be >= 0, got ", options.num_threads));
  }
  EncodeContext context{&tokenizer, {}, {}, options.json_key, std::nullopt, options.split_sentences, nullptr};
  if (options.append_end_of_document) context.end_of_document = tokenizer.EndOfDocumentId();
  int64_t total_bytes = 0;
  for (const fs::path& input : options.inputs) {
    context.names.push_back(input.string());
    context.formats.push_back(ResolveFormat(options.format, input));
    struct stat info {};
    if (::stat(input.c_str(), &info) != 0) {
      return absl::ErrnoToStatus(errno, StrCat("cannot read input '", input.string(), "'"));
    }
    if (!S_ISREG(info.st_mode)) {
      return absl::InvalidArgumentError(StrCat("cannot read input '", input.string(), "': not a regular file"));
    }
    // The dataset's .source.json records where it came from, as UTF-8
    // JSON: a path that is not would be recorded as another (and the
    // dataset then refused as built from other text).
    std::error_code ec;
    const std::string absolute = fs::weakly_canonical(fs::absolute(input, ec), ec).string();
    if (const std::optional<size_t> bad = FirstInvalidUtf8(absolute)) {
      return absl::InvalidArgumentError(StrCat("input '", EscapeControlChars(input.string(), /*non_ascii=*/true),
                                               "': its path '", EscapeControlChars(absolute, /*non_ascii=*/true),
                                               "' is not valid UTF-8 (byte ", *bad,
                                               "), which the dataset's .source.json cannot record"));
    }
    total_bytes += info.st_size;
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<IndexedDatasetBuilder> builder,
      IndexedDatasetBuilder::Create(options.output_prefix, TokenDtypeForVocabulary(tokenizer.vocab_size())));

  const int num_threads = options.num_threads > 0 ? options.num_threads
                                                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int64_t max_in_flight = 2 * int64_t{num_threads};
  PreprocessStats stats;
  int64_t next_ordinal = 0;
  int64_t next_to_write = 0;
  ChunkWorkers workers(context, num_threads);

  const auto write_next = [&]() -> absl::Status {
    const ChunkResult result = workers.Take(next_to_write++);
    RETURN_IF_ERROR(result.status);
    size_t sequence = 0;
    int64_t token = 0;
    for (const int64_t document_size : result.document_sizes) {
      for (int64_t k = 0; k < document_size; ++k, ++sequence) {
        const int64_t length = result.sequence_lengths[sequence];
        RETURN_IF_ERROR(builder->AddSequence(
            std::span<const int64_t>(result.tokens).subspan(static_cast<size_t>(token), static_cast<size_t>(length))));
        token += length;
      }
      RETURN_IF_ERROR(builder->EndDocument());
    }
    stats.documents += static_cast<int64_t>(result.document_sizes.size());
    stats.sequences += static_cast<int64_t>(result.sequence_lengths.size());
    stats.tokens += token;
    stats.bytes += result.input_bytes;
    if (progress) progress(stats.bytes, total_bytes);
    return absl::OkStatus();
  };
  const auto write_all = [&]() -> absl::Status {
    while (next_to_write < next_ordinal) RETURN_IF_ERROR(write_next());
    return absl::OkStatus();
  };

  absl::Status write_error;  // from a chunk written while reading
  for (size_t input = 0; input < options.inputs.size(); ++input) {
    const absl::Status read =
        ReadChunks(options.inputs[input], context.names[input], context.formats[input], options.chunk_bytes,
                   [&](std::string bytes, int64_t first_line) -> absl::Status {
                     if (options.cancelled && options.cancelled()) {
                       return absl::CancelledError("interrupted: the dataset was not written");
                     }
                     while (next_ordinal - next_to_write >= max_in_flight) {
                       write_error = write_next();
                       RETURN_IF_ERROR(write_error);
                     }
                     workers.Push(Chunk{next_ordinal++, input, first_line, std::move(bytes)});
                     return absl::OkStatus();
                   });
    if (!write_error.ok()) return write_error;
    if (!read.ok()) {
      // A failing chunk read before the read error comes first in input order.
      RETURN_IF_ERROR(write_all());
      return read;
    }
  }
  RETURN_IF_ERROR(write_all());
  // An empty dataset would only fail later, at training ("shorter than one
  // sample"); the builder's temporaries go, an earlier dataset stays.
  if (stats.tokens == 0) {
    return absl::InvalidArgumentError(
        StrCat("the inputs hold no text to tokenise (", stats.documents, " documents, 0 tokens): nothing written"));
  }
  // The old dataset's description goes first: a crash before the new one
  // is written leaves none, never a wrong one. A Ctrl-C waits for the
  // commit (an old dataset without its description, read as a new one's,
  // or a new .bin without its .idx, otherwise).
  const DeferTemporarySignals commit;
  const fs::path source_file = SourceFile(options.output_prefix);
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(source_file, ec))) {
    return absl::InvalidArgumentError(StrCat("cannot write ", source_file.string(), ": a directory is there"));
  }
  fs::remove(source_file, ec);
  if (ec) return absl::InternalError(StrCat("cannot remove ", source_file.string(), ": ", ec.message()));
  RETURN_IF_ERROR(builder->Finalize());
  RETURN_IF_ERROR(WriteDatasetSource(options, tokenizer, source_file));
  if (options.commit_also) RETURN_IF_ERROR(options.commit_also());
  if (progress) progress(total_bytes, total_bytes);
  return stats;
}

std::string TokenizerFingerprint(const Tokenizer& tokenizer) {
  constexpr std::string_view kProbe =
      "The quick brown fox jumps over the lazy dog. THE QUICK Brown fOX!\n\n"
      "  Numbers: 0 7 42 1999 3.14159 -273 1,000,000; code: x += y[i] * 2 // ok?\n"
      "\tTabs,  double  spaces and \"quotes\" -- (brackets) [more] {braces} <tags> @#$%^&_~`|\\\n"
      "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00dcber Stra\u00dfe \u00ce\u00f1t\u00ebrn\u00e2ti\u00f4n\u00e0l "
      "\u4e2d\u6587\u5b57 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \U0001f600 \u2014 \u2019 \u00bd";
  std::string text = StrCat(tokenizer.kind(), "|", tokenizer.vocab_size(), "|");
  for (const char* special : {"<|endoftext|>", "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"}) {
    const std::optional<int64_t> id = tokenizer.SpecialId(special);
    text += StrCat(id ? *id : -1, ",");
  }
  text += StrCat(tokenizer.EndOfDocumentId().value_or(-1), "|");
  if (absl::StatusOr<std::vector<int64_t>> ids = tokenizer.Encode(kProbe); ids.ok()) {
    for (const int64_t id : *ids) text += StrCat(id, ",");
  }
  text += StrCat("|");
  // The text of every id: the whole table (one decode per id).
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::array<int64_t, 1> one{id};
    absl::StatusOr<std::string> piece = tokenizer.Decode(one);
    text += StrCat(piece.ok() ? *piece : std::string("?"), "\x1f");
  }
  return Checksum(text);
}

std::string TokenizerDescription(const Tokenizer& tokenizer) {
  std::string description = StrCat(tokenizer.kind(), ", ", tokenizer.vocab_size(), " tokens");
  const absl::StatusOr<std::vector<int64_t>> upper = tokenizer.Encode("Hello World");
  const absl::StatusOr<std::vector<int64_t>> lower = tokenizer.Encode("hello world");
  if (upper.ok() && lower.ok() && *upper == *lower) description += ", uncased";
  return description;
}

absl::StatusOr<std::optional<DatasetSource>> ReadDatasetSource(const fs::path& output_prefix) {
  const fs::path path = SourceFile(output_prefix);
  std::error_code ec;
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        StrCat(path.string(), ": ", why, " (it says what the dataset was built from; remove it to skip the check)"));
  };
  // (A symbolic link loop was taken for no file, and the check skipped.)
  if (!fs::exists(path, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
      return bad(StrCat("cannot be read (", ec.message(), ")"));
    }
    return std::optional<DatasetSource>();
  }
  const absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return bad(StrCat("cannot be read (", text.status().message(), ")"));
  const nlohmann::json json = text->find('\0') != std::string::npos
                                  ? nlohmann::json()
                                  : nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return bad("not a JSON object");
  DatasetSource source;
  // The key being read, and what it must be, for the error.
  std::string key, expected;
  const auto field = [&](const nlohmann::json& node, const std::string& name, const std::string& shown,
                         const char* kind) -> const nlohmann::json& {
    key = shown;
    expected = kind;
    const nlohmann::json& value = node.at(name);
    // (get<int64_t>() would take 1.5 as 1.)
    const std::string_view want(kind);
    if ((want == "an integer" && !value.is_number_integer()) || (want == "a string" && !value.is_string()) ||
        (want == "true or false" && !value.is_boolean()) || (want == "an object" && !value.is_object()) ||
        (want == "a list" && !value.is_array())) {
      throw nlohmann::json::type_error::create(302, "of another type", nullptr);
    }
    return value;
  };
  try {
    source.index_bytes = field(json, "index_bytes", "index_bytes", "an integer").get<int64_t>();
    source.index_mtime_ns = field(json, "index_mtime_ns", "index_mtime_ns", "an integer").get<int64_t>();
    source.data_bytes = field(json, "data_bytes", "data_bytes", "an integer").get<int64_t>();
    // (Absent from descriptions written before it was kept.)
    if (json.contains("index_checksum")) {
      source.index_checksum = field(json, "index_checksum", "index_checksum", "a string").get<std::string>();
    }
    const nlohmann::json& tokenizer = field(json, "tokenizer", "tokenizer", "an object");
    source.tokenizer = field(tokenizer, "fingerprint", "tokenizer.fingerprint", "a string").get<std::string>();
    source.tokenizer_description =
        field(tokenizer, "description", "tokenizer.description", "a string").get<std::string>();
    source.vocab_size = field(tokenizer, "vocab_size", "tokenizer.vocab_size", "an integer").get<int64_t>();
    source.split_sentences = field(json, "split_sentences", "split_sentences", "true or false").get<bool>();
    source.end_of_document = field(json, "end_of_document", "end_of_document", "true or false").get<bool>();
    const nlohmann::json& inputs = field(json, "inputs", "inputs", "a list");
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string at = StrCat("inputs[", i, "]");
      if (!inputs[i].is_object()) {
        key = at;
        expected = "an object";
        throw nlohmann::json::type_error::create(302, "not an object", nullptr);
      }
      source.inputs.push_back(field(inputs[i], "path", at + ".path", "a string").get<std::string>());
      source.input_bytes.push_back(field(inputs[i], "bytes", at + ".bytes", "an integer").get<int64_t>());
      // (Absent from descriptions written before it was kept.)
      fs::path beside;
      if (inputs[i].contains("path_from_dataset")) {
        const fs::path relative =
            field(inputs[i], "path_from_dataset", at + ".path_from_dataset", "a string").get<std::string>();
        std::error_code beside_ec;
        beside = fs::weakly_canonical(fs::absolute(output_prefix, beside_ec).parent_path() / relative, beside_ec);
        if (beside_ec) beside.clear();
      }
      source.inputs_from_dataset.push_back(std::move(beside));
    }
  } catch (const nlohmann::json::exception& e) {
    // (at() of a missing key: out_of_range; get<T>() of another type: type_error.)
    return bad(e.id / 100 == 4 ? StrCat("malformed: it has no '", key, "'")
                               : StrCat("malformed: its '", key, "' is not ", expected));
  }
  const fs::path index = output_prefix.string() + ".idx";
  const auto index_bytes = fs::file_size(index, ec);
  const int64_t index_time = ec ? 0 : IndexTime(index, ec);
  const auto data_bytes = ec ? 0 : fs::file_size(output_prefix.string() + ".bin", ec);
  std::error_code legacy_ec;
  // The same sizes, and the same index: its time, or (a copy that did not
  // keep the time) its checksum.
  if (ec || static_cast<int64_t>(index_bytes) != source.index_bytes ||
      static_cast<int64_t>(data_bytes) != source.data_bytes ||
      (index_time != source.index_mtime_ns && IndexTime(index, legacy_ec, /*legacy=*/true) != source.index_mtime_ns &&
       (source.index_checksum.empty() || IndexChecksum(index) != source.index_checksum))) {
    return std::optional<DatasetSource>();
  }
  if (source.index_checksum.empty()) {
    // A description from before the checksum was kept, of this very index
    // (its time says so): the checksum is added, so a copy of the dataset
    // stays checked. Best effort: a dataset in a read-only place keeps
    // the description it has. (One writer at a time in this process: the
    // temporary file's name is per process.)
    static absl::Mutex upgrade_mu;
    absl::MutexLock lock(&upgrade_mu);
    source.index_checksum = IndexChecksum(index);
    nlohmann::json upgraded = json;
    upgraded["index_checksum"] = source.index_checksum;
    if (!source.index_checksum.empty()) {
      (void)WriteFileDurably(path, upgraded.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    }
  }
  return std::optional<DatasetSource>(std::move(source));
}

}  // namespace tessera::data
