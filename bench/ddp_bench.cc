// GPT-2 trained data-parallel over 2 processes, one CPU device each, talking
// over gloo: Tessera's side of bench/ddp_compare.sh (PyTorch DDP's is
// bench/ddp_torch.py). DESIGN §13's CPU model: 4 layers, hidden 256, 4 heads,
// seq 128, micro-batch 8 per rank, vocabulary 8192, AdamW, LM head tied to
// wte, dropout 0, one kernel thread per process (gpt2_nano with overrides;
// --set adds more). The plan's data parallelism all-reduces the gradients
// in buckets (train.dist.gradient_bucket_mb, 25 by default: two all-reduces
// of 21 MB in all here; 0 reduces each gradient alone); the collectives are
// printed.
//
//   ddp_bench [--dp 2] [--warmup 5] [--iters 20] [--independent] [--set KEY=VALUE]...
//             [--log-level warn] [--timeout 600]
//
// The job is compiled once here and cut into one NodePlan per process
// (CompileForNodes(config, {1, 1})); the binary re-executes itself as each
// node (`--node-child=...`), which runs its NodePlan through
// Runtime::LoadNodePlan with a JobFeed made from NodePlan.job_config, meeting
// the other over a file-backed KvStore — what tests/integration/
// multinode_test.cc does. Time per iteration comes from the fetch callback's
// timestamps on the node holding the sink: (t[last] - t[warmup - 1]) /
// iters, so the warm-up iterations (first-touch allocation, connection)
// are excluded. Prints the parameter count, the sink process's CPU time per
// iteration (all threads), each busy thread's iteration split into on a CPU /
// runnable waiting for one / blocked (from /proc/self/task/*/schedstat), and
//   tokens/s = dp × micro-batch × seq / time per iteration.
//
// Controls for where the time goes:
//   --dp 1                one process, no collectives;
//   --dp 1 --independent  two unrelated single-device jobs at once: the DP
//                         run's CPU time without the collectives (its wall
//                         time is not comparable on a loaded machine: the
//                         scheduler favours the DP processes, which sleep).

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "core/logging.h"
#include "core/registry.h"
#include "core/thread_pool.h"
#include "models/model.h"
#include "tests/comm/gloo_file_kv_store.h"
#include "train/feeds.h"
#include "train/job_config.h"
#include "train/trainer.h"

extern char** environ;

namespace tessera {
namespace {

std::string SourcePath(const std::string& relative) { return std::string(TESSERA_SOURCE_DIR) + "/" + relative; }

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// steady_clock is CLOCK_MONOTONIC on Linux: one clock for every process of
// the machine, so the nodes' timestamps can be compared.
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time of the whole process (every thread), which the other work of a
// shared machine does not inflate the way it does wall time.
double ProcessCpuSeconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One thread's scheduler times (/proc/self/task/TID/schedstat): on a CPU,
// and runnable but waiting for one (the other work of a shared machine).
// What is left of the wall time it slept: blocked on another thread or a peer.
struct ThreadTimes {
  int64_t tid = 0;
  double run_s = 0, wait_s = 0;
};

std::vector<ThreadTimes> ReadThreadTimes() {
  std::vector<ThreadTimes> out;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", error)) {
    std::ifstream in(entry.path() / "schedstat");
    int64_t run_ns = 0, wait_ns = 0;
    if (!(in >> run_ns >> wait_ns)) continue;  // the thread has just exited
    out.push_back({std::stoll(entry.path().filename().string()), static_cast<double>(run_ns) * 1e-9,
                   static_cast<double>(wait_ns) * 1e-9});
  }
  return out;
}

// ---- A node process ---------------------------------------------------------

// spec = NODE_PLAN_FILE,KV_DIR,TIMES_FILE. Writes one line per fetched
// iteration, "ITERATION NANOSECONDS CPU_SECONDS LOSS TID:RUN:WAIT...", and a last line
// "run LOAD_SECONDS RUN_SECONDS RUN_CPU_SECONDS" (LoadNodePlan includes the
// gloo rendezvous).
int RunNodeChild(const std::string& spec) {
  const size_t a = spec.find(','), b = spec.find(',', a + 1);
  if (a == std::string::npos || b == std::string::npos) {
    std::fprintf(stderr, "--node-child expects PLAN,KV_DIR,TIMES, got '%s'\n", spec.c_str());
    return 2;
  }
  const std::string plan_file = spec.substr(0, a), kv_dir = spec.substr(a + 1, b - a - 1), times_file = spec.substr(b + 1);
  std::ifstream in(plan_file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  auto node_plan = actors::ParseNodePlan(bytes.str());
  if (!node_plan.ok()) {
    std::fprintf(stderr, "node: %s\n", std::string(node_plan.status().message()).c_str());
    return 1;
  }
  auto feed = JobFeed::Make(nlohmann::json::parse(node_plan->job_config()));
  if (!feed.ok()) {
    std::fprintf(stderr, "node %u: %s\n", node_plan->node(), std::string(feed.status().message()).c_str());
    return 1;
  }
  comm::testing::FileKvStore kv(kv_dir);
  actors::RuntimeOptions options;
  // train.dist.intra_op_threads kernel threads (1: the actor's own thread),
  // as the job runner gives a device.
  std::unique_ptr<ThreadPool> pool;
  if ((*feed)->intra_op_threads() > 1) {
    pool = std::make_unique<ThreadPool>((*feed)->intra_op_threads());
    options.pool = pool.get();
  }
  options.kv = &kv;
  options.kv_prefix = "ddp_bench";
  options.stall_timeout_s = 120;
  options.connect_timeout_s = 60;
  struct Fetched {
    int64_t iteration;
    int64_t ns;
    double cpu_s;
    float loss;
    std::vector<ThreadTimes> threads;
  };
  std::vector<Fetched> fetched;
  const FeedFn fill = (*feed)->feed();
  const FetchFn fetch = [&fetched](int64_t iteration, const std::map<std::string, Tensor>& values) {
    fetched.push_back(
        {iteration, NowNs(), ProcessCpuSeconds(), values.at("loss").ToVector<float>().at(0), ReadThreadTimes()});
    return absl::OkStatus();
  };
  absl::Status status = BindFeeds(node_plan->plan(), fill, options.callbacks);
  if (status.ok()) status = BindFetch(node_plan->plan(), fetch, options.callbacks);
  double load_s = 0, run_s = 0, run_cpu_s = 0;
  if (status.ok()) {
    const auto load_started = std::chrono::steady_clock::now();
    auto runtime = actors::Runtime::LoadNodePlan(bytes.str(), std::move(options));
    load_s = SecondsSince(load_started);
    const auto run_started = std::chrono::steady_clock::now();
    const double cpu_started = ProcessCpuSeconds();
    status = runtime.ok() ? (*runtime)->Run() : runtime.status();
    run_s = SecondsSince(run_started);
    run_cpu_s = ProcessCpuSeconds() - cpu_started;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "node %u: %s\n", node_plan->node(), std::string(status.message()).c_str());
    return 1;
  }
  std::ofstream out(times_file);
  for (const Fetched& f : fetched) {
    out << f.iteration << " " << f.ns << " " << f.cpu_s << " " << f.loss;
    for (const ThreadTimes& t : f.threads) out << " " << t.tid << ":" << t.run_s << ":" << t.wait_s;
    out << "\n";
  }
  out << "run " << load_s << " " << run_s << " " << run_cpu_s << "\n";
  return out ? 0 : 1;
}

// ---- The parent ---------------------------------------------------------------

struct Scratch {
  Scratch() : dir(std::filesystem::temp_directory_path() / ("tessera_ddp_bench_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / "kv");
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
};

struct NodeTimes {
  std::vector<int64_t> ns;    // fetch timestamps, by iteration
  std::vector<double> cpu_s;  // the process's CPU time at each fetch
  std::vector<float> losses;
  std::vector<std::map<int64_t, ThreadTimes>> threads;  // by iteration, by thread id
  double load_s = 0, run_s = 0, run_cpu_s = 0;
};

NodeTimes ReadTimes(const std::filesystem::path& file) {
  NodeTimes times;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string first;
    fields >> first;
    if (first == "run") {
      fields >> times.load_s >> times.run_s >> times.run_cpu_s;
      continue;
    }
    int64_t ns = 0;
    double cpu_s = 0;
    float loss = 0;
    fields >> ns >> cpu_s >> loss;
    times.ns.push_back(ns);
    times.cpu_s.push_back(cpu_s);
    times.losses.push_back(loss);
    std::map<int64_t, ThreadTimes>& threads = times.threads.emplace_back();
    for (std::string word; fields >> word;) {
      ThreadTimes t;
      long long tid = 0;
      if (std::sscanf(word.c_str(), "%lld:%lf:%lf", &tid, &t.run_s, &t.wait_s) == 3) {
        t.tid = tid;
        threads[t.tid] = t;
      }
    }
  }
  return times;
}

// Trainable parameters of the config's model (what PyTorch's
// sum(p.numel() for p in model.parameters()) counts; the tied head has none).
absl::StatusOr<int64_t> CountParameters(const nlohmann::json& config) {
  Registry<models::Model> registry("model");
  RETURN_IF_ERROR(models::RegisterBuiltinModels(registry));
  ASSIGN_OR_RETURN(std::unique_ptr<models::Model> model, registry.Create(config.at("model")));
  ASSIGN_OR_RETURN(graph::Graph graph, model->BuildGraph(1));
  int64_t count = 0;
  for (graph::ValueId id : graph.Variables()) {
    if (graph.variable_info(id).trainable) count += graph.value(id).meta.shape.NumElements();
  }
  return count;
}

// The collectives one node runs per iteration: how many, and their bytes.
void PrintCollectives(const proto::NodePlan& part) {
  std::map<std::string, std::pair<int64_t, int64_t>> by_kind;  // description -> (count, bytes)
  for (const proto::Task& task : part.plan().tasks()) {
    if (task.kind() != proto::ACTOR_KIND_COLLECTIVE) continue;
    int64_t elements = 1;
    for (int64_t d : task.boxing().logical().shape()) elements *= d;
    auto& [count, bytes] = by_kind[task.boxing().description()];
    ++count;
    bytes += elements * 4;  // f32 in this model
  }
  for (const auto& [kind, stats] : by_kind) {
    std::printf("  node %u collectives: %lld x '%s', %.2f MB per iteration\n", part.node(),
                static_cast<long long>(stats.first), kind.c_str(), static_cast<double>(stats.second) / 1e6);
  }
}

struct BenchOptions {
  int dp = 2;
  int warmup = 5;
  int iters = 20;
  bool independent = false;
  int timeout_s = 600;
  std::string log_level = "warn";
  std::vector<std::string> overrides;
};

int RunBench(const BenchOptions& o) {
  Scratch scratch;
  // gpt2_nano made DESIGN §13's CPU benchmark model; dropout 0 (PyTorch's
  // side draws no masks either), the LM head is tied to wte in models.GPT2.
  std::vector<std::string> overrides = {
      "model.num_layers=4",
      "model.hidden_size=256",
      "model.num_attention_heads=4",
      "model.ffn_hidden_size=1024",
      "model.vocab_size=8192",
      "model.max_seq_length=128",
      "model.seq_length=128",
      "model.embedding_dropout_prob=0",
      "model.attention_dropout_prob=0",
      "model.output_dropout_prob=0",
      "train.train_micro_batch_size=8",
      "train.num_accumulation_steps=1",
      "train.log_period=1000000",
      "train.train_iter=" + std::to_string(o.warmup + o.iters),
      "train.output_dir=" + (scratch.dir / "out").string(),
      "train.dist.data_parallel_size=" + std::to_string(o.dp),
      "train.dist.intra_op_threads=1",
  };
  overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
  auto config = LoadJobConfig(SourcePath("configs/gpt2_nano.json"), overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "config: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  auto parameters = CountParameters(*config);
  if (!parameters.ok()) {
    std::fprintf(stderr, "model: %s\n", std::string(parameters.status().message()).c_str());
    return 1;
  }
  const auto& model = config->at("model");
  const int64_t micro_batch = config->at("train").at("train_micro_batch_size").get<int64_t>();
  const int64_t seq = model.at("seq_length").get<int64_t>();
  std::printf("tessera gpt2 layers=%lld hidden=%lld heads=%lld seq=%lld vocab=%lld micro_batch=%lld dp=%d%s\n",
              static_cast<long long>(model.at("num_layers").get<int64_t>()),
              static_cast<long long>(model.at("hidden_size").get<int64_t>()),
              static_cast<long long>(model.at("num_attention_heads").get<int64_t>()), static_cast<long long>(seq),
              static_cast<long long>(model.at("vocab_size").get<int64_t>()), static_cast<long long>(micro_batch), o.dp,
              o.independent ? " (2 independent jobs)" : "");
  std::printf("parameters %lld\n", static_cast<long long>(*parameters));

  const auto compile_started = std::chrono::steady_clock::now();
  auto parts = CompileForNodes(*config, std::vector<uint32_t>(static_cast<size_t>(o.dp), 1));
  if (!parts.ok()) {
    std::fprintf(stderr, "compile: %s\n", std::string(parts.status().message()).c_str());
    return 1;
  }
  std::printf("compiled %zu node plans in %.2f s\n", parts->size(), SecondsSince(compile_started));
  PrintCollectives(parts->front());

  // One process per node; --independent runs node 0's plan (dp 1, no peers)
  // twice, as two unrelated jobs.
  struct Child {
    pid_t pid = 0;
    std::filesystem::path times;
  };
  std::vector<Child> children;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const int copies = o.independent ? 2 : 1;
  for (int copy = 0; copy < copies; ++copy) {
    for (const proto::NodePlan& part : *parts) {
      const std::string name = "node" + std::to_string(part.node()) + "_" + std::to_string(copy);
      const auto plan_file = scratch.dir / (name + ".plan");
      std::ofstream(plan_file, std::ios::binary) << actors::SerializeNodePlan(part);
      const auto kv_dir = scratch.dir / ("kv" + std::to_string(copy));
      std::filesystem::create_directories(kv_dir);
      Child child{.times = scratch.dir / (name + ".times")};
      const std::string flag = "--node-child=" + plan_file.string() + "," + kv_dir.string() + "," + child.times.string();
      char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>(flag.c_str()),
                      const_cast<char*>(o.log_level.c_str()), nullptr};
      if (::posix_spawn(&child.pid, exe.c_str(), nullptr, nullptr, argv, environ) != 0) {
        std::perror("posix_spawn");
        for (const Child& c : children) ::kill(c.pid, SIGKILL);
        return 1;
      }
      children.push_back(child);
    }
  }
  // Wait for every child, killing the rest past the deadline or after one fails.
  bool failed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.timeout_s);
  for (size_t waiting = children.size(); waiting > 0;) {
    for (Child& c : children) {
      if (c.pid == 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(c.pid, &status, WNOHANG);
      if (done == 0) continue;
      c.pid = 0;
      --waiting;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failed = true;
    }
    if (waiting == 0) break;
    if (failed || std::chrono::steady_clock::now() > deadline) {
      if (!failed) std::fprintf(stderr, "node processes still running after %d s: killed\n", o.timeout_s);
      for (Child& c : children) {
        if (c.pid == 0) continue;
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
        c.pid = 0;
      }
      failed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (failed) {
    std::fprintf(stderr, "a node process failed (see its stderr)\n");
    return 1;
  }

  // The sink's node(s): the one whose fetch callback saw every iteration.
  const int total = o.warmup + o.iters;
  std::vector<double> rates;
  for (const Child& c : children) {
    const NodeTimes t = ReadTimes(c.times);
    std::printf("  %s: LoadNodePlan %.3f s, Run %.3f s (CPU %.3f s: %.0f%% of a core), %zu iterations fetched\n",
                c.times.stem().c_str(), t.load_s, t.run_s, t.run_cpu_s, 100 * t.run_cpu_s / t.run_s, t.ns.size());
    if (static_cast<int>(t.ns.size()) != total) continue;
    const double per_iteration = static_cast<double>(t.ns[total - 1] - t.ns[o.warmup - 1]) * 1e-9 / o.iters;
    const double cpu_per_iteration = (t.cpu_s[total - 1] - t.cpu_s[o.warmup - 1]) / o.iters;
    std::vector<double> steps;
    for (int i = o.warmup; i < total; ++i) steps.push_back(static_cast<double>(t.ns[i] - t.ns[i - 1]) * 1e-6);
    std::sort(steps.begin(), steps.end());
    std::printf("  %s: loss %.4f -> %.4f; ms per iteration: mean %.2f, min %.2f, median %.2f, max %.2f\n",
                c.times.stem().c_str(), t.losses.front(), t.losses.back(), per_iteration * 1e3, steps.front(),
                steps[steps.size() / 2], steps.back());
    std::printf("cpu_ms_per_iteration %.2f\n", cpu_per_iteration * 1e3);
    // Each thread's iteration: on a CPU, waiting for one, and blocked.
    std::vector<std::pair<ThreadTimes, double>> per_thread;  // (run, wait) per iteration, blocked
    for (const auto& [tid, last] : t.threads[total - 1]) {
      const auto first = t.threads[o.warmup - 1].find(tid);
      if (first == t.threads[o.warmup - 1].end()) continue;
      const ThreadTimes d{tid, (last.run_s - first->second.run_s) / o.iters, (last.wait_s - first->second.wait_s) / o.iters};
      per_thread.push_back({d, per_iteration - d.run_s - d.wait_s});
    }
    std::sort(per_thread.begin(), per_thread.end(),
              [](const auto& x, const auto& y) { return x.first.run_s > y.first.run_s; });
    for (const auto& [d, blocked] : per_thread) {
      if (d.run_s < 1e-3 * per_iteration) continue;  // idle threads (the launcher, the watchdog)
      std::printf("    thread %lld per iteration: on a CPU %.1f ms, runnable waiting for one %.1f ms, blocked %.1f ms\n",
                  static_cast<long long>(d.tid), d.run_s * 1e3, d.wait_s * 1e3, blocked * 1e3);
    }
    rates.push_back(static_cast<double>(o.dp * micro_batch * seq) / per_iteration);
  }
  if (rates.empty()) {
    std::fprintf(stderr, "no node fetched all %d iterations\n", total);
    return 1;
  }
  for (double rate : rates) std::printf("tokens/s %.1f\n", rate);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  constexpr std::string_view kChild = "--node-child=";
  if (argc == 3 && std::string_view(argv[1]).substr(0, kChild.size()) == kChild) {  // --node-child=SPEC LOG_LEVEL
    if (!tessera::SetLogLevel(argv[2]).ok()) return 2;
    return tessera::RunNodeChild(std::string(argv[1] + kChild.size()));
  }
  tessera::BenchOptions o;
  CLI::App app{"GPT-2 data-parallel over processes (gloo): tokens/s"};
  app.add_option("--dp", o.dp, "data-parallel processes, one CPU device each")->check(CLI::Range(1, 8));
  app.add_option("--warmup", o.warmup, "iterations excluded from the timing")->check(CLI::Range(1, 1000));
  app.add_option("--iters", o.iters, "timed iterations")->check(CLI::Range(1, 100000));
  app.add_flag("--independent", o.independent, "with --dp 1: two unrelated single-device jobs at once");
  app.add_option("--timeout", o.timeout_s, "seconds before the node processes are killed")->check(CLI::Range(1, 86400));
  app.add_option("--set", o.overrides, "extra config override KEY=VALUE (repeatable)");
  app.add_option("--log-level", o.log_level, "spdlog level of this process and the nodes")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  CLI11_PARSE(app, argc, argv);
  if (!tessera::SetLogLevel(o.log_level).ok()) return 2;
  if (o.independent && o.dp != 1) {
    std::fprintf(stderr, "--independent needs --dp 1\n");
    return 2;
  }
  return tessera::RunBench(o);
}
