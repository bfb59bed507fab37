#include "cluster/client.h"

#include <utility>

#include "cluster/grpc_status.h"
#include "core/status.h"
#include "core/strings.h"

namespace tessera::cluster {

namespace {

absl::Status CheckOptions(const Client::Options& options) {
  const auto fail = [](const absl::Status& status, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("client: ", what, std::string(status.message())));
  };
  if (absl::Status status = CheckAddress(options.master); !status.ok()) return fail(status, "master address ");
  if (absl::Status status = CheckSecurity(options.security); !status.ok()) return fail(status, "");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("client: timeout ", absl::FormatDuration(options.timeout), " must be > 0"));
  }
  if (options.keepalive < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client: keepalive ", absl::FormatDuration(options.keepalive), " must be at least 1s"));
  }
  return absl::OkStatus();
}

// What the master names its jobs by (protobuf refuses a request whose
// string is not UTF-8, with lines of its own on stderr and "INTERNAL").
absl::Status CheckJobId(const std::string& job_id) {
  if (IsPlainId(job_id)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("job id '", EscapeControlChars(job_id, /*non_ascii=*/true),
                                                 "' is not 1-128 characters of [A-Za-z0-9._-] (as job-000001)"));
}

}  // namespace

Client::Client(Options options) : options_(std::move(options)), invalid_(CheckOptions(options_)) {
  if (invalid_.ok()) {
    stub_ = control::Master::NewStub(MakeChannel(options_.master, options_.security, options_.keepalive));
  }
}

absl::StatusOr<std::string> Client::Submit(const std::string& config_json, const std::vector<std::string>& overrides) {
  if (!invalid_.ok()) return invalid_;
  control::SubmitJobRequest request;
  request.set_config_json(config_json);
  for (const std::string& o : overrides) request.add_overrides(o);
  control::SubmitJobResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = Reached(stub_->SubmitJob(&context, request, &response)); !status.ok()) return status;
  return response.job_id();
}

absl::StatusOr<control::JobInfo> Client::Get(const std::string& job_id) {
  if (!invalid_.ok()) return invalid_;
  RETURN_IF_ERROR(CheckJobId(job_id));
  control::GetJobRequest request;
  request.set_job_id(job_id);
  control::JobInfo response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = Reached(stub_->GetJob(&context, request, &response)); !status.ok()) return status;
  return response;
}

absl::StatusOr<std::vector<control::JobInfo>> Client::List() {
  if (!invalid_.ok()) return invalid_;
  control::ListJobsResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = Reached(stub_->ListJobs(&context, control::ListJobsRequest(), &response)); !status.ok()) {
    return status;
  }
  return std::vector<control::JobInfo>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<std::vector<control::WorkerInfo>> Client::ListWorkers() {
  if (!invalid_.ok()) return invalid_;
  control::ListWorkersResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = Reached(stub_->ListWorkers(&context, control::ListWorkersRequest(), &response)); !status.ok()) {
    return status;
  }
  return std::vector<control::WorkerInfo>(response.workers().begin(), response.workers().end());
}

absl::StatusOr<control::JobInfo> Client::Cancel(const std::string& job_id, const std::string& reason,
                                                bool checkpoint) {
  if (!invalid_.ok()) return invalid_;
  RETURN_IF_ERROR(CheckJobId(job_id));
  if (const std::optional<size_t> bad = FirstInvalidUtf8(reason)) {
    return absl::InvalidArgumentError(absl::StrCat("the cancel reason is not valid UTF-8 (byte ", *bad, ")"));
  }
  control::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  request.set_checkpoint(checkpoint);
  control::JobInfo response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = Reached(stub_->CancelJob(&context, request, &response)); !status.ok()) return status;
  return response;
}

absl::Status Client::Watch(const std::string& job_id, const std::function<bool(const control::JobEvent&)>& on_event,
                           bool follow) {
  if (!invalid_.ok()) return invalid_;
  if (!on_event) return absl::InvalidArgumentError("Client::Watch: on_event is empty (give a callback)");
  RETURN_IF_ERROR(CheckJobId(job_id));
  control::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_history_only(!follow);
  grpc::ClientContext context;
  PrepareContext(context, options_.security, absl::InfiniteDuration());
  {
    absl::MutexLock lock(&mu_);
    watches_.insert(&context);
  }
  bool stopped = false;  // by StopWatches
  const auto forget = [&] {
    absl::MutexLock lock(&mu_);
    stopped = watches_.erase(&context) == 0;
  };
  std::unique_ptr<grpc::ClientReader<control::JobEvent>> reader = stub_->WatchJob(&context, request);
  control::JobEvent event;
  while (reader->Read(&event)) {
    bool go_on = false;
    try {
      go_on = on_event(event);
    } catch (...) {
      forget();
      context.TryCancel();
      (void)reader->Finish();
      throw;
    }
    if (!go_on) {
      forget();
      context.TryCancel();
      (void)reader->Finish();
      return absl::CancelledError("watch stopped by the caller");
    }
  }
  absl::Status status = Reached(reader->Finish());
  forget();
  if (stopped) return absl::CancelledError("watch stopped by Client::StopWatches");
  return status;
}

absl::Status Client::Reached(const grpc::Status& status) const {
  absl::Status converted = ToAbsl(status);
  const std::optional<Unreachable> cause =
      DescribeUnreachable(converted, !options_.security.tls_ca.empty(), "--tls-ca");
  if (!cause) return converted;  // the master's own answers ("master is shutting down") as they are
  return absl::Status(converted.code(), absl::StrCat("cannot reach the master at ", options_.master, ": ", cause->why));
}

void Client::StopWatches() {
  absl::MutexLock lock(&mu_);
  for (grpc::ClientContext* context : watches_) context->TryCancel();
  watches_.clear();
}

}  // namespace tessera::cluster
