// Actor runtime throughput (DESIGN §13: >= 2 million actor messages per
// second per thread; a chain of 1,000 trivial actors sustains pieces at that
// rate). Trivial actors: a tick source, relays with no kernel, sinks with no
// callback, all on register descs with no tensors, so only the protocol is
// measured: per piece and (producer, consumer) edge one RegisterReady and one
// RegisterAck.
//
// Cases:
//   - ping-pong: a source and a sink on one thread, quota 1: every piece is a
//     RegisterReady then a RegisterAck round trip before the next can start;
//   - fan-out: one source whose register desc is read by 8 sinks, one thread;
//   - chains: source -> relays -> sink, 8 and 1,000 actors, on 1 thread and
//     on 2 (each thread holding half of the chain, or every edge crossing).
//
// Reported per case: messages handled (all threads), wall time of
// Runtime::Run (threads started, run, joined), messages per second per
// thread and its ratio to the 2 M target, pieces per second at the sink(s),
// and messages per CPU-second of the process during Run (all threads): on a
// machine shared with other jobs, wall time also counts the time the threads
// waited for a core, CPU time does not.
// As a same-run reference, the cost of the bare transport: a std::deque
// push + pop + hash lookup of the destination per message, which bounds what
// any protocol on top can reach. Each case runs 3 times; the best run is
// printed.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/message.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "bench/bench_args.h"
#include "core/text.h"

namespace tessera::actors {
namespace {

constexpr double kTarget = 2e6;  // messages / s / thread

// source -> `relays` relays -> sink; actor i on stream (i * streams / n), so
// each stream holds a contiguous run of the chain (`interleave`: i % streams,
// so every edge crosses threads).
proto::Plan Chain(int relays, int streams, bool interleave, int32_t quota, int64_t pieces) {
  PlanBuilder b(pieces);
  const int n = relays + 2;
  auto stream_of = [&](int i) {
    return static_cast<uint32_t>(interleave ? i % streams : static_cast<int64_t>(i) * streams / n);
  };
  uint64_t prev = b.AddTask(proto::ACTOR_KIND_SOURCE, "tick", stream_of(0));
  for (int i = 1; i <= relays; ++i) {
    uint64_t relay = b.AddTask(proto::ACTOR_KIND_COMPUTE, "relay", stream_of(i));
    b.AddRegisterDesc(prev, {relay}, quota, {});
    prev = relay;
  }
  uint64_t sink = b.AddTask(proto::ACTOR_KIND_SINK, "sink", stream_of(n - 1));
  b.AddRegisterDesc(prev, {sink}, quota, {});
  return b.Build();
}

// One source whose register desc is read by `consumers` sinks; one thread.
// consumers = 1 with quota 1 is the ping-pong: Ready and Ack strictly
// alternate.
proto::Plan FanOut(int consumers, int32_t quota, int64_t pieces) {
  PlanBuilder b(pieces);
  uint64_t source = b.AddTask(proto::ACTOR_KIND_SOURCE, "tick", 0);
  std::vector<uint64_t> sinks;
  for (int i = 0; i < consumers; ++i) sinks.push_back(b.AddTask(proto::ACTOR_KIND_SINK, "sink", 0));
  b.AddRegisterDesc(source, sinks, quota, {});
  return b.Build();
}

struct Result {
  double seconds = 1e30;
  double cpu_seconds = 0;  // process CPU time during Run, all threads
  int64_t messages = 0;
  int threads = 0;
};

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Result Measure(const proto::Plan& plan) {
  Result best;
  for (int rep = 0; rep < 3; ++rep) {
    auto runtime = Runtime::Load(plan);
    if (!runtime.ok()) {
      std::fprintf(stderr, "load: %s\n", runtime.status().ToString().c_str());
      std::exit(1);
    }
    const double cpu_start = CpuSeconds();
    absl::Status status = (*runtime)->Run();
    const double cpu_seconds = CpuSeconds() - cpu_start;
    if (!status.ok()) {
      std::fprintf(stderr, "run: %s\n", status.ToString().c_str());
      std::exit(1);
    }
    const auto& stats = (*runtime)->stats();
    if (stats.seconds < best.seconds) best = Result{stats.seconds, cpu_seconds, stats.messages, stats.threads};
  }
  return best;
}

double TransportReference(int64_t messages) {
  std::unordered_map<uint64_t, int64_t> actors;
  for (uint64_t i = 0; i < 1000; ++i) actors[i << 3] = 0;
  std::deque<Message> queue;
  const auto start = std::chrono::steady_clock::now();
  queue.push_back(Message::Ready(0, 0, 1, 0));
  for (int64_t i = 0; i < messages; ++i) {
    const Message m = queue.front();
    queue.pop_front();
    ++actors.find(m.dst)->second;
    queue.push_back(Message::Ready(m.dst, ((m.dst >> 3) + 1) % 1000 << 3, m.register_desc_id, 0));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(messages) / seconds;
}

void Report(const std::string& name, int actors, int64_t pieces, const Result& r) {
  const double per_thread = static_cast<double>(r.messages) / r.seconds / r.threads;
  const double per_cpu_second = static_cast<double>(r.messages) / r.cpu_seconds;
  std::printf("%-52s actors %5d threads %d pieces %8lld  msgs %9lld  %7.3f s  %6.2f M msgs/s/thread (%5.2fx target)  %9.0f pieces/s  cpu %6.2f M msgs/cpu-s\n",
              name.c_str(), actors, r.threads, static_cast<long long>(pieces), static_cast<long long>(r.messages),
              r.seconds, per_thread / 1e6, per_thread / kTarget, static_cast<double>(pieces) / r.seconds,
              per_cpu_second / 1e6);
  std::fflush(stdout);
}

}  // namespace
}  // namespace tessera::actors

int main(int argc, char** argv) {
  using namespace tessera::actors;
  if (argc > 1) {
    return tessera::bench::Usage("actor_bench", "(no arguments): the actor runtime's messages per second", argv[1]);
  }
  const double reference = TransportReference(20'000'000);
  std::printf("target: >= %.1f M msgs/s/thread (DESIGN §13); ratio = measured / target\n", kTarget / 1e6);
  std::printf("reference: bare deque transport + lookup %.2f M msgs/s (one thread)\n", reference / 1e6);

  constexpr int kFanOut = 8;
  constexpr int64_t kPingPongPieces = 2'000'000;
  constexpr int64_t kFanOutPieces = 500'000;
  Report("ping-pong: source <-> sink, 1 thread, quota 1", 2, kPingPongPieces,
         Measure(FanOut(1, 1, kPingPongPieces)));
  Report(tessera::StrCat("fan-out: 1 source -> ", kFanOut, " sinks, 1 thread, quota 1"), kFanOut + 1,
         kFanOutPieces, Measure(FanOut(kFanOut, 1, kFanOutPieces)));
  Report(tessera::StrCat("fan-out: 1 source -> ", kFanOut, " sinks, 1 thread, quota 2"), kFanOut + 1,
         kFanOutPieces, Measure(FanOut(kFanOut, 2, kFanOutPieces)));

  struct Config {
    const char* name;
    int relays, streams;
    bool interleave;
    int32_t quota;
    int64_t pieces;
  };
  constexpr int64_t kChainPieces = 10'000;
  const Config configs[] = {
      {"chain of 8 trivial actors, 1 thread, quota 2", 6, 1, false, 2, 200'000},
      {"chain of 1000 trivial actors, 1 thread, quota 2", 998, 1, false, 2, kChainPieces},
      {"chain of 1000, 1 thread, quota 1", 998, 1, false, 1, kChainPieces},
      {"chain of 1000, 2 threads (halves), quota 2", 998, 2, false, 2, kChainPieces},
      {"chain of 1000, 2 threads (every edge crosses)", 998, 2, true, 2, kChainPieces},
  };
  for (const Config& c : configs) {
    Result r = Measure(Chain(c.relays, c.streams, c.interleave, c.quota, c.pieces));
    Report(c.name, c.relays + 2, c.pieces, r);
  }
  return 0;
}
