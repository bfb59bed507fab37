#include "data/gpt2_tokenizer.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <utility>

#include "absl/hash/hash.h"
#include "core/file_util.h"
#include "core/json_text.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "data/internal/byte_level.h"

namespace tessera::data {
namespace {

// Pieces up to this many bytes are merged by rescanning all pairs after each
// merge (quadratic, but the fastest for the few bytes of a typical word);
// longer ones (runs of digits, whitespace or symbols) by a heap over a linked
// list, so that a megabyte with no spaces still encodes in n log n.
constexpr size_t kShortPieceBytes = 24;

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string Quote(std::string_view text) { return config::QuoteJson(nlohmann::json(std::string(text))); }

// encoder.json through nlohmann's SAX interface: unlike a DOM parse it sees
// every key (a DOM keeps the last of two equal keys) and stops at the first
// value that is not a token id, naming its key.
class EncoderJsonReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit EncoderJsonReader(std::string file) : file_(std::move(file)) {}

  bool null() override { return BadValue("null"); }
  bool boolean(bool) override { return BadValue("a boolean"); }
  bool number_integer(number_integer_t value) override {
    if (value < 0) return BadValue(StrCat("the negative number ", value));
    return Id(static_cast<uint64_t>(value));
  }
  bool number_unsigned(number_unsigned_t value) override { return Id(value); }
  bool number_float(number_float_t, const string_t& text) override { return BadValue(StrCat("the number ", text)); }
  bool string(string_t& value) override { return BadValue(StrCat("the string ", Quote(value))); }
  bool binary(binary_t&) override { return BadValue("binary data"); }
  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    return BadValue("an object");
  }
  bool key(string_t& key) override {
    key_ = key;
    return true;
  }
  bool end_object() override {
    depth_ = 0;
    return true;
  }
  // (At the top: a BERT vocab.txt's first line, "[PAD]", reads as one.)
  bool start_array(std::size_t) override {
    return BadValue(depth_ == 0 ? "'[' (a BERT vocab.txt, one token per line, given for it?)" : "an array");
  }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) override {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error
    // at line 3, column 7: ..."; the part after "parse error " is the news.
    std::string_view what = error.what();
    const size_t at = what.find("parse error ");
    if (at != std::string_view::npos) what.remove_prefix(at + std::string_view("parse error ").size());
    status_ = absl::InvalidArgumentError(StrCat(file_, ": invalid JSON ", what));
    return false;
  }

  const absl::Status& status() const { return status_; }
  std::vector<std::pair<std::string, uint64_t>>& entries() { return entries_; }

 private:
  bool BadValue(std::string_view what) {
    status_ = depth_ == 0
                  ? absl::InvalidArgumentError(StrCat(file_,
                                                      ": not a GPT-2 vocabulary (vocab.json: a JSON object from token "
                                                      "to id); it begins with ",
                                                      what))
                  : absl::InvalidArgumentError(
                        StrCat(file_, ": key ", Quote(key_), ": the id must be a non-negative integer, got ", what));
    return false;
  }
  bool Id(uint64_t id) {
    if (depth_ == 0) return BadValue(StrCat("the number ", id));
    entries_.emplace_back(std::move(key_), id);
    return true;
  }

  std::string file_;
  int depth_ = 0;
  std::string key_;
  std::vector<std::pair<std::string, uint64_t>> entries_;
  absl::Status status_;
};

}  // namespace

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Load(const std::filesystem::path& encoder_file,
                                                                   const std::filesystem::path& merges_file) {
  std::unique_ptr<Gpt2Tokenizer> tokenizer(new Gpt2Tokenizer());
  ASSIGN_OR_RETURN(tokenizer->pre_tokenizer_, internal::Gpt2PreTokenizer::Create());
  RETURN_IF_ERROR(tokenizer->LoadEncoder(encoder_file));
  RETURN_IF_ERROR(tokenizer->LoadMerges(merges_file));
  return tokenizer;
}

absl::Status Gpt2Tokenizer::LoadEncoder(const std::filesystem::path& file) {
  ASSIGN_OR_RETURN(const std::string json, ReadWholeFile(file));
  EncoderJsonReader reader(file.string());
  const bool parsed = nlohmann::json::sax_parse(json, &reader);
  RETURN_IF_ERROR(reader.status());
  TESSERA_CHECK(parsed);
  const std::vector<std::pair<std::string, uint64_t>>& entries = reader.entries();
  if (entries.empty()) return absl::InvalidArgumentError(StrCat(file.string(), ": no tokens"));
  if (entries.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(StrCat(file.string(), ": too many tokens (", entries.size(), ")"));
  }

  const size_t n = entries.size();
  token_bytes_.assign(n, std::string());
  std::vector<const std::string*> key_of_id(n, nullptr);
  id_of_bytes_.reserve(n);
  for (const auto& [key, id] : entries) {
    if (id >= n) {
      // (A missing token shifts the count: name the id no key has.)
      std::vector<bool> used(n, false);
      for (const auto& entry : entries) {
        if (entry.second < n) used[entry.second] = true;
      }
      const auto unused = std::find(used.begin(), used.end(), false);
      return absl::InvalidArgumentError(
          StrCat(file.string(), ": key ", Quote(key), ": id ", id, " is out of range: with ", n,
                 " tokens the ids must be 0..", n - 1,
                 unused == used.end() ? std::string()
                                      : StrCat(" (no key has id ", unused - used.begin(), ": a token missing?)")));
    }
    std::optional<std::string> bytes = internal::TokenTextToBytes(key);
    if (!bytes.has_value() || bytes->empty()) {
      return absl::InvalidArgumentError(StrCat(file.string(), ": key ", Quote(key),
                                               " is not a token of GPT-2's byte alphabet (each character stands for "
                                               "one byte; a space is written 'Ġ')"));
    }
    if (!id_of_bytes_.emplace(*bytes, static_cast<int32_t>(id)).second) {
      return absl::InvalidArgumentError(StrCat(file.string(), ": key ", Quote(key), " appears twice"));
    }
    if (key_of_id[id] != nullptr) {
      return absl::InvalidArgumentError(
          StrCat(file.string(), ": key ", Quote(key), ": id ", id, " is also the id of ", Quote(*key_of_id[id])));
    }
    key_of_id[id] = &key;
    token_bytes_[id] = *std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_bytes_.find(std::string(1, static_cast<char>(b)));
    if (it == id_of_bytes_.end()) {
      return absl::InvalidArgumentError(StrCat(file.string(), ": no token for byte ", b, " (",
                                               Quote(internal::BytesToTokenText(std::string(1, static_cast<char>(b)))),
                                               "); a byte-level vocabulary needs all 256"));
    }
    byte_token_[b] = it->second;
  }
  if (const auto it = id_of_bytes_.find("<|endoftext|>"); it != id_of_bytes_.end()) end_of_document_id_ = it->second;
  return absl::OkStatus();
}

absl::Status Gpt2Tokenizer::LoadMerges(const std::filesystem::path& file) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(file));
  std::vector<std::string_view> lines = Split(text, '\n');
  // A final newline leaves an empty last piece, which is not a line.
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  absl::flat_hash_map<uint64_t, int64_t> line_of_pair;
  int32_t rank = 0;
  for (size_t index = 0; index < lines.size(); ++index) {
    const int64_t line_number = static_cast<int64_t>(index) + 1;
    std::string_view line = lines[index];
    ConsumeSuffix(&line, "\r");
    if (index == 0 && line.starts_with("#version")) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      return absl::InvalidArgumentError(StrCat(internal::FileLine(file, line_number),
                                               ": expected two symbols separated by one space, got ", Quote(line)));
    }
    int32_t parts[2];
    std::string merged;
    for (int side = 0; side < 2; ++side) {
      const std::string_view symbol = side == 0 ? line.substr(0, space) : line.substr(space + 1);
      const std::optional<std::string> bytes = internal::TokenTextToBytes(symbol);
      const auto it = bytes.has_value() ? id_of_bytes_.find(*bytes) : id_of_bytes_.end();
      if (it == id_of_bytes_.end()) {
        return absl::InvalidArgumentError(
            StrCat(internal::FileLine(file, line_number), ": ", Quote(symbol), " is not a token of the encoder"));
      }
      parts[side] = it->second;
      merged += *bytes;
    }
    const auto result = id_of_bytes_.find(merged);
    if (result == id_of_bytes_.end()) {
      return absl::InvalidArgumentError(StrCat(internal::FileLine(file, line_number), ": the merge of ", Quote(line),
                                               ", ", Quote(internal::BytesToTokenText(merged)),
                                               ", is not a token of the encoder"));
    }
    const uint64_t key = PairKey(parts[0], parts[1]);
    if (const auto [it, inserted] = line_of_pair.emplace(key, line_number); !inserted) {
      return absl::InvalidArgumentError(
          StrCat(internal::FileLine(file, line_number), ": the merge ", Quote(line), " repeats line ", it->second));
    }
    merges_.emplace(key, Merge{rank++, result->second});
  }
  // Every token of several bytes that the pre-tokenizer keeps whole is some
  // merge's result: one no merge makes never comes out, and the ids of text
  // holding it are silently others (a cut merges file). Tokens it splits
  // (<|endoftext|>, <s>, [PAD]: added ones) are no merge's; a few whole ones
  // may be added too (runs of spaces, some vocabularies): refused only when
  // they are more than 1% of the vocabulary, as a cut file's are.
  std::vector<bool> made(token_bytes_.size(), false);
  for (const auto& [key, merge] : merges_) made[static_cast<size_t>(merge.token)] = true;
  int64_t unmade = 0;
  int32_t first = -1;
  for (size_t id = 0; id < token_bytes_.size(); ++id) {
    const std::string& bytes = token_bytes_[id];
    if (made[id] || bytes.size() < 2) continue;
    if (!FirstInvalidUtf8(bytes).has_value()) {
      int pieces = 0;
      RETURN_IF_ERROR(pre_tokenizer_->Split(bytes, [&](std::string_view) { ++pieces; }));
      if (pieces > 1) continue;
    }
    if (unmade++ == 0) first = static_cast<int32_t>(id);
  }
  if (unmade > 0 && (merges_.empty() || unmade * 100 > static_cast<int64_t>(token_bytes_.size()))) {
    return absl::InvalidArgumentError(
        StrCat(file.string(), ": ", merges_.empty() ? "no merges, though " : "", unmade, " of the encoder's ",
               token_bytes_.size(), " tokens have several bytes and no merge makes them (the first: ",
               Quote(internal::BytesToTokenText(token_bytes_[static_cast<size_t>(first)])), ", id ", first,
               "): an empty or cut merges file, or one of another vocabulary?"));
  }
  return absl::OkStatus();
}

const Gpt2Tokenizer::Merge* Gpt2Tokenizer::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Gpt2Tokenizer::MergeShortPiece(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& s = *symbols;
  while (s.size() >= 2) {
    const Merge* best = nullptr;
    int32_t left = 0, right = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const Merge* merge = FindMerge(s[i], s[i + 1]);
      if (merge != nullptr && (best == nullptr || merge->rank < best->rank)) {
        best = merge;
        left = s[i];
        right = s[i + 1];
      }
    }
    if (best == nullptr) return;
    // Every occurrence of the pair, left to right, without overlap.
    size_t out = 0;
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
        s[out++] = best->token;
        i += 2;
      } else {
        s[out++] = s[i++];
      }
    }
    s.resize(out);
  }
}

void Gpt2Tokenizer::MergeLongPiece(std::vector<int32_t>* symbols) const {
  // The same merges as MergeShortPiece. Symbols form a linked list (a merged
  // pair lives on at its left position); the heap holds (rank, position) of
  // every adjacent pair that has a merge, stale entries included and checked
  // when popped. All entries of the lowest rank are taken out before any is
  // merged: a merge can make a pair of lower rank, and encoder.py finishes
  // every occurrence of the current pair before looking at any other.
  std::vector<int32_t>& symbol = *symbols;
  const auto n = static_cast<int32_t>(symbol.size());
  std::vector<int32_t> next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  using Entry = std::pair<int32_t, int32_t>;  // (rank, position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto push = [&](int32_t position) {
    if (position < 0 || next[position] < 0) return;
    if (const Merge* merge = FindMerge(symbol[position], symbol[next[position]])) heap.emplace(merge->rank, position);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<int32_t> batch;
  while (!heap.empty()) {
    const int32_t rank = heap.top().first;
    batch.clear();
    while (!heap.empty() && heap.top().first == rank) {
      batch.push_back(heap.top().second);  // in increasing position
      heap.pop();
    }
    for (const int32_t position : batch) {
      const int32_t right = next[position];
      if (symbol[position] < 0 || right < 0) continue;
      const Merge* merge = FindMerge(symbol[position], symbol[right]);
      if (merge == nullptr || merge->rank != rank) continue;
      symbol[position] = merge->token;
      symbol[right] = -1;
      next[position] = next[right];
      if (next[right] >= 0) prev[next[right]] = position;
      push(prev[position]);
      push(position);
    }
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbol[out++] = symbol[i];
  symbol.resize(out);
}

void Gpt2Tokenizer::EncodePiece(std::string_view piece, std::vector<int64_t>* out) const {
  CacheShard* shard = nullptr;
  if (piece.size() <= kMaxCachedPieceBytes) {
    const absl::string_view key(piece.data(), piece.size());
    static_assert(kCacheShards == 64, "the shard index is the hash's top 6 bits");
    // The shard from the hash's top bits: the map inside uses the low ones.
    shard = &cache_[absl::Hash<absl::string_view>()(key) >> 58];
    absl::MutexLock lock(&shard->mutex);
    if (const auto it = shard->ids.find(key); it != shard->ids.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) symbols[i] = byte_token_[static_cast<uint8_t>(piece[i])];
  if (piece.size() <= kShortPieceBytes) {
    MergeShortPiece(&symbols);
  } else {
    MergeLongPiece(&symbols);
  }
  out->insert(out->end(), symbols.begin(), symbols.end());
  if (shard == nullptr) return;
  absl::MutexLock lock(&shard->mutex);
  // Emptying a full shard keeps memory bounded without bookkeeping; the
  // frequent pieces come back at once.
  if (shard->ids.size() >= kCacheEntriesPerShard) shard->ids.clear();
  shard->ids.emplace(std::string(piece), std::move(symbols));
}

absl::StatusOr<std::vector<int64_t>> Gpt2Tokenizer::Encode(std::string_view text) const {
  if (const std::optional<size_t> bad = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(StrCat("invalid UTF-8 at byte offset ", *bad));
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 1);
  RETURN_IF_ERROR(pre_tokenizer_->Split(text, [&](std::string_view piece) {
    if (piece.size() == 1) {
      ids.push_back(byte_token_[static_cast<uint8_t>(piece[0])]);
    } else {
      EncodePiece(piece, &ids);
    }
  }));
  return ids;
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(std::span<const int64_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(
          StrCat("token id ", ids[i], " (at position ", i, ") is out of range [0, ", vocab_size(), ")"));
    }
    text += token_bytes_[ids[i]];
  }
  return text;
}

std::optional<int64_t> Gpt2Tokenizer::SpecialId(std::string_view token) const {
  if (token.size() < 4 || !token.starts_with("<|") || !token.ends_with("|>")) return std::nullopt;
  const auto it = id_of_bytes_.find(absl::string_view(token.data(), token.size()));
  if (it == id_of_bytes_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tessera::data
