#include "cluster/kv_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/grpc_status.h"

namespace tessera::cluster {

KvClient::KvClient(std::shared_ptr<grpc::Channel> channel, Security security, std::string prefix,
                   absl::Duration rpc_timeout)
    : stub_(control::Master::NewStub(std::move(channel))),
      security_(std::move(security)),
      prefix_(std::move(prefix)),
      rpc_timeout_(rpc_timeout) {}

namespace {
absl::Status Cancelled() { return absl::CancelledError("kv: the job was stopped"); }
}  // namespace

bool KvClient::Begin(grpc::ClientContext& context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  in_flight_.insert(&context);
  return true;
}

void KvClient::End(grpc::ClientContext& context) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(&context);
}

void KvClient::CancelCalls() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : in_flight_) context->TryCancel();
}

absl::Status KvClient::Set(const std::string& key, std::string value) {
  control::KvPutRequest request;
  request.set_key(prefix_ + key);
  request.set_value(std::move(value));
  control::KvPutResponse response;
  grpc::ClientContext context;
  PrepareContext(context, security_, rpc_timeout_);
  if (!Begin(context)) return Cancelled();
  const grpc::Status status = stub_->KvPut(&context, request, &response);
  End(context);
  return ToAbsl(status);
}

absl::StatusOr<std::string> KvClient::Get(const std::string& key) {
  control::KvGetRequest request;
  request.set_key(prefix_ + key);
  control::KvGetResponse response;
  grpc::ClientContext context;
  PrepareContext(context, security_, rpc_timeout_);
  if (!Begin(context)) return Cancelled();
  const grpc::Status status = stub_->KvGet(&context, request, &response);
  End(context);
  if (!status.ok()) return ToAbsl(status);
  return std::move(*response.mutable_value());
}

absl::StatusOr<std::vector<std::string>> KvClient::Wait(const std::vector<std::string>& keys,
                                                        absl::Duration timeout) {
  control::KvWaitRequest request;
  for (const std::string& key : keys) request.add_keys(prefix_ + key);
  control::KvWaitResponse response;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    request.set_timeout_ms(absl::ToInt64Milliseconds(left));
    grpc::ClientContext context;
    // The RPC outlives the wait by the usual call timeout, so a wait that
    // times out on the master comes back as the master's answer.
    PrepareContext(context, security_, left + rpc_timeout_);
    if (!Begin(context)) return Cancelled();
    const grpc::Status status = stub_->KvWait(&context, request, &response);
    End(context);
    if (status.ok()) break;
    // The master holds so many waits (or calls) that it takes no more now:
    // wait here a little (or until cancelled) and ask again while time is
    // left. (An answer past the message size is RESOURCE_EXHAUSTED too.)
    const bool busy = status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                      !absl::StrContains(status.error_message(), "larger than max");
    if (!busy || left <= absl::ZeroDuration()) {
      return ToAbsl(status);
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), std::min(left, absl::Milliseconds(100)));
  }
  if (response.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat("kv: asked for ", keys.size(), " keys, the master answered ",
                                            response.values_size()));
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (std::string& value : *response.mutable_values()) values.push_back(std::move(value));
  return values;
}

}  // namespace tessera::cluster
