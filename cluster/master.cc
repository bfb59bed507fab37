#include "cluster/master.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "cluster/device_offer.h"
#include "cluster/grpc_status.h"
#include "cluster/metrics_http.h"
#include "cluster/tls_material.h"
#include "cluster/transport.h"
#include "comm/proto/control.grpc.pb.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/strings.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "train/loss_plot.h"
#include "train/tfevents.h"

namespace tessera::cluster {
namespace {

using control::JobState;
namespace fs = std::filesystem;

// Limits on what a request may carry (beyond kMaxMessageBytes).
constexpr size_t kMaxIdBytes = 128;
constexpr size_t kMaxAddressBytes = 256;
constexpr size_t kMaxConfigBytes = 8 << 20;
constexpr size_t kMaxOverrides = 1000;
constexpr size_t kMaxOverrideBytes = 4096;
// A running job's record takes its progress at most this often.
constexpr int64_t kPersistProgressMs = 5000;
constexpr size_t kMaxKvKeyBytes = 1024;
constexpr size_t kMaxKvValueBytes = 16 << 20;
constexpr size_t kMaxKvKeysPerWait = 4096;
constexpr size_t kMaxReportItems = 10000;
constexpr size_t kMaxLogLineBytes = 64 << 10;
// A job's metrics: names of at most 128 bytes, at most 256 of them (each
// one is kept for the job's life and sent in every JobInfo).
constexpr size_t kMaxMetricNameBytes = 128;
constexpr size_t kMaxMetricNames = 256;
// loss.svg is redrawn for a new evaluation at most this often (and at the
// job's end): it is drawn from every point so far, under the master's lock.
constexpr int64_t kLossPlotPeriodMs = 5000;
constexpr int64_t kMaxDevicesPerJob = 1 << 20;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool IsFinal(JobState state) {
  return state == control::SUCCEEDED || state == control::FAILED || state == control::CANCELLED;
}

grpc::Status Invalid(const std::string& message) { return {grpc::StatusCode::INVALID_ARGUMENT, message}; }
grpc::Status NotFound(const std::string& message) { return {grpc::StatusCode::NOT_FOUND, message}; }
// An id no job has, quoted as far as an id goes, control bytes escaped.
grpc::Status NoSuchJob(const std::string& job_id) {
  return NotFound(absl::StrCat("no job '", EscapeControlChars(job_id.substr(0, kMaxIdBytes)), "'"));
}
grpc::Status Precondition(const std::string& message) { return {grpc::StatusCode::FAILED_PRECONDITION, message}; }

std::string StateName(JobState state) { return control::JobState_Name(state); }

struct WorkerRecord {
  std::string id;
  uint64_t epoch = 0;
  int num_devices = 0;
  std::string devices;
  std::string device_type;  // the type of `devices` (cpu, cuda)
  std::string data_address;
  std::string address;
  std::shared_ptr<control::Worker::Stub> stub;
  absl::Time last_heartbeat;
  int failed_probes = 0;
  bool probe_in_flight = false;
  std::string job_id;  // the job holding its devices; empty: free
  bool draining = false;  // shutting down (HeartbeatRequest.draining): placed on no more
};

// The numbers (ReportRequest.seq) of the reports one node of a job's
// placement sent that were applied: every number below `below`, and those
// in `above`. A report is tried again after a transient failure with its
// number, so one whose answer was lost is not applied twice. Numbers of
// reports the node gave up on leave gaps; past kMaxReportGaps of them the
// oldest gaps are taken as applied (a report arriving that late is
// dropped).
class ReportWindow {
 public:
  static constexpr size_t kMaxReportGaps = 1024;
  // Whether `seq` is new, noting it (0: unnumbered, always new).
  bool Take(uint64_t seq) {
    if (seq == 0) return true;
    if (seq < below_ || above_.contains(seq)) return false;
    above_.insert(seq);
    if (above_.size() > kMaxReportGaps) below_ = *above_.begin();
    while (!above_.empty() && *above_.begin() == below_) {
      above_.erase(above_.begin());
      ++below_;
    }
    return true;
  }

 private:
  uint64_t below_ = 1;
  std::set<uint64_t> above_;
};

struct Job {
  std::string id;
  uint64_t session = 0;
  JobState state = control::PENDING;
  std::string reason;
  JobSpec spec;
  std::vector<WorkerSlot> slots;
  std::set<uint32_t> nodes_done;
  int64_t iteration = 0;
  int64_t persisted_ms = 0;  // when the record last took the iteration reached
  std::map<std::string, double> last_metrics;
  int64_t submit_ms = 0;
  int64_t end_ms = 0;
  // Ended while nodes still held it: its output directory is let go (the
  // empty checkpoints/ and the directory its submission made removed) once
  // the last of them has (before, `cancel --now` left them: the nodes'
  // claims on checkpoints/ kept both).
  bool outputs_held = false;
  // Its placements so far (the current one's number: LoadPlanRequest.launch).
  uint64_t launch = 0;
  bool launching = false;  // a launch thread of it has not returned yet
  // The reports of this placement applied, per node (reset at each launch).
  std::map<uint32_t, ReportWindow> reports_taken;
  std::deque<control::JobEvent> events;
  uint64_t events_base = 0;  // index of events.front() among all events
  size_t events_bytes = 0;   // their serialized sizes, summed
  // The outputs in spec.output_dir, opened at the job's first report (a
  // logged iteration, a checkpoint, an evaluation): a job that fails before
  // it writes nothing there, and an earlier run's files stay as they were.
  std::unique_ptr<std::ofstream> metrics_file;
  // metrics.jsonl's size after its last whole row (-1: not a regular file):
  // a row the disk took only part of is cut off again, so the file stays
  // JSON Lines.
  int64_t metrics_bytes = -1;
  std::unique_ptr<std::ofstream> log_file;
  std::vector<std::string> early_log;  // the master's lines from before they open
  // TensorBoard scalars and the loss curve (loss.svg) beside metrics.jsonl.
  std::unique_ptr<EventFileWriter> tensorboard;
  std::vector<LossPoint> train_losses, eval_losses;
  int64_t loss_plot_ms = 0;  // when loss.svg was last drawn (kLossPlotPeriodMs)
  // spec.output_dir, claimed from submission to the job's end: no other
  // process's run (a `tessera train`, another master's job) writes it
  // meanwhile. Made at submission if missing, and removed at the end if
  // the job left it empty.
  DirectoryClaim output_claim;
  // A worker said it lost its link to a peer (UNAVAILABLE): the job ends
  // with the lost peer's name if a probe finds one dead before the
  // deadline, else with this report.
  std::string link_lost_report;
  absl::Time link_lost_deadline;
  // A graceful cancel in progress: why, when it gives up waiting, and how
  // many nodes ended interrupted (the others reached the end).
  bool stopping = false;
  std::string stop_reason;
  absl::Time stop_deadline;
  std::set<uint32_t> nodes_interrupted;
  std::string interrupted_at;  // a node's "interrupted at iteration N; checkpoint ..."
  // metrics.jsonl or log.txt could not be written (a full disk): the job
  // stops as a graceful cancel does and ends FAILED; nothing is written to
  // them any more (nor are they opened, and so truncated, again).
  bool outputs_failed = false;
  // Its first report is opening its outputs (without the master's lock):
  // its other reports wait, and the directory is not let go meanwhile.
  bool outputs_opening = false;
  // Where this job's lines are in its log.txt (a resumed job appends to
  // the earlier one's): from log_offset to log_end, the file's inode then,
  // and its last line: a master restarted while the job ran shows them
  // again in `tessera logs`, once they are found there unchanged (-1:
  // unknown, or log.txt is not a regular file).
  int64_t log_offset = -1;
  int64_t log_end = -1;
  uint64_t log_inode = 0;
  std::string log_last_line;  // its first kLogCheckBytes
};

// An ended job's last log lines kept in its record (a restarted master's
// `tessera logs` shows them): at most this many, of at most kLogTailBytes.
constexpr size_t kLogTailLines = 200;
// The events (log lines, metrics, states) a job keeps for WatchJob, in
// bytes: while it runs, and once it ended.
constexpr size_t kMaxEventBytesPerJob = size_t{32} << 20;
constexpr size_t kEndedJobEventBytes = size_t{256} << 10;
constexpr size_t kLogTailBytes = 64 << 10;
constexpr size_t kLogTailLineBytes = 8 << 10;
constexpr size_t kLogCheckBytes = 256;

// A job record of the state directory (PersistLocked writes it): every
// field checked for its kind and range, an error naming the field (it
// quoted nlohmann's "cannot use at() with discarded", and took an
// iteration of -5).
constexpr size_t kMaxJobRecordBytes = 64 << 20;

class RecordReader {
 public:
  explicit RecordReader(const nlohmann::json& record, std::string prefix = "")
      : record_(record), prefix_(std::move(prefix)) {}

  const nlohmann::json* Find(const std::string& name, bool required = true) {
    if (!ok()) return nullptr;
    auto it = record_.find(name);
    if (it == record_.end()) {
      if (required) Fail(name, "is missing");
      return nullptr;
    }
    return &*it;
  }
  bool Bool(const std::string& name, bool fallback) {
    const nlohmann::json* value = Find(name, /*required=*/false);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) return Fail(name, "is not true or false"), fallback;
    return value->get<bool>();
  }
  std::string String(const std::string& name, const std::string& fallback = "", bool required = true) {
    const nlohmann::json* value = Find(name, required);
    if (value == nullptr) return fallback;
    if (!value->is_string()) return Fail(name, "is not a string"), fallback;
    return value->get<std::string>();
  }
  int64_t Integer(const std::string& name, int64_t lo, int64_t hi, std::optional<int64_t> fallback = std::nullopt) {
    const nlohmann::json* value = Find(name, !fallback.has_value());
    if (value == nullptr) return fallback.value_or(0);
    if (!value->is_number_integer() || (value->is_number_unsigned() && value->get<uint64_t>() > uint64_t(INT64_MAX))) {
      return Fail(name, "is not an integer"), 0;
    }
    const int64_t number = value->get<int64_t>();
    if (number < lo || number > hi) return Fail(name, absl::StrCat(number, " is not in [", lo, ", ", hi, "]")), 0;
    return number;
  }
  void Fail(const std::string& name, const std::string& what) {
    if (ok()) status_ = absl::InvalidArgumentError(absl::StrCat("'", prefix_, name, "' ", what));
  }
  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }

 private:
  const nlohmann::json& record_;
  std::string prefix_;  // of a nested record's field names: "slots[0]."
  absl::Status status_;
};

// (`output_dir_made`: whether the job's submission made its output_dir.)
absl::Status ReadJobRecord(const nlohmann::json& record, Job& job, JobState& state, bool& output_dir_made) {
  if (record.is_discarded()) return absl::InvalidArgumentError("not valid JSON (cut short or damaged)");
  if (!record.is_object()) return absl::InvalidArgumentError("not a JSON object");
  RecordReader r(record);
  constexpr int64_t kMax = INT64_MAX;
  job.id = r.String("job_id");
  job.session = static_cast<uint64_t>(r.Integer("session", 1, kMax));
  const std::string state_name = r.String("state");
  if (r.ok() && !control::JobState_Parse(state_name, &state)) {
    r.Fail("state", absl::StrCat("'", EscapeControlChars(state_name.substr(0, kMaxIdBytes)), "' is no job state"));
  }
  job.reason = r.String("reason");
  if (const nlohmann::json* config = r.Find("config")) {
    if (!config->is_object()) r.Fail("config", "is not a JSON object");
    job.spec.config = *config;
  }
  job.spec.devices_needed = r.Integer("devices_needed", 1, kMaxDevicesPerJob);
  job.spec.device_type = r.String("device_type", "cpu", /*required=*/false);  // records before it: CPU jobs
  if (r.ok() && job.spec.device_type != "cpu" && job.spec.device_type != "cuda") {
    r.Fail("device_type", absl::StrCat("'", EscapeControlChars(job.spec.device_type.substr(0, kMaxIdBytes)),
                                       "' is neither cpu nor cuda"));
  }
  job.spec.iterations = r.Integer("iterations", 0, kMax);
  job.spec.start_iteration = r.Integer("start_iteration", 0, kMax, int64_t{0});
  job.spec.output_dir = r.String("output_dir");
  output_dir_made = r.Bool("output_dir_made", false);  // (records before it: false)
  job.iteration = r.Integer("iteration", 0, kMax);
  if (const nlohmann::json* metrics = r.Find("last_metrics")) {
    if (!metrics->is_object()) r.Fail("last_metrics", "is not a JSON object");
    for (auto it = metrics->begin(); r.ok() && it != metrics->end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& value = it.value();
      // (JSON has no NaN: a diverged loss is written as null.)
      if (value.is_null()) {
        job.last_metrics[name] = std::numeric_limits<double>::quiet_NaN();
      } else if (value.is_number()) {
        job.last_metrics[name] = value.get<double>();
      } else {
        r.Fail(absl::StrCat("last_metrics.", name), "is not a number");
      }
    }
  }
  job.log_offset = r.Integer("log_offset", -1, kMax, int64_t{-1});
  job.log_end = r.Integer("log_end", -1, kMax, int64_t{-1});
  job.log_inode = static_cast<uint64_t>(r.Integer("log_inode", 0, kMax, int64_t{0}));
  job.log_last_line = r.String("log_last_line", "", /*required=*/false);
  if (const nlohmann::json* tail = r.Find("log_tail", /*required=*/false)) {
    if (!tail->is_array() || tail->size() > kLogTailLines) {
      r.Fail("log_tail", absl::StrCat("is not an array of at most ", kLogTailLines, " lines"));
    }
    for (size_t i = 0; r.ok() && i < tail->size(); ++i) {
      const nlohmann::json& line = (*tail)[i];
      if (!line.is_string() || line.get_ref<const std::string&>().size() > kLogTailBytes) {
        r.Fail(absl::StrCat("log_tail[", i, "]"), "is not a log line");
        break;
      }
      control::JobEvent event;
      event.set_log_line(line.get_ref<const std::string&>());
      job.events_bytes += event.ByteSizeLong();
      job.events.push_back(std::move(event));
    }
  }
  job.submit_ms = r.Integer("submit_time_ms", 0, kMax);
  job.end_ms = r.Integer("end_time_ms", 0, kMax);
  if (const nlohmann::json* slots = r.Find("slots")) {
    if (!slots->is_array()) r.Fail("slots", "is not an array");
    for (size_t i = 0; r.ok() && i < slots->size(); ++i) {
      if (!(*slots)[i].is_object()) {
        r.Fail(absl::StrCat("slots[", i, "]"), "is not a JSON object");
        break;
      }
      RecordReader slot((*slots)[i], absl::StrCat("slots[", i, "]."));
      WorkerSlot read{slot.String("worker_id"), static_cast<uint32_t>(slot.Integer("node", 0, UINT32_MAX)),
                      static_cast<int>(slot.Integer("num_devices", 1, kMaxDevicesPerJob)), slot.String("data_address")};
      if (slot.ok() && !IsPlainId(read.worker_id)) slot.Fail("worker_id", "is not a worker id");
      if (!slot.ok()) return slot.status();
      job.slots.push_back(std::move(read));
    }
  }
  return r.status();
}

struct PendingStop {
  std::shared_ptr<control::Worker::Stub> stub;
  std::string job_id;
  std::string reason;
  bool graceful = false;
  uint64_t launch = 0;  // the placement it stops (0: whichever)
};

struct UrgentProbe {
  std::string worker_id;
  std::shared_ptr<control::Worker::Stub> stub;
  std::string job_id;
};

}  // namespace

class Master::Impl final : public control::Master::Service {
 public:
  Impl(Options options, std::unique_ptr<JobCompiler> compiler)
      : options_(std::move(options)), compiler_(std::move(compiler)) {}

  ~Impl() override {
    Shutdown();
    if (state_lock_fd_ >= 0) ::close(state_lock_fd_);
  }

  absl::StatusOr<std::string> Start() {
    if (started_) return absl::FailedPreconditionError("master already started");
    if (auto status = CheckOptions(); !status.ok()) return status;
    if (auto status = LoadState(); !status.ok()) {
      ForgetNewStateDir();
      return status;
    }
    auto served = Serve(options_.listen, options_.security, this, "master");
    if (!served.ok()) {
      ForgetNewStateDir();
      return served.status();
    }
    server_ = std::move(served->server);
    address_ = std::move(served->address);
    if (options_.metrics_port >= 0) {
      metrics_server_ = std::make_unique<MetricsHttpServer>([this] { return RenderMetrics(); });
      auto bound = metrics_server_->Start(options_.metrics_host, options_.metrics_port);
      if (!bound.ok()) {
        server_->Shutdown();
        server_.reset();
        ForgetNewStateDir();
        return bound.status();
      }
      metrics_port_ = *bound;
    }
    started_ = true;
    scheduler_ = std::thread([this] { SchedulerLoop(); });
    monitor_ = std::thread([this] { MonitorLoop(); });
    TLOG_INFO("master listening on {}", address_);
    return address_;
  }

  int metrics_port() const { return metrics_port_; }

  // A master that did not start leaves no --state-dir it made (with its
  // .lock in it: "no output behind").
  void ForgetNewStateDir() {
    if (!state_dir_made_) return;
    if (state_lock_fd_ >= 0) ::close(state_lock_fd_);
    state_lock_fd_ = -1;
    std::error_code ignored;
    fs::remove(fs::path(options_.state_dir) / ".lock", ignored);
    fs::remove(options_.state_dir, ignored);  // only if empty
    state_dir_made_ = false;
  }

  // What the CLI's flags check for `tessera master`, for a program that
  // embeds the master.
  absl::Status CheckOptions() const {
    const auto fail = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat("master: ", parts...)); };
    if (compiler_ == nullptr) return fail("no job compiler (Master was given a null JobCompiler)");
    if (auto status = CheckSecurity(options_.security); !status.ok()) return fail(status.message());
    if (auto note = ServedCertificateNote(options_.security.tls_cert)) TLOG_WARN("master: {}", *note);
    if (options_.metrics_port < -1 || options_.metrics_port > 65535) {
      return fail("metrics_port ", options_.metrics_port, " is not -1 (none) or a port in [0, 65535]");
    }
    if (auto status = CheckDurations({{"heartbeat_interval", options_.heartbeat_interval},
                                      {"worker_timeout", options_.worker_timeout},
                                      {"probe_timeout", options_.probe_timeout},
                                      {"rpc_timeout", options_.rpc_timeout},
                                      {"max_kv_wait", options_.max_kv_wait},
                                      {"stop_grace", options_.stop_grace}});
        !status.ok()) {
      return fail(status.message());
    }
    if (options_.worker_timeout < 2 * options_.heartbeat_interval) {
      return fail("worker_timeout ", absl::FormatDuration(options_.worker_timeout),
                  " must be at least twice heartbeat_interval ", absl::FormatDuration(options_.heartbeat_interval));
    }
    if (options_.probe_failures < 1) return fail("probe_failures ", options_.probe_failures, " must be >= 1");
    if (options_.max_events_per_job < 1) return fail("max_events_per_job must be >= 1");
    return absl::OkStatus();
  }

  int jobs_running() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(
        std::count_if(jobs_.begin(), jobs_.end(), [](const auto& job) { return IsActive(*job.second); }));
  }

  void Drain() {
    absl::MutexLock lock(&mu_);
    if (!draining_) {
      draining_ = true;
      const bool kept = !options_.state_dir.empty();
      TLOG_INFO("shutting down: stopping the running jobs at an iteration boundary; {}",
                kept ? "the queued ones stay queued" : "the queued ones are cancelled (no --state-dir keeps them)");
      for (auto& [id, job] : jobs_) {
        if (job->state == control::RUNNING) {
          if (!job->stopping) StartStoppingLocked(*job, "the master is shutting down");
        } else if (job->state == control::COMPILING) {
          RequeueLocked(*job, "");  // nothing of it ran: queued for the next master
        }
        // Without a state directory no next master learns of them: they
        // end, said so (and the output directories their submissions made
        // go), not silently with the process.
        if (!kept && job->state == control::PENDING) {
          EndJobLocked(*job, control::CANCELLED,
                       "the master shut down before the job started (it has no --state-dir to keep queued jobs in)");
        }
      }
      changed_.SignalAll();
    }
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ ||
             std::none_of(jobs_.begin(), jobs_.end(), [](const auto& job) { return IsActive(*job.second); });
    };
    mu_.Await(absl::Condition(&ended));
  }

  void Shutdown() {
    if (!started_) return;
    started_ = false;
    {
      absl::MutexLock lock(&mu_);
      shutting_down_ = true;
      // Calls to workers still in flight (a Stop, a LoadPlan) end now, not
      // at their deadline: a hung worker does not hold the master's exit.
      for (grpc::ClientContext* call : cancelable_calls_) call->TryCancel();
    }
    {
      absl::MutexLock lock(&kv_mu_);
      kv_shutting_down_ = true;
    }
    // Watches and KV waits notice shutting_down_ within their poll period.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (scheduler_.joinable()) scheduler_.join();
    // (Their calls to workers were cancelled above.)
    for (const std::unique_ptr<LaunchThread>& launch : launches_) launch->thread.join();
    launches_.clear();
    if (monitor_.joinable()) monitor_.join();
    {
      absl::MutexLock lock(&mu_);
      auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return async_in_flight_ == 0; };
      mu_.Await(absl::Condition(&done));
    }
    {
      absl::MutexLock lock(&mu_);
      retired_stubs_.clear();
    }
    if (metrics_server_) metrics_server_->Stop();
    server_.reset();
  }

  // ---- Master service ----

  grpc::Status RegisterWorker(grpc::ServerContext* context, const control::RegisterWorkerRequest* request,
                              control::RegisterWorkerResponse* response) override {
    if (auto s = Enter(*context, "RegisterWorker"); !s.ok()) return s;
    if (!request->worker_id().empty() && !IsPlainId(request->worker_id())) {
      return Invalid("worker_id must be 1-128 characters of [A-Za-z0-9._-]");
    }
    // The worker's --devices, parsed as the worker did (cluster/device_offer.h).
    const absl::StatusOr<DeviceOffer> offer = ParseDeviceOffer(request->devices());
    if (!offer.ok()) return ToGrpc(offer.status());
    if (request->worker_address().empty() || request->worker_address().size() > kMaxAddressBytes ||
        request->data_address().size() > kMaxAddressBytes) {
      return Invalid("worker_address must be set and addresses at most 256 bytes");
    }
    // As the worker's own flags check them (a registration sent otherwise
    // handed every peer of its jobs an address such as 0.0.0.0 to dial).
    if (auto status = CheckAddress(request->worker_address()); !status.ok()) {
      return Invalid(absl::StrCat("worker_address ", status.message()));
    }
    if (!request->data_address().empty()) {
      if (auto status = CheckDataHost(request->data_address()); !status.ok()) {
        return Invalid(absl::StrCat("data_address ", status.message()));
      }
    }
    auto record = std::make_unique<WorkerRecord>();
    record->devices = request->devices();
    record->device_type = std::string(DeviceTypeName(offer->type));
    record->num_devices = offer->count();
    record->data_address = request->data_address();
    // (A worker listening on every interface, 0.0.0.0, is dialled at the
    // IP its registration came from: 0.0.0.0 reached only this machine.)
    record->address = DialableAddress(request->worker_address(), context->peer());
    record->stub = control::Worker::NewStub(MakeChannel(record->address, options_.security));
    // The master calls its workers too: one it cannot call with its token
    // and TLS settings is refused now, naming why (it was taken, lost for
    // its failed probes and taken again, for ever). A worker not reached
    // at all is left to the heartbeat deadline, as before.
    {
      grpc::ClientContext probe;
      // (Well inside the worker's own deadline for its registration, at
      // least 1 s: a worker that does not answer at all is not held up.)
      PrepareContext(probe, options_.security, absl::Milliseconds(500));
      control::WorkerStatusResponse ignored;
      const grpc::Status answer = record->stub->Status(&probe, control::WorkerStatusRequest(), &ignored);
      // TLS that does not match: the clients' words for it (a plaintext
      // master dialling a TLS worker reads "Socket closed"), or any other
      // failed handshake.
      const std::optional<Unreachable> cause =
          DescribeUnreachable(ToAbsl(answer), !options_.security.tls_ca.empty(), "--tls-cert/--tls-key/--tls-ca");
      const bool handshake =
          (cause && cause->tls_mismatch) ||
          (answer.error_code() == grpc::StatusCode::UNAVAILABLE &&
           (absl::StrContains(answer.error_message(), "SSL") || absl::StrContains(answer.error_message(), "Ssl") ||
            absl::StrContains(answer.error_message(), "handshake")));
      if (answer.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
          answer.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
          answer.error_code() == grpc::StatusCode::UNIMPLEMENTED || handshake) {
        return Precondition(absl::StrCat("the master cannot call this worker back at ", record->address, " (",
                                         ToAbsl(answer).message(),
                                         "): give the worker the master's --token-file, and TLS on both or neither "
                                         "(--tls-cert, --tls-key, --tls-ca)"));
      }
    }
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return {grpc::StatusCode::UNAVAILABLE, "master is shutting down"};
    if (request->worker_id().empty()) {
      // A fresh id: one a worker registered with before a master restart
      // may hold "worker-1" already.
      do {
        record->id = absl::StrCat("worker-", ++next_worker_number_);
      } while (workers_.contains(record->id));
      PersistWorkerNumberLocked();
    } else {
      record->id = request->worker_id();
    }
    if (auto held = workers_.find(record->id); held != workers_.end()) {
      // The same worker again (it restarted) replaces its record; another
      // one, while the holder still heartbeats, is refused, or the two
      // would evict each other turn by turn.
      if (held->second->address != record->address &&
          absl::Now() - held->second->last_heartbeat < options_.worker_timeout) {
        return {grpc::StatusCode::ALREADY_EXISTS,
                absl::StrCat("worker id '", record->id, "' is held by the live worker at ", held->second->address,
                             " (give this one another --id)")};
      }
      LoseWorkerLocked(record->id, "re-registered (it restarted, or lost this master for its heartbeat timeout)");
    }
    record->epoch = ++next_epoch_;
    record->last_heartbeat = absl::Now();
    response->set_worker_id(record->id);
    response->set_epoch(record->epoch);
    response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
    response->set_worker_timeout_ms(absl::ToInt64Milliseconds(options_.worker_timeout));
    TLOG_INFO("worker {} registered ({} at {})", record->id, record->devices, record->address);
    workers_[record->id] = std::move(record);
    changed_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* context, const control::HeartbeatRequest* request,
                         control::HeartbeatResponse* response) override {
    if (auto s = Enter(*context, "Heartbeat"); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    auto* worker = FindWorkerLocked(request->worker_id(), request->epoch());
    if (worker == nullptr) {
      return Precondition(absl::StrCat("unknown worker '", request->worker_id().substr(0, kMaxIdBytes),
                                       "' or stale epoch (register first)"));
    }
    worker->last_heartbeat = absl::Now();
    if (request->leaving()) {
      worker->draining = true;  // an orderly exit, logged as such
      LoseWorkerLocked(worker->id, "it shut down");
      return grpc::Status::OK;
    }
    if (request->draining() && !worker->draining) DrainWorkerLocked(*worker);
    bool holds_own_job = false;
    for (const control::WorkerJob& held : request->jobs()) {
      if (held.job_id() == worker->job_id) {
        holds_own_job = true;
        auto it = jobs_.find(held.job_id());
        if (it != jobs_.end() && IsActive(*it->second) && it->second->session == held.session()) {
          NoteProgressLocked(*it->second, held.iteration());
          continue;
        }
      }
      response->add_drop_job_ids(held.job_id());
    }
    // The worker no longer holds a job that has ended: its devices are free.
    if (!worker->job_id.empty() && !holds_own_job) {
      auto it = jobs_.find(worker->job_id);
      if (it == jobs_.end() || IsFinal(it->second->state)) {
        const std::string let_go = std::move(worker->job_id);
        worker->job_id.clear();
        WorkerLetGoLocked(let_go);
        changed_.SignalAll();
      }
    }
    return grpc::Status::OK;
  }

  // A node of `job` has completed `iteration` (its logged metrics, or its
  // heartbeat between them). The record follows the progress (every few
  // seconds at most), so a restarted master still knows how far the job got.
  void NoteProgressLocked(Job& job, int64_t iteration) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (iteration <= job.iteration || iteration > job.spec.iterations) return;
    job.iteration = iteration;
    if (const int64_t now = NowMs(); now - job.persisted_ms >= kPersistProgressMs) {
      job.persisted_ms = now;
      PersistLocked(job);
    }
  }

  grpc::Status Report(grpc::ServerContext* context, const control::ReportRequest* request,
                      control::ReportResponse*) override {
    if (auto s = Enter(*context, "Report"); !s.ok()) return s;
    if (static_cast<size_t>(request->metrics_size()) > kMaxReportItems ||
        static_cast<size_t>(request->log_lines_size()) > kMaxReportItems) {
      return Invalid("a report carries at most 10000 metrics and 10000 log lines");
    }
    for (const std::string& line : request->log_lines()) {
      if (line.size() > kMaxLogLineBytes) return Invalid("log lines are at most 64 KiB");
    }
    // (A job trains at most 2^32 - 1 iterations: a report past them would
    // reach the curves as no run's.)
    for (const control::Metrics& metrics : request->metrics()) {
      if (metrics.iteration() < 0 || metrics.iteration() > int64_t{UINT32_MAX}) {
        return Invalid(absl::StrCat("metrics of iteration ", metrics.iteration(), ": not in [0, ", UINT32_MAX, "]"));
      }
      if (metrics.values_size() > static_cast<int>(kMaxMetricNames)) {
        return Invalid(
            absl::StrCat("metrics of iteration ", metrics.iteration(), ": more than ", kMaxMetricNames, " values"));
      }
      for (const auto& [name, value] : metrics.values()) {
        if (name.empty() || name.size() > kMaxMetricNameBytes ||
            std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
          return Invalid(absl::StrCat("metrics of iteration ", metrics.iteration(), ": the name '",
                                      EscapeControlChars(name.substr(0, 64)), name.size() > 64 ? "...'" : "'",
                                      " is not 1-", kMaxMetricNameBytes, " bytes without control characters"));
        }
      }
    }
    absl::MutexLock lock(&mu_);
    WorkerRecord* worker = nullptr;
    Job* job_record = nullptr;
    const WorkerSlot* slot = nullptr;
    // (Checked again after the outputs were opened: the lock is let go
    // meanwhile.)
    for (;;) {
      worker = FindWorkerLocked(request->worker_id(), request->epoch());
      if (worker == nullptr) return Precondition("unknown worker or stale epoch (register first)");
      auto it = jobs_.find(request->job_id());
      if (it == jobs_.end()) return NoSuchJob(request->job_id());
      job_record = it->second.get();
      Job& job = *job_record;
      slot = nullptr;
      for (const WorkerSlot& s : job.slots) {
        if (s.worker_id == worker->id) slot = &s;
      }
      if (slot == nullptr || job.session != request->session()) {
        return Precondition(
            absl::StrCat("job ", job.id, " (session ", request->session(), ") does not run on worker ", worker->id));
      }
      if (IsFinal(job.state)) {
        if (request->finished() && worker->job_id == job.id) {
          worker->job_id.clear();
          ReleaseOutputsLocked(job);
          changed_.SignalAll();
        }
        return grpc::Status::OK;  // late news of an ended job
      }
      // Late news of an earlier placement of a job queued again.
      if (request->launch() != 0 && request->launch() != job.launch) return grpc::Status::OK;
      if (job.metrics_file || job.outputs_failed || job.spec.output_dir.empty() ||
          (request->metrics_size() == 0 && request->log_lines_size() == 0)) {
        break;
      }
      // The job's first report opens its outputs, outside the lock: a
      // resumed run's metrics.jsonl is read and rewritten there (a long
      // one held every other RPC of the master for seconds, heartbeats
      // included). Another report of the job waits for it.
      if (job.outputs_opening) {
        mu_.Await(absl::Condition(
            +[](Job* waiting) { return !waiting->outputs_opening; }, job_record));
        continue;
      }
      job.outputs_opening = true;
      const fs::path dir(job.spec.output_dir);
      const int64_t start_iteration = job.spec.start_iteration;
      const std::string config_text =
          job.spec.config.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      mu_.Unlock();
      absl::StatusOr<OpenedOutputs> opened = OpenOutputs(dir, start_iteration, config_text);
      mu_.Lock();
      job.outputs_opening = false;
      if (IsFinal(job.state)) {
        // Ended meanwhile: the files take the lines logged so far, its end
        // among them (kept for them), and close; the directory is let go
        // if its nodes have.
        if (opened.ok()) {
          (void)TakeOutputsLocked(job, *std::move(opened));
          job.metrics_file.reset();
          job.log_file.reset();
          job.tensorboard.reset();
        }
        job.early_log.clear();
        ReleaseOutputsLocked(job);
        continue;
      }
      if (!opened.ok()) {
        EndJobLocked(job, control::FAILED, std::string(opened.status().message()));
        return grpc::Status::OK;
      }
      if (absl::Status taken = TakeOutputsLocked(job, *std::move(opened)); !taken.ok()) {
        EndJobLocked(job, control::FAILED, std::string(taken.message()));
        return grpc::Status::OK;
      }
      job.persisted_ms = 0;  // (below: the record takes where its lines are)
    }
    Job& job = *job_record;
    {
      size_t names = job.last_metrics.size();
      std::set<std::string> added;
      for (const control::Metrics& metrics : request->metrics()) {
        for (const auto& [name, value] : metrics.values()) {
          if (!job.last_metrics.contains(name) && added.insert(name).second) ++names;
        }
      }
      if (names > kMaxMetricNames) {
        return Invalid(absl::StrCat("job ", job.id, " would have more than ", kMaxMetricNames, " metric names"));
      }
    }
    // A report tried again whose first try was applied (its answer lost).
    if (!job.reports_taken[slot->node].Take(request->seq())) return grpc::Status::OK;
    // The node holding the job's sink (the last pipeline stage's first
    // rank) reports its metrics; the others report none.
    for (const control::Metrics& metrics : request->metrics()) {
      // The latest value of each (merged: an evaluation's row holds its
      // eval_* values alone, and clearing took the loss and throughput
      // from status and /metrics until the next logged iteration).
      for (const auto& [name, value] : metrics.values()) job.last_metrics[name] = value;
      NoteProgressLocked(job, metrics.iteration());
      if (job.metrics_file) {
        nlohmann::json line = {{"iter", metrics.iteration()}};
        for (const auto& [name, value] : metrics.values()) line[name] = value;
        errno = 0;
        const std::string row = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
        *job.metrics_file << row;
        job.metrics_file->flush();
        if (!*job.metrics_file) {
          const int error = errno;
          job.metrics_file.reset();  // (closed before the cut: its buffer goes first)
          if (job.metrics_bytes >= 0) {
            std::error_code cut_error;
            fs::resize_file(fs::path(job.spec.output_dir) / "metrics.jsonl", static_cast<uintmax_t>(job.metrics_bytes),
                            cut_error);
          }
          OutputFailedLocked(job, "metrics.jsonl", error);
        } else {
          if (job.metrics_bytes >= 0) job.metrics_bytes += static_cast<int64_t>(row.size());
          RecordCurvesLocked(job, metrics);
        }
      }
      control::JobEvent event;
      *event.mutable_metrics() = metrics;
      AddEventLocked(job, std::move(event));
    }
    for (const std::string& line : request->log_lines()) {
      const std::string text = absl::StrCat("[node ", slot->node, "] ", line);
      LogLocked(job, text);
      control::JobEvent event;
      event.set_log_line(text);
      AddEventLocked(job, std::move(event));
    }
    // Where its lines end in log.txt follows them as its progress does
    // (every few seconds at most): a restarted master shows those lines.
    if (request->log_lines_size() > 0 && job.log_file) {
      if (const int64_t now = NowMs(); now - job.persisted_ms >= kPersistProgressMs) {
        job.persisted_ms = now;
        PersistLocked(job);
      }
    }
    if (request->finished()) {
      worker->job_id.clear();
      changed_.SignalAll();
      if (job.stopping && (request->code() == 0 || request->code() == static_cast<int>(absl::StatusCode::kCancelled))) {
        // A node of a graceful cancel: interrupted where the nodes agreed,
        // or at the end (the agreed iteration was the last).
        job.nodes_done.insert(slot->node);
        if (request->code() != 0) {
          NoteInterruptedIteration(job, request->message());
          job.nodes_interrupted.insert(slot->node);
          if (job.interrupted_at.empty() || slot->node == 0) {
            job.interrupted_at = OneLine(request->message().substr(0, kMaxLogLineBytes));
          }
        }
        if (job.nodes_done.size() == job.slots.size()) {
          if (job.nodes_interrupted.empty()) {
            EndJobLocked(job, control::SUCCEEDED, "");
          } else {
            EndJobLocked(job, StoppedStateOf(job), absl::StrCat(job.stop_reason, "; ", job.interrupted_at));
          }
        }
        return grpc::Status::OK;
      }
      if (request->code() != 0) {
        const absl::Status error(static_cast<absl::StatusCode>(std::clamp(request->code(), 1, 16)),
                                 OneLine(request->message().substr(0, kMaxLogLineBytes)));
        const std::string reason = absl::StrCat("worker ", worker->id, " (node ", slot->node, "): ", error.ToString());
        if (error.code() == absl::StatusCode::kCancelled &&
            absl::StartsWith(error.message(), "interrupted at iteration ")) {
          // A node stopped at an iteration boundary by its process's
          // signal (a `tessera train` Ctrl-C): a resumable stop, not a
          // failure.
          NoteInterruptedIteration(job, std::string(error.message()));
          EndJobLocked(job, control::CANCELLED, reason);
        } else if (error.code() == absl::StatusCode::kUnavailable) {
          // A lost link is a symptom: the cause is usually a peer that died
          // or hangs. Probe the job's other workers now and name the one that
          // does not answer; a report of another kind meanwhile wins.
          if (job.link_lost_report.empty() && !SuspectPeersLocked(job, worker->id, reason)) {
            EndJobLocked(job, control::FAILED, reason);
          }
        } else if (job.stopping && !job.stop_reason.empty()) {
          // Failed while stopping (the checkpoint of a stop for a full
          // disk failing too): why it was stopping comes first.
          EndJobLocked(job, control::FAILED, absl::StrCat(job.stop_reason, "; while stopping, ", reason));
        } else {
          EndJobLocked(job, control::FAILED, reason);
        }
      } else {
        job.nodes_done.insert(slot->node);
        if (job.nodes_done.size() == job.slots.size() && job.state == control::RUNNING) {
          EndJobLocked(job, control::SUCCEEDED, "");
        }
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status SubmitJob(grpc::ServerContext* context, const control::SubmitJobRequest* request,
                         control::SubmitJobResponse* response) override {
    if (auto s = Enter(*context, "SubmitJob"); !s.ok()) return s;
    if (request->config_json().size() > kMaxConfigBytes) {
      return Invalid(absl::StrCat("the job's config is ", request->config_json().size(),
                                  " bytes, more than the 8 MiB a job's config may hold"));
    }
    if (static_cast<size_t>(request->overrides_size()) > kMaxOverrides) return Invalid("more than 1000 overrides");
    std::vector<std::string> overrides;
    for (const std::string& o : request->overrides()) {
      if (o.size() > kMaxOverrideBytes) {
        // (Named by its key, escaped and cut: it said only "an override".)
        return Invalid(absl::StrCat("override '", EscapeControlChars(o.substr(0, std::min<size_t>(o.find('='), 64))),
                                    "=...' is ", o.size(), " bytes, longer than 4096"));
      }
      overrides.push_back(o);
    }
    absl::StatusOr<JobSpec> spec;
    {
      absl::MutexLock lock(&compiler_mu_);
      spec = compiler_->Resolve(request->config_json(), overrides);
    }
    if (!spec.ok()) return Invalid(std::string(spec.status().message()));
    if (spec->devices_needed < 1 || spec->devices_needed > kMaxDevicesPerJob) {
      return Invalid(absl::StrCat("the job needs ", spec->devices_needed, " devices (must be in [1, ",
                                  kMaxDevicesPerJob, "])"));
    }
    absl::MutexLock lock(&mu_);
    if (shutting_down_ || draining_) return {grpc::StatusCode::UNAVAILABLE, "master is shutting down"};
    // Two jobs writing one output_dir would interleave their metrics and
    // mix their checkpoints.
    if (!spec->output_dir.empty()) {
      const std::string dir = DirKey(spec->output_dir);
      // An ended job whose nodes are still stopping (`cancel --now`, a job
      // cancelled while it loaded) lets the directory go within about a
      // heartbeat: waited for, up to 10 s, so a resume right after the
      // cancel is not refused.
      const auto let_go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (shutting_down_) return true;
        for (const auto& [id, other] : jobs_) {
          if (IsFinal(other->state) && other->outputs_held && !other->spec.output_dir.empty() &&
              DirKey(other->spec.output_dir) == dir) {
            return false;
          }
        }
        return true;
      };
      mu_.AwaitWithTimeout(absl::Condition(&let_go), absl::Seconds(10));
      if (shutting_down_ || draining_) return {grpc::StatusCode::UNAVAILABLE, "master is shutting down"};
      for (const auto& [id, other] : jobs_) {
        if ((!IsFinal(other->state) || other->outputs_held) && !other->spec.output_dir.empty() &&
            DirKey(other->spec.output_dir) == dir) {
          return {grpc::StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("train.output_dir '", spec->output_dir, "' is written by job ", id, " (",
                               StateName(other->state), IsFinal(other->state) ? ", its nodes still stopping" : "",
                               "): one job at a time writes a directory")};
        }
      }
    }
    // Its config.json among the job records: each restart warned about it.
    if (!spec->output_dir.empty() && !options_.state_dir.empty()) {
      const std::string dir = DirKey(spec->output_dir), state = DirKey(options_.state_dir);
      if (dir == state || dir.starts_with(state + "/")) {
        return {grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("train.output_dir '", spec->output_dir, "' is in the master's --state-dir '",
                             options_.state_dir, "' (its job records): give the job a directory of its own")};
      }
    }
    DirectoryClaim claim;
    if (!spec->output_dir.empty()) {
      absl::StatusOr<DirectoryClaim> claimed = DirectoryClaim::Acquire(spec->output_dir);
      if (!claimed.ok()) {
        return {claimed.status().code() == absl::StatusCode::kFailedPrecondition ? grpc::StatusCode::FAILED_PRECONDITION
                                                                                 : grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("train.output_dir: ", claimed.status().message())};
      }
      claim = *std::move(claimed);
    }
    auto job = std::make_unique<Job>();
    job->output_claim = std::move(claim);
    job->session = ++next_session_;
    job->id = absl::StrFormat("job-%06d", job->session);
    job->spec = *std::move(spec);
    job->submit_ms = NowMs();
    Job& ref = *job;
    jobs_[job->id] = std::move(job);
    queue_.push_back(ref.id);
    AddStateEventLocked(ref);
    for (const std::string& warning : ref.spec.warnings) MasterLineLocked(ref, absl::StrCat("warning: ", warning));
    PersistLocked(ref);
    response->set_job_id(ref.id);
    TLOG_INFO("job {} submitted ({} devices)", ref.id, ref.spec.devices_needed);
    changed_.SignalAll();
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext* context, const control::GetJobRequest* request,
                      control::JobInfo* response) override {
    if (auto s = Enter(*context, "GetJob"); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) return NoSuchJob(request->job_id());
    FillInfoLocked(*it->second, *response);
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* context, const control::ListJobsRequest*,
                        control::ListJobsResponse* response) override {
    if (auto s = Enter(*context, "ListJobs"); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) FillInfoLocked(*job, *response->add_jobs());
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext* context, const control::CancelJobRequest* request,
                         control::JobInfo* response) override {
    if (auto s = Enter(*context, "CancelJob"); !s.ok()) return s;
    if (request->reason().size() > kMaxLogLineBytes) return Invalid("reason is longer than 64 KiB");
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request->job_id());
    if (it == jobs_.end()) return NoSuchJob(request->job_id());
    Job& job = *it->second;
    if (IsFinal(job.state)) return Precondition(absl::StrCat("job ", job.id, " already ended: ", StateName(job.state)));
    // (One line, as every reason: a client's newlines and terminal escapes
    // went into status, logs and the job's record as they came.)
    const std::string asked = OneLine(request->reason());
    const std::string reason = asked.empty()              ? std::string("cancelled by a client")
                               : asked.starts_with("by ") ? absl::StrCat("cancelled ", asked)
                                                          : absl::StrCat("cancelled: ", asked);
    if (request->checkpoint() && job.state == control::RUNNING) {
      if (!job.stopping) StartStoppingLocked(job, reason);
    } else if (job.state == control::RUNNING) {
      // (`tessera cancel --now`: said as the worker's own stop says it.)
      EndJobLocked(job, control::CANCELLED, absl::StrCat(reason, " (at once: no further checkpoint is written)"));
    } else {
      EndJobLocked(job, control::CANCELLED, reason);
    }
    FillInfoLocked(job, *response);
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* context, const control::WatchJobRequest* request,
                        grpc::ServerWriter<control::JobEvent>* writer) override {
    if (auto s = Enter(*context, "WatchJob"); !s.ok()) return s;
    // (One of the history only does not wait.)
    const bool waits = !request->history_only();
    if (waits) {
      if (auto s = EnterWait("WatchJob"); !s.ok()) return s;
    }
    const absl::Cleanup left = [this, waits] {
      if (waits) waiting_calls_.fetch_sub(1);
    };
    uint64_t cursor = 0;
    for (;;) {
      std::vector<control::JobEvent> batch;
      bool ended = false;
      {
        absl::MutexLock lock(&mu_);
        auto it = jobs_.find(request->job_id());
        if (it == jobs_.end()) return NoSuchJob(request->job_id());
        const Job* job = it->second.get();
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return shutting_down_ || IsFinal(job->state) || job->events_base + job->events.size() > cursor;
        };
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
        if (shutting_down_) return {grpc::StatusCode::UNAVAILABLE, "master is shutting down"};
        cursor = std::max(cursor, job->events_base);
        for (uint64_t i = cursor - job->events_base; i < job->events.size(); ++i) batch.push_back(job->events[i]);
        cursor += batch.size();
        ended = IsFinal(job->state);
      }
      for (const control::JobEvent& event : batch) {
        if (!writer->Write(event)) return {grpc::StatusCode::CANCELLED, "watcher went away"};
      }
      if (ended || request->history_only()) return grpc::Status::OK;
      if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "watcher went away"};
    }
  }

  grpc::Status ListWorkers(grpc::ServerContext* context, const control::ListWorkersRequest*,
                           control::ListWorkersResponse* response) override {
    if (auto s = Enter(*context, "ListWorkers"); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (const auto& [id, worker] : workers_) {
      control::WorkerInfo* info = response->add_workers();
      info->set_worker_id(id);
      info->set_epoch(worker->epoch);
      info->set_devices(worker->devices);
      info->set_address(worker->address);
      info->set_job_id(worker->job_id);
      info->set_last_heartbeat_ms_ago(absl::ToInt64Milliseconds(now - worker->last_heartbeat));
      info->set_draining(worker->draining);
    }
    return grpc::Status::OK;
  }

  grpc::Status KvPut(grpc::ServerContext* context, const control::KvPutRequest* request,
                     control::KvPutResponse*) override {
    if (auto s = Enter(*context, "KvPut"); !s.ok()) return s;
    if (auto s = CheckKey(request->key()); !s.ok()) return s;
    if (request->value().size() > kMaxKvValueBytes) return Invalid("kv values are at most 16 MiB");
    // Only a job's nodes write the KV, under JOB/SESSION/, and its keys go
    // as it ends: a key of no job would stay for good (keys of no job, put
    // until the KV was full, failed every job spanning workers after).
    {
      const std::vector<std::string> parts = absl::StrSplit(request->key(), absl::MaxSplits('/', 2));
      uint64_t session = 0;
      absl::MutexLock lock(&mu_);
      const auto job = parts.size() == 3 ? jobs_.find(parts[0]) : jobs_.end();
      if (job == jobs_.end() || !absl::SimpleAtoi(parts[1], &session) || session != job->second->session ||
          parts[2].empty()) {
        return Precondition(absl::StrCat("kv: key '", EscapeControlChars(request->key().substr(0, 128)),
                                         "' is not a job's (JOB/SESSION/NAME, of a job submitted and not ended)"));
      }
    }
    absl::MutexLock lock(&kv_mu_);
    // A key of a job that ended (its nodes, stopping, still writing) would
    // stay for good: the job's keys were dropped as it ended.
    if (const std::string job = request->key().substr(0, request->key().find('/')); kv_ended_jobs_.contains(job)) {
      return Precondition(absl::StrCat("kv: job ", job, " already ended"));
    }
    const auto held = kv_.find(request->key());
    const size_t replaced = held == kv_.end() ? 0 : held->first.size() + held->second.size();
    const size_t bytes = request->key().size() + request->value().size();
    if (kv_bytes_ - replaced + bytes > options_.max_kv_bytes) {
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              absl::StrCat("the master's kv holds at most ", options_.max_kv_bytes, " bytes of keys and values (",
                           kv_bytes_, " now)")};
    }
    kv_bytes_ = kv_bytes_ - replaced + bytes;
    kv_[request->key()] = request->value();
    return grpc::Status::OK;
  }

  grpc::Status KvGet(grpc::ServerContext* context, const control::KvGetRequest* request,
                     control::KvGetResponse* response) override {
    if (auto s = Enter(*context, "KvGet"); !s.ok()) return s;
    if (auto s = CheckKey(request->key()); !s.ok()) return s;
    absl::MutexLock lock(&kv_mu_);
    auto it = kv_.find(request->key());
    if (it == kv_.end()) return NotFound(absl::StrCat("kv: no key '", request->key(), "'"));
    response->set_value(it->second);
    return grpc::Status::OK;
  }

  grpc::Status KvWait(grpc::ServerContext* context, const control::KvWaitRequest* request,
                      control::KvWaitResponse* response) override {
    if (auto s = Enter(*context, "KvWait"); !s.ok()) return s;
    if (auto s = EnterWait("KvWait"); !s.ok()) return s;
    const absl::Cleanup left = [this] { waiting_calls_.fetch_sub(1); };
    if (request->keys_size() == 0 || static_cast<size_t>(request->keys_size()) > kMaxKvKeysPerWait) {
      return Invalid("kv wait takes 1 to 4096 keys");
    }
    for (const std::string& key : request->keys()) {
      if (auto s = CheckKey(key); !s.ok()) return s;
    }
    if (request->timeout_ms() < 0) return Invalid("kv wait: timeout_ms must be >= 0");
    const absl::Duration timeout = std::min(absl::Milliseconds(request->timeout_ms()), options_.max_kv_wait);
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&kv_mu_);
    auto all_set = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kv_mu_) {
      for (const std::string& key : request->keys()) {
        if (!kv_.contains(key)) return false;
      }
      return true;
    };
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kv_mu_) { return kv_shutting_down_ || all_set(); };
    // Poll in slices so a watcher that hangs up or a shutdown ends the wait.
    while (!done() && absl::Now() < deadline && !context->IsCancelled()) {
      kv_mu_.AwaitWithDeadline(absl::Condition(&done), std::min(deadline, absl::Now() + absl::Milliseconds(200)));
    }
    if (kv_shutting_down_) return {grpc::StatusCode::UNAVAILABLE, "master is shutting down"};
    if (!all_set()) {
      // (The message goes back in gRPC's metadata, 8 KiB at most: ten keys
      // of 1 KiB quoted in full made the client read "metadata size
      // exceeds limit" instead. At most 4 keys, each cut to 256 bytes.)
      std::vector<std::string> missing;
      int64_t unset = 0;
      for (const std::string& key : request->keys()) {
        if (kv_.contains(key)) continue;
        if (++unset <= 4) {
          missing.push_back(OneLine(key.size() > 256 ? absl::StrCat(key.substr(0, 256), "...") : key));
        }
      }
      if (unset > 4) missing.push_back(absl::StrCat("and ", unset - 4, " more"));
      return {grpc::StatusCode::DEADLINE_EXCEEDED,
              absl::StrCat("kv: waited ", absl::FormatDuration(timeout), " for ", absl::StrJoin(missing, ", "),
                           " (never set)")};
    }
    for (const std::string& key : request->keys()) response->add_values(kv_.at(key));
    return grpc::Status::OK;
  }

 private:
  static bool IsActive(const Job& job) { return job.state == control::COMPILING || job.state == control::RUNNING; }

  grpc::Status Enter(const grpc::ServerContext& context, const char* method) {
    {
      absl::MutexLock lock(&mu_);
      ++rpc_counts_[method];
    }
    return CheckToken(context, options_.security.token);
  }

  // Takes one of the places of calls that wait (KvWait, WatchJob); the
  // caller gives it back as it returns.
  grpc::Status EnterWait(const char* method) {
    const int held = waiting_calls_.fetch_add(1);
    if (held < options_.max_waiting_calls) return grpc::Status::OK;
    waiting_calls_.fetch_sub(1);
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat(method, ": the master holds at most ", options_.max_waiting_calls,
                         " waiting calls (KvWait, WatchJob) at once; try again")};
  }

  static grpc::Status CheckKey(const std::string& key) {
    if (key.empty() || key.size() > kMaxKvKeyBytes) return Invalid("kv keys are 1 to 1024 bytes");
    return grpc::Status::OK;
  }

  WorkerRecord* FindWorkerLocked(const std::string& id, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = workers_.find(id);
    if (it == workers_.end() || it->second->epoch != epoch) return nullptr;
    return it->second.get();
  }

  void FillInfoLocked(const Job& job, control::JobInfo& info) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    info.set_job_id(job.id);
    info.set_state(job.state);
    info.set_reason(job.reason);
    info.set_devices_needed(job.spec.devices_needed);
    info.set_iterations(job.spec.iterations);
    info.set_iteration(job.iteration);
    for (const WorkerSlot& slot : job.slots) {
      control::WorkerSlot* out = info.add_slots();
      out->set_worker_id(slot.worker_id);
      out->set_node(slot.node);
      out->set_num_devices(slot.num_devices);
      out->set_data_address(slot.data_address);
    }
    info.set_submit_time_ms(job.submit_ms);
    info.set_end_time_ms(job.end_ms);
    for (const auto& [name, value] : job.last_metrics) (*info.mutable_last_metrics())[name] = value;
    info.set_output_dir(job.spec.output_dir);
  }

  void AddEventLocked(Job& job, control::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job.events_bytes += event.ByteSizeLong();
    job.events.push_back(std::move(event));
    TrimEventsLocked(job, std::max<size_t>(options_.max_events_per_job, 1));
  }

  // Drops a job's oldest events past `max_events` or past its bytes: a
  // running job's kMaxEventBytesPerJob (lines of up to 64 KiB each held
  // gigabytes), an ended one's kEndedJobEventBytes (every ended job kept
  // its whole history for the master's life; its metrics.jsonl and log.txt
  // hold it all).
  static void TrimEventsLocked(Job& job, size_t max_events) {
    const size_t max_bytes = IsFinal(job.state) ? kEndedJobEventBytes : kMaxEventBytesPerJob;
    while (job.events.size() > 1 && (job.events.size() > max_events || job.events_bytes > max_bytes)) {
      job.events_bytes -= job.events.front().ByteSizeLong();
      job.events.pop_front();
      ++job.events_base;
    }
  }

  void AddStateEventLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    control::JobEvent event;
    FillInfoLocked(job, *event.mutable_state());
    AddEventLocked(job, std::move(event));
  }

  // Moves `job` to `state` (not final) and records it.
  void SetStateLocked(Job& job, JobState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job.state = state;
    AddStateEventLocked(job);
    PersistLocked(job);
    changed_.SignalAll();
  }

  // A graceful cancel: every node of the running job is asked to stop at an
  // iteration boundary they agree on (PlanRunner::RequestStop); their
  // reports end the job (Report), or the grace period does (MonitorLoop).
  void StartStoppingLocked(Job& job, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job.stopping = true;
    job.stop_reason = reason;
    job.stop_deadline = absl::Now() + options_.stop_grace;
    job.reason = absl::StrCat("stopping at an iteration boundary (", reason, ")");
    for (const WorkerSlot& slot : job.slots) {
      auto it = workers_.find(slot.worker_id);
      if (it == workers_.end() || it->second->job_id != job.id) continue;
      pending_stops_.push_back({it->second->stub, job.id, reason, /*graceful=*/true, job.launch});
    }
    MasterLineLocked(job, job.reason);
    TLOG_INFO("job {}: {}", job.id, job.reason);
    changed_.SignalAll();
  }

  // A worker shutting down: no job is placed on it any more, and the job it
  // holds stops as a graceful cancel would (at an iteration boundary its
  // nodes agree on, with a checkpoint there; ending CANCELLED, so
  // `--resume` continues it), or, not started yet, goes back to the head of
  // the queue.
  void DrainWorkerLocked(WorkerRecord& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    worker.draining = true;
    TLOG_INFO("worker {} is shutting down: it takes no new job", worker.id);
    changed_.SignalAll();
    auto it = worker.job_id.empty() ? jobs_.end() : jobs_.find(worker.job_id);
    if (it == jobs_.end() || IsFinal(it->second->state)) return;
    Job& job = *it->second;
    const std::string reason = absl::StrCat("worker ", worker.id, " is shutting down");
    if (job.state == control::RUNNING) {
      if (!job.stopping) StartStoppingLocked(job, reason);
    } else if (job.state == control::COMPILING) {
      // Nothing ran yet: it waits for other workers, first in the queue.
      MasterLineLocked(job, absl::StrCat(reason, " before the job started: queued again"));
      RequeueLocked(job, "");
    }
  }

  // A node killed before its first checkpoint leaves the job an empty
  // checkpoints/ (its claim, which removes the directory it made, never
  // ended): it goes with the job, unless a node of it still holds it.
  static void RemoveEmptyCheckpointsDir(const Job& job) {
    if (job.spec.output_dir.empty()) return;
    const fs::path dir = fs::path(job.spec.output_dir) / "checkpoints";
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(dir, ec)) || !fs::is_empty(dir, ec) || ec) return;
    if (!DirectoryClaim::CheckUnclaimed(dir).ok()) return;
    (void)::rmdir(dir.c_str());  // (fails, harmlessly, once something is in it)
  }

  // Lets an ended job's output directory go once no worker holds the job:
  // its empty checkpoints/ and the directory its submission made, if left
  // empty, are removed.
  void ReleaseOutputsLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!job.outputs_held || job.outputs_opening) return;
    for (const WorkerSlot& slot : job.slots) {
      auto it = workers_.find(slot.worker_id);
      if (it != workers_.end() && it->second->job_id == job.id) return;
    }
    job.outputs_held = false;
    RemoveEmptyCheckpointsDir(job);
    job.output_claim.Release();
  }

  // A worker let `job_id` go (it finished, dropped or lost it).
  void WorkerLetGoLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(job_id);
    if (it != jobs_.end() && IsFinal(it->second->state)) ReleaseOutputsLocked(*it->second);
  }

  // Ends `job` (final `state`, `reason`); stops it on every worker that
  // holds it and drops its KV keys.
  void EndJobLocked(Job& job, JobState state, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (IsFinal(job.state)) return;
    const bool was_placed = IsActive(job);
    job.state = state;
    job.reason = reason;
    job.end_ms = NowMs();
    queue_.erase(std::remove(queue_.begin(), queue_.end(), job.id), queue_.end());
    if (was_placed && state != control::SUCCEEDED) {
      for (const WorkerSlot& slot : job.slots) {
        auto it = workers_.find(slot.worker_id);
        if (it == workers_.end() || it->second->job_id != job.id) continue;
        pending_stops_.push_back({it->second->stub, job.id, reason, /*graceful=*/false, job.launch});
      }
    }
    if (!reason.empty()) LogLocked(job, absl::StrCat("[master] ", StateName(state), ": ", reason));
    if (job.metrics_file) WriteLossPlotLocked(job);
    job.metrics_file.reset();
    job.log_file.reset();
    if (!job.outputs_opening) job.early_log.clear();  // (else written once they opened)
    job.tensorboard.reset();
    job.outputs_held = true;
    ReleaseOutputsLocked(job);
    AddStateEventLocked(job);
    PersistLocked(job);
    {
      absl::MutexLock kv_lock(&kv_mu_);
      const std::string prefix = job.id + "/";
      kv_ended_jobs_.insert(job.id);
      for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.starts_with(prefix);) {
        kv_bytes_ -= it->first.size() + it->second.size();
        it = kv_.erase(it);
      }
    }
    if (state == control::SUCCEEDED) {
      TLOG_INFO("job {} SUCCEEDED", job.id);
    } else if (!options_.warn_on_job_failure) {
      TLOG_INFO("job {} {}: {}", job.id, StateName(state), reason);
    } else {
      TLOG_WARN("job {} {}: {}", job.id, StateName(state), reason);
    }
    changed_.SignalAll();
  }

  void LoseWorkerLocked(const std::string& id, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = workers_.find(id);
    if (it == workers_.end()) return;
    std::unique_ptr<WorkerRecord> worker = std::move(it->second);
    workers_.erase(it);
    // Its channel is released on the monitor thread, never inside a gRPC
    // callback (where this may run) — gRPC does not take that well.
    retired_stubs_.push_back(worker->stub);
    if (worker->draining) {
      TLOG_INFO("worker {} gone (it was shutting down): {}", id, why);
    } else {
      TLOG_WARN("worker {} lost: {}", id, why);
    }
    if (worker->job_id.empty()) return;
    auto job = jobs_.find(worker->job_id);
    if (job == jobs_.end()) return;
    if (IsFinal(job->second->state)) {
      ReleaseOutputsLocked(*job->second);  // (it holds the job no longer)
      return;
    }
    uint32_t node = 0;
    for (const WorkerSlot& slot : job->second->slots) {
      if (slot.worker_id == id) node = slot.node;
    }
    std::string reason = absl::StrCat("worker ", id, " (node ", node, ") lost: ", why);
    if (job->second->state == control::COMPILING) {
      // Nothing ran yet (a LoadPlan it never answered): the job waits for
      // other workers, first in the queue, as where the worker was
      // unreachable at LoadPlan (it was FAILED).
      MasterLineLocked(*job->second, absl::StrCat(reason, " before the job started: queued again"));
      RequeueLocked(*job->second, id);
      return;
    }
    // A job that had trained its last iteration and committed its final
    // checkpoint (no evaluation left) has nothing left to run: its end
    // report went with the worker (one shut down while the master hung),
    // and it was FAILED as if cut short. A restarted master says the
    // same of it.
    Job& lost = *job->second;
    // (Whatever progress the master heard: it may have hung meanwhile.)
    if (lost.state == control::RUNNING && lost.spec.iterations > 0 && !lost.spec.output_dir.empty()) {
      const absl::StatusOr<std::optional<JobCompiler::CheckpointMark>> mark = compiler_->LatestCheckpoint(lost.spec);
      if (mark.ok() && mark->has_value() && (*mark)->iteration >= lost.spec.iterations &&
          !(*mark)->evaluation_pending) {
        MasterLineLocked(lost, absl::StrCat(reason, " after the job's end: its checkpoint of the last iteration, ",
                                            (*mark)->iteration, ", is complete"));
        EndJobLocked(lost, control::SUCCEEDED, "");
        return;
      }
    }
    if (!lost.link_lost_report.empty()) absl::StrAppend(&reason, "; before that ", lost.link_lost_report);
    EndJobLocked(lost, control::FAILED, reason);
  }

  // `job` holds a lost-link report from `reporter`: probes every other
  // worker still running it at once (one failed probe loses the worker: its
  // peer has seen the link go already) and ends the job with the report at
  // the deadline if all of them answer. False: no peer to probe.
  bool SuspectPeersLocked(Job& job, const std::string& reporter, const std::string& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t before = urgent_probes_.size();
    for (const WorkerSlot& slot : job.slots) {
      auto it = workers_.find(slot.worker_id);
      if (slot.worker_id == reporter || it == workers_.end() || it->second->job_id != job.id) continue;
      urgent_probes_.push_back({slot.worker_id, it->second->stub, job.id});
    }
    if (urgent_probes_.size() == before) return false;
    job.link_lost_report = report;
    job.link_lost_deadline = absl::Now() + options_.probe_timeout + options_.heartbeat_interval;
    suspect_jobs_.insert(job.id);
    MasterLineLocked(job, absl::StrCat(report, " (probing its peers)"));
    changed_.SignalAll();
    return true;
  }

  // A queued job's reason for waiting, told to its followers when it changes.
  void SetWaitingReasonLocked(Job& job, std::string reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job.reason == reason) return;
    job.reason = std::move(reason);
    // (Not persisted: a restart replaces a queued job's reason anyway, and
    // each advance of the queue rewrote and synced every queued record,
    // under the lock heartbeats wait for.)
    // Followers (submit --follow, logs -f) see why it waits, not only PENDING.
    control::JobEvent event;
    event.set_log_line(absl::StrCat("[master] ", job.reason));
    AddEventLocked(job, std::move(event));
  }

  // The next job that can start now, with its slots; nullptr if none.
  Job* PlaceNextLocked(std::vector<WorkerSlot>& slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (draining_) return nullptr;  // the queue waits for the next master
    // Per device type: the live workers' devices and the free ones.
    std::map<std::string, int64_t> total_of, free_of;
    std::vector<WorkerRecord*> free_workers;
    for (auto& [id, worker] : workers_) {
      if (worker->draining) continue;  // leaving: neither counted nor placed on
      total_of[worker->device_type] += worker->num_devices;
      if (worker->job_id.empty()) free_workers.push_back(worker.get());
    }
    std::sort(free_workers.begin(), free_workers.end(),
              [](const WorkerRecord* a, const WorkerRecord* b) { return a->epoch < b->epoch; });
    for (const WorkerRecord* worker : free_workers) free_of[worker->device_type] += worker->num_devices;
    for (const std::string& id : queue_) {
      Job& job = *jobs_.at(id);
      // Queued again while its last launch still ends (its LoadPlans
      // returning, its loads stopped): placed once it has, so the two never
      // load on one worker at once (the new one was refused: "already
      // loaded"); the jobs behind it go meanwhile.
      if (job.launching) continue;
      const std::string& type = job.spec.device_type;
      const int64_t total = total_of[type], free = free_of[type];
      // A job the cluster as it is cannot hold waits without blocking the queue.
      const auto too_big = [this, &total_of](Job& waiting) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const int64_t have = total_of[waiting.spec.device_type];
        if (waiting.spec.devices_needed <= have) return false;
        SetWaitingReasonLocked(
            waiting, absl::StrCat("waiting: needs ", waiting.spec.devices_needed, " ", waiting.spec.device_type,
                                  " devices, the live workers have ", have));
        return true;
      };
      if (too_big(job)) continue;
      if (job.spec.devices_needed > free) {
        // FIFO: the head waits for busy devices, and the jobs behind it that
        // could run on the cluster wait for the head.
        SetWaitingReasonLocked(job, absl::StrCat("waiting: needs ", job.spec.devices_needed, " ", type, " devices, ",
                                                 free, " of the live workers' ", total, " are free"));
        bool behind = false;
        for (const std::string& other : queue_) {
          if (other == id) {
            behind = true;
            continue;
          }
          Job& next = *jobs_.at(other);
          if (behind && !too_big(next)) SetWaitingReasonLocked(next, absl::StrCat("waiting: queued behind ", id));
        }
        return nullptr;
      }
      int64_t needed = job.spec.devices_needed;
      slots.clear();
      for (WorkerRecord* worker : free_workers) {
        if (needed <= 0) break;
        if (worker->device_type != type) continue;
        WorkerSlot slot;
        slot.worker_id = worker->id;
        slot.node = static_cast<uint32_t>(slots.size());
        slot.num_devices = static_cast<int>(std::min<int64_t>(worker->num_devices, needed));
        slot.data_address = worker->data_address;
        needed -= slot.num_devices;
        worker->job_id = job.id;
        slots.push_back(slot);
      }
      job.reason.clear();
      return &job;
    }
    return nullptr;
  }

  void SchedulerLoop() {
    for (;;) {
      std::string job_id;
      JobSpec spec;
      std::vector<WorkerSlot> slots;
      uint64_t launch = 0;
      {
        absl::MutexLock lock(&mu_);
        Job* job = nullptr;
        while (!shutting_down_ && (job = PlaceNextLocked(slots)) == nullptr) {
          changed_.WaitWithTimeout(&mu_, absl::Milliseconds(500));
        }
        if (shutting_down_) return;
        queue_.erase(std::remove(queue_.begin(), queue_.end(), job->id), queue_.end());
        job->slots = slots;
        ++job->launch;
        job->reports_taken.clear();
        job->launching = true;
        SetStateLocked(*job, control::COMPILING);
        job_id = job->id;
        spec = job->spec;
        launch = job->launch;
        // Each launch on a thread of its own: one waiting on a hung worker
        // (a LoadPlan's 10 s) held every other job's placement (free
        // workers sat idle meanwhile).
        std::erase_if(launches_, [](const std::unique_ptr<LaunchThread>& t) {
          if (!t->done.load()) return false;
          t->thread.join();
          return true;
        });
        auto thread = std::make_unique<LaunchThread>();
        LaunchThread* raw = thread.get();
        try {
          raw->thread = std::thread([this, raw, job_id, spec, slots, launch] {
            Launch(job_id, spec, slots, launch);
            {
              absl::MutexLock lock(&mu_);
              jobs_.at(job_id)->launching = false;
              changed_.SignalAll();
            }
            raw->done.store(true);
          });
        } catch (const std::system_error& e) {  // no thread (EAGAIN): the job fails, the master goes on
          job->launching = false;
          EndJobLocked(*job, control::FAILED, absl::StrCat("cannot start its launch thread: ", e.what()));
          continue;
        }
        launches_.push_back(std::move(thread));
      }
    }
  }

  struct LaunchThread {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  // COMPILING -> RUNNING: compiles, loads every node's plan, starts them.
  // `launch`: the job's placement this is (a job queued again meanwhile and
  // placed anew has another: this one then stops).
  void Launch(const std::string& job_id, const JobSpec& spec, const std::vector<WorkerSlot>& slots, uint64_t launch) {
    absl::StatusOr<std::vector<std::string>> plans;
    {
      absl::MutexLock lock(&compiler_mu_);
      plans = compiler_->Compile(spec, slots);
    }
    if (plans.ok() && plans->size() != slots.size()) {
      plans = absl::InternalError(absl::StrCat("the compiler made ", plans->size(), " node plans for ", slots.size(),
                                               " workers"));
    }
    uint64_t session = 0;
    std::vector<std::shared_ptr<control::Worker::Stub>> stubs;
    {
      absl::MutexLock lock(&mu_);
      Job& job = *jobs_.at(job_id);
      // (Cancelled, or a worker was lost, meanwhile.)
      if (job.state != control::COMPILING || job.launch != launch) return;
      if (!plans.ok()) {
        EndJobLocked(job, control::FAILED, absl::StrCat("compile: ", plans.status().message()));
        return;
      }
      session = job.session;
      for (const WorkerSlot& slot : slots) {
        auto it = workers_.find(slot.worker_id);
        if (it == workers_.end()) return;  // lost: the job has failed already
        stubs.push_back(it->second->stub);
      }
    }
    // Queued again (a worker of it shutting down) while it loads: the
    // workers that loaded it drop it now, before the scheduler places it
    // anew (a stray loaded plan would refuse the next one).
    const auto still_launching = [&](size_t loaded) {
      {
        absl::MutexLock lock(&mu_);
        const Job& job = *jobs_.at(job_id);
        if (job.state == control::COMPILING && job.launch == launch) return true;
      }
      for (size_t k = 0; k < loaded; ++k) {
        control::StopRequest request;
        request.set_job_id(job_id);
        request.set_reason("queued again");
        request.set_launch(launch);
        control::StopResponse response;
        grpc::ClientContext context;
        PrepareContext(context, options_.security, options_.rpc_timeout);
        const CancelableCall cancelable(this, &context);
        (void)stubs[k]->Stop(&context, request, &response);
      }
      return false;
    };
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!still_launching(i)) return;
      control::LoadPlanRequest request;
      request.set_job_id(job_id);
      request.set_session(session);
      request.set_launch(launch);
      request.set_node(slots[i].node);
      for (const WorkerSlot& slot : slots) {
        control::WorkerSlot* out = request.add_slots();
        out->set_worker_id(slot.worker_id);
        out->set_node(slot.node);
        out->set_num_devices(slot.num_devices);
        out->set_data_address(slot.data_address);
      }
      request.set_plan(std::move((*plans)[i]));
      control::LoadPlanResponse response;
      grpc::ClientContext context;
      PrepareContext(context, options_.security, options_.rpc_timeout);
      const CancelableCall cancelable(this, &context);
      const absl::Status status = ToAbsl(stubs[i]->LoadPlan(&context, request, &response));
      // A failure of a launch queued again meanwhile is that launch's end.
      if (!status.ok() && !still_launching(i)) return;
      if (absl::IsUnavailable(status)) {
        // The worker went away before the master noticed: not the job's
        // fault. Lose the worker, queue the job again.
        Requeue(job_id, launch, slots[i].worker_id, absl::StrCat("LoadPlan: ", status.message()));
        return;
      }
      if (!status.ok()) {
        FailLaunch(
            job_id, launch,
            absl::StrCat("worker ", slots[i].worker_id, " (node ", slots[i].node, "): LoadPlan: ", status.ToString()));
        return;
      }
    }
    if (!still_launching(slots.size())) return;
    {
      absl::MutexLock lock(&mu_);
      Job& job = *jobs_.at(job_id);
      if (job.state != control::COMPILING || job.launch != launch) return;
      SetStateLocked(job, control::RUNNING);
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      control::StartRequest request;
      request.set_job_id(job_id);
      control::StartResponse response;
      grpc::ClientContext context;
      PrepareContext(context, options_.security, options_.rpc_timeout);
      const CancelableCall cancelable(this, &context);
      const absl::Status status = ToAbsl(stubs[i]->Start(&context, request, &response));
      if (absl::IsUnavailable(status)) {
        // It went away between LoadPlan and Start: the job fails as with
        // any worker lost while it runs.
        absl::MutexLock lock(&mu_);
        LoseWorkerLocked(slots[i].worker_id, absl::StrCat("Start: ", status.message()));
        return;
      }
      if (!status.ok()) {
        FailLaunch(
            job_id, launch,
            absl::StrCat("worker ", slots[i].worker_id, " (node ", slots[i].node, "): Start: ", status.ToString()));
        return;
      }
    }
  }

  // COMPILING -> PENDING (at the head of the queue): frees the job's
  // workers, stops it where it was loaded already, loses `lost_worker`.
  void Requeue(const std::string& job_id, uint64_t launch, const std::string& lost_worker, const std::string& why) {
    absl::MutexLock lock(&mu_);
    Job& job = *jobs_.at(job_id);
    if (job.state != control::COMPILING || job.launch != launch) return;
    RequeueLocked(job, lost_worker);
    LoseWorkerLocked(lost_worker, why);
  }

  // COMPILING -> PENDING (at the head of the queue): frees the job's
  // workers and stops it where it was loaded already (but on
  // `lost_worker`, if any).
  void RequeueLocked(Job& job, const std::string& lost_worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const WorkerSlot& slot : job.slots) {
      auto it = workers_.find(slot.worker_id);
      if (it == workers_.end() || it->second->job_id != job.id) continue;
      it->second->job_id.clear();
      if (slot.worker_id != lost_worker) {
        pending_stops_.push_back({it->second->stub, job.id, "requeued", /*graceful=*/false, job.launch});
      }
    }
    job.slots.clear();
    queue_.insert(queue_.begin(), job.id);
    SetStateLocked(job, control::PENDING);
  }

  void FailLaunch(const std::string& job_id, uint64_t launch, const std::string& reason) {
    absl::MutexLock lock(&mu_);
    Job& job = *jobs_.at(job_id);
    // Cancelled, or queued again (a worker shutting down), meanwhile: the
    // failure is of the launch that was stopped (placed anew since: of
    // another launch). (Shutting down: the call was cancelled; the record
    // stays for the next master.)
    if (shutting_down_ || (job.state != control::COMPILING && job.state != control::RUNNING) || job.launch != launch) {
      return;
    }
    // Asked to stop (a cancel, a daemon shutting down) before every node
    // started: it ends as that stop says, before its first iteration.
    if (job.stopping) {
      EndJobLocked(job, StoppedStateOf(job), absl::StrCat(job.stop_reason, "; stopped before it started"));
      return;
    }
    EndJobLocked(job, control::FAILED, reason);
  }

  // A directory's path as one string however it is spelled (relative to
  // the master's working directory, trailing '/', '..').
  static std::string DirKey(const std::string& dir) {
    std::error_code error;
    fs::path path = fs::weakly_canonical(fs::absolute(dir, error), error);
    if (error) return fs::path(dir).lexically_normal().string();
    path = path.lexically_normal();
    if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();
    return path.string();
  }

  // A line for the job's log.txt: written when the outputs are open, kept
  // until they open before that (the first lines of a job the master
  // stops), dropped when the job ends first.
  void LogLocked(Job& job, std::string line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job.log_file) {
      errno = 0;
      WriteLogLineLocked(job, line);
      job.log_file->flush();
      if (!*job.log_file) OutputFailedLocked(job, "log.txt", errno);
    } else if (!job.spec.output_dir.empty() && !job.outputs_failed && (!IsFinal(job.state) || job.outputs_opening) &&
               job.early_log.size() < 1000) {
      job.early_log.push_back(std::move(line));
    }
  }

  // One line into the open log.txt, its end and last line noted.
  static void WriteLogLineLocked(Job& job, const std::string& line) {
    *job.log_file << line << "\n";
    if (job.log_end >= 0) {
      job.log_end += static_cast<int64_t>(line.size()) + 1;
      job.log_last_line = line.substr(0, kLogCheckBytes);
    }
  }

  // How a graceful stop ends: CANCELLED, or FAILED when the job's outputs
  // could not be written.
  static JobState StoppedStateOf(const Job& job) { return job.outputs_failed ? control::FAILED : control::CANCELLED; }

  // A write to the job's metrics.jsonl or log.txt failed (`error`: its
  // errno): asked-for outputs are never dropped silently (the job trained
  // on with them cut short, and succeeded). It stops at an iteration
  // boundary as a graceful cancel would, with a checkpoint where one can
  // still be written, and ends FAILED naming the file.
  void OutputFailedLocked(Job& job, const std::string& file, int error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // (The other file goes on: log.txt tells how the job ended.)
    (file == "log.txt" ? job.log_file : job.metrics_file).reset();
    if (job.outputs_failed || IsFinal(job.state)) return;
    job.outputs_failed = true;
    const std::string reason =
        absl::StrCat("cannot write ", (fs::path(job.spec.output_dir) / file).string(),
                     error != 0 ? absl::StrCat(": ", std::strerror(error)) : std::string(": the write failed"));
    TLOG_INFO("job {}: {}", job.id, reason);
    if (job.state == control::RUNNING && !job.stopping) {
      StartStoppingLocked(job, reason);
    } else if (job.stopping) {
      job.stop_reason = absl::StrCat(reason, "; ", job.stop_reason);
    } else {
      EndJobLocked(job, control::FAILED, reason);
    }
  }

  // A node's "interrupted at iteration N[; ...]": the job's progress is N
  // (its last logged iteration may be earlier).
  static void NoteInterruptedIteration(Job& job, const std::string& text) {
    constexpr std::string_view kPrefix = "interrupted at iteration ";
    std::string_view message = text;
    if (!message.starts_with(kPrefix)) return;
    message.remove_prefix(kPrefix.size());
    int64_t iteration = 0;
    if (absl::SimpleAtoi(std::string(message.substr(0, message.find_first_of("; "))), &iteration) &&
        iteration > job.iteration && iteration <= job.spec.iterations) {
      job.iteration = iteration;
    }
  }

  // A line of the master's own about the job: in log.txt and among the
  // job's events (`tessera logs`). (Its end is in its final state event.)
  void MasterLineLocked(Job& job, const std::string& text) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string line = absl::StrCat("[master] ", text);
    LogLocked(job, line);
    control::JobEvent event;
    event.set_log_line(line);
    AddEventLocked(job, std::move(event));
  }

  // A job's outputs, opened by OpenOutputs and not yet the job's.
  struct OpenedOutputs {
    std::unique_ptr<std::ofstream> metrics_file;
    int64_t metrics_bytes = -1;
    std::unique_ptr<std::ofstream> log_file;
    int64_t log_offset = -1;
    uint64_t log_inode = 0;
    std::unique_ptr<EventFileWriter> tensorboard;
    std::vector<LossPoint> train_losses, eval_losses;  // an earlier run's, resumed
  };

  // Creates train.output_dir with config.json (`config_text`),
  // metrics.jsonl and log.txt; an error (the job fails) when it cannot:
  // asked-for outputs are never dropped silently. A run from scratch whose
  // outputs cannot all be opened (a full disk) leaves none of them behind
  // (a config.json and empty logs of a run that never started). Called
  // without the master's lock (the job's outputs_opening keeps its other
  // reports out): the directory is the job's own (its claim).
  static absl::StatusOr<OpenedOutputs> OpenOutputs(const fs::path& dir, int64_t start_iteration,
                                                   const std::string& config_text) {
    bool wrote = false;  // (a refusal before any write removes nothing)
    OpenedOutputs outputs;
    const absl::Status opened = OpenOutputsOnce(dir, start_iteration, config_text, outputs, wrote);
    if (opened.ok()) return outputs;
    if (wrote && start_iteration == 0) {
      outputs = OpenedOutputs{};
      RemoveFreshOutputs(dir);
    }
    return opened;
  }

  // What a run from scratch wrote in `dir` before its outputs failed.
  static void RemoveFreshOutputs(const fs::path& dir) {
    std::error_code ignored;
    for (const char* name : {"config.json", "metrics.jsonl", "log.txt"}) {
      if (fs::is_regular_file(dir / name, ignored)) fs::remove(dir / name, ignored);
    }
    (void)KeepEventsUpTo(dir, -1);
  }

  static absl::Status OpenOutputsOnce(const fs::path& dir, int64_t start_iteration, const std::string& config_text,
                                      OpenedOutputs& outputs, bool& wrote) {
    std::error_code error;
    fs::create_directories(dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create train.output_dir '", dir.string(), "': ", error.message()));
    }
    // Each of the files is checked before the first is written: one that
    // cannot be (a directory in its place) left the others half made.
    // A FIFO or a socket in the place of one is refused too (opening it
    // waited for a reader forever). A device is written to (/dev/null),
    // and not read by a resume (/dev/zero's end never came).
    bool metrics_regular = true;
    for (const char* name : {"config.json", "metrics.jsonl", "log.txt"}) {
      const fs::file_status status = fs::status(dir / name, error);
      if (error && error != std::errc::no_such_file_or_directory) {
        return absl::InvalidArgumentError(absl::StrCat("cannot write ", (dir / name).string(), ": ", error.message()));
      }
      error.clear();
      if (fs::is_directory(status)) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot write ", (dir / name).string(), ": a directory is there"));
      }
      if (fs::is_fifo(status) || fs::is_socket(status)) {
        return absl::InvalidArgumentError(absl::StrCat("cannot write ", (dir / name).string(),
                                                       ": not a regular file (a ",
                                                       fs::is_fifo(status) ? "FIFO" : "socket", ")"));
      }
      if (std::string_view(name) == "metrics.jsonl")
        metrics_regular = !fs::exists(status) || fs::is_regular_file(status);
    }
    wrote = true;
    if (auto status = WriteFileDurably(dir / "config.json", config_text); !status.ok()) return status;
    std::ios::openmode mode = std::ios::trunc;
    if (start_iteration > 0) {
      // A resumed run continues the earlier one's outputs: the metrics up to
      // where it resumes (and their loss curves: its plot continues them),
      // then its own.
      if (metrics_regular) {
        if (auto kept =
                KeepMetricsUpTo(dir / "metrics.jsonl", start_iteration, outputs.train_losses, outputs.eval_losses);
            !kept.ok()) {
          return kept;
        }
      }
      // And its TensorBoard events (the iterations after it would be a dead
      // branch in the plots).
      if (auto kept = KeepEventsUpTo(dir, start_iteration); !kept.ok()) return kept;
      mode = std::ios::app;
    }
    // A run from scratch replaces an earlier run's curves (its
    // metrics.jsonl is truncated below; its event files go).
    if (start_iteration == 0) {
      if (auto removed = KeepEventsUpTo(dir, -1); !removed.ok()) return removed;
    }
    outputs.metrics_file = std::make_unique<std::ofstream>(dir / "metrics.jsonl", mode);
    outputs.log_file = std::make_unique<std::ofstream>(dir / "log.txt", mode);
    {
      std::error_code size_error;
      const std::uintmax_t size = fs::file_size(dir / "metrics.jsonl", size_error);
      outputs.metrics_bytes = metrics_regular && !size_error ? static_cast<int64_t>(size) : -1;
    }
    // (Where this job's lines begin: the end of the earlier run's, resumed.
    // A symbolic link or a device is not read back after a restart.)
    struct stat log_stat {};
    std::error_code link_error;
    const bool regular = !fs::is_symlink(fs::symlink_status(dir / "log.txt", link_error)) &&
                         ::stat((dir / "log.txt").c_str(), &log_stat) == 0 && S_ISREG(log_stat.st_mode);
    outputs.log_offset = regular ? static_cast<int64_t>(log_stat.st_size) : -1;
    outputs.log_inode = regular ? static_cast<uint64_t>(log_stat.st_ino) : 0;
    auto tensorboard = EventFileWriter::Create(dir);
    if (!tensorboard.ok()) return tensorboard.status();
    outputs.tensorboard = *std::move(tensorboard);
    if (!*outputs.metrics_file || !*outputs.log_file) {
      return absl::InternalError(absl::StrCat("cannot write metrics.jsonl and log.txt in '", dir.string(), "'"));
    }
    return absl::OkStatus();
  }

  // The opened outputs become the job's, with the lines logged before
  // they opened.
  absl::Status TakeOutputsLocked(Job& job, OpenedOutputs outputs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    job.metrics_file = std::move(outputs.metrics_file);
    job.metrics_bytes = outputs.metrics_bytes;
    job.log_file = std::move(outputs.log_file);
    job.log_offset = outputs.log_offset;
    job.log_end = job.log_offset;
    job.log_inode = outputs.log_inode;
    job.log_last_line.clear();
    job.tensorboard = std::move(outputs.tensorboard);
    job.train_losses.insert(job.train_losses.end(), outputs.train_losses.begin(), outputs.train_losses.end());
    job.eval_losses.insert(job.eval_losses.end(), outputs.eval_losses.begin(), outputs.eval_losses.end());
    errno = 0;
    for (const std::string& line : job.early_log) WriteLogLineLocked(job, line);
    job.log_file->flush();
    job.early_log.clear();
    if (!*job.log_file) {
      const int error = errno;
      job.metrics_file.reset();
      job.log_file.reset();
      job.tensorboard.reset();
      if (job.spec.start_iteration == 0) RemoveFreshOutputs(job.spec.output_dir);
      return absl::InternalError(absl::StrCat("cannot write ", (fs::path(job.spec.output_dir) / "log.txt").string(),
                                              ": ", error != 0 ? std::strerror(error) : "the write failed"));
    }
    return absl::OkStatus();
  }

  // One metrics report into the TensorBoard file (every value a scalar
  // under its name: loss, lr, grad_norm, tokens_per_s, eval_loss, ...) and
  // the loss curve; an evaluation redraws loss.svg. Failures are logged, not
  // fatal: metrics.jsonl stays the record.
  void RecordCurvesLocked(Job& job, const control::Metrics& metrics) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job.tensorboard) {
      std::vector<std::pair<std::string, float>> scalars;
      for (const auto& [name, value] : metrics.values()) scalars.emplace_back(name, static_cast<float>(value));
      if (auto status = job.tensorboard->AddScalars(metrics.iteration(), scalars); !status.ok()) {
        TLOG_WARN("job {}: TensorBoard events not written: {}", job.id, std::string(status.message()));
        job.tensorboard.reset();
      }
    }
    if (auto loss = metrics.values().find("loss"); loss != metrics.values().end()) {
      job.train_losses.push_back({metrics.iteration(), loss->second});
    }
    if (auto loss = metrics.values().find("eval_loss"); loss != metrics.values().end()) {
      job.eval_losses.push_back({metrics.iteration(), loss->second});
      // (Redrawn from every point so far: a report of many evaluations
      // drew it for each, held the master seconds and lost its workers.)
      if (const int64_t now = NowMs(); now - job.loss_plot_ms >= kLossPlotPeriodMs) {
        job.loss_plot_ms = now;
        WriteLossPlotLocked(job);
      }
    }
  }

  void WriteLossPlotLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (job.train_losses.empty() && job.eval_losses.empty()) return;
    const auto status = WriteLossPlot(fs::path(job.spec.output_dir) / "loss.svg", job.train_losses, job.eval_losses);
    if (!status.ok()) TLOG_WARN("job {}: loss.svg not written: {}", job.id, std::string(status.message()));
  }

  // How a job that was running when the master stopped ends: SUCCEEDED
  // where its checkpoint of the last iteration is complete (it finished
  // while the master was down), else FAILED with how far it got (the
  // record may lag its metrics.jsonl by the persist period) and where
  // `--resume` continues (the compiler reads the checkpoints). Sets
  // job.reason.
  JobState EndRestartedJobLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Still being placed: it ran nothing, and what its output directory
    // holds is an earlier run's (it was listed SUCCEEDED on that run's last
    // checkpoint, or as having reached that run's last logged iteration).
    if (job.state == control::COMPILING) {
      job.reason = "master restarted while the job was starting (COMPILING: no iteration had run): submit it again";
      return control::FAILED;
    }
    // (Only the rows of a job that opened its outputs: a metrics.jsonl it
    // never wrote is another run's.)
    // (And their values: the record's were of its last persisted
    // iteration, shown beside the later one logged.)
    if (!job.spec.output_dir.empty() && job.log_offset >= 0) {
      std::map<std::string, double> values;
      const int64_t logged = LastLoggedIteration(fs::path(job.spec.output_dir) / "metrics.jsonl", &values);
      if (logged > job.iteration) {
        job.iteration = logged;
        for (const auto& [name, value] : values) job.last_metrics[name] = value;
      }
    }
    absl::StatusOr<std::optional<JobCompiler::CheckpointMark>> mark = absl::UnknownError("");
    {
      absl::MutexLock compiler_lock(&compiler_mu_);
      mark = compiler_->LatestCheckpoint(job.spec);
    }
    absl::StatusOr<std::optional<int64_t>> checkpoint = std::optional<int64_t>();
    if (!mark.ok()) {
      checkpoint = mark.status();
    } else if (*mark) {
      checkpoint = std::optional<int64_t>((*mark)->iteration);
    }
    // (A worker that outlived the master trains on until it notices, and
    // may checkpoint past what reached metrics.jsonl.)
    if (checkpoint.ok() && checkpoint->has_value()) job.iteration = std::max(job.iteration, **checkpoint);
    const bool finished =
        checkpoint.ok() && checkpoint->has_value() && job.spec.iterations > 0 && **checkpoint >= job.spec.iterations;
    if (finished && (*mark)->evaluation_pending) {
      // (It was reported SUCCEEDED: the final evaluation a stop cut short
      // never ran, and save_best never weighed it.)
      job.reason = absl::StrCat("master restarted (the job had trained its last iteration, ", **checkpoint,
                                ", but a stop cut its final evaluation short: `tessera submit --resume` runs it)");
      return control::FAILED;
    }
    if (finished) {
      const int64_t logged = LastLoggedIteration(fs::path(job.spec.output_dir) / "metrics.jsonl");
      job.reason = absl::StrCat(
          "it finished while the master was down (its checkpoint of the last iteration, ", **checkpoint,
          ", is complete",
          logged < job.spec.iterations ? absl::StrCat("; metrics.jsonl ends at iteration ", logged) : std::string(),
          ")");
      return control::SUCCEEDED;
    }
    job.reason = FailedRestartReason(job, checkpoint);
    return control::FAILED;
  }

  static std::string FailedRestartReason(const Job& job, const absl::StatusOr<std::optional<int64_t>>& checkpoint) {
    const std::string reached =
        job.iteration > 0 ? absl::StrCat("the job had reached iteration ", job.iteration) : "the job had just started";
    // A node of it still holding its checkpoints (a worker that outlived the
    // master): what it writes before it notices is what a resume takes.
    const bool still_written = !job.spec.output_dir.empty() &&
                               !DirectoryClaim::CheckUnclaimed(fs::path(job.spec.output_dir) / "checkpoints").ok();
    if (still_written && checkpoint.ok()) {
      return absl::StrCat(
          "master restarted (", reached, "; a node of it is still writing its checkpoints (",
          checkpoint->has_value() ? absl::StrCat("the latest so far: iteration ", **checkpoint) : "none so far",
          "): once it has stopped, `tessera submit --resume` continues from the latest)");
    }
    if (!checkpoint.ok()) {
      return job.iteration > 0 ? absl::StrCat("master restarted (", reached,
                                              "; `tessera submit --resume` continues from its latest checkpoint)")
                               : std::string("master restarted");
    }
    if (!checkpoint->has_value()) {
      return absl::StrCat("master restarted (", reached,
                          " and written no checkpoint: `tessera submit --resume` starts it afresh)");
    }
    return absl::StrCat("master restarted (", reached, "; its latest checkpoint is iteration ", **checkpoint,
                        ": `tessera submit --resume` continues from it)");
  }

  // The job's last lines (at most kLogTailLines, from its last
  // kLogTailBytes) in its log.txt: bytes [log_offset, log_end) as its record
  // last noted them (the lines of its last few seconds may be missing), and
  // none unless the file is the one written then (its inode), still holds
  // them (long enough, its line before log_end the job's last) and is a
  // regular file (a FIFO would block; a symbolic link is not followed): a
  // run that wrote into the directory since, appending or replacing, must
  // not pass its lines for the job's.
  static std::vector<std::string> ReadOwnLogLines(const fs::path& path, const Job& job) {
    std::vector<std::string> lines;
    const int64_t offset = job.log_offset, end = job.log_end;
    if (offset < 0 || end <= offset || job.log_inode == 0) return lines;
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return lines;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_ino) != job.log_inode ||
        st.st_size < end) {
      ::close(fd);
      return lines;
    }
    const int64_t start = std::max<int64_t>(offset, end - static_cast<int64_t>(kLogTailBytes));
    std::string text(static_cast<size_t>(end - start), '\0');
    const ssize_t got = ::pread(fd, text.data(), text.size(), start);
    ::close(fd);
    if (got != static_cast<ssize_t>(text.size()) || text.back() != '\n') return lines;
    text.pop_back();
    const size_t last = text.rfind('\n');
    const std::string_view last_line =
        std::string_view(text).substr(last == std::string::npos ? 0 : last + 1).substr(0, kLogCheckBytes);
    // (Its last line begins the kept text only when the tail holds it whole.)
    if ((last != std::string::npos || start == offset) && last_line != job.log_last_line) return lines;
    size_t begin = 0;
    if (start > offset) {  // (a line cut by the tail's start)
      if (last == std::string::npos) return lines;
      begin = text.find('\n') + 1;
    }
    while (begin <= text.size()) {
      size_t stop = text.find('\n', begin);
      if (stop == std::string::npos) stop = text.size();
      lines.push_back(text.substr(begin, stop - begin));
      begin = stop + 1;
    }
    if (lines.size() > kLogTailLines) lines.erase(lines.begin(), lines.end() - kLogTailLines);
    return lines;
  }

  // The highest "iter" among the last rows of a metrics.jsonl (0: none),
  // read from its last 64 KiB only.
  // The last iteration metrics.jsonl logged (0: none); with `values`, the
  // latest value of each metric in its last rows (merged as the live
  // job's last_metrics are).
  static int64_t LastLoggedIteration(const fs::path& path, std::map<std::string, double>* values = nullptr) {
    std::error_code error;
    if (!fs::is_regular_file(path, error)) return 0;  // (a FIFO's or /dev/zero's end never comes)
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) return 0;
    constexpr std::streamoff kTail = 64 << 10;
    const std::streamoff size = in.tellg();
    in.seekg(std::max<std::streamoff>(0, size - kTail));
    std::string line;
    if (size > kTail) std::getline(in, line);  // a row cut by the seek
    int64_t last = 0;
    while (std::getline(in, line)) {
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      if (row.is_object() && row.contains("iter") && row["iter"].is_number_integer()) {
        last = std::max(last, row["iter"].get<int64_t>());
        if (values != nullptr) {
          for (const auto& [name, value] : row.items()) {
            if (name != "iter" && value.is_number()) (*values)[name] = value.get<double>();
          }
        }
      }
    }
    return last;
  }

  // Rewrites metrics.jsonl without its rows past `iteration` (a missing
  // file is fine; lines that are not JSON objects with an "iter" are kept),
  // and gives the loss curves of the rows kept (a resumed job's plot
  // continues them).
  static absl::Status KeepMetricsUpTo(const fs::path& path, int64_t iteration, std::vector<LossPoint>& train,
                                      std::vector<LossPoint>& eval) {
    std::ifstream in(path);
    if (!in) return absl::OkStatus();
    std::string kept, line;
    while (std::getline(in, line)) {
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      // A row cut short by a crash (the last one written) is no row: kept,
      // it would sit among the resumed run's and break the JSONL.
      if (!row.is_object()) continue;
      const auto iter = row.find("iter");
      if (iter != row.end() && iter->is_number_integer()) {
        const int64_t row_iteration = iter->get<int64_t>();
        if (row_iteration > iteration) continue;
        if (auto loss = row.find("loss"); loss != row.end() && loss->is_number()) {
          train.push_back({row_iteration, loss->get<double>()});
        }
        if (auto loss = row.find("eval_loss"); loss != row.end() && loss->is_number()) {
          eval.push_back({row_iteration, loss->get<double>()});
        }
      }
      kept += line + "\n";
    }
    return WriteFileDurably(path, kept);
  }

  // ---- persistence ----

  void PersistLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.state_dir.empty()) return;
    nlohmann::json record = {{"job_id", job.id},
                             {"session", job.session},
                             {"state", StateName(job.state)},
                             {"reason", job.reason},
                             {"config", job.spec.config},
                             {"devices_needed", job.spec.devices_needed},
                             {"device_type", job.spec.device_type},
                             {"iterations", job.spec.iterations},
                             {"start_iteration", job.spec.start_iteration},
                             {"output_dir", job.spec.output_dir},
                             {"output_dir_made", job.output_claim.made()},
                             {"iteration", job.iteration},
                             {"last_metrics", job.last_metrics},
                             {"submit_time_ms", job.submit_ms},
                             {"end_time_ms", job.end_ms},
                             {"log_offset", job.log_offset},
                             {"log_end", job.log_end},
                             {"log_inode", job.log_inode},
                             {"log_last_line", job.log_last_line},
                             {"slots", nlohmann::json::array()}};
    if (IsFinal(job.state)) {
      // Its last log lines, for `tessera logs` after a restart (log.txt may
      // hold a later run's by then).
      // (A line longer than kLogTailLineBytes, a long traceback, is cut
      // there: one such line would otherwise leave no room for the rest.)
      std::vector<std::string> tail;
      size_t bytes = 0;
      for (auto it = job.events.rbegin(); it != job.events.rend() && tail.size() < kLogTailLines; ++it) {
        if (!it->has_log_line()) continue;
        std::string line = it->log_line().size() <= kLogTailLineBytes
                               ? it->log_line()
                               : absl::StrCat(it->log_line().substr(0, kLogTailLineBytes), " [cut]");
        bytes += line.size();
        if (bytes > kLogTailBytes) break;
        tail.push_back(std::move(line));
      }
      nlohmann::json& lines = record["log_tail"] = nlohmann::json::array();
      for (auto it = tail.rbegin(); it != tail.rend(); ++it) lines.push_back(std::move(*it));
    }
    for (const WorkerSlot& slot : job.slots) {
      record["slots"].push_back({{"worker_id", slot.worker_id},
                                 {"node", slot.node},
                                 {"num_devices", slot.num_devices},
                                 {"data_address", slot.data_address}});
    }
    const auto status = WriteFileDurably(fs::path(options_.state_dir) / (job.id + ".json"),
                                         record.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    if (!status.ok()) TLOG_WARN("job {}: not persisted: {}", job.id, std::string(status.message()));
  }

  // The last "worker-N" given, kept in --state-dir so that the next master
  // never gives a number again: its jobs' records name the workers that ran
  // them, and a worker of before the restart comes back with its number.
  static constexpr std::string_view kWorkerNumberFile = "last_worker_number";
  void PersistWorkerNumberLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (options_.state_dir.empty()) return;
    const auto status =
        WriteFileDurably(fs::path(options_.state_dir) / kWorkerNumberFile, absl::StrCat(next_worker_number_, "\n"));
    if (!status.ok()) TLOG_WARN("worker numbers: not persisted: {}", std::string(status.message()));
  }

  absl::Status LoadState() {
    if (options_.state_dir.empty()) return absl::OkStatus();
    std::error_code error;
    state_dir_made_ = fs::create_directories(options_.state_dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create --state-dir '", options_.state_dir, "': ", error.message()));
    }
    // One master per state directory: two would overwrite each other's
    // records. The lock goes with the process (flock), so a killed master's
    // does not stay behind.
    const std::string lock_path = (fs::path(options_.state_dir) / ".lock").string();
    state_lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (state_lock_fd_ < 0) {
      // (Named: a directory in its place was "cannot write into" a
      // directory that was writable.)
      const int error_number = errno;
      return absl::Status(error_number == EACCES || error_number == EROFS ? absl::StatusCode::kPermissionDenied
                                                                          : absl::StatusCode::kFailedPrecondition,
                          absl::StrCat("--state-dir '", options_.state_dir, "': cannot open its lock ", lock_path, ": ",
                                       std::strerror(error_number)));
    }
    if (::flock(state_lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("--state-dir '", options_.state_dir,
                                                        "' is in use by another master (it holds ", lock_path, ")"));
    }
    absl::MutexLock lock(&mu_);
    {
      // (A regular file of a number: /dev/zero in its place was read
      // without end, a FIFO waited on, before any signal was handled.)
      absl::StatusOr<std::string> text = ReadWholeFile(fs::path(options_.state_dir) / kWorkerNumberFile, 64);
      if (!text.ok() && !absl::IsNotFound(text.status())) {
        return absl::FailedPreconditionError(absl::StrCat("--state-dir: ", text.status().message()));
      }
      uint64_t number = 0;
      if (text.ok() && absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &number)) {
        next_worker_number_ = number;
      } else if (text.ok()) {
        // (Replaced at the next worker's registration: said, not silent.)
        TLOG_WARN("state dir: {} holds no number; worker numbers go on after the highest of the job records",
                  (fs::path(options_.state_dir) / kWorkerNumberFile).string());
      }
    }
    std::vector<std::pair<uint64_t, std::string>> requeued;  // (session, id): submit order
    for (const auto& entry : fs::directory_iterator(options_.state_dir, error)) {
      // A master killed inside a record's write left its temporary
      // (job-000007.json.tmp-PID, or the worker number's): the lock says no
      // master writes here now. (Other files are the user's.)
      const std::string name = entry.path().filename().string();
      if (const size_t tmp = name.rfind(".tmp-");
          tmp != std::string::npos && tmp + 5 < name.size() &&
          ((name.starts_with("job-") && std::string_view(name).substr(0, tmp).ends_with(".json")) ||
           std::string_view(name).substr(0, tmp) == kWorkerNumberFile) &&
          std::all_of(name.begin() + static_cast<std::ptrdiff_t>(tmp + 5), name.end(),
                      [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
        std::error_code removed;
        if (entry.is_regular_file(removed) && fs::remove(entry.path(), removed)) {
          TLOG_INFO("state dir: removed {}, a write a killed master left unfinished", entry.path().string());
        }
        continue;
      }
      if (entry.path().extension() != ".json") continue;
      // A record that cannot be read still keeps its job id from being
      // given again (job-000007.json: session 7).
      uint64_t numbered = 0;
      if (const std::string stem = entry.path().stem().string();
          stem.starts_with("job-") && absl::SimpleAtoi(stem.substr(4), &numbered)) {
        next_session_ = std::max(next_session_, numbered);
      }
      std::error_code kind_error;
      if (!entry.is_regular_file(kind_error)) {
        TLOG_WARN("state dir: skipping {}: not a file", entry.path().string());
        continue;
      }
      // (A record of a job is a few KiB and its config; a file far larger is
      // no record.)
      absl::StatusOr<std::string> text = ReadWholeFile(entry.path(), kMaxJobRecordBytes);
      if (!text.ok()) {
        TLOG_WARN("state dir: skipping {}: {}", entry.path().string(), std::string(text.status().message()));
        continue;
      }
      // (The parser ends at a NUL byte: a damaged tail after one was taken
      // for nothing.)
      const nlohmann::json record = text->find('\0') != std::string::npos
                                        ? nlohmann::json()
                                        : nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      auto job = std::make_unique<Job>();
      JobState state = control::JOB_STATE_UNSPECIFIED;
      bool output_dir_made = false;
      if (absl::Status read = ReadJobRecord(record, *job, state, output_dir_made); !read.ok()) {
        TLOG_WARN("state dir: skipping {}: not a job record ({})", entry.path().string(), std::string(read.message()));
        continue;
      }
      // (Its log lines, read into its events: as many as a job keeps.)
      TrimEventsLocked(*job, std::max<size_t>(options_.max_events_per_job, 1) - 1);
      for (const WorkerSlot& slot : job->slots) {
        // (A state directory from before the number was kept.)
        uint64_t number = 0;
        if (slot.worker_id.starts_with("worker-") && absl::SimpleAtoi(slot.worker_id.substr(7), &number)) {
          next_worker_number_ = std::max(next_worker_number_, number);
        }
      }
      if (!IsPlainId(job->id) || jobs_.contains(job->id)) continue;
      if (job->id != entry.path().stem().string()) {
        TLOG_WARN("state dir: skipping {}: it holds the record of {}", entry.path().string(), job->id);
        continue;
      }
      job->state = state;
      next_session_ = std::max(next_session_, job->session);
      absl::StatusOr<JobSpec> again = absl::UnknownError("");
      if (state == control::PENDING) {
        // Never started: it waits in the queue again, in its turn, resolved
        // anew (where it starts from is what the disk says now).
        absl::MutexLock compiler_lock(&compiler_mu_);
        again = compiler_->Resolve(job->spec.config.dump(), {});
      }
      if (state == control::PENDING && again.ok() && !again->output_dir.empty()) {
        // (Made at its submission: it goes again if the job leaves it empty.)
        absl::StatusOr<DirectoryClaim> claimed = DirectoryClaim::Acquire(again->output_dir, output_dir_made);
        if (claimed.ok()) {
          job->output_claim = *std::move(claimed);
        } else {
          again = absl::Status(claimed.status().code(), absl::StrCat("train.output_dir: ", claimed.status().message()));
        }
      }
      if (state == control::PENDING && again.ok()) {
        job->spec = *std::move(again);
        job->reason = "queued again after a master restart";
        requeued.emplace_back(job->session, job->id);
        PersistLocked(*job);
        control::JobEvent event;
        event.set_log_line(absl::StrCat("[master] ", job->reason));
        AddEventLocked(*job, std::move(event));
        TLOG_INFO("job {}: {}", job->id, job->reason);
      } else if (state == control::PENDING) {
        job->state = control::FAILED;
        job->reason = absl::StrCat("master restarted; the queued job no longer resolves: ", again.status().message());
        job->end_ms = NowMs();
        PersistLocked(*job);
      } else if (!IsFinal(state)) {
        // Its lines so far, for `tessera logs` (they were in memory only).
        if (job->log_offset >= 0 && !job->spec.output_dir.empty()) {
          for (std::string& line : ReadOwnLogLines(fs::path(job->spec.output_dir) / "log.txt", *job)) {
            control::JobEvent event;
            event.set_log_line(std::move(line));
            AddEventLocked(*job, std::move(event));
          }
        }
        job->state = EndRestartedJobLocked(*job);
        job->end_ms = NowMs();
        if (output_dir_made && !job->spec.output_dir.empty()) {
          // Made at its submission and left empty (it stopped while it
          // compiled): it goes, as at any job's end.
          absl::StatusOr<DirectoryClaim> claimed = DirectoryClaim::Acquire(job->spec.output_dir, /*made_before=*/true);
          if (claimed.ok()) claimed->Release();
        }
        PersistLocked(*job);
      }
      AddStateEventLocked(*job);
      jobs_[job->id] = std::move(job);
    }
    std::sort(requeued.begin(), requeued.end());
    for (const auto& [session, id] : requeued) queue_.push_back(id);
    if (error) return absl::InternalError(absl::StrCat("cannot read --state-dir '", options_.state_dir, "': ", error.message()));
    return absl::OkStatus();
  }

  // A synchronous call to a worker that Shutdown may cancel, for its scope
  // (one begun after Shutdown started is cancelled at once).
  class CancelableCall {
   public:
    CancelableCall(Impl* impl, grpc::ClientContext* context) : impl_(impl), context_(context) {
      absl::MutexLock lock(&impl_->mu_);
      impl_->cancelable_calls_.insert(context_);
      if (impl_->shutting_down_) context_->TryCancel();
    }
    ~CancelableCall() {
      absl::MutexLock lock(&impl_->mu_);
      impl_->cancelable_calls_.erase(context_);
    }
    CancelableCall(const CancelableCall&) = delete;
    CancelableCall& operator=(const CancelableCall&) = delete;

   private:
    Impl* impl_;
    grpc::ClientContext* context_;
  };

  // ---- liveness ----

  void MonitorLoop() {
    const absl::Duration tick = std::clamp(options_.heartbeat_interval / 4, absl::Milliseconds(10), absl::Milliseconds(250));
    absl::Time next_probe = absl::Now();
    absl::Time last_pass = absl::Now();
    for (;;) {
      std::vector<PendingStop> stops;
      std::vector<UrgentProbe> urgent;
      std::vector<std::pair<std::string, std::shared_ptr<control::Worker::Stub>>> probes;
      {
        absl::MutexLock lock(&mu_);
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return shutting_down_ || !pending_stops_.empty() || !urgent_probes_.empty();
        };
        mu_.AwaitWithTimeout(absl::Condition(&wake), tick);
        if (shutting_down_) return;
        urgent.swap(urgent_probes_);
        // Lost-link reports whose peers all answered: the report is the reason.
        for (auto it = suspect_jobs_.begin(); it != suspect_jobs_.end();) {
          auto job = jobs_.find(*it);
          if (job == jobs_.end() || IsFinal(job->second->state)) {
            it = suspect_jobs_.erase(it);
          } else if (absl::Now() >= job->second->link_lost_deadline) {
            EndJobLocked(*job->second, control::FAILED, job->second->link_lost_report);
            it = suspect_jobs_.erase(it);
          } else {
            ++it;
          }
        }
        // Graceful cancels past their grace period stop at once.
        for (auto& [id, job] : jobs_) {
          if (job->stopping && !IsFinal(job->state) && absl::Now() >= job->stop_deadline) {
            EndJobLocked(*job, StoppedStateOf(*job),
                         absl::StrCat(job->stop_reason, "; the nodes did not stop within ",
                                      absl::FormatDuration(options_.stop_grace), ": stopped at once"));
          }
        }
        stops.swap(pending_stops_);
        // Stubs of lost workers go once no call holds them any more.
        std::erase_if(retired_stubs_, [](const auto& stub) { return stub.use_count() == 1; });
        const absl::Time now = absl::Now();
        // This loop passes every `tick`: a gap of a whole worker timeout is
        // the master not running (a stopped process, a suspended machine),
        // and the heartbeats it missed meanwhile say nothing of the
        // workers: each gets a fresh deadline instead of being lost for it.
        if (now - last_pass > options_.worker_timeout) {
          TLOG_WARN("the master did not run for {} (stopped or suspended): the workers' heartbeat deadlines restart",
                    absl::FormatDuration(absl::Trunc(now - last_pass, absl::Milliseconds(1))));  // (0 at 100 ms)
          for (auto& [id, worker] : workers_) worker->last_heartbeat = now;
        }
        last_pass = now;
        std::vector<std::string> late;
        for (const auto& [id, worker] : workers_) {
          if (now - worker->last_heartbeat > options_.worker_timeout) late.push_back(id);
        }
        for (const std::string& id : late) {
          LoseWorkerLocked(id, absl::StrCat("no heartbeat for ", absl::FormatDuration(options_.worker_timeout)));
        }
        if (now >= next_probe) {
          next_probe = now + options_.heartbeat_interval;
          for (auto& [id, worker] : workers_) {
            if (worker->probe_in_flight) continue;
            worker->probe_in_flight = true;
            probes.emplace_back(id, worker->stub);
          }
        }
        async_in_flight_ += static_cast<int>(stops.size() + probes.size() + urgent.size());
      }
      for (PendingStop& stop : stops) SendStop(std::move(stop));
      for (auto& [id, stub] : probes) SendProbe(id, stub);
      for (UrgentProbe& probe : urgent) SendUrgentProbe(std::move(probe));
    }
  }

  // The state of one asynchronous call. `done` is declared first so that it
  // is destroyed last: the in-flight count drops only once the call's
  // context, stub and channel are gone, so Shutdown never overtakes them.
  template <typename Request, typename Response>
  struct AsyncCall {
    struct Done {
      Impl* impl = nullptr;  // set once the call is counted in flight
      ~Done() {
        if (impl != nullptr) impl->AsyncDone();
      }
    } done;
    std::shared_ptr<control::Worker::Stub> stub;
    grpc::ClientContext context;
    Request request;
    Response response;
  };

  void SendStop(PendingStop stop) {
    using Call = AsyncCall<control::StopRequest, control::StopResponse>;
    auto call = std::make_shared<Call>();
    call->done.impl = this;
    call->stub = std::move(stop.stub);
    call->request.set_job_id(stop.job_id);
    call->request.set_reason(stop.reason);
    call->request.set_graceful(stop.graceful);
    call->request.set_launch(stop.launch);
    PrepareContext(call->context, options_.security, options_.rpc_timeout);
    Call* raw = call.get();
    {
      absl::MutexLock lock(&mu_);
      cancelable_calls_.insert(&raw->context);
    }
    raw->stub->async()->Stop(&raw->context, &raw->request, &raw->response, [this, call](const grpc::Status& status) {
      {
        absl::MutexLock lock(&mu_);
        cancelable_calls_.erase(&call->context);
      }
      if (!status.ok()) TLOG_DEBUG("Stop of {} failed: {}", call->request.job_id(), status.error_message());
    });
  }

  void SendProbe(const std::string& worker_id, const std::shared_ptr<control::Worker::Stub>& stub) {
    using Call = AsyncCall<control::WorkerStatusRequest, control::WorkerStatusResponse>;
    auto call = std::make_shared<Call>();
    call->done.impl = this;
    call->stub = stub;
    PrepareContext(call->context, options_.security, options_.probe_timeout);
    Call* raw = call.get();
    raw->stub->async()->Status(&raw->context, &raw->request, &raw->response,
                               [this, call, worker_id](const grpc::Status& status) {
                                 absl::MutexLock lock(&mu_);
                                 auto it = workers_.find(worker_id);
                                 if (it == workers_.end() || it->second->stub != call->stub) return;
                                 WorkerRecord& worker = *it->second;
                                 worker.probe_in_flight = false;
                                 if (status.ok()) {
                                   worker.failed_probes = 0;
                                 } else if (++worker.failed_probes >= options_.probe_failures) {
                                   LoseWorkerLocked(worker_id, absl::StrCat("its Worker service did not answer ",
                                                                            options_.probe_failures, " probes (",
                                                                            status.error_message(), ")"));
                                 }
                               });
  }

  // A probe of a worker whose peer lost its link to it: no answer within
  // probe_timeout loses it (if it still runs that job).
  void SendUrgentProbe(UrgentProbe probe) {
    using Call = AsyncCall<control::WorkerStatusRequest, control::WorkerStatusResponse>;
    auto call = std::make_shared<Call>();
    call->done.impl = this;
    call->stub = std::move(probe.stub);
    PrepareContext(call->context, options_.security, options_.probe_timeout);
    Call* raw = call.get();
    raw->stub->async()->Status(
        &raw->context, &raw->request, &raw->response,
        [this, call, worker_id = std::move(probe.worker_id), job_id = std::move(probe.job_id)](const grpc::Status& status) {
          if (status.ok()) return;
          absl::MutexLock lock(&mu_);
          auto it = workers_.find(worker_id);
          if (it == workers_.end() || it->second->stub != call->stub || it->second->job_id != job_id) return;
          LoseWorkerLocked(worker_id, absl::StrCat("its Worker service did not answer a probe after a peer lost its link "
                                                   "to it (", status.error_message(), ")"));
        });
  }

  void AsyncDone() {
    absl::MutexLock lock(&mu_);
    --async_in_flight_;
  }

  // ---- /metrics ----

  std::string RenderMetrics() {
    absl::MutexLock lock(&mu_);
    std::string text;
    absl::StrAppend(&text, "# HELP tessera_jobs Jobs known to the master, by state.\n# TYPE tessera_jobs gauge\n");
    std::map<JobState, int> by_state;
    for (const auto& [id, job] : jobs_) ++by_state[job->state];
    for (JobState state : {control::PENDING, control::COMPILING, control::RUNNING, control::SUCCEEDED, control::FAILED,
                           control::CANCELLED}) {
      absl::StrAppend(&text, "tessera_jobs{state=\"", StateName(state), "\"} ", by_state[state], "\n");
    }
    absl::StrAppend(&text, "# HELP tessera_workers_alive Registered, live workers.\n# TYPE tessera_workers_alive gauge\n",
                    "tessera_workers_alive ", workers_.size(), "\n");
    absl::StrAppend(&text, "# HELP tessera_job_loss Last reported loss of a running job.\n# TYPE tessera_job_loss gauge\n");
    // Throughput in samples (every model) and tokens (language models).
    std::string samples =
        "# HELP tessera_job_samples_per_second Last reported samples/s of a running job.\n"
        "# TYPE tessera_job_samples_per_second gauge\n";
    std::string tokens =
        "# HELP tessera_job_tokens_per_second Last reported tokens/s of a running job.\n"
        "# TYPE tessera_job_tokens_per_second gauge\n";
    for (const auto& [id, job] : jobs_) {
      if (job->state != control::RUNNING) continue;
      // (Values in full and as Prometheus spells NaN and infinities: StrCat
      // kept 6 digits and wrote nan, inf; ids from records escaped.)
      const std::string label = PrometheusLabel(id);
      if (auto it = job->last_metrics.find("loss"); it != job->last_metrics.end()) {
        absl::StrAppend(&text, "tessera_job_loss{job=\"", label, "\"} ", PrometheusValue(it->second), "\n");
      }
      if (auto it = job->last_metrics.find("samples_per_s"); it != job->last_metrics.end()) {
        absl::StrAppend(&samples, "tessera_job_samples_per_second{job=\"", label, "\"} ", PrometheusValue(it->second),
                        "\n");
      }
      if (auto it = job->last_metrics.find("tokens_per_s"); it != job->last_metrics.end()) {
        absl::StrAppend(&tokens, "tessera_job_tokens_per_second{job=\"", label, "\"} ", PrometheusValue(it->second),
                        "\n");
      }
    }
    absl::StrAppend(&text, samples, tokens,
                    "# HELP tessera_rpcs_total RPCs received, by method.\n# TYPE tessera_rpcs_total counter\n");
    for (const auto& [method, count] : rpc_counts_) {
      absl::StrAppend(&text, "tessera_rpcs_total{method=\"", method, "\"} ", count, "\n");
    }
    return text;
  }

  const Options options_;
  absl::Mutex compiler_mu_;
  // Resolve and Compile under compiler_mu_; LatestCheckpoint, a read of
  // the disk, is thread-safe: called without it when a worker is lost,
  // while another job compiles.
  const std::unique_ptr<JobCompiler> compiler_;
  bool started_ = false;  // Start/Shutdown's thread only
  std::string address_;
  int metrics_port_ = -1;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsHttpServer> metrics_server_;
  std::thread scheduler_;
  // The launches under way (and ended ones not yet joined), the scheduler's
  // alone until Shutdown has joined it.
  std::vector<std::unique_ptr<LaunchThread>> launches_;
  std::thread monitor_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // a job or worker changed: the scheduler looks again
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // Drain: no job is submitted or placed any more.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<WorkerRecord>> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> queue_ ABSL_GUARDED_BY(mu_);  // PENDING jobs, oldest first
  std::vector<PendingStop> pending_stops_ ABSL_GUARDED_BY(mu_);
  std::vector<UrgentProbe> urgent_probes_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> suspect_jobs_ ABSL_GUARDED_BY(mu_);  // jobs with a link_lost_report
  std::vector<std::shared_ptr<control::Worker::Stub>> retired_stubs_ ABSL_GUARDED_BY(mu_);
  int async_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Calls to workers Shutdown cancels (registered for their duration).
  std::set<grpc::ClientContext*> cancelable_calls_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 0;
  bool state_dir_made_ = false;  // LoadState created --state-dir
  int state_lock_fd_ = -1;  // the --state-dir's .lock, held (flock) while this master lives
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_worker_number_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> rpc_counts_ ABSL_GUARDED_BY(mu_);

  // The KV has its own lock: waits hold it (in AwaitWithDeadline) often.
  absl::Mutex kv_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(kv_mu_);
  // The jobs that ended, whose prefix takes no more keys.
  std::set<std::string> kv_ended_jobs_ ABSL_GUARDED_BY(kv_mu_);
  size_t kv_bytes_ ABSL_GUARDED_BY(kv_mu_) = 0;  // keys and values of kv_
  bool kv_shutting_down_ ABSL_GUARDED_BY(kv_mu_) = false;
  std::atomic<int> waiting_calls_{0};  // KvWait and WatchJob calls in progress
};

Master::Master(Options options, std::unique_ptr<JobCompiler> compiler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(compiler))) {}
Master::~Master() = default;
absl::StatusOr<std::string> Master::Start() { return impl_->Start(); }
int Master::metrics_port() const { return impl_->metrics_port(); }
void Master::Shutdown() { impl_->Shutdown(); }
void Master::Drain() { impl_->Drain(); }
int Master::jobs_running() const { return impl_->jobs_running(); }

}  // namespace tessera::cluster
