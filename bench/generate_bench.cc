// Greedy generation from a GPT-2 checkpoint with the KV cache
// (train/generate.h): Tessera's side of bench/generate_compare.sh (PyTorch's
// is tests/train/gpt2_reference.py's `bench` mode, with the same prompt and
// the same timing).
//
//   generate_bench --checkpoint DIR [--prompt-len 16] [--new-tokens 256]
//                  [--threads 1 | --tensor-parallel N] [--repeats 5]
//
// Prints "tokens/s X" (new tokens / time of the whole Generate call, prompt
// included, the best of the repeats after one warm-up) and "ids ..." (the
// last run's tokens, for comparing the two sides).

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/thread_pool.h"
#include "train/generate.h"

namespace {

struct Options {
  std::string checkpoint;
  int64_t prompt_len = 16;
  int64_t new_tokens = 256;
  int threads = 1;
  int64_t tensor_parallel = 1;  // ranks, each on its own thread (threads unused)
  int repeats = 5;
};

int Run(const Options& o) {
  // One pool thread is the caller itself: no pool at all for 1.
  std::unique_ptr<tessera::ThreadPool> pool;
  if (o.threads > 1) pool = std::make_unique<tessera::ThreadPool>(o.threads);
  auto generator =
      tessera::Generator::Open(o.checkpoint, {.pool = pool.get(), .tensor_parallel_size = o.tensor_parallel});
  if (!generator.ok()) {
    std::fprintf(stderr, "generate_bench: %s\n", std::string(generator.status().message()).c_str());
    return 1;
  }
  // The prompt of gpt2_reference.py's bench_prompt.
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < o.prompt_len; ++i) prompt.push_back((i * 7919 + 1) % (*generator)->vocab_size());
  const tessera::GenerateOptions greedy{.max_new_tokens = o.new_tokens, .temperature = 0};
  tessera::GenerateOptions warm_up = greedy;
  warm_up.max_new_tokens = 8;
  if (auto g = (*generator)->Generate(prompt, warm_up); !g.ok()) {
    std::fprintf(stderr, "generate_bench: %s\n", std::string(g.status().message()).c_str());
    return 1;
  }
  double best = 0;
  std::vector<int64_t> ids;
  for (int r = 0; r < o.repeats; ++r) {
    const auto begin = std::chrono::steady_clock::now();
    auto g = (*generator)->Generate(prompt, greedy);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (!g.ok()) {
      std::fprintf(stderr, "generate_bench: %s\n", std::string(g.status().message()).c_str());
      return 1;
    }
    if (static_cast<int64_t>(g->ids.size()) != o.new_tokens) {
      std::fprintf(stderr, "generate_bench: stopped after %zu tokens (%s)\n", g->ids.size(),
                   std::string(tessera::StopReasonName(g->stop)).c_str());
      return 1;
    }
    best = r == 0 ? seconds : std::min(best, seconds);
    ids = std::move(g->ids);
  }
  std::printf("tokens/s %.1f\n", static_cast<double>(o.new_tokens) / best);
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) joined += ',';
    joined += std::to_string(ids[i]);
  }
  std::printf("ids %s\n", joined.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Greedy generation with the KV cache: tokens/s"};
  app.add_option("--checkpoint", o.checkpoint, "a checkpoint or an output directory")->required();
  app.add_option("--prompt-len", o.prompt_len, "prompt tokens")->check(CLI::Range(1, 1 << 20));
  app.add_option("--new-tokens", o.new_tokens, "tokens generated per run")->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", o.threads, "kernel threads (the caller included)")->check(CLI::Range(1, 256));
  app.add_option("--tensor-parallel", o.tensor_parallel, "ranks the model is split over, a thread each")
      ->check(CLI::Range(1, 64));
  app.add_option("--repeats", o.repeats, "timed runs (the best is printed)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  if (o.tensor_parallel > 1 && o.threads > 1) {
    std::fprintf(stderr, "generate_bench: --threads and --tensor-parallel: each rank runs on its own thread\n");
    return 1;
  }
  return Run(o);
}
