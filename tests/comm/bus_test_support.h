#pragma once
// What the bus tests (bus_test.cc, bus_fuzz_test.cc) share: the wire format
// written out from bus.h's description independently of bus.cc (so the tests
// check the format, not only that the bus agrees with itself), blocking raw
// sockets that can send any bytes, and a recorder of what a session's
// handlers saw.
//
// Thread-safety: Recorder is thread-safe (its handlers run on a bus's I/O
// thread); the rest are free functions on values and file descriptors.

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "comm/bus/bus.h"

namespace tessera::comm::bus::testing {

using Clock = std::chrono::steady_clock;

inline constexpr auto kWait = std::chrono::seconds(10);

// --- the wire format ---

inline constexpr uint32_t kMagic = 0x31425354;  // "TSB1" read little-endian
inline constexpr uint32_t kHello = 1, kHelloAck = 2, kReject = 3, kData = 4;
inline constexpr uint32_t kRejectAuth = 1, kRejectVersion = 2, kRejectWrongNode = 3, kRejectProtocol = 5;
inline constexpr size_t kHeaderBytes = 28;
inline constexpr size_t kHelloFixedBytes = 24;  // version, from, to, incarnation, token length

inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
inline void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
inline uint32_t GetU32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// A header whose length field says `length`, whatever follows it.
inline std::string Header(uint32_t type, uint64_t session, uint64_t address, uint32_t length, uint32_t magic = kMagic) {
  std::string out;
  PutU32(&out, magic);
  PutU32(&out, type);
  PutU64(&out, session);
  PutU64(&out, address);
  PutU32(&out, length);
  return out;
}

inline std::string Frame(uint32_t type, uint64_t session, uint64_t address, const std::string& payload,
                         uint32_t magic = kMagic) {
  return Header(type, session, address, static_cast<uint32_t>(payload.size()), magic) + payload;
}

inline std::string HelloPayload(uint32_t from, uint32_t to, const std::string& token, uint32_t version = 1,
                                uint64_t incarnation = 0x1234) {
  std::string out;
  PutU32(&out, version);
  PutU32(&out, from);
  PutU32(&out, to);
  PutU64(&out, incarnation);
  PutU32(&out, static_cast<uint32_t>(token.size()));
  return out + token;
}

// --- waiting ---

// Polls `condition` until it holds or `limit` passes (for state only visible
// through stats() or /proc).
inline bool WaitFor(const std::function<bool()>& condition, std::chrono::duration<double> limit = kWait) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
  while (!condition()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The first of `items[from...]` that `matches`, waiting on `cv` up to
// `limit` (`lock` holds the mutex that guards `items`).
template <typename T>
std::optional<T> WaitForMatch(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                              const std::vector<T>& items, size_t from, const std::function<bool(const T&)>& matches,
                              std::chrono::duration<double> limit) {
  std::optional<T> found;
  cv.wait_for(lock, limit, [&] {
    for (size_t i = from; i < items.size() && !found; ++i) {
      if (matches(items[i])) found = items[i];
    }
    return found.has_value();
  });
  return found;
}

struct Received {
  uint32_t from;
  uint64_t address;
  std::string payload;
};
struct LinkError {
  uint32_t node;
  absl::Status status;
  Clock::time_point at;
};

// Records what one session's handlers saw.
class Recorder {
 public:
  explicit Recorder(bool keep_payloads = true) : keep_payloads_(keep_payloads) {}

  FrameHandler OnFrame() {
    return [this](uint32_t from, uint64_t address, std::string_view payload) {
      std::lock_guard<std::mutex> lock(mu_);
      frames_.push_back(Received{from, address, keep_payloads_ ? std::string(payload) : std::string()});
      if (address != next_address_[from]) out_of_order_ = true;
      next_address_[from] = address + 1;
      cv_.notify_all();
    };
  }
  LinkErrorHandler OnError() {
    return [this](uint32_t node, const absl::Status& error) {
      std::lock_guard<std::mutex> lock(mu_);
      errors_.push_back(LinkError{node, error, Clock::now()});
      cv_.notify_all();
    };
  }
  absl::Status Subscribe(Bus& bus, uint64_t session) { return bus.Subscribe(session, OnFrame(), OnError()); }

  bool WaitFrames(size_t n, std::chrono::duration<double> limit = kWait) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return frames_.size() >= n; });
  }
  // The first error about `node`, waiting for it.
  std::optional<LinkError> WaitError(uint32_t node, std::chrono::duration<double> limit = kWait) {
    return WaitErrorMatching([node](const LinkError& e) { return e.node == node; }, 0, limit);
  }
  // The first error from the `from`-th on that `matches`, waiting for it.
  std::optional<LinkError> WaitErrorMatching(const std::function<bool(const LinkError&)>& matches, size_t from,
                                             std::chrono::duration<double> limit = kWait) {
    std::unique_lock<std::mutex> lock(mu_);
    return WaitForMatch(lock, cv_, errors_, from, matches, limit);
  }
  std::vector<Received> frames() {
    std::lock_guard<std::mutex> lock(mu_);
    return frames_;
  }
  size_t frame_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return frames_.size();
  }
  std::vector<LinkError> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }
  size_t error_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_.size();
  }
  // Frames from each node arrived with addresses 0, 1, 2, ...
  bool in_order() {
    std::lock_guard<std::mutex> lock(mu_);
    return !out_of_order_;
  }

 private:
  const bool keep_payloads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Received> frames_;
  std::vector<LinkError> errors_;
  std::map<uint32_t, uint64_t> next_address_;
  bool out_of_order_ = false;
};

// --- raw sockets ---

// A blocking TCP socket connected to `address` ("127.0.0.1:PORT"); -1 on failure.
inline int RawConnect(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The local port of a connected socket: how the bus names this connection.
inline int LocalPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  return ntohs(addr.sin_port);
}

// Writes what the peer takes; a peer that already closed is fine here.
inline void WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Reads into *received (when not null) until `done` holds (true), the bus
// closes the connection (EOF or reset: false, *closed set) or `limit` passes
// (false).
inline bool ReadUntil(int fd, std::string* received, const std::function<bool()>& done,
                      std::chrono::duration<double> limit, bool* closed) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
  char buffer[4096];
  *closed = false;
  while (!done()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      *closed = true;
      return false;
    }
    if (received != nullptr) received->append(buffer, static_cast<size_t>(n));
  }
  return true;
}

// Reads until the bus closes the connection (EOF or reset); false if it is
// still open after `limit`. What was read goes to *received.
inline bool WaitClosed(int fd, std::string* received = nullptr, std::chrono::duration<double> limit = kWait) {
  bool closed = false;
  ReadUntil(
      fd, received, [] { return false; }, limit, &closed);
  return closed;
}

// Reads until `received` holds at least `bytes` bytes; false on EOF, error or
// after `limit`.
inline bool ReadAtLeast(int fd, size_t bytes, std::string* received, std::chrono::duration<double> limit = kWait) {
  bool closed = false;
  return ReadUntil(
      fd, received, [&] { return received->size() >= bytes; }, limit, &closed);
}

// Entries of a /proc directory (descriptors, threads).
inline int CountEntries(const char* dir) {
  DIR* d = ::opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;  // for /proc/self/fd, opendir's own descriptor included: the same on every call
}

}  // namespace tessera::comm::bus::testing
