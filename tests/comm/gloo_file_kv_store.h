#pragma once
// A KvStore over a directory, for processes of one machine that rendezvous
// without a master (multi-process gloo tests and benchmarks). Each key is one
// file, written under a temporary name and renamed into place, so a reader
// sees a whole value or none. Wait polls every millisecond until its deadline.
//
// Thread-safety: thread-safe; several processes may share the directory.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective/kv_store.h"
#include "core/text.h"

namespace tessera::comm::testing {

class FileKvStore final : public KvStore {
 public:
  explicit FileKvStore(std::filesystem::path dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, std::string value) override {
    const std::filesystem::path temp = dir_ / StrCat(".tmp.", ::getpid(), ".", counter_.fetch_add(1));
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out.flush()) return absl::InternalError(StrCat("FileKvStore: cannot write ", temp.string()));
    }
    std::error_code error;
    std::filesystem::rename(temp, Path(key), error);
    if (error) return absl::InternalError(StrCat("FileKvStore: rename to ", Path(key).string(), ": ", error.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    std::ifstream in(Path(key), std::ios::binary);
    if (!in) return absl::NotFoundError(StrCat("FileKvStore: no key '", key, "'"));
    std::ostringstream value;
    value << in.rdbuf();
    return value.str();
  }

  absl::StatusOr<std::vector<std::string>> Wait(const std::vector<std::string>& keys,
                                                absl::Duration timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    for (;;) {
      std::vector<std::string> values;
      std::vector<std::string> missing;
      for (const std::string& key : keys) {
        absl::StatusOr<std::string> value = Get(key);
        if (value.ok()) {
          values.push_back(*std::move(value));
        } else {
          missing.push_back(key);
        }
      }
      if (missing.empty()) return values;
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(StrCat("FileKvStore: waited ", absl::FormatDuration(timeout), " for ",
                                                  Join(missing, ", "), " (never set)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  // Keys hold '/', which a file name cannot.
  std::filesystem::path Path(const std::string& key) const {
    std::string name;
    for (char c : key) {
      if (c == '/') {
        name += "%2F";
      } else if (c == '%') {
        name += "%25";
      } else {
        name += c;
      }
    }
    return dir_ / name;
  }

  const std::filesystem::path dir_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace tessera::comm::testing
