#include "cluster/worker.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/device_offer.h"
#include "cluster/grpc_status.h"
#include "cluster/kv_client.h"
#include "cluster/tls_material.h"
#include "comm/proto/control.grpc.pb.h"
#include "core/logging.h"
#include "core/strings.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace tessera::cluster {
namespace {

constexpr size_t kMaxIdBytes = 128;
constexpr int kMaxSlots = 1 << 16;

enum class Phase { kLoading, kLoaded, kRunning, kDone };

// One job on this worker. Shared by the map, the job's thread and RPC
// handlers that call into the runner outside the lock.
struct JobEntry {
  RunContext context;
  std::string worker_id;
  uint64_t epoch = 0;
  std::unique_ptr<KvClient> kv;
  std::unique_ptr<PlanRunner> runner;  // set once loaded; read-only then
  std::thread thread;
  std::atomic<int64_t> iteration{0};  // completed, as far as this node knows
  // The runner returned (its end being reported): nothing left to stop.
  std::atomic<bool> ran{false};
  // Stopped at once (StopJob, not graceful): its reports are tried once.
  std::atomic<bool> cancelled{false};
  // Guarded by the worker's report mutex: its reports queued (numbering
  // them: ReportRequest.seq) and those sent or given up.
  uint64_t reports_queued = 0;
  uint64_t reports_done = 0;
  void RaiseIteration(int64_t reached) {
    int64_t seen = iteration.load();
    while (reached > seen && !iteration.compare_exchange_weak(seen, reached)) {
    }
  }
  // Guarded by the worker's mutex:
  Phase phase = Phase::kLoading;
  uint64_t launch = 0;  // LoadPlanRequest.launch
  uint64_t registration = 0;  // the worker's registration it was loaded under
  bool stop_requested = false;
  absl::Status stop_reason;
};

grpc::Status Precondition(const std::string& message) { return {grpc::StatusCode::FAILED_PRECONDITION, message}; }

// A report waiting for the reporter thread.
struct QueuedReport {
  std::shared_ptr<JobEntry> entry;
  control::ReportRequest report;
  size_t bytes = 0;  // its serialized size
};
// What the reports not yet sent may hold (a master hung for long, with
// rows logged every iteration).
constexpr size_t kMaxReportBacklogBytes = size_t{64} << 20;

}  // namespace

class Worker::Impl final : public control::Worker::Service {
 public:
  Impl(Options options, PlanRunnerFactory factory) : options_(std::move(options)), factory_(std::move(factory)) {
    master_channel_ =
        options_.master_channel ? options_.master_channel() : MakeChannel(options_.master, options_.security);
    if (master_channel_ != nullptr) master_ = control::Master::NewStub(master_channel_);  // (else Start says so)
  }
  ~Impl() override { Shutdown(); }

  absl::StatusOr<std::string> Start() {
    if (started_) return absl::FailedPreconditionError("worker already started");
    if (auto status = CheckOptions(); !status.ok()) return status;
    // Its peers will dial the data-plane address: one this machine cannot
    // listen on would fail every job placed here, not the worker.
    if (!options_.data_address.empty()) {
      const std::string host = DataHostName(options_.data_address);
      if (auto status = CheckListenable(host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host);
          !status.ok()) {
        return absl::Status(status.code(), absl::StrCat("worker: data_address ", status.message()));
      }
    }
    auto served = Serve(options_.listen, options_.security, this, "worker");
    if (!served.ok()) return served.status();
    server_ = std::move(served->server);
    address_ = std::move(served->address);
    started_ = true;
    reporter_ = std::thread([this] { ReportLoop(); });
    heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
    return address_;
  }

  // What the CLI's flags check for `tessera worker`, for a program that
  // embeds the worker.
  absl::Status CheckOptions() const {
    const auto fail = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat("worker: ", parts...)); };
    if (auto status = CheckAddress(options_.master); !status.ok()) return fail("master address ", status.message());
    if (master_channel_ == nullptr) return fail("master_channel gave no channel");
    if (!options_.data_address.empty()) {
      if (auto status = CheckDataHost(options_.data_address); !status.ok()) {
        return fail("data_address ", status.message());
      }
    }
    if (auto offer = ParseDeviceOffer(options_.devices); !offer.ok()) return fail(offer.status().message());
    if (!options_.worker_id.empty() && !IsPlainId(options_.worker_id)) {
      return fail("worker_id '", EscapeControlChars(options_.worker_id.substr(0, 128)),
                  "' is not 1-128 characters of [A-Za-z0-9._-]");
    }
    if (auto status = CheckSecurity(options_.security); !status.ok()) return fail(status.message());
    if (auto note = ServedCertificateNote(options_.security.tls_cert)) TLOG_WARN("worker: {}", *note);
    if (auto status = CheckDurations({{"heartbeat_interval", options_.heartbeat_interval},
                                      {"master_timeout", options_.master_timeout},
                                      {"rpc_timeout", options_.rpc_timeout}});
        !status.ok()) {
      return fail(status.message());
    }
    return absl::OkStatus();
  }

  void Shutdown() {
    if (!started_) return;
    started_ = false;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      // (Its heartbeat in flight too: it waited out its deadline, 2 s, or
      // 10 s with long heartbeats, on a master that stopped answering.)
      if (heartbeat_call_ != nullptr) heartbeat_call_->TryCancel();
      // (And a report waiting on a master known silent: the reporter
      // sends each job's end after it.)
      if (master_silent_) {
        for (grpc::ClientContext* report : reports_in_flight_) report->TryCancel();
      }
    }
    StopAll(absl::CancelledError("stopped at once (the worker is shutting down): no checkpoint"));
    heartbeat_thread_.join();
    // The master's calls in flight get 2 s to end; none where the master
    // stopped answering (they waited the 2 s on it).
    bool silent = false;
    {
      absl::MutexLock lock(&mu_);
      silent = master_silent_;
    }
    server_->Shutdown(std::chrono::system_clock::now() + (silent ? std::chrono::seconds(0) : std::chrono::seconds(2)));
    {
      absl::MutexLock lock(&mu_);
      auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return std::none_of(jobs_.begin(), jobs_.end(),
                            [](const auto& job) { return job.second->phase == Phase::kLoading; });
      };
      mu_.Await(absl::Condition(&ended));
    }
    Reap(/*all=*/true);  // (each job's end reported first)
    {
      absl::MutexLock lock(&report_mu_);
      reports_closed_ = true;  // (what is left, sent: a job's that never ran)
    }
    reporter_.join();
    // The worker tells the master it is gone, drained or stopped at once, so
    // that it is no longer listed and a worker started in its place may
    // take its id at once.
    control::HeartbeatRequest farewell;
    bool say_farewell = false;
    {
      absl::MutexLock lock(&mu_);
      say_farewell = registered_ && !master_silent_;
      farewell = NewBeatLocked();
    }
    if (say_farewell) {
      farewell.set_leaving(true);
      control::HeartbeatResponse answer;
      grpc::ClientContext context;
      PrepareContext(context, options_.security, QuickRpcTimeout());
      (void)master_->Heartbeat(&context, farewell, &answer);
    }
    server_.reset();
  }

  void Drain() {
    control::HeartbeatRequest beat;
    bool registered = false;
    std::vector<std::string> ids;
    {
      absl::MutexLock lock(&mu_);
      if (!draining_) {
        draining_ = true;
        if (jobs_.empty()) {
          TLOG_INFO("shutting down: taking no new job");
        } else {
          TLOG_INFO("shutting down: taking no new job; stopping {} job(s) at an iteration boundary", jobs_.size());
        }
      }
      registered = registered_;
      beat = NewBeatLocked();
      for (const auto& [id, entry] : jobs_) ids.push_back(id);
    }
    // The master, told first, stops each job on all of its nodes and places
    // none here; this node asks its jobs to stop too (the same request
    // twice is one), so no lost message of the master's keeps them going.
    // A master that does not answer leaves it to this worker alone: a job on
    // it alone still ends at an iteration boundary with a checkpoint.
    control::HeartbeatResponse answer;
    grpc::ClientContext context;
    PrepareContext(context, options_.security, QuickRpcTimeout());
    const bool told = registered && master_->Heartbeat(&context, beat, &answer).ok();
    {
      absl::MutexLock lock(&mu_);
      master_silent_ = !told;
      // A report begun before, waiting out its full deadline on a master
      // that does not answer, would hold its job's iteration (and so the
      // stop and its checkpoint) that long.
      if (!told) {
        for (grpc::ClientContext* report : reports_in_flight_) report->TryCancel();
      }
    }
    if (!told && !ids.empty()) {
      TLOG_WARN("the master did not hear that this worker is shutting down; stopping its jobs here");
    }
    StopAllForShutdown(/*master_silent=*/!told);
    for (const std::string& id : answer.drop_job_ids()) StopJob(id, absl::CancelledError("dropped by the master"));
    absl::MutexLock lock(&mu_);
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ ||
             std::all_of(jobs_.begin(), jobs_.end(), [](const auto& job) { return job.second->phase == Phase::kDone; });
    };
    mu_.Await(absl::Condition(&drained));
  }

  std::string worker_id() const {
    absl::MutexLock lock(&mu_);
    return worker_id_;
  }
  bool registered() const {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  int jobs_held() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(jobs_.size());
  }

  // ---- Worker service ----

  grpc::Status LoadPlan(grpc::ServerContext* context, const control::LoadPlanRequest* request,
                        control::LoadPlanResponse*) override {
    if (auto s = CheckToken(*context, options_.security.token); !s.ok()) return s;
    if (request->job_id().empty() || request->job_id().size() > kMaxIdBytes) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "job_id must be 1-128 bytes"};
    }
    if (request->slots_size() == 0 || request->slots_size() > kMaxSlots ||
        request->node() >= static_cast<uint32_t>(request->slots_size())) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("node ", request->node(), " is not among the ", request->slots_size(), " slots")};
    }
    auto entry = std::make_shared<JobEntry>();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || draining_) return {grpc::StatusCode::UNAVAILABLE, "the worker is shutting down"};
      // The master places jobs on a worker as soon as it has registered it,
      // so a plan can arrive before the registration's answer: wait for it.
      if (!registered_ && registering_) {
        mu_.AwaitWithTimeout(absl::Condition(this, &Impl::RegistrationSettled), options_.rpc_timeout);
      }
      if (stopping_ || draining_) return {grpc::StatusCode::UNAVAILABLE, "the worker is shutting down"};
      if (!registered_) return Precondition("the worker is not registered with a master");
      if (request->slots(static_cast<int>(request->node())).worker_id() != worker_id_) {
        return {grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("slot ", request->node(), " names worker '",
                             request->slots(static_cast<int>(request->node())).worker_id().substr(0, kMaxIdBytes),
                             "', this is '", worker_id_, "'")};
      }
      if (auto held = jobs_.find(request->job_id()); held != jobs_.end()) {
        // Loaded by a launch the master gave up (the job was queued again)
        // and not started: this launch's plan replaces it.
        if (held->second->phase != Phase::kLoaded) {
          return Precondition(absl::StrCat("job ", request->job_id(), " is already ",
                                           held->second->phase == Phase::kLoading   ? "loading"
                                           : held->second->phase == Phase::kRunning ? "running"
                                                                                    : "ending",
                                           " on this worker"));
        }
        jobs_.erase(held);
      }
      entry->worker_id = worker_id_;
      entry->epoch = epoch_;
      entry->registration = registrations_;
      entry->launch = request->launch();
      jobs_[request->job_id()] = entry;
    }
    RunContext& run = entry->context;
    run.job_id = request->job_id();
    run.session = request->session();
    run.node = request->node();
    for (const control::WorkerSlot& slot : request->slots()) {
      run.slots.push_back({slot.worker_id(), slot.node(), slot.num_devices(), slot.data_address()});
    }
    entry->kv = std::make_unique<KvClient>(master_channel_, options_.security,
                                           absl::StrCat(run.job_id, "/", run.session, "/"), options_.rpc_timeout);
    run.kv = entry->kv.get();
    run.token = options_.security.token;
    JobEntry* raw = entry.get();  // the entry outlives its runner, which owns these callbacks' uses
    const std::weak_ptr<JobEntry> weak = entry;  // (the queue of reports holds the entry)
    run.report_metrics = [this, raw, weak](const JobMetrics& metrics) {
      raw->RaiseIteration(metrics.iteration);
      control::ReportRequest report = NewReport(*raw);
      control::Metrics* out = report.add_metrics();
      out->set_iteration(metrics.iteration);
      for (const auto& [name, value] : metrics.values) (*out->mutable_values())[name] = value;
      QueueReport(weak.lock(), std::move(report));
    };
    run.report_progress = [raw](int64_t iteration) { raw->RaiseIteration(iteration); };
    run.report_log = [this, raw, weak](const std::string& line) {
      control::ReportRequest report = NewReport(*raw);
      report.add_log_lines(line);
      QueueReport(weak.lock(), std::move(report));
    };
    std::unique_ptr<PlanRunner> runner = factory_();
    absl::Status loaded = runner == nullptr ? absl::InternalError("the worker has no plan runner")
                                            : runner->Load(entry->context, request->plan());
    absl::MutexLock lock(&mu_);
    if (loaded.ok() && entry->stop_requested) loaded = entry->stop_reason;
    if (!loaded.ok()) {
      jobs_.erase(run.job_id);
      return ToGrpc(loaded);
    }
    entry->runner = std::move(runner);
    entry->phase = Phase::kLoaded;
    return grpc::Status::OK;
  }

  grpc::Status Start(grpc::ServerContext* context, const control::StartRequest* request,
                     control::StartResponse*) override {
    if (auto s = CheckToken(*context, options_.security.token); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) {
      return {grpc::StatusCode::NOT_FOUND, absl::StrCat("no job '", request->job_id().substr(0, kMaxIdBytes),
                                                        "' on this worker (LoadPlan first)")};
    }
    std::shared_ptr<JobEntry> entry = it->second;
    if (entry->phase != Phase::kLoaded) {
      return Precondition(absl::StrCat("job ", request->job_id(), " is ",
                                       entry->phase == Phase::kLoading ? "still loading" : "already started"));
    }
    try {
      entry->thread = std::thread([this, entry] { RunJob(entry); });
    } catch (const std::exception& e) {
      // (A thread the system refuses, EAGAIN: the master fails the job and
      // stops it here, still loaded; the job waited forever.)
      return {
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("cannot start the thread of job ", request->job_id().substr(0, kMaxIdBytes), ": ", e.what())};
    }
    entry->phase = Phase::kRunning;
    return grpc::Status::OK;
  }

  grpc::Status Stop(grpc::ServerContext* context, const control::StopRequest* request,
                    control::StopResponse*) override {
    if (auto s = CheckToken(*context, options_.security.token); !s.ok()) return s;
    const absl::Status reason = absl::CancelledError(
        request->reason().empty() ? "stopped by the master" : request->reason().substr(0, 4096));
    if (!StopJob(request->job_id(), reason, request->graceful(), request->launch())) {
      return {grpc::StatusCode::NOT_FOUND, absl::StrCat("no job '", request->job_id().substr(0, kMaxIdBytes),
                                                        "' on this worker")};
    }
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext* context, const control::WorkerStatusRequest*,
                      control::WorkerStatusResponse* response) override {
    if (auto s = CheckToken(*context, options_.security.token); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    response->set_worker_id(worker_id_);
    response->set_epoch(epoch_);
    FillJobsLocked(*response->mutable_jobs());
    return grpc::Status::OK;
  }

 private:
  void FillJobsLocked(google::protobuf::RepeatedPtrField<control::WorkerJob>& out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, entry] : jobs_) {
      if (entry->phase == Phase::kDone) continue;
      control::WorkerJob* job = out.Add();
      job->set_job_id(id);
      job->set_session(entry->context.session);
      job->set_started(entry->phase == Phase::kRunning);
      job->set_iteration(entry->iteration.load());
    }
  }

  // Cancels, or with `graceful` asks to stop at an iteration boundary (a
  // running job), or forgets (a loaded one) a job; false if there is none.
  // `launch` (not 0): only that placement of the job (a late "queued
  // again" stop killed the next placement's load).
  bool StopJob(const std::string& job_id, const absl::Status& reason, bool graceful = false, uint64_t launch = 0) {
    std::shared_ptr<JobEntry> entry;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return false;
      entry = it->second;
      if (launch != 0 && entry->launch != 0 && entry->launch != launch) {
        TLOG_INFO("job {}: a stop of its placement {} left placement {} be", job_id, launch, entry->launch);
        return true;
      }
      switch (entry->phase) {
        case Phase::kLoading:
          entry->stop_requested = true;
          entry->stop_reason = reason;
          return true;
        case Phase::kLoaded:
          jobs_.erase(it);
          return true;
        case Phase::kDone:
          return true;
        case Phase::kRunning:
          // (Ended, its report on the way: a worker shut down after its
          // last job succeeded logged that it stopped it, with no checkpoint.)
          if (entry->ran) return true;
          break;
      }
    }
    TLOG_INFO("stopping job {}{}: {}", job_id, graceful ? " at an iteration boundary" : "",
              std::string(reason.message()));
    if (graceful) {
      entry->runner->RequestStop(reason);
    } else {
      entry->cancelled = true;
      entry->runner->Cancel(reason);
      // (And its calls to the master's KV: a stop agreement waiting on a
      // master that stopped answering held the job the whole RPC timeout.)
      entry->kv->CancelCalls();
    }
    return true;
  }

  // Stops every job of a worker shutting down: at an iteration boundary,
  // with a checkpoint; but at once, where the master does not answer, a job
  // that spans several workers (its nodes agree where to stop, and commit
  // its checkpoint, through the master's KV: waiting on a silent master
  // held the worker 15-18 s past the signal).
  void StopAllForShutdown(bool master_silent) {
    std::vector<std::pair<std::string, bool>> jobs;  // (id, spans several workers)
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, entry] : jobs_) {
        // (The slots are read once loaded: LoadPlan fills them unlocked.)
        jobs.emplace_back(id, entry->phase == Phase::kRunning && entry->context.slots.size() > 1);
      }
    }
    for (const auto& [id, spans] : jobs) {
      if (master_silent && spans) {
        StopJob(id, absl::CancelledError("the worker is shutting down and the master does not answer (the job's "
                                         "workers agree where to stop through it): stopped at once, no checkpoint"));
      } else {
        StopJob(id, absl::CancelledError("the worker is shutting down"), /*graceful=*/true);
      }
    }
  }

  // StopJob on every job held.
  void StopAll(const absl::Status& reason, bool graceful = false) {
    std::vector<std::string> ids;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, entry] : jobs_) ids.push_back(id);
    }
    for (const std::string& id : ids) StopJob(id, reason, graceful);
  }

  // The deadline of the RPCs of a worker on its way out.
  absl::Duration QuickRpcTimeout() const {
    return std::min(options_.rpc_timeout, std::max(options_.heartbeat_interval * 2, absl::Seconds(1)));
  }

  void RunJob(const std::shared_ptr<JobEntry>& entry) {
    const absl::Status status = entry->runner->Run();
    entry->ran = true;
    control::ReportRequest report = NewReport(*entry);
    report.set_finished(true);
    report.set_code(static_cast<int>(status.code()));
    report.set_message(std::string(status.message()));
    // (After its rows and lines: the job's end is what frees it on the
    // master.)
    QueueReport(entry, std::move(report));
    {
      absl::MutexLock lock(&report_mu_);
      report_mu_.Await(absl::Condition(
          +[](JobEntry* job) ABSL_NO_THREAD_SAFETY_ANALYSIS { return job->reports_done == job->reports_queued; },
          entry.get()));
    }
    absl::MutexLock lock(&mu_);
    entry->phase = Phase::kDone;
    reap_needed_ = true;
  }

  // A report of `entry`'s. (Its launch is set before the runner exists,
  // and read only by the runner's callbacks and thread.)
  static control::ReportRequest NewReport(const JobEntry& entry) {
    control::ReportRequest report;
    report.set_worker_id(entry.worker_id);
    report.set_epoch(entry.epoch);
    report.set_job_id(entry.context.job_id);
    report.set_session(entry.context.session);
    report.set_launch(entry.launch);
    return report;
  }

  // Queues a report of `entry`'s, numbered, for the reporter thread: a
  // job's training never waits on the master (a report took its RPC
  // deadline out of the job's iteration while the master hung). Past
  // kMaxReportBacklogBytes not yet sent, metrics rows and log lines are
  // dropped (said once per backlog); a job's end never is.
  void QueueReport(std::shared_ptr<JobEntry> entry, control::ReportRequest report) {
    if (entry == nullptr) return;
    const size_t bytes = report.ByteSizeLong();
    absl::MutexLock lock(&report_mu_);
    if (!report.finished() && report_bytes_ + bytes > kMaxReportBacklogBytes) {
      if (!report_backlog_said_) {
        report_backlog_said_ = true;
        TLOG_WARN("the master is {} MiB of reports behind: dropping metrics rows and log lines until it catches up",
                  kMaxReportBacklogBytes >> 20);
      }
      return;
    }
    report.set_seq(++entry->reports_queued);
    report_bytes_ += bytes;
    reports_.push_back({std::move(entry), std::move(report), bytes});
  }

  // The reporter thread: sends the queued reports in order (each tried
  // again while its failure passes) until the queue is closed and empty.
  void ReportLoop() {
    for (;;) {
      QueuedReport* next = nullptr;
      {
        absl::MutexLock lock(&report_mu_);
        report_mu_.Await(absl::Condition(
            +[](Impl* self) ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->reports_closed_ || !self->reports_.empty(); },
            this));
        if (reports_.empty()) return;
        next = &reports_.front();  // (stays put: the queue grows at its back)
      }
      SendReportRetrying(*next->entry, next->report);
      std::shared_ptr<JobEntry> sent;  // (released outside the lock: it may be the entry's last hold)
      absl::MutexLock lock(&report_mu_);
      sent = std::move(next->entry);
      ++sent->reports_done;
      report_bytes_ -= next->bytes;
      if (report_bytes_ <= kMaxReportBacklogBytes / 2) report_backlog_said_ = false;
      reports_.pop_front();
    }
  }

  // SendReport, tried again 0.5, 1 and 2 s apart while the failure is of
  // the kind that passes (a metrics row or log line lost so was missing
  // from the job's outputs for good; its end, left RUNNING on the master).
  // The master applies each report's number once, so a retry of one it
  // took adds nothing. Not tried again for a master gone silent, a worker
  // stopping, or (but for its end) a job stopped at once.
  grpc::Status SendReportRetrying(const JobEntry& entry, const control::ReportRequest& report) {
    for (int attempt = 0;; ++attempt) {
      const grpc::Status sent = SendReport(report, entry.registration);
      const bool transient = sent.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             sent.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                             sent.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                             sent.error_code() == grpc::StatusCode::INTERNAL ||
                             sent.error_code() == grpc::StatusCode::UNKNOWN;
      bool silent = false;
      {
        absl::MutexLock lock(&mu_);
        silent = master_silent_ || stopping_;
      }
      if (sent.ok() || !transient || silent || attempt == 3 || (!report.finished() && entry.cancelled)) return sent;
      TLOG_INFO("report of {}job {} failed ({}): trying again", report.finished() ? "the end of " : "", report.job_id(),
                sent.error_message());
      absl::SleepFor(absl::Milliseconds(500) * (1 << attempt));
    }
  }

  // The Report call's status (OK where nothing was sent: a leaving worker's
  // metrics for a silent master).
  grpc::Status SendReport(const control::ReportRequest& report, uint64_t registration) {
    control::ReportResponse response;
    grpc::ClientContext context;
    bool leaving = false;
    {
      absl::MutexLock lock(&mu_);
      leaving = draining_ || stopping_;
      // On its way out, with a master that has stopped answering: the
      // metrics and log lines it would report wait on nothing (its jobs'
      // checkpoints do not wait for a report each); a job's end is still
      // tried.
      if (leaving && master_silent_ && !report.finished()) return grpc::Status::OK;
      if (registration <= abandoned_registration_) {
        return {grpc::StatusCode::FAILED_PRECONDITION, "not sent: the master no longer knows this worker's epoch"};
      }
      // (A TryCancel before the call starts cancels it when it does. A
      // job's end cut short so is no loss: the master finds a finished
      // job's final checkpoint when it loses the worker.)
      reports_in_flight_.insert(&context);
    }
    PrepareContext(context, options_.security, leaving ? QuickRpcTimeout() : options_.rpc_timeout);
    const grpc::Status status = master_->Report(&context, report, &response);
    absl::MutexLock lock(&mu_);
    reports_in_flight_.erase(&context);
    if (status.ok()) {
      master_silent_ = false;
    } else {
      TLOG_DEBUG("report of job {} failed: {}", report.job_id(), status.error_message());
      if (leaving && (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                      status.error_code() == grpc::StatusCode::UNAVAILABLE)) {
        master_silent_ = true;
      }
    }
    return status;
  }

  // Joins the threads of finished jobs and drops them (all: every job, for
  // shutdown, after CancelAll).
  void Reap(bool all) {
    std::vector<std::shared_ptr<JobEntry>> done;
    {
      absl::MutexLock lock(&mu_);
      if (!reap_needed_ && !all) return;
      reap_needed_ = false;
      for (auto it = jobs_.begin(); it != jobs_.end();) {
        if (it->second->phase == Phase::kDone || (all && it->second->phase != Phase::kLoading)) {
          done.push_back(std::move(it->second));
          it = jobs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& entry : done) {
      if (entry->thread.joinable()) entry->thread.join();
    }
    const bool reaped = !done.empty();
    done.clear();
#if defined(__GLIBC__)
    // The jobs' registers, plans and threads are gone: give the freed memory
    // back to the system (glibc keeps it in its arenas otherwise), so an
    // idle daemon holds only its own.
    if (reaped) malloc_trim(0);
#else
    (void)reaped;
#endif
  }

  void HeartbeatLoop() {
    absl::Duration interval = options_.heartbeat_interval;
    // How long a silent master is waited for: master_timeout, or the
    // master's own wait for a silent worker where longer (a master that
    // beats every 5 s, or rides out 30 s hangs, had every job cancelled
    // by one beat lost).
    absl::Duration master_timeout = options_.master_timeout;
    absl::Time last_answer = absl::Now();
    for (bool first = true;; first = false) {
      if (!first) {
        absl::MutexLock lock(&mu_);
        auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || reap_needed_; };
        mu_.AwaitWithTimeout(absl::Condition(&stop), interval);
        if (stopping_) return;
      }
      Reap(/*all=*/false);
      bool registered = false;
      control::HeartbeatRequest beat;
      {
        absl::MutexLock lock(&mu_);
        registered = registered_;
        beat = NewBeatLocked();
      }
      if (!registered) {
        // A worker shutting down does not come back.
        if (!beat.draining() && Register(interval, master_timeout)) last_answer = absl::Now();
        continue;
      }
      control::HeartbeatResponse answer;
      grpc::ClientContext context;
      PrepareContext(context, options_.security, std::min(options_.rpc_timeout, interval * 2));
      {
        // (Shutdown cancels it: a silent master held the shutdown the
        // call's whole deadline.)
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        heartbeat_call_ = &context;
      }
      const grpc::Status status = master_->Heartbeat(&context, beat, &answer);
      {
        absl::MutexLock lock(&mu_);
        heartbeat_call_ = nullptr;
        if (stopping_) return;
      }
      if (status.ok()) {
        last_answer = absl::Now();
        {
          absl::MutexLock lock(&mu_);
          master_silent_ = false;
        }
        for (const std::string& id : answer.drop_job_ids()) StopJob(id, absl::CancelledError("dropped by the master"));
        continue;
      }
      const bool forgotten = status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
      if (forgotten || absl::Now() - last_answer > master_timeout) {
        bool draining = false;
        {
          absl::MutexLock lock(&mu_);
          draining = draining_;
        }
        // (A master that answers but no longer knows this worker, restarted
        // or having taken it for lost, is not "lost": said as it is.)
        const std::string what = forgotten
                                     ? absl::StrCat("the master no longer knows this worker (", status.error_message(),
                                                    "): it restarted, or took this worker for lost")
                                     : absl::StrCat("lost the master (", status.error_message(), ")");
        size_t held = 0;
        {
          absl::MutexLock lock(&mu_);
          held = jobs_.size();
          // The master no longer takes this epoch's reports (it lost this
          // worker, or forgot it): those queued and in flight go unsent (each
          // waited out its deadline, and its retries, before the jobs' ends).
          if (forgotten || !draining) {
            abandoned_registration_ = registrations_;
            for (grpc::ClientContext* report : reports_in_flight_) report->TryCancel();
          }
        }
        if (draining) {
          // Shutting down anyway: its jobs stop at an iteration boundary, a
          // job on this worker alone with its checkpoint (Drain).
          TLOG_WARN("{} while shutting down{}", what, held > 0 ? "; stopping its jobs here" : "");
          if (!forgotten) {
            absl::MutexLock lock(&mu_);
            master_silent_ = true;  // (reports skipped, no grace at the server's shutdown)
          }
          StopAllForShutdown(/*master_silent=*/!forgotten);
        } else {
          TLOG_WARN("{}; {}registering again", what, held > 0 ? "cancelling its jobs and " : "");
          StopAll(absl::UnavailableError(absl::StrCat("lost the master: ", status.error_message())));
        }
        absl::MutexLock lock(&mu_);
        registered_ = false;
      }
    }
  }

  control::HeartbeatRequest NewBeatLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    control::HeartbeatRequest beat;
    beat.set_worker_id(worker_id_);
    beat.set_epoch(epoch_);
    beat.set_draining(draining_);
    FillJobsLocked(*beat.mutable_jobs());
    return beat;
  }

  bool RegistrationSettled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return registered_ || !registering_ || stopping_;
  }

  bool Register(absl::Duration& interval, absl::Duration& master_timeout) {
    control::RegisterWorkerRequest request;
    {
      absl::MutexLock lock(&mu_);
      request.set_worker_id(worker_id_.empty() ? options_.worker_id : worker_id_);
      registering_ = true;
    }
    // Whatever the answer, the registration is settled when this returns.
    struct Settle {
      Impl* self;
      ~Settle() {
        absl::MutexLock lock(&self->mu_);
        self->registering_ = false;
      }
    } settle{this};
    request.set_devices(options_.devices);
    request.set_data_address(options_.data_address);
    request.set_worker_address(address_);
    control::RegisterWorkerResponse response;
    grpc::ClientContext context;
    PrepareContext(context, options_.security, std::min(options_.rpc_timeout, std::max(interval * 2, absl::Seconds(1))));
    const grpc::Status status = master_->RegisterWorker(&context, request, &response);
    if (!status.ok()) {
      TLOG_DEBUG("registering with {}: {}", options_.master, status.error_message());
      // Bad requests do not get better by retrying, but the master may be
      // replaced by one that accepts them; keep trying, loudly.
      if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS && options_.worker_id.empty()) {
        // The id the master gave before it restarted is another worker's
        // now: ask for a fresh one.
        absl::MutexLock lock(&mu_);
        TLOG_WARN("{}; registering for a new id", status.error_message());
        worker_id_.clear();
        return false;
      }
      // In words (the TLS handshake's OpenSSL codes, "Socket closed").
      const std::optional<Unreachable> cause =
          DescribeUnreachable(ToAbsl(status), !options_.security.tls_ca.empty(), "--tls-cert/--tls-key/--tls-ca");
      if ((status.error_code() != grpc::StatusCode::UNAVAILABLE &&
           status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) ||
          (cause && cause->tls_mismatch)) {
        // (gRPC's own answers may carry no text: a worker's address given
        // as the master's said "refused registration: " and nothing.) Once
        // per minute while the answer stays the same: a wrong token was
        // 86,400 lines a day. A master whose TLS this worker's does not
        // match is named at once too (it waited 10 s, then quoted OpenSSL).
        const std::string why(cause ? cause->why : ToAbsl(status).message());
        const absl::Time now = absl::Now();
        if (why != last_refusal_ || now - last_refusal_warning_ >= absl::Seconds(60)) {
          TLOG_WARN("the master at {} {}: {}{}", options_.master, cause ? "cannot be reached" : "refused registration",
                    why,
                    refusals_unlogged_ > 0 ? absl::StrCat(" (and ", refusals_unlogged_, " times since the last line)")
                                           : std::string());
          last_refusal_ = why;
          last_refusal_warning_ = now;
          refusals_unlogged_ = 0;
        } else {
          ++refusals_unlogged_;
        }
      } else {
        // No master there (yet): waiting is right, silently is not.
        const absl::Time now = absl::Now();
        if (unanswered_since_ == absl::InfiniteFuture()) unanswered_since_ = now;
        if (now - unanswered_since_ >= absl::Seconds(10) && now - last_unanswered_warning_ >= absl::Seconds(60)) {
          last_unanswered_warning_ = now;
          TLOG_WARN("no answer from the master at {} for {:.0f} s: {}; still trying", options_.master,
                    absl::ToDoubleSeconds(now - unanswered_since_),
                    cause ? cause->why : std::string(ToAbsl(status).message()));
        }
      }
      return false;
    }
    unanswered_since_ = absl::InfiniteFuture();
    if (response.heartbeat_interval_ms() > 0) interval = absl::Milliseconds(response.heartbeat_interval_ms());
    master_timeout = std::max(options_.master_timeout, absl::Milliseconds(response.worker_timeout_ms()));
    absl::MutexLock lock(&mu_);
    worker_id_ = response.worker_id();
    epoch_ = response.epoch();
    ++registrations_;
    registered_ = true;
    TLOG_INFO("registered with {} as {} (epoch {})", options_.master, worker_id_, epoch_);
    return true;
  }

  const Options options_;
  const PlanRunnerFactory factory_;
  std::shared_ptr<grpc::Channel> master_channel_;
  std::unique_ptr<control::Master::Stub> master_;
  bool started_ = false;  // Start/Shutdown's thread only
  std::string address_;   // set by Start, before any thread reads it
  std::unique_ptr<grpc::Server> server_;
  std::thread heartbeat_thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Drain: shutting down once its jobs have stopped; takes no new one.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // Draining or stopping, the master did not answer its last call: reports
  // other than a job's end are skipped until it answers again.
  bool master_silent_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> reports_in_flight_ ABSL_GUARDED_BY(mu_);  // SendReport's calls
  // Registrations so far, and the last the worker gave up (it lost the
  // master, or the master forgot it): reports of jobs loaded under it are
  // not sent. (Not the epochs: a master restarted without a state
  // directory numbers them from 1 again.)
  uint64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t abandoned_registration_ ABSL_GUARDED_BY(mu_) = 0;
  // The reports not yet sent, in order (QueueReport), and the thread
  // sending them (ReportLoop). Never held while mu_ is taken.
  absl::Mutex report_mu_;
  std::deque<QueuedReport> reports_ ABSL_GUARDED_BY(report_mu_);
  size_t report_bytes_ ABSL_GUARDED_BY(report_mu_) = 0;
  bool report_backlog_said_ ABSL_GUARDED_BY(report_mu_) = false;
  bool reports_closed_ ABSL_GUARDED_BY(report_mu_) = false;
  std::thread reporter_;
  grpc::ClientContext* heartbeat_call_ ABSL_GUARDED_BY(mu_) = nullptr;     // HeartbeatLoop's call in flight
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  // A registration RPC is in flight (LoadPlan waits for its answer).
  bool registering_ ABSL_GUARDED_BY(mu_) = false;
  // Registration attempts no master answered (the heartbeat thread's own).
  absl::Time unanswered_since_ = absl::InfiniteFuture();
  absl::Time last_unanswered_warning_ = absl::InfinitePast();
  // The last refusal logged (Register's thread only).
  std::string last_refusal_;
  absl::Time last_refusal_warning_ = absl::InfinitePast();
  int64_t refusals_unlogged_ = 0;
  bool reap_needed_ ABSL_GUARDED_BY(mu_) = false;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<JobEntry>> jobs_ ABSL_GUARDED_BY(mu_);
};

Worker::Worker(Options options, PlanRunnerFactory factory)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(factory))) {}
Worker::~Worker() = default;
absl::StatusOr<std::string> Worker::Start() { return impl_->Start(); }
void Worker::Shutdown() { impl_->Shutdown(); }
void Worker::Drain() { impl_->Drain(); }
std::string Worker::worker_id() const { return impl_->worker_id(); }
bool Worker::registered() const { return impl_->registered(); }
int Worker::jobs_held() const { return impl_->jobs_held(); }

}  // namespace tessera::cluster
