#include "cluster/client.h"

#include <utility>

#include "cluster/grpc_status.h"

namespace tessera::cluster {

Client::Client(Options options)
    : options_(std::move(options)), stub_(control::Master::NewStub(MakeChannel(options_.master, options_.security))) {}

absl::StatusOr<std::string> Client::Submit(const std::string& config_json, const std::vector<std::string>& overrides) {
  control::SubmitJobRequest request;
  request.set_config_json(config_json);
  for (const std::string& o : overrides) request.add_overrides(o);
  control::SubmitJobResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = ToAbsl(stub_->SubmitJob(&context, request, &response)); !status.ok()) return status;
  return response.job_id();
}

absl::StatusOr<control::JobInfo> Client::Get(const std::string& job_id) {
  control::GetJobRequest request;
  request.set_job_id(job_id);
  control::JobInfo response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = ToAbsl(stub_->GetJob(&context, request, &response)); !status.ok()) return status;
  return response;
}

absl::StatusOr<std::vector<control::JobInfo>> Client::List() {
  control::ListJobsResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = ToAbsl(stub_->ListJobs(&context, control::ListJobsRequest(), &response)); !status.ok()) {
    return status;
  }
  return std::vector<control::JobInfo>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<std::vector<control::WorkerInfo>> Client::ListWorkers() {
  control::ListWorkersResponse response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = ToAbsl(stub_->ListWorkers(&context, control::ListWorkersRequest(), &response)); !status.ok()) {
    return status;
  }
  return std::vector<control::WorkerInfo>(response.workers().begin(), response.workers().end());
}

absl::StatusOr<control::JobInfo> Client::Cancel(const std::string& job_id, const std::string& reason,
                                                bool checkpoint) {
  control::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  request.set_checkpoint(checkpoint);
  control::JobInfo response;
  grpc::ClientContext context;
  PrepareContext(context, options_.security, options_.timeout);
  if (auto status = ToAbsl(stub_->CancelJob(&context, request, &response)); !status.ok()) return status;
  return response;
}

absl::Status Client::Watch(const std::string& job_id, const std::function<bool(const control::JobEvent&)>& on_event,
                           bool follow) {
  control::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_history_only(!follow);
  grpc::ClientContext context;
  PrepareContext(context, options_.security, absl::InfiniteDuration());
  std::unique_ptr<grpc::ClientReader<control::JobEvent>> reader = stub_->WatchJob(&context, request);
  control::JobEvent event;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      context.TryCancel();
      (void)reader->Finish();
      return absl::CancelledError("watch stopped by the caller");
    }
  }
  return ToAbsl(reader->Finish());
}

}  // namespace tessera::cluster
