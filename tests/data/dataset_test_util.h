#pragma once
// Shared helpers of the dataset tests: a scratch directory, a byte-level test
// double for Tokenizer, and a builder shortcut.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/text.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace tessera::data::testing {

// A fresh directory under the system temp dir, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tessera_dataset_XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }
  // Names of the directory's entries, sorted.
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline void WriteFile(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Test double: one id per byte (the byte's value), special tokens after the
// 256 bytes. Encode fails on byte 0x01 so tests can provoke tokenizer errors.
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kEndOfText = 256;
  static constexpr int64_t kCls = 257;
  static constexpr int64_t kSep = 258;
  static constexpr int64_t kMask = 259;
  static constexpr int64_t kPad = 260;

  explicit ByteTokenizer(int64_t vocab_size = 261, bool has_end_of_document = true)
      : vocab_size_(vocab_size), has_end_of_document_(has_end_of_document) {}

  absl::StatusOr<std::vector<int64_t>> Encode(std::string_view text) const override {
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (size_t k = 0; k < text.size(); ++k) {
      const auto byte = static_cast<unsigned char>(text[k]);
      if (byte == 0x01) return absl::InvalidArgumentError(StrCat("byte 0x01 at offset ", k));
      ids.push_back(byte);
    }
    return ids;
  }
  absl::StatusOr<std::string> Decode(std::span<const int64_t> ids) const override {
    std::string text;
    for (const int64_t id : ids) text += static_cast<char>(id);
    return text;
  }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string_view kind() const override { return "bytes"; }
  std::optional<int64_t> SpecialId(std::string_view token) const override {
    if (token == "<|endoftext|>") return kEndOfText;
    if (token == "[CLS]") return kCls;
    if (token == "[SEP]") return kSep;
    if (token == "[MASK]") return kMask;
    if (token == "[PAD]") return kPad;
    return std::nullopt;
  }
  std::optional<int64_t> EndOfDocumentId() const override {
    return has_end_of_document_ ? std::optional<int64_t>(kEndOfText) : std::nullopt;
  }

 private:
  int64_t vocab_size_;
  bool has_end_of_document_;
};

// Documents of sequences of tokens.
using Corpus = std::vector<std::vector<std::vector<int64_t>>>;

inline void BuildCorpus(const std::filesystem::path& prefix, const Corpus& corpus,
                        TokenDtype dtype = TokenDtype::kUint16) {
  auto builder = IndexedDatasetBuilder::Create(prefix, dtype);
  ASSERT_TRUE(builder.ok()) << builder.status();
  for (const auto& document : corpus) {
    for (const auto& sequence : document) ASSERT_TRUE((*builder)->AddSequence(sequence).ok());
    ASSERT_TRUE((*builder)->EndDocument().ok());
  }
  const absl::Status finalized = (*builder)->Finalize();
  ASSERT_TRUE(finalized.ok()) << finalized;
}

}  // namespace tessera::data::testing
