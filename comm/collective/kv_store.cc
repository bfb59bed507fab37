#include "comm/collective/kv_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera::comm {

absl::Status InProcessKvStore::Set(const std::string& key, std::string value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::move(value);
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessKvStore::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("kv: no key '", key, "'"));
  return it->second;
}

absl::StatusOr<std::vector<std::string>> InProcessKvStore::Wait(const std::vector<std::string>& keys,
                                                                absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::string> missing;
  for (;;) {
    missing.clear();
    for (const std::string& key : keys) {
      if (!values_.contains(key)) missing.push_back(key);
    }
    if (missing.empty()) break;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      missing.clear();
      for (const std::string& key : keys) {
        if (!values_.contains(key)) missing.push_back(key);
      }
      if (missing.empty()) break;
      return absl::DeadlineExceededError(absl::StrCat("kv: waited ", absl::FormatDuration(timeout), " for ",
                                                      absl::StrJoin(missing, ", "), " (never set)"));
    }
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(values_.at(key));
  return values;
}

absl::StatusOr<std::vector<std::string>> CancellableKvStore::Wait(const std::vector<std::string>& keys,
                                                                  absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    if (cancel_.load()) return absl::CancelledError("kv: the wait was cancelled (another member failed)");
    const absl::Duration left = give_up - absl::Now();
    auto values = inner_.Wait(keys, std::clamp(left, absl::ZeroDuration(), absl::Milliseconds(100)));
    if (values.ok() || !absl::IsDeadlineExceeded(values.status())) return values;
    if (left <= absl::Milliseconds(100)) break;
  }
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!inner_.Get(key).ok()) missing.push_back(key);
  }
  return absl::DeadlineExceededError(absl::StrCat("kv: waited ", absl::FormatDuration(timeout), " for ",
                                                  absl::StrJoin(missing, ", "), " (never set)"));
}

}  // namespace tessera::comm
