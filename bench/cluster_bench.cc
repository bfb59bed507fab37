// Time from `submit` to the first iteration: a master and two workers
// (cpu:2 each) in this process, talking gRPC, gloo and the actor bus over
// loopback, run gpt2_nano (2 layers) data-parallel over 4 devices, logging
// every iteration. Per job: Submit returned, RUNNING (compiled, every node
// plan loaded, started), the first metrics event (the gloo rendezvous, the
// bus links, the parameters' init and one iteration), SUCCEEDED. The
// reference in the same run is tessera::Train of the same config in one
// process (compile, load, init, the same iterations): the ratio is what the
// control plane and the processes' rendezvous add.
//
//   ./build/bin/cluster_bench [--jobs N]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_args.h"
#include "cluster/client.h"
#include "cluster/engine_job.h"
#include "cluster/master.h"
#include "cluster/worker.h"
#include "core/config.h"
#include "core/logging.h"
#include "train/job_config.h"
#include "train/trainer.h"

namespace tessera::cluster {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kIterations = 3;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
// The runs write their outputs (metrics.jsonl, config.json; a cluster job
// its last checkpoint) under here, each job in a directory of its own (a
// job refuses one holding an earlier run's checkpoints).
const std::string& OutputDir() {
  static const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("tessera_cluster_bench_", ::getpid())).string();
  return dir;
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(status.message()).c_str());
    std::filesystem::remove_all(OutputDir());
    std::exit(1);
  }
}

std::vector<std::string> Overrides(const std::string& output_dir) {
  return {"model.num_layers=2",
          absl::StrCat("train.train_iter=", kIterations),
          "train.log_period=1",
          "train.dist.data_parallel_size=4",
          "train.dist.intra_op_threads=1",
          "train.output_dir=" + output_dir};
}

struct JobTimes {
  double submitted, running, first_iteration, succeeded;
};

int Main(int argc, char** argv) {
  int jobs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::optional<long long> n =
        std::strcmp(argv[i], "--jobs") == 0 && i + 1 < argc ? bench::PositiveInteger(argv[i + 1]) : std::nullopt;
    if (std::strcmp(argv[i], "--jobs") == 0 && (!n || *n > 1000)) {
      return bench::BadValue("cluster_bench", "[--jobs N]", "--jobs", "an integer in [1, 1000]");
    }
    if (!n) {
      return bench::Usage("cluster_bench",
                          "[--jobs N]: N jobs (5) of gpt2_nano, data parallel 4, through a master and 2 workers "
                          "in this process, against tessera::Train in one process",
                          argv[i]);
    }
    jobs = static_cast<int>(*n);
    ++i;
  }
  Check(SetLogLevel("error"), "SetLogLevel");
  const std::string path = std::string(TESSERA_SOURCE_DIR) + "/configs/gpt2_nano.json";
  auto files = config::LoadConfigFiles(path);
  Check(files.status(), "config");
  auto resolved = LoadJobConfig(path, Overrides(OutputDir() + "/in_process"));
  Check(resolved.status(), "config");

  // The reference: the same job in one process, no daemons.
  std::vector<double> in_process;
  for (int j = 0; j < jobs; ++j) {
    const auto start = Clock::now();
    Check(Train(*resolved).status(), "Train");
    in_process.push_back(Ms(Clock::now() - start));
  }

  Master master(Master::Options(), MakeEngineJobCompiler());
  auto address = master.Start();
  Check(address.status(), "Master::Start");
  std::vector<std::unique_ptr<Worker>> workers;
  EngineRunnerOptions runner;
  for (int w = 0; w < 2; ++w) {
    Worker::Options options;
    options.master = *address;
    options.devices = "cpu:2";
    workers.push_back(std::make_unique<Worker>(options, MakeEnginePlanRunnerFactory(runner)));
    Check(workers.back()->Start().status(), "Worker::Start");
  }
  while (!workers[0]->registered() || !workers[1]->registered()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Client::Options client_options;
  client_options.master = *address;
  Client client(client_options);

  std::vector<JobTimes> times;
  for (int j = 0; j < jobs; ++j) {
    // Both workers free again (the master frees them as they report).
    for (;;) {
      auto listed = client.ListWorkers();
      Check(listed.status(), "ListWorkers");
      if (std::all_of(listed->begin(), listed->end(), [](const auto& w) { return w.job_id().empty(); })) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    JobTimes t{};
    const auto start = Clock::now();
    auto job = client.Submit(files->dump(), Overrides(absl::StrCat(OutputDir(), "/job-", j)));
    Check(job.status(), "Submit");
    t.submitted = Ms(Clock::now() - start);
    Check(client.Watch(*job, [&](const control::JobEvent& event) {
      const double now = Ms(Clock::now() - start);
      if (event.has_state() && event.state().state() == control::RUNNING && t.running == 0) t.running = now;
      if (event.has_metrics() && t.first_iteration == 0) t.first_iteration = now;
      if (event.has_state() && event.state().state() == control::SUCCEEDED) t.succeeded = now;
      return true;
    }), "Watch");
    if (t.succeeded == 0) {
      auto info = client.Get(*job);
      std::fprintf(stderr, "job %s did not succeed: %s\n", job->c_str(), info.ok() ? info->reason().c_str() : "?");
      return 1;
    }
    times.push_back(t);
  }
  for (auto& w : workers) w->Shutdown();
  master.Shutdown();
  std::filesystem::remove_all(OutputDir());

  const auto median_of = [&](double JobTimes::*field) {
    std::vector<double> v;
    for (const JobTimes& t : times) v.push_back(t.*field);
    return Median(v);
  };
  std::printf("gpt2_nano (2 layers), data parallel 4 over 2 workers (cpu:2 each), %d iterations; median of %d jobs\n",
              kIterations, jobs);
  std::printf("%-44s %10s\n", "", "ms");
  std::printf("%-44s %10.1f\n", "submit returned (config checked, queued)", median_of(&JobTimes::submitted));
  std::printf("%-44s %10.1f\n", "RUNNING (compiled, plans loaded, started)", median_of(&JobTimes::running));
  std::printf("%-44s %10.1f\n", "first iteration's metrics at the client", median_of(&JobTimes::first_iteration));
  std::printf("%-44s %10.1f\n", "SUCCEEDED", median_of(&JobTimes::succeeded));
  const double reference = Median(in_process);
  std::printf("%-44s %10.1f\n", "reference: tessera::Train in one process", reference);
  std::printf("%-44s %10.2f\n", "cluster SUCCEEDED / one process", median_of(&JobTimes::succeeded) / reference);
  return 0;
}

}  // namespace
}  // namespace tessera::cluster

int main(int argc, char** argv) { return tessera::cluster::Main(argc, argv); }
