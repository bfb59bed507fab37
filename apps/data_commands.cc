#include "apps/data_commands.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "apps/cli_errors.h"
#include "core/file_util.h"
#include "core/status.h"
#include "core/text.h"
#include "core/thread_pool.h"
#include "data/bpe_trainer.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "train/export.h"
#include "train/generate.h"
#include "train/job_config.h"

namespace tessera {
namespace {


// The vocabulary flags both verbs share. gpt2 defaults to the GPT-2
// vocabulary scripts/setup_data.sh puts in the cache directory.
struct VocabularyFlags {
  std::string tokenizer;
  std::string vocab_file;
  std::string merges_file;
  bool keep_case = false;

  void Add(CLI::App* app, const std::string& kinds) {
    app->add_option("--tokenizer", tokenizer, kinds)->required();
    app->add_option("--vocab-file", vocab_file,
                    "gpt2: encoder.json (default $TESSERA_CACHE/gpt2/encoder.json); bert: vocab.txt (required)");
    app->add_option("--merges-file", merges_file, "gpt2: vocab.bpe (default $TESSERA_CACHE/gpt2/vocab.bpe)");
    app->add_flag("--keep-case", keep_case, "bert: no lower-casing or accent stripping (cased vocabularies)");
  }

  data::TokenizerFiles Files() const {
    data::TokenizerFiles files;
    files.kind = tokenizer;
    files.lower_case = !keep_case;
    if (tokenizer == "gpt2") {
      if (keep_case) Fail("--keep-case is for --tokenizer bert (GPT-2's byte-level BPE keeps case)");
      files.vocab_file = vocab_file.empty() ? CacheDir() / "gpt2" / "encoder.json" : ExpandPath(vocab_file);
      files.merges_file = merges_file.empty() ? CacheDir() / "gpt2" / "vocab.bpe" : ExpandPath(merges_file);
    } else if (tokenizer == "bert") {
      if (vocab_file.empty()) Fail("--tokenizer bert needs --vocab-file (a WordPiece vocab.txt)");
      if (!merges_file.empty()) Fail("--merges-file is for --tokenizer gpt2");
      files.vocab_file = ExpandPath(vocab_file);
    }
    return files;
  }
};

std::unique_ptr<data::Tokenizer> Load(const data::TokenizerFiles& files) {
  auto tokenizer = data::LoadTokenizer(files);
  if (!tokenizer.ok()) Fail(std::string(tokenizer.status().message()));
  return std::move(*tokenizer);
}

// "bpe:N" -> N; 0 for anything else.
int64_t BpeVocabularySize(const std::string& spec) {
  if (!spec.starts_with("bpe:")) return 0;
  int64_t n = 0;
  const char* first = spec.data() + 4;
  const char* last = spec.data() + spec.size();
  auto [ptr, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || ptr != last || n < data::BpeTrainer::kMinVocabSize || n > INT32_MAX) {
    Fail(StrCat("--tokenizer ", spec, ": N must be an integer in [", data::BpeTrainer::kMinVocabSize, ", ", INT32_MAX,
                "]"));
  }
  return n;
}

// Bytes done of total, redrawn in place on a terminal, else nothing until
// the summary line.
class ByteProgress {
 public:
  explicit ByteProgress(std::string what) : what_(std::move(what)), tty_(::isatty(::fileno(stderr)) == 1) {}
  void Update(int64_t done, int64_t total) {
    if (!tty_) return;
    const double seconds = Seconds();
    const double mb = static_cast<double>(done) / 1e6;
    std::fprintf(stderr, "\r%s %3.0f%%  %.1f / %.1f MB  %.1f MB/s\033[K", what_.c_str(),
                 total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0, mb,
                 static_cast<double>(total) / 1e6, seconds > 0 ? mb / seconds : 0.0);
    std::fflush(stderr);
  }
  void Finish() {
    if (tty_) std::fputs("\n", stderr);
  }
  double Seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  std::string what_;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The temporaries a killed run writing `prefix` left: `prefix` + an infix
// + what the writer appends, mkstemp's six characters (`random`: of a file
// untouched for 10 minutes, as a live writer appends to its own all along)
// or a process id that no process has any more. Anything else of a like
// name (a user's file, one of the inputs, a live writer's) stays.
struct TemporaryName {
  std::string_view infix;
  bool random;  // mkstemp's XXXXXX; else a process id
};
void RemoveStaleTemporaries(const std::filesystem::path& prefix, std::initializer_list<TemporaryName> names,
                            const std::vector<std::filesystem::path>& keep = {}) {
  const std::filesystem::path dir = prefix.has_parent_path() ? prefix.parent_path() : std::filesystem::path(".");
  const std::string base = prefix.filename().string();
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    for (const TemporaryName& temporary : names) {
      if (!name.starts_with(base) || std::string_view(name).substr(base.size()).find(temporary.infix) != 0) continue;
      const std::string_view rest = std::string_view(name).substr(base.size() + temporary.infix.size());
      const bool alnum = !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0;
      });
      const bool digits = alnum && std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
      bool dead = false;
      if (digits && rest.size() <= 9) {
        const pid_t pid = static_cast<pid_t>(std::stol(std::string(rest)));
        dead = ::kill(pid, 0) != 0 && errno == ESRCH;
      }
      bool untouched = false;
      if (temporary.random && alnum && rest.size() == 6) {
        std::error_code time_ec;
        const auto written = std::filesystem::last_write_time(entry.path(), time_ec);
        untouched = !time_ec && std::filesystem::file_time_type::clock::now() - written > std::chrono::minutes(10);
      }
      if (temporary.random ? untouched : dead) stale.push_back(entry.path());
    }
  }
  for (const auto& path : stale) {
    const bool kept = std::any_of(keep.begin(), keep.end(), [&](const std::filesystem::path& k) {
      return std::filesystem::equivalent(k, path, ec);
    });
    if (!kept) std::filesystem::remove_all(path, ec);
  }
}

// Whether the learnt vocabulary's two files can replace their namesakes in
// `to`: each missing or a file (a directory there failed the second rename,
// after the dataset and the other file were in place).
absl::Status CheckVocabularyTargets(const std::filesystem::path& to) {
  for (const char* name : {"vocab.bpe", "encoder.json"}) {
    std::error_code ec;
    const std::filesystem::file_status status = std::filesystem::symlink_status(to / name, ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
        !std::filesystem::is_symlink(status)) {
      return absl::InvalidArgumentError(
          StrCat("the learnt vocabulary's ", name, " would replace ", (to / name).string(), ", which is not a file"));
    }
  }
  return absl::OkStatus();
}

// Moves the learnt vocabulary's two files from `from` into `to` (made if
// missing), each replacing its namesake; whatever else `to` holds stays.
absl::Status PlaceVocabulary(const std::filesystem::path& from, const std::filesystem::path& to) {
  RETURN_IF_ERROR(CheckVocabularyTargets(to));
  std::error_code ec;
  std::filesystem::create_directories(to, ec);
  if (ec || !std::filesystem::is_directory(to)) {
    return absl::InvalidArgumentError(StrCat("cannot make the vocabulary directory ", to.string(),
                                             ec ? ": " + ec.message() : std::string(": a file is there")));
  }
  // The merges first: a crash between the two renames leaves new merges
  // beside the old encoder, which a rerun replaces (no id changes meaning
  // without the encoder).
  for (const char* name : {"vocab.bpe", "encoder.json"}) {
    std::filesystem::rename(from / name, to / name, ec);
    if (ec)
      return absl::InternalError(
          StrCat("cannot move ", (from / name).string(), " to ", to.string(), ": ", ec.message()));
  }
  return SyncPath(to);
}

void AddPreprocess(CLI::App& app) {
  struct Flags {
    std::vector<std::string> inputs;
    std::string output;
    VocabularyFlags vocabulary;
    std::string format = "auto";
    std::string json_key = "text";
    bool split_sentences = false;
    bool no_eod = false;
    int threads = 0;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* verb = app.add_subcommand(
      "preprocess",
      "Tokenise text files into an indexed dataset (PREFIX.bin + PREFIX.idx, Megatron's format) for training");
  verb->add_option("--input", flags->inputs, "Text files, read in order (.jsonl: a JSON object per line)")
      ->required()
      ->expected(1, -1);
  verb->add_option("--output", flags->output, "Output prefix: writes PREFIX.bin and PREFIX.idx")->required();
  flags->vocabulary.Add(verb,
                        "gpt2 (GPT-2's byte-level BPE), bert (WordPiece, needs --vocab-file), or bpe:N (learn a "
                        "byte-level BPE vocabulary of N tokens from the inputs first, written to PREFIX-vocab/)");
  verb->add_option("--format", flags->format,
                   "auto (.jsonl by name, else paragraphs), paragraphs (blank lines separate documents), lines (a "
                   "document per line) or jsonl")
      ->check(CLI::IsMember({"auto", "paragraphs", "lines", "jsonl"}))
      ->capture_default_str();
  verb->add_option("--json-key", flags->json_key, "jsonl: the field holding each document")->capture_default_str();
  verb->add_flag("--split-sentences", flags->split_sentences,
                 "One sequence per sentence, no end-of-document token (what BERT's dataset reads)");
  verb->add_flag("--no-eod", flags->no_eod,
                 "Do not end each document with the end-of-document token (--split-sentences ends none)");
  verb->add_option("--threads", flags->threads, "Worker threads (0: all hardware threads)")
      ->check(InRange(0, 1024))
      ->capture_default_str();
  verb->callback([flags, verb] {
    RemoveTemporariesOnSignals();
    const std::filesystem::path prefix = ExpandPath(flags->output);
    if (prefix.extension() == ".bin" || prefix.extension() == ".idx") {
      // (It wrote X.bin.bin and X.bin.idx, which data_prefix=X.bin read.)
      Fail(StrCat("--output ", flags->output, ": give the prefix, without ", prefix.extension().string(),
                  " (PREFIX.bin and PREFIX.idx are written)"));
    }
    std::vector<std::filesystem::path> inputs;
    for (const std::string& input : flags->inputs) inputs.push_back(ExpandPath(input));
    RemoveStaleTemporaries(
        prefix, {{".bin.tmp-", true}, {".idx.tmp-", true}, {".source.json.tmp-", false}, {"-vocab.tmp-", false}},
        inputs);
    if (verb->count("--json-key") > 0 && flags->format != "jsonl" &&
        (flags->format != "auto" || std::none_of(flags->inputs.begin(), flags->inputs.end(),
                                                 [](const std::string& in) { return data::IsJsonlName(in); }))) {
      Fail("--json-key is for jsonl input (--format jsonl, or an input named *.jsonl)");
    }
    // An output that is one of the inputs would overwrite it.
    if (absl::Status distinct =
            data::CheckInputsAreNotOutputs(inputs, prefix, BpeVocabularySize(flags->vocabulary.tokenizer) > 0);
        !distinct.ok()) {
      Fail(StrCat("--output ", flags->output, ": ", distinct.message()));
    }
    data::PreprocessOptions options;
    options.inputs = inputs;
    options.output_prefix = prefix;
    options.json_key = flags->json_key;
    if (flags->no_eod && flags->split_sentences) {
      Fail(
          "--no-eod with --split-sentences: --split-sentences ends documents with no token already (give one of them)");
    }
    // (Sentences are BERT's: its pairs take no end-of-document token, as
    // Megatron's BERT datasets; one put [SEP] after every document.)
    options.append_end_of_document = !flags->no_eod && !flags->split_sentences;
    options.split_sentences = flags->split_sentences;
    options.num_threads = flags->threads;
    if (flags->format == "paragraphs") options.format = data::InputFormat::kParagraphs;
    if (flags->format == "lines") options.format = data::InputFormat::kLines;
    if (flags->format == "jsonl") options.format = data::InputFormat::kJsonl;
    data::TokenizerFiles files;
    // bpe:N learns into a directory of its own, whose two files move into
    // PREFIX-vocab/ only once the dataset is written: a failed run leaves
    // neither a vocabulary without its dataset nor one that does not match
    // the dataset beside it.
    std::filesystem::path learnt, vocab_dir;
    struct RemoveLearnt {
      std::filesystem::path* dir;
      ~RemoveLearnt() {
        std::error_code ec;
        if (!dir->empty()) std::filesystem::remove_all(*dir, ec);
      }
    } remove_learnt{&learnt};
    std::vector<std::unique_ptr<TemporaryFile>> learnt_registered;
    if (const int64_t vocab_size = BpeVocabularySize(flags->vocabulary.tokenizer); vocab_size > 0) {
      if (!flags->vocabulary.vocab_file.empty() || !flags->vocabulary.merges_file.empty()) {
        Fail(StrCat("--vocab-file and --merges-file are for gpt2 and bert: --tokenizer ", flags->vocabulary.tokenizer,
                    " learns its own into ", prefix.string(), "-vocab/"));
      }
      if (flags->vocabulary.keep_case) Fail("--keep-case is for --tokenizer bert (byte-level BPE keeps case)");
      auto trainer = data::BpeTrainer::Create();
      if (!trainer.ok()) Fail(std::string(trainer.status().message()));
      // The documents the encoder reads (a .jsonl's field, not its JSON).
      if (auto added = data::ForEachDocument(options, [&](std::string_view text) { return (*trainer)->AddText(text); });
          !added.ok()) {
        Fail(std::string(added.message()));
      }
      vocab_dir = prefix.string() + "-vocab";
      if (std::error_code ec; std::filesystem::exists(vocab_dir, ec) && !std::filesystem::is_directory(vocab_dir, ec)) {
        Fail(StrCat("--tokenizer ", flags->vocabulary.tokenizer, " writes its vocabulary into ", vocab_dir.string(),
                    "/, where a file is"));
      }
      if (absl::Status placeable = CheckVocabularyTargets(vocab_dir); !placeable.ok()) {
        Fail(std::string(placeable.message()));
      }
      learnt = StrCat(vocab_dir.string(), ".tmp-", ::getpid());
      // A Ctrl-C while the vocabulary is written or the corpus encoded
      // leaves no vocabulary of a dataset never written (registered before
      // they exist: the next run's clean-up would find them otherwise).
      learnt_registered.emplace_back(std::make_unique<TemporaryFile>(learnt / "encoder.json"));
      learnt_registered.emplace_back(std::make_unique<TemporaryFile>(learnt / "vocab.bpe"));
      learnt_registered.emplace_back(std::make_unique<TemporaryFile>(learnt, /*directory=*/true));
      if (auto trained = (*trainer)->Train(vocab_size, learnt); !trained.ok()) Fail(std::string(trained.message()));
      files = {.kind = "gpt2", .vocab_file = learnt / "encoder.json", .merges_file = learnt / "vocab.bpe"};
    } else if (flags->vocabulary.tokenizer == "gpt2" || flags->vocabulary.tokenizer == "bert") {
      files = flags->vocabulary.Files();
    } else {
      Fail(StrCat("--tokenizer ", flags->vocabulary.tokenizer, ": expected gpt2, bert or bpe:N"));
    }
    const std::unique_ptr<data::Tokenizer> tokenizer = Load(files);
    if (!learnt.empty()) {
      // In the dataset's commit: a Ctrl-C there left the new dataset beside
      // the old vocabulary, the new one deleted.
      options.commit_also = [&] { return PlaceVocabulary(learnt, vocab_dir); };
    }
    ByteProgress progress("preprocess");
    auto stats =
        data::Preprocess(options, *tokenizer, [&](int64_t done, int64_t total) { progress.Update(done, total); });
    progress.Finish();
    if (!stats.ok()) Fail(std::string(stats.status().message()));
    if (!learnt.empty()) {
      std::error_code ec;
      std::filesystem::remove(learnt, ec);  // empty now
      learnt.clear();
      std::printf("vocabulary: %s/encoder.json, %s/vocab.bpe (%lld tokens)\n", vocab_dir.c_str(), vocab_dir.c_str(),
                  static_cast<long long>(tokenizer->vocab_size()));
    }
    const double seconds = progress.Seconds();
    std::printf(
        "wrote %s.bin and %s.idx: %lld documents, %lld sequences, %lld tokens from %.1f MB in %.1f s (%.1f MB/s)\n",
        prefix.c_str(), prefix.c_str(), static_cast<long long>(stats->documents),
        static_cast<long long>(stats->sequences), static_cast<long long>(stats->tokens),
        static_cast<double>(stats->bytes) / 1e6, seconds,
        seconds > 0 ? static_cast<double>(stats->bytes) / 1e6 / seconds : 0.0);
    std::fflush(stdout);
    Succeed();
  });
}

// `bytes` as text: each maximal invalid part (a character cut short, a
// stray byte) as one U+FFFD, as GPT-2's encoder.py (errors="replace") and
// Python's "maximal subpart" do. Ids decode to bytes, and ids that end
// inside a character (or a model's unlikely byte tokens) give part of one.
std::string ReplaceInvalidUtf8(std::string_view bytes) {
  std::string shown;
  for (std::string_view rest = bytes; !rest.empty();) {
    const size_t valid = FirstInvalidUtf8(rest).value_or(rest.size());
    shown.append(rest.substr(0, valid));
    if (valid == rest.size()) break;
    shown.append("\xEF\xBF\xBD");
    const auto lead = static_cast<unsigned char>(rest[valid]);
    const size_t length = lead >= 0xF0 && lead <= 0xF4   ? 4
                          : lead >= 0xE0 && lead <= 0xEF ? 3
                          : lead >= 0xC2 && lead <= 0xDF ? 2
                                                         : 1;
    size_t taken = 1;
    while (taken < length && valid + taken < rest.size()) {
      const auto next = static_cast<unsigned char>(rest[valid + taken]);
      unsigned char lo = 0x80, hi = 0xBF;
      if (taken == 1 && lead == 0xE0) lo = 0xA0;
      if (taken == 1 && lead == 0xED) hi = 0x9F;
      if (taken == 1 && lead == 0xF0) lo = 0x90;
      if (taken == 1 && lead == 0xF4) hi = 0x8F;
      if (next < lo || next > hi) break;
      ++taken;
    }
    rest.remove_prefix(valid + taken);
  }
  return shown;
}

void AddTokenize(CLI::App& app) {
  struct Flags {
    VocabularyFlags vocabulary;
    bool decode = false;
    std::vector<std::string> text;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* verb = app.add_subcommand("tokenize", "Print the token ids of a text (or, with --decode, the text of ids)");
  flags->vocabulary.Add(verb, "gpt2 (GPT-2's byte-level BPE) or bert (WordPiece, needs --vocab-file)");
  verb->add_flag("--decode", flags->decode, "Read token ids (decimal, separated by spaces) and print their text");
  verb->add_option("TEXT", flags->text,
                   "The text (several arguments are joined by spaces); - or nothing: standard input, "
                   "less one final line break (as `$(...)` drops it: `echo TEXT |` tokenizes TEXT)");
  verb->callback([flags] {
    if (flags->vocabulary.tokenizer != "gpt2" && flags->vocabulary.tokenizer != "bert") {
      Fail(StrCat("--tokenizer ", flags->vocabulary.tokenizer, ": expected gpt2 or bert"));
    }
    const std::unique_ptr<data::Tokenizer> tokenizer = Load(flags->vocabulary.Files());
    std::string text;
    const bool from_stdin = flags->text.empty() || (flags->text.size() == 1 && flags->text[0] == "-");
    const std::string source = from_stdin ? "standard input" : "TEXT";
    if (from_stdin) {
      struct stat st {};
      if (::fstat(STDIN_FILENO, &st) != 0) Fail(StrCat("cannot read standard input: ", std::strerror(errno)));
      if (S_ISDIR(st.st_mode)) Fail("standard input is a directory, not text");
      // (Bounded: `< /dev/zero` grew without end. A corpus is preprocess's.)
      constexpr size_t kMaxTokenizeBytes = size_t{1} << 30;
      std::array<char, 1 << 16> chunk;
      // (read(2) itself: a failing read, a write-only descriptor say, was
      // taken by std::cin for the end of an empty text.)
      for (;;) {
        const ssize_t n = ::read(STDIN_FILENO, chunk.data(), chunk.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) Fail(StrCat("cannot read standard input: ", std::strerror(errno)));
        if (n == 0) break;
        if (text.size() + static_cast<size_t>(n) > kMaxTokenizeBytes) {
          Fail("standard input is over 1 GiB: tokenize prints the ids of a text; a corpus is for `tessera preprocess`");
        }
        text.append(chunk.data(), static_cast<size_t>(n));
      }
      // The line break that ends what `echo` or an editor wrote is not part
      // of the text asked about (it was one more id, GPT-2's 198).
      if (text.ends_with('\n')) {
        text.pop_back();
        if (text.ends_with('\r')) text.pop_back();
      }
    } else {
      for (size_t i = 0; i < flags->text.size(); ++i) {
        text += (i > 0 ? " " : "") + flags->text[i];
      }
    }
    if (flags->decode) {
      std::vector<int64_t> ids;
      std::istringstream in(text);
      std::string word;
      while (in >> word) {
        int64_t id = 0;
        auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
        if (ec != std::errc() || ptr != word.data() + word.size())
          Fail(StrCat("--decode: '", word, "' is not a token id"));
        ids.push_back(id);
      }
      auto decoded = tokenizer->Decode(ids);
      if (!decoded.ok()) Fail(std::string(decoded.status().message()));
      const std::string shown = ReplaceInvalidUtf8(*decoded);
      std::fwrite(shown.data(), 1, shown.size(), stdout);
      std::fputs("\n", stdout);
    } else {
      auto ids = tokenizer->Encode(text);
      if (!ids.ok()) Fail(StrCat(source, ": ", ids.status().message()));
      std::string line;
      for (size_t i = 0; i < ids->size(); ++i) line += StrCat(i > 0 ? " " : "", (*ids)[i]);
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
    Succeed();
  });
}

void AddGenerate(CLI::App& app) {
  struct Flags {
    std::string path;
    std::string prompt;
    std::string config;
    TextGenerateOptions options;
    int threads = 0;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* verb = app.add_subcommand(
      "generate", "Continue a prompt with a trained GPT (its latest checkpoint, with a KV cache) and print the text");
  verb->add_option("CHECKPOINT_OR_OUTPUT_DIR", flags->path,
                   "A checkpoint (output_dir/checkpoints/iter_N), a training output directory (its latest one), "
                   "or Hugging Face GPT-2 weights (model.safetensors, with --config)")
      ->required();
  verb->add_option("--prompt", flags->prompt, "The text to continue")->required();
  verb->add_option("--config", flags->config,
                   "A run config (model and tokenization sections) to use instead of the checkpoint's; required "
                   "for Hugging Face weights");
  verb->add_option("--max-new-tokens", flags->options.generate.max_new_tokens, "Tokens to generate at most")
      ->check(InRange(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  verb->add_option("--temperature", flags->options.generate.temperature, "Sampling temperature; 0: greedy (the argmax)")
      ->check(InRange(0.0, 1e6))
      ->capture_default_str();
  verb->add_option("--top-k", flags->options.generate.top_k, "Sample among the k likeliest tokens; 0: all")
      ->check(InRange(int64_t{0}, int64_t{2147483647}))
      ->capture_default_str();
  verb->add_option("--top-p", flags->options.generate.top_p,
                   "Sample among the likeliest tokens holding this probability, in (0, 1]; 1: all")
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            double value = 0;
            if (!CLI::detail::lexical_cast(text, value) || !(value > 0 && value <= 1)) {
              return "'" + text + "' is not a number in (0, 1]";
            }
            return "";
          },
          "FLOAT in (0, 1]"))
      ->capture_default_str();
  verb->add_option("--seed", flags->options.generate.seed, "Seed of the draws (the same seed, the same text)")
      ->check(CLI::Validator(
          [](std::string& value) {
            // CLI11 would wrap -1 and saturate 2^64 into the same seed.
            uint64_t seed = 0;
            const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), seed);
            return error == std::errc() && end == value.data() + value.size()
                       ? std::string()
                       : StrCat("'", value, "' is not an integer in [0, 2^64 - 1]");
          },
          "UINT64"))
      ->capture_default_str();
  verb->add_option("--threads", flags->threads, "Kernel threads (0: all hardware threads)")
      ->check(InRange(0, 1024))
      ->capture_default_str();
  verb->add_option("--tensor-parallel", flags->options.generator.tensor_parallel_size,
                   "Split the model over N ranks as training's tensor parallelism (heads, MLP columns and the "
                   "vocabulary), each holding only its slices and running on a thread of its own; N need not divide "
                   "the heads (ranks beyond them hold none) and is at most the vocabulary")
      ->check(InRange(int64_t{1}, int64_t{1024}))
      ->capture_default_str();
  verb->callback([flags, verb] {
    if (flags->options.generator.tensor_parallel_size > 1 && flags->threads > 0) {
      Fail("--threads and --tensor-parallel: with several ranks each runs its kernels on its own thread");
    }
    // Greedy decoding draws nothing: the flags of the draws are unread.
    if (flags->options.generate.temperature == 0) {
      for (const char* flag : {"--top-k", "--top-p", "--seed"}) {
        if (verb->count(flag) > 0) {
          Fail(StrCat(flag,
                      " with --temperature 0: greedy decoding takes the likeliest token and draws nothing (give "
                      "a temperature above 0 to sample)"));
        }
      }
    }
    const int threads = flags->threads > 0 ? flags->threads : std::max(1u, std::thread::hardware_concurrency());
    std::unique_ptr<ThreadPool> pool;
    if (threads > 1 && flags->options.generator.tensor_parallel_size == 1) pool = std::make_unique<ThreadPool>(threads);
    flags->options.generator.pool = pool.get();
    if (!flags->config.empty()) {
      auto config = LoadJobConfig(ExpandPath(flags->config), {});
      if (!config.ok()) Fail(std::string(config.status().message()));
      flags->options.generator.run_config = *config;
    }
    auto generated = GenerateText(ExpandPath(flags->path), flags->prompt, flags->options);
    if (!generated.ok()) Fail(std::string(generated.status().message()));
    std::fwrite(flags->prompt.data(), 1, flags->prompt.size(), stdout);
    // (The continuation as text: a last token may stop inside a character.)
    const std::string continuation = ReplaceInvalidUtf8(generated->text);
    std::fwrite(continuation.data(), 1, continuation.size(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    // Cut short by the model's context, not by the request: said, on stderr.
    const int64_t made = static_cast<int64_t>(generated->generation.ids.size());
    if (generated->generation.stop == StopReason::kContextFull && made < flags->options.generate.max_new_tokens) {
      std::fprintf(stderr,
                   "tessera: stopped after %lld of the %lld new tokens asked for: the model's %lld positions "
                   "(model.max_seq_length) are full\n",
                   static_cast<long long>(made), static_cast<long long>(flags->options.generate.max_new_tokens),
                   static_cast<long long>(generated->prompt_tokens + made));
    }
    Succeed();
  });
}

void AddExport(CLI::App& app) {
  struct Flags {
    std::string path;
    std::string output;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* verb = app.add_subcommand(
      "export",
      "Write a trained GPT-2's or BERT's weights as Hugging Face's model.safetensors (GPT2Model's, or "
      "BertForPreTraining's, names and layout)");
  verb->add_option("CHECKPOINT_OR_OUTPUT_DIR", flags->path,
                   "A checkpoint (output_dir/checkpoints/iter_N) or a training output directory (its latest one)")
      ->required();
  verb->add_option("--output", flags->output,
                   "A .safetensors file to write the weights to, or a directory (made if missing) to write "
                   "model.safetensors and transformers' config.json into, as save_pretrained does; replaced if they "
                   "exist")
      ->required();
  verb->callback([flags] {
    RemoveTemporariesOnSignals();
    const std::filesystem::path output = ExpandPath(flags->output);
    for (const std::filesystem::path& written :
         output.extension() == ".safetensors"
             ? std::vector<std::filesystem::path>{output}
             : std::vector{output / "model.safetensors", output / "config.json", output / "vocab.json",
                           output / "merges.txt", output / "vocab.txt", output / "tokenizer_config.json"}) {
      RemoveStaleTemporaries(written, {{".tmp-", false}});
    }
    auto summary = ExportHuggingFace(ExpandPath(flags->path), output);
    if (!summary.ok()) Fail(std::string(summary.status().message()));
    std::printf("exported %lld tensors (%.1f MB) of %s to %s%s%s\n", static_cast<long long>(summary->tensors),
                static_cast<double>(summary->bytes) / 1e6, summary->checkpoint.c_str(), summary->weights.c_str(),
                summary->config.empty() ? "" : " and ", summary->config.c_str());
    if (!summary->tokenizer_files.empty()) {
      std::vector<std::string> names;
      for (const auto& file : summary->tokenizer_files) names.push_back(file.filename().string());
      std::printf("the run's tokenizer: %s\n", absl::StrJoin(names, ", ").c_str());
    } else if (!summary->config.empty()) {
      std::printf("%s\n", summary->tokenizer_note.c_str());
    }
    std::fflush(stdout);
    Succeed();
  });
}

}  // namespace

void AddDataCommands(CLI::App& app) {
  AddPreprocess(app);
  AddTokenize(app);
  AddGenerate(app);
  AddExport(app);
}

}  // namespace tessera
