// The NCCL communicator (comm/collective/nccl_communicator.h).
#include "comm/collective/nccl_communicator.h"

#include <cstring>
#include <string>

namespace tessera::comm {

std::string LazyModuleLoadingWarning(const char* mode) {
  if (mode != nullptr && std::strcmp(mode, "EAGER") == 0) return "";
  return std::string("CUDA_MODULE_LOADING=") + (mode == nullptr ? "(unset)" : mode) +
         ": CUDA loads kernels lazily, and a kernel's first launch may wait for the GPU's queued NCCL collectives, "
         "which wait for peers that may wait for this process: a multi-GPU job can hang in its first iteration "
         "(unset the variable, Tessera then sets EAGER, or set EAGER)";
}

}  // namespace tessera::comm

#ifdef TESSERA_WITH_CUDA

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/stream.h"
#include "core/text.h"

namespace tessera::comm {

// One event, re-recorded behind each op: an op's stream waits for the
// event's latest record (the op issued before it), then records it behind
// itself. Held from the wait to the record, so the order of the records is
// the order of the ops.
class NcclSequence {
 public:
  explicit NcclSequence(cudaEvent_t event) : event_(event) {}
  ~NcclSequence() {
    // Every communicator holding the sequence is gone, its stream drained
    // or its kernels aborted.
    cudaEventDestroy(event_);
  }
  NcclSequence(const NcclSequence&) = delete;
  NcclSequence& operator=(const NcclSequence&) = delete;

  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mu_); }
  // With Lock held: `stream` waits for the previous op's record.
  cudaError_t After(cudaStream_t stream) { return recorded_ ? cudaStreamWaitEvent(stream, event_, 0) : cudaSuccess; }
  // With Lock held: the next op waits for what is on `stream` now.
  cudaError_t Behind(cudaStream_t stream) {
    const cudaError_t e = cudaEventRecord(event_, stream);
    if (e == cudaSuccess) recorded_ = true;
    return e;
  }

 private:
  cudaEvent_t event_;
  std::mutex mu_;
  bool recorded_ = false;  // under mu_
};

absl::StatusOr<std::shared_ptr<NcclSequence>> MakeNcclSequence(int device) {
  cudaEvent_t event = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    return absl::InternalError(StrCat("cuda:", device, ": the NCCL issue order's event: ", cudaGetErrorString(e)));
  }
  return std::make_shared<NcclSequence>(event);
}

namespace {

absl::StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kBool:
      return ncclUint8;
    default:
      break;
  }
  return absl::InvalidArgumentError(StrCat("NCCL moves no ", DTypeName(dtype), " tensors"));
}

// "invalid usage (what NCCL said last)": NCCL's own words name the cause
// (a peer's abort, a mismatch, a missing GPU) where the code alone does not.
// Taken before the communicator is aborted: after that it is gone.
std::string Explain(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  if (last == nullptr || *last == '\0') return ncclGetErrorString(r);
  return StrCat(ncclGetErrorString(r), " (", last, ")");
}

bool Cancelled(const NcclOptions& options) { return options.cancel != nullptr && options.cancel->load(); }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclOptions options, ncclComm_t comm, std::unique_ptr<Stream> stream)
      : options_(std::move(options)), comm_(comm), stream_(std::move(stream)) {
    watcher_ = std::thread([this] { Watch(); });
  }
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    watcher_.join();
    // Ops still on the GPU: a short wait, then the abort that ends kernels
    // waiting for peers.
    if (!stream_->Shutdown(10)) AbortComm();
    std::unique_lock<std::mutex> lock(mu_);
    if (comm_aborted_) return;
    // A non-blocking communicator is finalised first, polled (NCCL's guide:
    // ncclCommFinalize returns at once and the state says when its flush is
    // done), with a bound: a finalisation that fails or outlasts it ends in
    // the abort rather than a destructor blocked on a peer.
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    }
    comm_aborted_ = true;
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string Describe() const override {
    return StrCat("nccl group '", options_.group, "' rank ", options_.rank, "/", options_.size,
                  " on cuda:", options_.device);
  }

  void AllReduce(const Tensor& input, Tensor output, ReduceOp op, DoneFn done) override {
    if (absl::Status ok = SameCount(input, output, "all-reduce"); !ok.ok()) return done(ok);
    Launch("all-reduce", {input, output}, std::move(done), [=, this](cudaStream_t s, ncclDataType_t type) {
      return ncclAllReduce(input.raw_data(), output.raw_data(), static_cast<size_t>(input.NumElements()), type,
                           op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, s);
    });
  }

  void AllGather(const Tensor& input, Tensor output, std::vector<int64_t> counts, DoneFn done) override {
    if (absl::Status ok = CheckCounts(counts, input.NumElements(), output.NumElements(), true, "all-gather");
        !ok.ok()) {
      return done(ok);
    }
    Launch("all-gather", {input, output}, std::move(done), [=, this](cudaStream_t s, ncclDataType_t type) {
      // Uneven counts: one broadcast from each rank into its chunk.
      const size_t element = DTypeSize(input.dtype());
      ncclResult_t r = ncclGroupStart();
      int64_t offset = 0;
      for (int root = 0; root < size() && r == ncclSuccess; ++root) {
        char* chunk = static_cast<char*>(output.raw_data()) + offset * element;
        r = ncclBroadcast(root == rank() ? input.raw_data() : chunk, chunk,
                          static_cast<size_t>(counts[static_cast<size_t>(root)]), type, root, comm_, s);
        offset += counts[static_cast<size_t>(root)];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  void ReduceScatter(const Tensor& input, Tensor output, std::vector<int64_t> counts, ReduceOp op,
                     DoneFn done) override {
    if (absl::Status ok = CheckCounts(counts, output.NumElements(), input.NumElements(), true, "reduce-scatter");
        !ok.ok()) {
      return done(ok);
    }
    Launch("reduce-scatter", {input, output}, std::move(done), [=, this](cudaStream_t s, ncclDataType_t type) {
      // Uneven counts: one reduce of each chunk to its rank.
      const size_t element = DTypeSize(input.dtype());
      ncclResult_t r = ncclGroupStart();
      int64_t offset = 0;
      for (int root = 0; root < size() && r == ncclSuccess; ++root) {
        const char* chunk = static_cast<const char*>(input.raw_data()) + offset * element;
        r = ncclReduce(chunk, root == rank() ? output.raw_data() : nullptr,
                       static_cast<size_t>(counts[static_cast<size_t>(root)]), type,
                       op == ReduceOp::kSum ? ncclSum : ncclMax, root, comm_, s);
        offset += counts[static_cast<size_t>(root)];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  void AllToAll(const Tensor& input, std::vector<int64_t> send_counts, Tensor output, std::vector<int64_t> recv_counts,
                DoneFn done) override {
    if (absl::Status ok = CheckCounts(send_counts, -1, input.NumElements(), false, "all-to-all send"); !ok.ok()) {
      return done(ok);
    }
    if (absl::Status ok = CheckCounts(recv_counts, -1, output.NumElements(), false, "all-to-all receive"); !ok.ok()) {
      return done(ok);
    }
    Launch("all-to-all", {input, output}, std::move(done), [=, this](cudaStream_t s, ncclDataType_t type) {
      const size_t element = DTypeSize(input.dtype());
      ncclResult_t r = ncclGroupStart();
      int64_t sent = 0, received = 0;
      for (int peer = 0; peer < size() && r == ncclSuccess; ++peer) {
        const auto p = static_cast<size_t>(peer);
        r = ncclSend(static_cast<const char*>(input.raw_data()) + sent * element, static_cast<size_t>(send_counts[p]),
                     type, peer, comm_, s);
        if (r == ncclSuccess) {
          r = ncclRecv(static_cast<char*>(output.raw_data()) + received * element, static_cast<size_t>(recv_counts[p]),
                       type, peer, comm_, s);
        }
        sent += send_counts[p];
        received += recv_counts[p];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  void Broadcast(Tensor buffer, int root, DoneFn done) override {
    if (root < 0 || root >= size()) return done(Error("broadcast", StrCat("root ", root, " of a group of ", size())));
    Launch("broadcast", {buffer}, std::move(done), [=, this](cudaStream_t s, ncclDataType_t type) {
      return ncclBroadcast(buffer.raw_data(), buffer.raw_data(), static_cast<size_t>(buffer.NumElements()), type, root,
                           comm_, s);
    });
  }

  void Send(const Tensor& input, int peer, DoneFn done) override {
    if (peer < 0 || peer >= size()) return done(Error("send", StrCat("peer ", peer, " of a group of ", size())));
    Launch("send", {input}, std::move(done), [=, this](cudaStream_t s, ncclDataType_t type) {
      return ncclSend(input.raw_data(), static_cast<size_t>(input.NumElements()), type, peer, comm_, s);
    });
  }
  void Recv(Tensor output, int peer, DoneFn done) override {
    if (peer < 0 || peer >= size()) return done(Error("recv", StrCat("peer ", peer, " of a group of ", size())));
    Launch("recv", {output}, std::move(done), [=, this](cudaStream_t s, ncclDataType_t type) {
      return ncclRecv(output.raw_data(), static_cast<size_t>(output.NumElements()), type, peer, comm_, s);
    });
  }

  void Abort(absl::Status reason) override {
    if (reason.ok()) reason = absl::CancelledError(StrCat(Describe(), ": aborted"));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_reason_.ok()) abort_reason_ = std::move(reason);
    }
    AbortComm();
  }

 private:
  using Enqueue = std::function<ncclResult_t(cudaStream_t, ncclDataType_t)>;

  absl::Status Error(std::string_view op, std::string_view what) const {
    return absl::InvalidArgumentError(StrCat(Describe(), ": ", op, ": ", what));
  }
  absl::Status SameCount(const Tensor& input, const Tensor& output, std::string_view op) const {
    if (input.NumElements() != output.NumElements() || input.dtype() != output.dtype()) {
      return Error(op, StrCat("input ", input.meta().ToString(), " and output ", output.meta().ToString()));
    }
    return absl::OkStatus();
  }
  // counts: one per rank, none negative; `own` (>= 0) must be counts[rank],
  // `total` their sum (for a chunked buffer) or, with !own_chunk, too.
  absl::Status CheckCounts(const std::vector<int64_t>& counts, int64_t own, int64_t total, bool own_chunk,
                           std::string_view op) const {
    if (counts.size() != static_cast<size_t>(size())) {
      return Error(op, StrCat(counts.size(), " counts for a group of ", size()));
    }
    for (int64_t c : counts) {
      if (c < 0) return Error(op, StrCat("a negative count ", c));
    }
    if (own_chunk && own != counts[static_cast<size_t>(rank())]) {
      return Error(
          op, StrCat("this rank's chunk holds ", own, " elements, counts say ", counts[static_cast<size_t>(rank())]));
    }
    const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (sum != total) return Error(op, StrCat("counts sum to ", sum, ", the buffer holds ", total));
    return absl::OkStatus();
  }

  absl::Status AbortedStatus() {
    std::lock_guard<std::mutex> lock(mu_);
    return abort_reason_;
  }
  // Why the communicator is gone (comm_aborted_): the abort's reason, or,
  // for the destructor's abort of ops that did not finish, that.
  absl::Status AbortReasonLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return abort_reason_.ok() ? absl::CancelledError(StrCat(Describe(), ": aborted")) : abort_reason_;
  }

  // Runs `enqueue` on the stream after checking the tensors, and `done`
  // once the GPU finished it (or with the abort's reason).
  void Launch(std::string_view op, std::vector<Tensor> tensors, DoneFn done, Enqueue enqueue) {
    if (absl::Status aborted = AbortedStatus(); !aborted.ok()) return done(aborted);
    const Device gpu{DeviceType::kCuda, options_.device};
    for (const Tensor& t : tensors) {
      if (t.device() != gpu) return done(Error(op, StrCat("a tensor on ", t.device().ToString())));
      if (t.dtype() != tensors[0].dtype()) return done(Error(op, "tensors of different dtypes"));
    }
    absl::StatusOr<ncclDataType_t> type = NcclType(tensors[0].dtype());
    if (!type.ok()) return done(Error(op, std::string(type.status().message())));
    // `this` outlives both: the work runs inside Enqueue (a CUDA stream's
    // runs on the calling thread), and the destructor shuts the stream down,
    // dropping callbacks not yet called, before anything else goes.
    NcclCommunicator* self = this;
    const std::string what = StrCat(Describe(), ": ", op);
    stream_->Enqueue([self, what, tensors, enqueue = std::move(enqueue), type = *type]() -> absl::Status {
      std::lock_guard<std::mutex> op(self->calls_mu_);  // one op (its calls and their polling) at a time
      // The GPU's issue order (NcclOptions.sequence), held from the wait
      // for the op issued before this one to the record behind it.
      NcclSequence* sequence = self->options_.sequence.get();
      std::unique_lock<std::mutex> order;
      if (sequence != nullptr) order = sequence->Lock();
      const auto stream = static_cast<cudaStream_t>(self->stream_->native());
      if (sequence != nullptr) {
        if (const cudaError_t e = sequence->After(stream); e != cudaSuccess) {
          return absl::InternalError(StrCat(what, ": waiting for the GPU's previous NCCL op: ", cudaGetErrorString(e)));
        }
      }
      // Every call with the handle holds mu_ and first checks the abort:
      // ncclCommAbort (the watcher's, Abort's) frees the communicator, so a
      // call after it, or during it, would read freed memory. A
      // non-blocking communicator's calls return at once, so holding mu_
      // across one never holds up an abort for long.
      std::unique_lock<std::mutex> lock(self->mu_);
      if (self->comm_aborted_) return self->AbortReasonLocked();
      ncclResult_t r = enqueue(stream, type);
      // Still enqueuing (connecting to peers, say): wait for it, letting an
      // abort in between polls.
      while (r == ncclInProgress) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        lock.lock();
        if (self->comm_aborted_) return self->AbortReasonLocked();
        if (ncclCommGetAsyncError(self->comm_, &r) != ncclSuccess) break;
      }
      if (r != ncclSuccess) return absl::InternalError(StrCat(what, ": ", Explain(r, self->comm_)));
      if (sequence != nullptr) {
        if (const cudaError_t e = sequence->Behind(stream); e != cudaSuccess) {
          return absl::InternalError(StrCat(what, ": recording the GPU's NCCL order: ", cudaGetErrorString(e)));
        }
      }
      return absl::OkStatus();
    });
    stream_->OnComplete([self, tensors = std::move(tensors), done = std::move(done)](absl::Status status) {
      // An abort wins: what completed after it may hold anything.
      if (absl::Status aborted = self->AbortedStatus(); !aborted.ok()) status = aborted;
      done(std::move(status));
    });
  }

  void AbortComm() {
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_aborted_) return;
    comm_aborted_ = true;
    ncclCommAbort(comm_);
  }

  // Polls the communicator's asynchronous error (a dead peer, the network)
  // and aborts on one.
  void Watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!closing_) {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (closing_ || comm_aborted_) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t got = ncclCommGetAsyncError(comm_, &state);
      if (got == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) continue;
      const ncclResult_t error = got != ncclSuccess ? got : state;
      if (abort_reason_.ok()) {
        abort_reason_ =
            absl::UnavailableError(StrCat(Describe(), ": ", Explain(error, comm_), "; the communicator is aborted"));
      }
      comm_aborted_ = true;
      ncclCommAbort(comm_);
    }
  }

  const NcclOptions options_;
  ncclComm_t comm_;
  std::unique_ptr<Stream> stream_;
  std::mutex calls_mu_;  // held for a whole op, taken before mu_
  // Guards the handle: every NCCL call with comm_ holds it (the watcher's
  // polls, the aborts, the destroy, the ops' calls), so none runs during or
  // after ncclCommAbort, which frees the communicator.
  std::mutex mu_;
  std::condition_variable cv_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
  bool comm_aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Communicator>> MakeNcclCommunicator(const NcclOptions& options) {
  const std::string who = StrCat("nccl group '", options.group, "' rank ", options.rank, "/", options.size);
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(StrCat(who, ": no such rank"));
  }
  if (options.size > 1 && options.kv == nullptr) {
    return absl::InvalidArgumentError(StrCat(who, ": a group of several ranks needs a KvStore to meet"));
  }
  absl::StatusOr<std::unique_ptr<Stream>> stream =
      MakeCudaStream(options.device, StrCat("cuda:", options.device, " collective stream"));
  if (!stream.ok()) return absl::Status(stream.status().code(), StrCat(who, ": ", stream.status().message()));
  // The unique id: made by rank 0, met through the KV.
  ncclUniqueId id;
  const std::string key = StrCat(options.kv_prefix, "/nccl/", options.group);
  if (options.rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return absl::InternalError(StrCat(who, ": ncclGetUniqueId: ", Explain(r, nullptr)));
    }
    if (options.size > 1) RETURN_IF_ERROR(options.kv->Set(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    absl::StatusOr<std::vector<std::string>> values;
    if (options.cancel != nullptr) {
      CancellableKvStore view(*options.kv, *options.cancel);
      values = view.Wait({key}, absl::Seconds(options.timeout_s));
    } else {
      values = options.kv->Wait({key}, absl::Seconds(options.timeout_s));
    }
    if (absl::IsCancelled(values.status())) {
      return absl::CancelledError(StrCat(who, ": given up, another member failed"));
    }
    if (!values.ok()) {
      return absl::DeadlineExceededError(
          StrCat(who, ": rank 0's unique id never came (", values.status().message(), ")"));
    }
    if (values->at(0).size() != sizeof(id.internal)) {
      return absl::InvalidArgumentError(
          StrCat(who, ": a unique id of ", values->at(0).size(), " bytes under '", key, "'"));
    }
    std::memcpy(id.internal, values->at(0).data(), sizeof(id.internal));
  }
  if (options.size > 1) {
    static std::once_flag warned;
    if (const std::string warning = LazyModuleLoadingWarning(std::getenv("CUDA_MODULE_LOADING")); !warning.empty()) {
      std::call_once(warned, [&] { TLOG_WARN("{}", warning); });
    }
  }
  // Non-blocking creation, polled: peers that never come are a timeout.
  if (const cudaError_t err = cudaSetDevice(options.device); err != cudaSuccess) {
    return absl::FailedPreconditionError(StrCat(who, ": cuda:", options.device, ": ", cudaGetErrorString(err)));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.timeout_s);
  while (r == ncclInProgress) {
    if (Cancelled(options)) {
      ncclCommAbort(comm);
      return absl::CancelledError(StrCat(who, ": given up, another member failed"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(
          StrCat(who, ": the group did not form within ", options.timeout_s, " s (a peer missing?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) {
    const std::string why = Explain(r, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::InternalError(StrCat(who, ": ncclCommInitRankConfig: ", why));
  }
  return std::shared_ptr<Communicator>(std::make_shared<NcclCommunicator>(options, comm, *std::move(stream)));
}

}  // namespace tessera::comm

#else  // no CUDA

namespace tessera::comm {

class NcclSequence {};

absl::StatusOr<std::shared_ptr<NcclSequence>> MakeNcclSequence(int device) {
  return absl::UnimplementedError("cuda:" + std::to_string(device) + ": this build of Tessera has no CUDA support");
}

absl::StatusOr<std::shared_ptr<Communicator>> MakeNcclCommunicator(const NcclOptions& options) {
  return absl::UnimplementedError("nccl group '" + options.group + "': this build of Tessera has no CUDA support");
}

}  // namespace tessera::comm

#endif
