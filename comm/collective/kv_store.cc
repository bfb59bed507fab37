#include "comm/collective/kv_store.h"

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

}  // namespace tessera::comm
