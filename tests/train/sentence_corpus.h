#pragma once
// A small English-like corpus for the text-data tests: paragraphs
// (documents) of six sentences drawn deterministically from a few word
// lists, "subject verb object." with ", and it was good." ending every
// third sentence.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tessera::testing {

// The phrases sentences are drawn from: subjects, verbs, objects.
inline const std::vector<std::vector<std::string>>& SentenceCorpusPhrases() {
  static const auto* const lists = new std::vector<std::vector<std::string>>{
      {"The king", "A shepherd", "Her brother", "The people", "My servant"},
      {"went up to", "spoke unto", "looked upon", "built", "remembered"},
      {"the city", "the mountain", "his house", "the river", "the temple"}};
  return *lists;
}
// The words outside the phrases (and the marks).
inline const std::vector<std::string>& SentenceCorpusExtraTokens() {
  static const auto* const words = new std::vector<std::string>{",", ".", "and", "it", "was", "good"};
  return *words;
}

// Writes `paragraphs` paragraphs, blank-line separated, the draws seeded by `seed`.
inline void WriteSentenceCorpus(const std::filesystem::path& path, int paragraphs, uint32_t seed) {
  const auto& lists = SentenceCorpusPhrases();
  std::ofstream out(path);
  uint32_t state = seed;
  auto pick = [&](const std::vector<std::string>& list) -> const std::string& {
    state = state * 1103515245u + 12345u;
    return list[(state >> 16) % list.size()];
  };
  for (int p = 0; p < paragraphs; ++p) {
    for (int s = 0; s < 6; ++s) {
      out << pick(lists[0]) << " " << pick(lists[1]) << " " << pick(lists[2])
          << (s % 3 == 2 ? ", and it was good." : ".") << (s + 1 < 6 ? " " : "\n");
    }
    out << "\n";
  }
}

}  // namespace tessera::testing
