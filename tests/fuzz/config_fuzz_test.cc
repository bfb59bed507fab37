// The config fuzzer (issue 9): the master daemon will parse job configs that
// arrive over the network, so no config may crash, hang or exhaust the
// process that reads it.
//
// A deterministic, seeded generator mutates the shipped configs
// (configs/mlp_demo.json, configs/gpt2_nano.json) and runs each case through
// config -> model -> graph -> plan in-process (LoadJobConfig, then
// TrainingPlan; nothing is trained). A case is, at random:
//   - overrides on the command line: key paths from the schema and outside it
//     (typos, new segments, paths through leaves), values of every JSON type,
//     boundary and huge integers, NaN / inf / 1e400 as text, deep nesting,
//     invalid UTF-8;
//   - a mutated file: the resolved config with keys set, deleted, retyped,
//     sections replaced by scalars, then serialised and sometimes corrupted
//     byte-wise (flips, truncation, stray bytes);
//   - a random `_base_` graph: files naming each other (cycles, diamonds,
//     missing files, deep chains, lattices), each holding part of a config.
// Every case must end in OK or an error status within kCaseLimitSeconds (more
// for large accepted plans: CaseLimitSeconds).
// The counts (cases, OK, errors by class) are printed.
//
// Deterministic: case i draws from (seed, i), whatever thread runs it.
// TESSERA_FUZZ_SEED overrides the seed, TESSERA_FUZZ_CASES the number of
// cases, TESSERA_FUZZ_THREADS the threads (default: the machine's).

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "core/config.h"
#include "core/logging.h"
#include "core/schema.h"
#include "core/text.h"
#include "tests/cli_runner.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kDefaultSeed = 20261201;
constexpr int64_t kDefaultCases = 10000;
constexpr double kCaseLimitSeconds = 5;
// A config accepted and planned: the memory planner's lifetime analysis
// grows with the square of the registers per device, so a plan of tens of
// thousands of actors (a 255-layer GPT on one device: 38k, about 12 s on
// the development machine) gets more time: 5 s per 10k actors. Its event
// graph holds every act of two iterations, which grows linearly with the
// micro-batches (the analysis too, since it walks each micro-batch's
// releases only a little ahead), so many micro-batches get 5 s per million
// acts (mlp_demo at 65,536 micro-batches, 3.9M acts: 2.3 s alone, twice that
// under a loaded ctest; when the analysis grew with their square, 40 min).
double CaseLimitSeconds(int64_t actors, int64_t micro_batches) {
  const double acts = static_cast<double>(actors) * static_cast<double>(micro_batches);
  return std::max(
      {kCaseLimitSeconds, kCaseLimitSeconds * static_cast<double>(actors) / 10000.0, kCaseLimitSeconds * acts / 1e6});
}
// Cases run on up to this many threads (TESSERA_FUZZ_THREADS), case i on
// thread i % threads; a case writes its files to directory i % kCaseDirs,
// so cases running at once never share one.
constexpr int kMaxThreads = 8;
constexpr int64_t kCaseDirs = 2 * kMaxThreads;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  int64_t value = 0;
  return ParseInteger(std::string_view(text), &value) ? value : fallback;
}

class Generator {
 public:
  Generator(uint64_t seed, int64_t index, const std::vector<std::string>& paths, const std::vector<std::string>& own_paths)
      : rng_(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index)), paths_(paths), own_paths_(own_paths) {}

  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // A key path: mostly declared ones, else typos, extensions and inventions.
  std::string Path() {
    if (benign_) return own_paths_[static_cast<size_t>(Pick(static_cast<int>(own_paths_.size())))];
    const std::string& known = paths_[static_cast<size_t>(Pick(static_cast<int>(paths_.size())))];
    switch (Pick(16)) {
      case 0: {  // a typo: drop, swap or change one character
        std::string p = known;
        const size_t at = static_cast<size_t>(Pick(static_cast<int>(p.size())));
        switch (Pick(3)) {
          case 0: p.erase(at, 1); break;
          case 1: if (at + 1 < p.size()) std::swap(p[at], p[at + 1]); break;
          default: p[at] = static_cast<char>('a' + Pick(26)); break;
        }
        return p.empty() ? "x" : p;
      }
      case 1: return known + "." + Word();  // below a leaf, or a new key in a section
      case 2: return Word() + "." + Word();
      case 3: return Word();
      default: return known;
    }
  }

  std::string Word() {
    static const char* const kWords[] = {"lr", "size", "x", "_target_", "_base_", "enabled", "dist", "model", "train",
                                         "optim", "0", "layers", "seed", "dataloader", "a.b", ""};
    return kWords[Pick(static_cast<int>(std::size(kWords)))];
  }

  int64_t BoundaryInt() {
    static const int64_t kInts[] = {0, 1, -1, 2, 3, 7, 64, 255, 256, 257, 1023, 1024, 65535, 65536, 2147483647,
                                    2147483648LL, -2147483648LL, 4294967295LL, 4294967296LL, 9007199254740993LL,
                                    INT64_MAX, INT64_MIN, INT64_MAX - 1, 1LL << 40, 1LL << 62};
    return kInts[Pick(static_cast<int>(std::size(kInts)))];
  }

  // A JSON value of any type; numbers near `near` when it is a number.
  json Value(const json& near, int depth = 0) {
    switch (benign_ ? 9 + Pick(5) : Pick(20)) {
      case 0: return nullptr;
      case 1: return Chance(0.5);
      case 2: return BoundaryInt();
      case 3: return static_cast<uint64_t>(18446744073709551615ull);
      case 4: {
        static const double kFloats[] = {0.0, -0.0, 0.5, 1.0, -1.0, 1e-300, 1e300, 2.5, 0.999999, 1e-8, 3.3e38, 1e16};
        return kFloats[Pick(static_cast<int>(std::size(kFloats)))];
      }
      case 5: {
        static const char* const kStrings[] = {"", "a", "AdamW", "models.GPT2", "cpu", "cuda", "linear", "true", "1", "null",
                                               "NaN", "\xc3\xa9t\xc3\xa9", "../../etc/passwd", "/dev/null", "a\nb"};
        return kStrings[Pick(static_cast<int>(std::size(kStrings)))];
      }
      case 6: {
        json a = json::array();
        const int n = Pick(4);
        for (int i = 0; i < n; ++i) a.push_back(depth < 3 ? Value(near, depth + 1) : json(BoundaryInt()));
        return a;
      }
      case 7: {
        json o = json::object();
        if (depth < 3) o[Word()] = Value(near, depth + 1);
        return o;
      }
      case 8: {  // deep nesting
        if (!Chance(0.3)) return near;
        json v = 1;
        const int levels = 1 + Pick(60);
        for (int i = 0; i < levels; ++i) v = json::array({v});
        return v;
      }
      default:
        if (near.is_number_integer()) {
          const int64_t n = near.get<int64_t>();
          static const int64_t kScale[] = {-1, 0, 2, 10};
          int64_t v = n / 2;
          bool overflow = false;  // near a boundary the neighbour is the boundary itself
          switch (Pick(4)) {
            case 0: overflow = __builtin_add_overflow(n, 1, &v); break;
            case 1: overflow = __builtin_sub_overflow(n, 1, &v); break;
            case 2: overflow = __builtin_mul_overflow(n, kScale[Pick(4)], &v); break;
            default: break;
          }
          return overflow ? n : v;
        }
        if (near.is_number()) return near.get<double>() * (Chance(0.5) ? 2.0 : -1.0);
        if (near.is_array() && !near.empty()) {
          json a = near;
          a[static_cast<size_t>(Pick(static_cast<int>(a.size())))] = Value(a[0], depth + 1);
          return a;
        }
        return near;
    }
  }

  // The text of an override value: JSON, or raw text JSON cannot hold.
  std::string ValueText(const json& near) {
    switch (benign_ ? 2 : Pick(16)) {
      case 0: {
        static const char* const kRaw[] = {"NaN", "Infinity", "-inf", "inf", "1e400", "-1e400", "0x10", "1_000", "[1,", "{\"a\":",
                                           "\xff\xfe", "caf\xc3", "\xed\xa0\x80", "\xc0\xaf", "'single'", "=", ""};
        return kRaw[Pick(static_cast<int>(std::size(kRaw)))];
      }
      case 1: return std::string(static_cast<size_t>(1 + Pick(200)), '[') + std::string(static_cast<size_t>(Pick(200)), ']');
      default: return Value(near).dump(-1, ' ', false, json::error_handler_t::replace);
    }
  }

  // Benign cases change declared keys to values near theirs, so that many
  // get past the checks and exercise the model, graph and plan.
  void set_benign(bool benign) { benign_ = benign; }

 private:
  std::mt19937_64 rng_;
  bool benign_ = false;
  const std::vector<std::string>& paths_;      // of every source config
  const std::vector<std::string>& own_paths_;  // of this case's source
};

// The node at `path` in `config` (created as objects along the way when
// `create`), or null.
json* At(json& config, const std::string& path, bool create) {
  json* node = &config;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string segment = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) {
      if (!create) return nullptr;
      *node = json::object();
    }
    if (!create && !node->contains(segment)) return nullptr;
    node = &(*node)[segment];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

struct Case {
  std::string kind;
  fs::path file;
  std::vector<std::string> overrides;
};

class ConfigFuzzer {
 public:
  ConfigFuzzer(uint64_t seed, fs::path dir) : seed_(seed), dir_(std::move(dir)) {
    for (const char* name : {"configs/mlp_demo.json", "configs/gpt2_nano.json"}) {
      const std::string path = ::tessera::testing::SourcePath(name);
      sources_.push_back(path);
      auto resolved = LoadJobConfig(path);
      EXPECT_TRUE(resolved.ok()) << resolved.status();
      resolved_.push_back(resolved.ok() ? *resolved : json::object());
      own_paths_.push_back(config::DeclaredPaths(JobSchema(), resolved_.back()));
      for (const std::string& p : own_paths_.back()) paths_.push_back(p);
    }
    std::sort(paths_.begin(), paths_.end());
    paths_.erase(std::unique(paths_.begin(), paths_.end()), paths_.end());
  }

  Case Make(int64_t index) const {
    const int source = static_cast<int>(static_cast<uint64_t>(index) % sources_.size());
    Generator g(seed_, index, paths_, own_paths_[static_cast<size_t>(source)]);
    g.set_benign(g.Chance(0.4));
    Case c;
    c.file = sources_[static_cast<size_t>(source)];
    const int kind = g.Pick(10);
    if (kind < 5) {
      c.kind = "overrides";
      const int n = 1 + g.Pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string path = g.Path();
        json near = nullptr;
        json resolved = resolved_[static_cast<size_t>(source)];
        if (json* node = At(resolved, path, false)) near = *node;
        c.overrides.push_back(path + "=" + g.ValueText(near));
      }
    } else if (kind < 9) {
      c.kind = "file";
      json config = resolved_[static_cast<size_t>(source)];
      const int n = 1 + g.Pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string path = g.Path();
        if (g.Chance(0.15)) {
          if (json* parent = At(config, path.substr(0, path.rfind('.')), false); parent && parent->is_object()) {
            parent->erase(path.substr(path.rfind('.') + 1));
          }
          continue;
        }
        json near = nullptr;
        if (json* node = At(config, path, false)) near = *node;
        *At(config, path, true) = g.Value(near);
      }
      std::string text = config.dump(g.Chance(0.5) ? 2 : -1, ' ', false, json::error_handler_t::replace);
      if (g.Chance(0.1)) Corrupt(g, text);
      c.file = Write(index, "case.json", text);
    } else {
      c.kind = "bases";
      c.file = BaseGraph(g, index, resolved_[static_cast<size_t>(source)]);
    }
    return c;
  }

 private:
  static void Corrupt(Generator& g, std::string& text) {
    if (text.empty()) return;
    const size_t at = static_cast<size_t>(g.Pick(static_cast<int>(text.size())));
    switch (g.Pick(5)) {
      case 0: text.resize(at); break;
      case 1: text[at] = static_cast<char>(text[at] ^ (1 << g.Pick(8))); break;
      case 2: text.insert(at, "\xff"); break;
      case 3: text.insert(at, std::string(1, '\0')); break;
      default: text.insert(at, "/* */"); break;
    }
  }

  fs::path Write(int64_t index, const std::string& name, const std::string& text) const {
    const fs::path path = dir_ / StrCat("case", index % kCaseDirs) / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    return path;
  }

  // Files f0..fk naming random others (and missing ones) as bases; f0 is the
  // config. Each holds one namespace of the real config, some mutated.
  fs::path BaseGraph(Generator& g, int64_t index, const json& config) const {
    const fs::path dir = dir_ / StrCat("case", index % kCaseDirs);
    fs::remove_all(dir);
    fs::create_directories(dir);
    const int files = 2 + g.Pick(20);
    std::vector<std::string> namespaces;
    for (const auto& [key, value] : config.items()) namespaces.push_back(key);
    for (int f = 0; f < files; ++f) {
      json file = json::object();
      const int bases = g.Pick(4);
      json list = json::array();
      for (int b = 0; b < bases; ++b) {
        if (g.Chance(0.05)) {
          list.push_back("missing.json");
        } else if (g.Chance(0.1)) {
          list.push_back(StrCat("f", f, ".json"));  // itself
        } else {
          // Mostly later files (a DAG, chains, lattices), sometimes earlier (cycles).
          const int target = g.Chance(0.9) ? f + 1 + g.Pick(std::max(1, files - f - 1)) : g.Pick(files);
          list.push_back(StrCat("f", std::min(target, files - 1), ".json"));
        }
      }
      if (!list.empty()) file["_base_"] = g.Chance(0.2) && list.size() == 1 ? list[0] : list;
      const std::string& ns = namespaces[static_cast<size_t>(g.Pick(static_cast<int>(namespaces.size())))];
      file[ns] = config[ns];
      if (g.Chance(0.2)) file[ns] = g.Value(file[ns]);
      std::ofstream(dir / StrCat("f", f, ".json"), std::ios::binary | std::ios::trunc)
          << file.dump(-1, ' ', false, json::error_handler_t::replace);
    }
    return dir / "f0.json";
  }

  uint64_t seed_;
  fs::path dir_;
  std::vector<std::string> sources_;
  std::vector<json> resolved_;
  std::vector<std::string> paths_;
  std::vector<std::vector<std::string>> own_paths_;
};

// "unknown config key", "config key 'x' must be" -> "must be", ...: the
// class of an error, for the counts.
std::string ErrorClass(const absl::Status& status) {
  const std::string message(status.message());
  static const char* const kClasses[] = {"malformed override", "not an object", "unknown config key", "is not implemented yet",
                                         "expects", "must be", "must not be", "not valid UTF-8", "deeper than",
                                         "JSON syntax error", "cycle", "does not exist", "NUL byte", "reads more than",
                                         "chain deeper", "no 'model' section", "_target_", "devices", "!= the model",
                                         "global_batch_size", "overflow", "exceeds", "stage", "not a multiple"};
  for (const char* c : kClasses) {
    if (message.find(c) != std::string::npos) return StrCat(absl::StatusCodeToString(status.code()), ": ", c);
  }
  return StrCat(absl::StatusCodeToString(status.code()), ": ", message.substr(0, 60));
}

TEST(ConfigFuzz, EveryCaseIsOkOrAnErrorAndFast) {
  ASSERT_TRUE(SetLogLevel("off").ok());
  const uint64_t seed = static_cast<uint64_t>(EnvInt("TESSERA_FUZZ_SEED", kDefaultSeed));
  const int64_t cases = EnvInt("TESSERA_FUZZ_CASES", kDefaultCases);
  std::printf("config fuzzer: seed %llu, %lld cases (TESSERA_FUZZ_SEED / TESSERA_FUZZ_CASES to change)\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(cases));
  const fs::path dir = fs::temp_directory_path() / StrCat("tessera_config_fuzz_", ::getpid());
  ConfigFuzzer fuzzer(seed, dir);
  const int threads = static_cast<int>(std::clamp<int64_t>(
      EnvInt("TESSERA_FUZZ_THREADS", std::max(1u, std::thread::hardware_concurrency())), 1, kMaxThreads));
  struct Counts {
    std::map<std::string, int64_t> by_kind, ok_by_kind, errors;
    double slowest = 0;
    int64_t slowest_case = -1;
  };
  std::vector<Counts> per_thread(static_cast<size_t>(threads));
  const auto started = std::chrono::steady_clock::now();
  const auto work = [&](int thread) {
    Counts& counts = per_thread[static_cast<size_t>(thread)];
    for (int64_t i = thread; i < cases; i += threads) {
      const Case c = fuzzer.Make(i);
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status status;
      int64_t actors = 0, micro_batches = 1;
      auto config = LoadJobConfig(c.file, c.overrides);
      if (config.ok()) {
        auto plan = TrainingPlan(*config);
        status = plan.status();
        if (plan.ok()) {
          actors = plan->tasks_size();
          for (const auto& task : plan->tasks()) micro_batches = std::max(micro_batches, task.repeat_num());
        }
      } else {
        status = config.status();
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (seconds > counts.slowest) {
        counts.slowest = seconds;
        counts.slowest_case = i;
      }
      ++counts.by_kind[c.kind];
      if (status.ok()) {
        ++counts.ok_by_kind[c.kind];
      } else {
        ++counts.errors[ErrorClass(status)];
        EXPECT_EQ(std::string(status.message()).find('\n'), std::string::npos) << "case " << i << ": " << status;
      }
      if (seconds > CaseLimitSeconds(actors, micro_batches)) {
        std::string text;
        std::ifstream in(c.file);
        for (std::string line; std::getline(in, line);) text += line + " ";
        ADD_FAILURE() << "case " << i << " (" << c.kind << ") took " << seconds << " s: " << text << " overrides "
                      << absl::StrJoin(c.overrides, " ");
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& t : pool) t.join();
  std::map<std::string, int64_t> by_kind, ok_by_kind, errors;
  double slowest = 0;
  int64_t slowest_case = -1;
  for (const Counts& counts : per_thread) {
    for (const auto& [k, n] : counts.by_kind) by_kind[k] += n;
    for (const auto& [k, n] : counts.ok_by_kind) ok_by_kind[k] += n;
    for (const auto& [k, n] : counts.errors) errors[k] += n;
    if (counts.slowest > slowest) {
      slowest = counts.slowest;
      slowest_case = counts.slowest_case;
    }
  }
  fs::remove_all(dir);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  int64_t ok = 0;
  for (const auto& [kind, n] : ok_by_kind) ok += n;
  std::printf("config fuzzer: %lld cases in %.1f s on %d threads, %lld OK, %lld errors; slowest case %lld: %.3f s\n",
              static_cast<long long>(cases), total, threads, static_cast<long long>(ok),
              static_cast<long long>(cases - ok), static_cast<long long>(slowest_case), slowest);
  for (const auto& [kind, n] : by_kind) {
    std::printf("  %-10s %6lld cases, %6lld OK\n", kind.c_str(), static_cast<long long>(n),
                static_cast<long long>(ok_by_kind[kind]));
  }
  std::vector<std::pair<int64_t, std::string>> sorted;
  for (const auto& [error, n] : errors) sorted.emplace_back(n, error);
  std::sort(sorted.rbegin(), sorted.rend());
  for (const auto& [n, error] : sorted) std::printf("  %6lld  %s\n", static_cast<long long>(n), error.c_str());
  // The generator must reach the plan often enough to exercise it.
  EXPECT_GT(ok, cases / 20) << "too few cases got past the config checks";
}

}  // namespace
}  // namespace tessera
