// Actor bus (comm/bus) over loopback TCP, between two processes (the echo
// side forked: the round trip two workers' runtimes see) and between two
// buses of one process:
//   - round trip of a 32-byte frame (A sends, B's handler sends it back, the
//     calling thread wakes on A's handler): median and p99 in µs;
//   - one-way throughput: 32-byte frames (frames/s) and 1 MiB frames (MB/s),
//     from the first Send to the last frame delivered.
// Same-run references over a plain blocking POSIX TCP socket pair (TCP_NODELAY,
// a thread echoing): the 32-byte ping-pong, and 1 MiB writes one way. Printed
// side by side with the ratio bus / raw: these machines are shared and noisy,
// so compare, don't quote absolutes (DESIGN §12).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_args.h"
#include "comm/bus/bus.h"
#include "core/logging.h"

namespace tessera::comm::bus {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRoundTrips = 20000;
constexpr int kWarmup = 1000;
constexpr int kSmallFrames = 500000;
constexpr int kLargeFrames = 256;
constexpr size_t kSmall = 32;
constexpr size_t kLarge = 1 << 20;

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(status.message()).c_str());
    std::exit(1);
  }
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Percentiles {
  double median, p99;
};
Percentiles Summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples[samples.size() * 99 / 100]};
}

// Counts frames delivered on one bus and wakes a waiter at a target.
class Counter {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    if (count_ >= target_) cv_.notify_all();
  }
  void WaitFor(int64_t target) {
    std::unique_lock<std::mutex> lock(mu_);
    target_ = target;
    cv_.wait(lock, [&] { return count_ >= target_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t count_ = 0;
  int64_t target_ = 0;
};

struct BusResults {
  Percentiles round_trip_us;
  double frames_per_s;
  double large_mb_per_s;
};

BusResults MeasureBus() {
  // Declared before the buses: handlers may run until a bus is gone.
  Counter pongs, small_seen, large_seen;
  BusOptions options_a, options_b;
  options_a.node = 1;
  options_b.node = 2;
  options_a.token = options_b.token = "bench";
  auto a_or = Bus::Start(options_a);
  auto b_or = Bus::Start(options_b);
  Check(a_or.status(), "Bus::Start");
  Check(b_or.status(), "Bus::Start");
  std::unique_ptr<Bus> a = std::move(*a_or), b = std::move(*b_or);
  Check(a->Connect(2, b->address()), "Connect");
  auto ignore_errors = [](uint32_t node, const absl::Status& error) {
    std::fprintf(stderr, "link to node %u: %s\n", node, std::string(error.message()).c_str());
  };

  // Session 1: ping-pong (B echoes).
  Check(b->Subscribe(1, [&](uint32_t from, uint64_t address, std::string_view payload) {
          Check(b->Send(from, 1, address, payload), "echo");
        }, ignore_errors), "Subscribe");
  Check(a->Subscribe(1, [&](uint32_t, uint64_t, std::string_view) { pongs.Add(); }, ignore_errors), "Subscribe");
  const std::string small(kSmall, 's');
  std::vector<double> samples;
  samples.reserve(kRoundTrips);
  for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
    const auto start = Clock::now();
    Check(a->Send(2, 1, i, small), "Send");
    pongs.WaitFor(i + 1);
    if (i >= kWarmup) samples.push_back(Micros(Clock::now() - start));
  }

  // Session 2: one way, 32-byte frames; session 3: 1 MiB frames.
  Check(b->Subscribe(2, [&](uint32_t, uint64_t, std::string_view) { small_seen.Add(); }, ignore_errors), "Subscribe");
  Check(b->Subscribe(3, [&](uint32_t, uint64_t, std::string_view) { large_seen.Add(); }, ignore_errors), "Subscribe");
  auto start = Clock::now();
  for (int i = 0; i < kSmallFrames; ++i) Check(a->Send(2, 2, i, small), "Send");
  small_seen.WaitFor(kSmallFrames);
  const double small_s = std::chrono::duration<double>(Clock::now() - start).count();

  const std::string large(kLarge, 'L');
  start = Clock::now();
  // A bounded window, as the actor protocol's quotas would keep it.
  for (int i = 0; i < kLargeFrames; ++i) {
    if (i >= 16) large_seen.WaitFor(i - 15);
    Check(a->Send(2, 3, i, large), "Send");
  }
  large_seen.WaitFor(kLargeFrames);
  const double large_s = std::chrono::duration<double>(Clock::now() - start).count();
  for (uint64_t session : {1, 2, 3}) {
    a->Unsubscribe(session);
    b->Unsubscribe(session);
  }
  return {Summarize(std::move(samples)), kSmallFrames / small_s, kLargeFrames * double(kLarge) / 1e6 / large_s};
}

// --- the reference: plain blocking sockets ---

void ReadFully(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got <= 0) std::exit(2);
    data += got;
    n -= static_cast<size_t>(got);
  }
}
void WriteFully(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t put = ::send(fd, data, n, MSG_NOSIGNAL);
    if (put <= 0) std::exit(2);
    data += put;
    n -= static_cast<size_t>(put);
  }
}

// A listening loopback socket on a port the OS picks (its address in `addr`).
int ListenLoopback(sockaddr_in& addr) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  addr = sockaddr_in{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::_Exit(2);
  }
  return listener;
}

// A connected loopback TCP pair with TCP_NODELAY on both ends.
std::pair<int, int> TcpPair() {
  sockaddr_in addr;
  const int listener = ListenLoopback(addr);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::exit(2);
  const int server = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  const int one = 1;
  ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {client, server};
}

struct RawResults {
  Percentiles round_trip_us;
  double large_mb_per_s;
};

RawResults MeasureRaw() {
  auto [client, server] = TcpPair();
  std::thread echo([fd = server] {
    char buffer[kSmall];
    for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
      ReadFully(fd, buffer, kSmall);
      WriteFully(fd, buffer, kSmall);
    }
  });
  char buffer[kSmall] = {};
  std::vector<double> samples;
  samples.reserve(kRoundTrips);
  for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
    const auto start = Clock::now();
    WriteFully(client, buffer, kSmall);
    ReadFully(client, buffer, kSmall);
    if (i >= kWarmup) samples.push_back(Micros(Clock::now() - start));
  }
  echo.join();

  std::string large(kLarge, 'L');
  const auto start = Clock::now();
  std::thread reader([fd = server] {
    std::string in(kLarge, '\0');
    for (int i = 0; i < kLargeFrames; ++i) ReadFully(fd, in.data(), kLarge);
  });
  for (int i = 0; i < kLargeFrames; ++i) WriteFully(client, large.data(), kLarge);
  reader.join();
  const double large_s = std::chrono::duration<double>(Clock::now() - start).count();
  ::close(client);
  ::close(server);
  return {Summarize(std::move(samples)), kLargeFrames * double(kLarge) / 1e6 / large_s};
}

// --- across two processes: what two workers' buses see ---

// The 32-byte ping-pong with the echoing side in a child process (forked
// before this process has any thread). `bus`: Bus to Bus; else a plain
// blocking TCP pair.
Percentiles RoundTripAcrossProcesses(bool bus) {
  const auto tell_parent = [](int fd, const std::string& line) {
    if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::_Exit(2);
  };
  int to_parent[2], to_child[2];
  if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) std::exit(2);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(to_parent[0]);
    ::close(to_child[1]);
    char done = 0;
    if (bus) {
      BusOptions options;
      options.node = 2;
      options.token = "bench";
      auto b = Bus::Start(options);
      Check(b.status(), "Bus::Start (child)");
      Bus* raw = b->get();
      Check(raw->Subscribe(1, [raw](uint32_t from, uint64_t address, std::string_view payload) {
              Check(raw->Send(from, 1, address, payload), "echo");
            }, [](uint32_t, const absl::Status&) {}), "Subscribe");
      const std::string address = raw->address() + "\n";
      tell_parent(to_parent[1], address);
      (void)!::read(to_child[0], &done, 1);  // EOF: the parent is done
      b->reset();
    } else {
      sockaddr_in addr;
      const int listener = ListenLoopback(addr);
      const std::string port = std::to_string(ntohs(addr.sin_port)) + "\n";
      tell_parent(to_parent[1], port);
      const int fd = ::accept(listener, nullptr, nullptr);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      char buffer[kSmall];
      for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
        ReadFully(fd, buffer, kSmall);
        WriteFully(fd, buffer, kSmall);
      }
      ::close(fd);
    }
    std::_Exit(0);
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  std::string line;
  for (char c; ::read(to_parent[0], &c, 1) == 1 && c != '\n';) line.push_back(c);
  if (line.empty()) {
    std::fprintf(stderr, "the echo process did not start\n");
    std::exit(2);
  }
  std::vector<double> samples;
  samples.reserve(kRoundTrips);
  const std::string small(kSmall, 's');
  Counter pongs;
  std::unique_ptr<Bus> a;  // outlives the child's: its link is closed from there
  if (bus) {
    BusOptions options;
    options.node = 1;
    options.token = "bench";
    auto a_or = Bus::Start(options);
    Check(a_or.status(), "Bus::Start");
    a = std::move(*a_or);
    Check(a->Connect(2, line), "Connect");
    Check(a->Subscribe(1, [&](uint32_t, uint64_t, std::string_view) { pongs.Add(); },
                       [](uint32_t, const absl::Status&) {}), "Subscribe");
    for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
      const auto start = Clock::now();
      Check(a->Send(2, 1, i, small), "Send");
      pongs.WaitFor(i + 1);
      if (i >= kWarmup) samples.push_back(Micros(Clock::now() - start));
    }
    a->Unsubscribe(1);
  } else {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(line)));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::exit(2);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buffer[kSmall] = {};
    for (int i = 0; i < kWarmup + kRoundTrips; ++i) {
      const auto start = Clock::now();
      WriteFully(fd, buffer, kSmall);
      ReadFully(fd, buffer, kSmall);
      if (i >= kWarmup) samples.push_back(Micros(Clock::now() - start));
    }
    ::close(fd);
  }
  ::close(to_child[1]);
  ::waitpid(child, nullptr, 0);
  ::close(to_parent[0]);
  a.reset();
  return Summarize(std::move(samples));
}

int Main() {
  // The echo sides' links close at the end of each part: not news.
  Check(SetLogLevel("error"), "SetLogLevel");
  // Forks first, while this process has no thread.
  const Percentiles raw_processes = RoundTripAcrossProcesses(/*bus=*/false);
  const Percentiles bus_processes = RoundTripAcrossProcesses(/*bus=*/true);
  const RawResults raw = MeasureRaw();
  const BusResults bus = MeasureBus();
  std::printf("actor bus over loopback TCP between two processes (what two workers' runtimes use)\n");
  std::printf("%-36s %12s %12s %10s\n", "", "bus", "raw socket", "bus/raw");
  std::printf("%-36s %12.1f %12.1f %10.2f\n", "round trip 32 B, median (us)", bus_processes.median,
              raw_processes.median, bus_processes.median / raw_processes.median);
  std::printf("%-36s %12.1f %12.1f %10.2f\n\n", "round trip 32 B, p99 (us)", bus_processes.p99, raw_processes.p99,
              bus_processes.p99 / raw_processes.p99);
  std::printf("actor bus over loopback TCP, two buses in one process (reference: blocking POSIX TCP pair)\n");
  std::printf("%-36s %12s %12s %10s\n", "", "bus", "raw socket", "bus/raw");
  std::printf("%-36s %12.1f %12.1f %10.2f\n", "round trip 32 B, median (us)", bus.round_trip_us.median,
              raw.round_trip_us.median, bus.round_trip_us.median / raw.round_trip_us.median);
  std::printf("%-36s %12.1f %12.1f %10.2f\n", "round trip 32 B, p99 (us)", bus.round_trip_us.p99,
              raw.round_trip_us.p99, bus.round_trip_us.p99 / raw.round_trip_us.p99);
  std::printf("%-36s %12.0f %12s %10s\n", "one way 32 B frames (frames/s)", bus.frames_per_s, "-", "-");
  std::printf("%-36s %12.0f %12.0f %10.2f\n", "one way 1 MiB frames (MB/s)", bus.large_mb_per_s, raw.large_mb_per_s,
              bus.large_mb_per_s / raw.large_mb_per_s);
  return 0;
}

}  // namespace
}  // namespace tessera::comm::bus

int main(int argc, char** argv) {
  if (argc > 1) {
    return tessera::bench::Usage("bus_bench", "(no arguments): the network bus against raw sockets", argv[1]);
  }
  return tessera::comm::bus::Main();
}
