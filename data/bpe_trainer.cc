#include "data/bpe_trainer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "core/file_util.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/text.h"
#include "data/internal/byte_level.h"

namespace tessera::data {
namespace {

// Files are read this much at a time.
constexpr size_t kBlockBytes = size_t{1} << 20;
// A block is cut only at a safe place (see SafeCut); text without one for
// this long (no ASCII letter, digit or symbol before whitespace: e.g. a
// megabyte of CJK with no spaces) is cut at a character boundary instead,
// which may split one word in two, so that memory stays bounded.
constexpr size_t kMaxPendingBytes = size_t{64} << 20;

bool IsAsciiWhitespace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

// The largest p in (0, text.size()) such that pre-tokenising text[0, p) and
// text[p, end) apart gives the same pieces as the whole, or 0 if none is
// found. Such a p: text[p - 1] is not whitespace and text[p] is. Every piece
// is either all whitespace or has whitespace only as its first character, so
// a piece ends at p; the pattern has no lookbehind, so what follows p splits
// the same on its own; and every branch that reads text[p] to end a piece
// before it ends it alike at the end of the text. An ASCII byte is checked,
// which needs no decoding.
size_t SafeCut(std::string_view text) {
  for (size_t p = text.size() - 1; p > 0; --p) {
    const auto before = static_cast<unsigned char>(text[p - 1]);
    if (IsAsciiWhitespace(text[p]) && before < 0x80 && !IsAsciiWhitespace(static_cast<char>(before))) return p;
  }
  return 0;
}

// The last UTF-8 character boundary in `text` after its first byte, or 0.
size_t CharacterCut(std::string_view text) {
  for (size_t p = text.size() - 1; p > 0; --p) {
    if ((static_cast<unsigned char>(text[p]) & 0xC0) != 0x80) return p;
  }
  return 0;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t LeftOf(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t RightOf(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// The merge loop's state: the distinct words as symbol sequences, how often
// each adjacent pair occurs (weighted by word count) and in which words.
class Merger {
 public:
  explicit Merger(const absl::flat_hash_map<std::string, int64_t>& word_counts) {
    const std::array<uint8_t, 256>& order = internal::GptByteOrder();
    std::array<int32_t, 256> byte_token{};
    for (int32_t id = 0; id < 256; ++id) {
      byte_token[order[id]] = id;
      tokens_.emplace_back(1, static_cast<char>(order[id]));
      id_of_bytes_.emplace(tokens_.back(), id);
    }
    // Sorted so that the words' indices, and with them everything after, do
    // not depend on the hash map's iteration order.
    std::vector<std::pair<std::string_view, int64_t>> sorted(word_counts.begin(), word_counts.end());
    std::sort(sorted.begin(), sorted.end());
    words_.reserve(sorted.size());
    for (const auto& [bytes, count] : sorted) {
      if (bytes.size() < 2) continue;  // no pair to merge
      Word word{{}, count};
      for (const char b : bytes) word.symbols.push_back(byte_token[static_cast<uint8_t>(b)]);
      const auto index = static_cast<int32_t>(words_.size());
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        const uint64_t key = PairKey(word.symbols[i], word.symbols[i + 1]);
        pair_counts_[key] += count;
        std::vector<int32_t>& where = pair_words_[key];
        if (where.empty() || where.back() != index) where.push_back(index);
      }
      words_.push_back(std::move(word));
    }
    for (const auto& [key, count] : pair_counts_) heap_.push(Candidate{count, key});
    seen_stamp_.assign(words_.size(), -1);
  }

  // Learns merges until there are `target` tokens; false when the corpus
  // runs out of pairs first.
  bool Run(int64_t target) {
    while (static_cast<int64_t>(tokens_.size()) < target) {
      std::optional<uint64_t> best = PopBest();
      if (!best.has_value()) return false;
      ApplyMerge(*best);
    }
    return true;
  }

  // The heap's comparator points into this object.
  Merger(const Merger&) = delete;
  Merger& operator=(const Merger&) = delete;

  const std::vector<std::string>& tokens() const { return tokens_; }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

 private:
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  struct Candidate {
    int64_t count;  // the pair's count when pushed: an upper bound of its count now
    uint64_t pair;
  };
  // Orders the heap: highest count on top, then the pair whose tokens' bytes
  // sort first.
  struct Lower {
    const std::vector<std::string>* tokens;
    bool operator()(const Candidate& a, const Candidate& b) const {
      if (a.count != b.count) return a.count < b.count;
      const std::string& a_left = (*tokens)[LeftOf(a.pair)];
      const std::string& b_left = (*tokens)[LeftOf(b.pair)];
      if (a_left != b_left) return a_left > b_left;
      return (*tokens)[RightOf(a.pair)] > (*tokens)[RightOf(b.pair)];
    }
  };

  int64_t CountOf(uint64_t pair) const {
    const auto it = pair_counts_.find(pair);
    return it == pair_counts_.end() ? 0 : it->second;
  }

  // The most frequent pair. Counts of pairs only fall after they are pushed
  // (a merge makes new pairs, which are pushed with their counts), so an
  // entry whose count is still current is the true maximum; a stale one is
  // pushed back with its current count.
  std::optional<uint64_t> PopBest() {
    while (!heap_.empty()) {
      const Candidate top = heap_.top();
      heap_.pop();
      const int64_t count = CountOf(top.pair);
      if (count == top.count && count > 0) return top.pair;
      if (count > 0) heap_.push(Candidate{count, top.pair});
    }
    return std::nullopt;
  }

  void ApplyMerge(uint64_t pair) {
    const int32_t left = LeftOf(pair), right = RightOf(pair);
    std::string bytes = tokens_[left] + tokens_[right];
    // Two different pairs can spell the same token ("a"+"bc", "ab"+"c"); it
    // keeps its first id, and the new merge line leads to it too.
    int32_t merged;
    if (const auto it = id_of_bytes_.find(bytes); it != id_of_bytes_.end()) {
      merged = it->second;
    } else {
      merged = static_cast<int32_t>(tokens_.size());
      id_of_bytes_.emplace(bytes, merged);
      tokens_.push_back(std::move(bytes));
    }
    merges_.emplace_back(left, right);
    ++stamp_;

    absl::flat_hash_set<uint64_t> grown;
    std::vector<int32_t> where = std::move(pair_words_[pair]);
    pair_words_.erase(pair);
    std::vector<int32_t> merged_symbols;
    for (const int32_t index : where) {
      if (seen_stamp_[index] == stamp_) continue;
      seen_stamp_[index] = stamp_;
      Word& word = words_[index];
      std::vector<int32_t>& s = word.symbols;
      // Every occurrence, left to right, without overlap: as the tokenizer
      // will apply this merge.
      merged_symbols.clear();
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          merged_symbols.push_back(merged);
          i += 2;
        } else {
          merged_symbols.push_back(s[i++]);
        }
      }
      if (merged_symbols.size() == s.size()) continue;  // a stale entry: the pair is gone from this word
      for (size_t i = 0; i + 1 < s.size(); ++i) pair_counts_[PairKey(s[i], s[i + 1])] -= word.count;
      for (size_t i = 0; i + 1 < merged_symbols.size(); ++i) {
        const uint64_t key = PairKey(merged_symbols[i], merged_symbols[i + 1]);
        pair_counts_[key] += word.count;
        if (merged_symbols[i] == merged || merged_symbols[i + 1] == merged) {
          std::vector<int32_t>& list = pair_words_[key];
          if (list.empty() || list.back() != index) list.push_back(index);
          grown.insert(key);
        }
      }
      s.swap(merged_symbols);
    }
    pair_counts_.erase(pair);
    for (const uint64_t key : grown) heap_.push(Candidate{CountOf(key), key});
  }

  std::vector<Word> words_;
  std::vector<std::string> tokens_;  // id -> bytes
  absl::flat_hash_map<std::string, int32_t> id_of_bytes_;
  std::vector<std::pair<int32_t, int32_t>> merges_;
  absl::flat_hash_map<uint64_t, int64_t> pair_counts_;
  // Words that hold (or held: entries are not removed) each pair.
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> pair_words_;
  std::priority_queue<Candidate, std::vector<Candidate>, Lower> heap_{Lower{&tokens_}};
  // A word is rewritten once per merge even if listed twice.
  std::vector<int64_t> seen_stamp_;
  int64_t stamp_ = 0;
};

std::string EncoderJson(const std::vector<std::string>& tokens) {
  // As Python's json.dumps (GPT-2's file): ", " and ": ", non-ASCII escaped.
  std::string json = "{";
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (id > 0) json += ", ";
    json += nlohmann::json(tokens[id]).dump(-1, ' ', /*ensure_ascii=*/true);
    json += StrCat(": ", id);
  }
  json += "}";
  return json;
}

}  // namespace

BpeTrainer::BpeTrainer(std::unique_ptr<internal::Gpt2PreTokenizer> pre_tokenizer)
    : pre_tokenizer_(std::move(pre_tokenizer)) {}
BpeTrainer::~BpeTrainer() = default;

absl::StatusOr<std::unique_ptr<BpeTrainer>> BpeTrainer::Create() {
  ASSIGN_OR_RETURN(std::unique_ptr<internal::Gpt2PreTokenizer> pre_tokenizer, internal::Gpt2PreTokenizer::Create());
  return std::unique_ptr<BpeTrainer>(new BpeTrainer(std::move(pre_tokenizer)));
}

absl::Status BpeTrainer::Count(std::string_view text, std::string_view where, int64_t base_offset,
                               absl::flat_hash_map<std::string, int64_t>* counts) const {
  if (const std::optional<size_t> bad = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(
        StrCat(where, where.empty() ? "" : ": ", "invalid UTF-8 at byte offset ", base_offset + *bad));
  }
  return pre_tokenizer_->Split(
      text, [&](std::string_view piece) { ++(*counts)[absl::string_view(piece.data(), piece.size())]; });
}

absl::Status BpeTrainer::AddText(std::string_view text) {
  // Only an internal PCRE2 failure can stop Split half-way; UTF-8 is checked
  // before anything is counted.
  return Count(text, "", 0, &word_counts_);
}

absl::Status BpeTrainer::AddFile(const std::filesystem::path& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) return absl::NotFoundError(StrCat(path.string(), ": no such file"));
  if (std::filesystem::is_directory(status)) {
    return absl::InvalidArgumentError(StrCat(path.string(), ": is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(StrCat(path.string(), ": cannot open for reading"));
  // Blocks are counted as they are read, but a file with invalid UTF-8 must
  // count nothing: its counts are kept apart until the end.
  absl::flat_hash_map<std::string, int64_t> counts;
  std::string pending;  // read but not yet counted
  int64_t pending_offset = 0;
  std::vector<char> block(kBlockBytes);
  while (true) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto got = static_cast<size_t>(in.gcount());
    if (in.bad()) return absl::InvalidArgumentError(StrCat(path.string(), ": read error"));
    pending.append(block.data(), got);
    if (got == 0 || in.eof()) break;
    size_t cut = SafeCut(pending);
    if (cut == 0 && pending.size() >= kMaxPendingBytes) cut = CharacterCut(pending);
    if (cut == 0) continue;
    RETURN_IF_ERROR(Count(std::string_view(pending).substr(0, cut), path.string(), pending_offset, &counts));
    pending.erase(0, cut);
    pending_offset += static_cast<int64_t>(cut);
  }
  RETURN_IF_ERROR(Count(pending, path.string(), pending_offset, &counts));
  for (auto& [word, count] : counts) word_counts_[word] += count;
  return absl::OkStatus();
}

absl::Status BpeTrainer::Train(int64_t vocab_size, const std::filesystem::path& output_dir) const {
  if (vocab_size < kMinVocabSize || vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(StrCat("vocab_size ", vocab_size, " is out of range: it must be at least ",
                                             kMinVocabSize, " (the 256 bytes and <|endoftext|>)"));
  }
  Merger merger(word_counts_);
  if (!merger.Run(vocab_size - 1)) {
    return absl::InvalidArgumentError(StrCat("the corpus (", word_counts_.size(),
                                             " distinct words) has no pair left to merge after ",
                                             merger.merges().size(), " merges, at ", merger.tokens().size(),
                                             " tokens; vocab_size ", vocab_size, " needs a larger corpus"));
  }
  std::vector<std::string> token_texts;
  token_texts.reserve(vocab_size);
  for (const std::string& bytes : merger.tokens()) token_texts.push_back(internal::BytesToTokenText(bytes));
  token_texts.emplace_back("<|endoftext|>");
  std::string merges = "#version: 0.2\n";
  for (const auto& [left, right] : merger.merges()) {
    merges += StrCat(token_texts[left], " ", token_texts[right], "\n");
  }

  std::error_code error;
  std::filesystem::create_directories(output_dir, error);
  if (error || !std::filesystem::is_directory(output_dir)) {
    return absl::InvalidArgumentError(
        StrCat(output_dir.string(), ": cannot create the output directory",
               error ? StrCat(": ", error.message()) : std::string(" (a file is in the way)")));
  }
  RETURN_IF_ERROR(WriteFileDurably(output_dir / "encoder.json", EncoderJson(token_texts)));
  return WriteFileDurably(output_dir / "vocab.bpe", merges);
}

absl::Status TrainBpe(std::span<const std::filesystem::path> files, int64_t vocab_size,
                      const std::filesystem::path& output_dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<BpeTrainer> trainer, BpeTrainer::Create());
  for (const std::filesystem::path& file : files) RETURN_IF_ERROR(trainer->AddFile(file));
  return trainer->Train(vocab_size, output_dir);
}

}  // namespace tessera::data
