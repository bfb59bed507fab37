// All-reduce of 64 MB of f32 across 2 processes on loopback: Tessera's gloo
// Communicator against gloo's own AllreduceRing, in the same run and the same
// processes, over separate connections of the same kind. Prints the median of
// the repetitions as GB/s (bytes of the buffer / time) and the ratio.
//
//   gloo_bench [--mb 64] [--reps 7]
//
// Forks rank 1 before any thread exists; both ranks rendezvous through a
// FileKvStore in a fresh temporary directory.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "comm/collective/gloo_communicator.h"
#include "comm/collective/gloo_store.h"
#include "gloo/allreduce_ring.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "tests/comm/completion.h"
#include "tests/comm/gloo_file_kv_store.h"

namespace tessera::comm {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunRank(int rank, const std::string& dir, int64_t mb, int reps) {
  testing::FileKvStore store(dir);
  GlooOptions options;
  options.group = "bench/ours";
  options.rank = rank;
  options.size = 2;
  auto comm = ConnectGloo(store, options);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 1;
  }
  // gloo's own ring on its own context (same device kind, same store).
  std::shared_ptr<gloo::Context> ring_context;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    context->setTimeout(std::chrono::seconds(30));
    GlooStore gloo_store(store, "bench/ring", absl::Seconds(30));
    context->connectFullMesh(gloo_store, device);
    ring_context = context;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: gloo ring context: %s\n", rank, e.what());
    return 1;
  }

  const int64_t n = mb * (int64_t{1} << 20) / 4;
  auto tensor = Tensor::Zeros(Shape{n}, DType::kF32);
  if (!tensor.ok()) return 1;
  Tensor buffer = *tensor;
  float* data = buffer.data<float>();
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>((i * 7 + rank) % 1000) * 1e-3f;
  gloo::AllreduceRing<float> ring(ring_context, {data}, static_cast<int>(n));

  const auto seconds = [](auto start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> ours;
  std::vector<double> theirs;
  // Alternate the two so drifts of the machine hit both; rep 0 warms up.
  for (int rep = 0; rep <= reps; ++rep) {
    auto start = std::chrono::steady_clock::now();
    testing::Completion done;
    (*comm)->AllReduce(buffer, buffer, ReduceOp::kSum, done.Fn());
    const absl::Status status = done.Wait(std::chrono::seconds(60));
    if (!status.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
      return 1;
    }
    if (rep > 0) ours.push_back(seconds(start));
    start = std::chrono::steady_clock::now();
    try {
      ring.run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: gloo ring: %s\n", rank, e.what());
      return 1;
    }
    if (rep > 0) theirs.push_back(seconds(start));
  }
  if (rank == 0) {
    const double bytes = static_cast<double>(n) * 4;
    const double ours_gbs = bytes / Median(ours) / 1e9;
    const double theirs_gbs = bytes / Median(theirs) / 1e9;
    std::printf("all-reduce f32 %lld MB, 2 processes, loopback, median of %d\n", static_cast<long long>(mb), reps);
    std::printf("  tessera gloo Communicator  %7.3f GB/s  (%.1f ms)\n", ours_gbs, Median(ours) * 1e3);
    std::printf("  gloo::AllreduceRing        %7.3f GB/s  (%.1f ms)\n", theirs_gbs, Median(theirs) * 1e3);
    std::printf("  ratio                      %7.2fx\n", ours_gbs / theirs_gbs);
  }
  return 0;
}

}  // namespace
}  // namespace tessera::comm

int main(int argc, char** argv) {
  int64_t mb = 64;
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    const bool takes_value = std::strcmp(argv[i], "--mb") == 0 || std::strcmp(argv[i], "--reps") == 0;
    const std::optional<long long> value =
        takes_value && i + 1 < argc ? tessera::bench::PositiveInteger(argv[i + 1]) : std::nullopt;
    if (!takes_value) return tessera::bench::Usage("gloo_bench", "[--mb MB] [--reps N]", argv[i]);
    if (!value || *value > (1 << 20)) {
      return tessera::bench::BadValue("gloo_bench", "[--mb MB] [--reps N]", argv[i], "an integer in [1, 1048576]");
    }
    if (std::strcmp(argv[i], "--mb") == 0) {
      mb = *value;
    } else {
      reps = static_cast<int>(*value);
    }
    ++i;
  }
  std::string dir = (std::filesystem::temp_directory_path() / "gloo_bench_XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const pid_t child = ::fork();  // before any thread
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) std::_Exit(tessera::comm::RunRank(1, dir, mb, reps));
  const int rc = tessera::comm::RunRank(0, dir, mb, reps);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::filesystem::remove_all(dir);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
