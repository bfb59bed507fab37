#include "comm/collective/gloo_store.h"

#include <utility>

#include "gloo/common/error.h"

namespace tessera::comm {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_.Set(Key(key), std::string(data.begin(), data.end()));
  if (!status.ok()) Fail(std::move(status));
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::vector<std::string>> values = store_.Wait({Key(key)}, timeout_);
  if (!values.ok()) Fail(std::move(values).status());
  const std::string& value = values->front();
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(Key(key));
  // gloo passes kNoTimeout (zero) for "no timeout"; nothing here waits forever.
  const absl::Duration limit = timeout.count() > 0 ? absl::FromChrono(timeout) : timeout_;
  absl::StatusOr<std::vector<std::string>> values = store_.Wait(full, limit);
  if (!values.ok()) Fail(std::move(values).status());
}

absl::Status GlooStore::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void GlooStore::Fail(absl::Status status) {
  const std::string message(status.message());
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = std::move(status);
  }
  throw gloo::IoException(message);
}

}  // namespace tessera::comm
