#pragma once
// The embedding API (DESIGN §11): compile a logical graph into a job and run
// it through the actor runtime.
//
//   ASSIGN_OR_RETURN(auto engine, Engine::Compile(std::move(graph), {}));
//   RETURN_IF_ERROR(engine->Run(100, feed, fetch));
//
// Compile applies Autodiff -> ApplyOptimizer -> EliminateDeadCode when
// options.train (the graph must have a loss). Run lowers the graph to a plan
// for `iterations` (scheduler/lower.h), serialises and parses it back, loads
// it into an actors::Runtime and runs it. Feeds are called on actor threads
// for every graph input (the learning rate "lr" included) every iteration,
// and for data inputs every micro-batch under gradient accumulation
// (options.num_micro_batches = m > 1: the graph is built at micro-batch size,
// Compile inserts repeat / acc between Autodiff and ApplyOptimizer, and the
// feed of micro-batch k of an iteration fills rows [k·b, (k+1)·b) of that
// iteration's global batch of m·b rows); iteration-rate inputs such as "lr"
// are fed with micro_batch 0. The fetch callback runs once per iteration
// with "loss" and every fetch (e.g. "grad_norm"), averaged over the
// micro-batches; its tensors are valid only during the call.
//
// Variables start from their init rules on the first Run; each later Run
// goes on from the values (and optimizer state) the previous one trained and
// from the next iteration (feeds, fetches, kernel steps count on), so
// Run(3) then Run(2) trains like Run(5) (a new Run with other layout
// options is not supported: the kept values are per shard). Not thread-safe.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "actors/runtime.h"
#include "comm/proto/plan.pb.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "graph/graph.h"
#include "graph/passes.h"
#include "scheduler/lower.h"
#include "train/feeds.h"

namespace tessera {

// Runs a serialised plan with these host callbacks; the default runs it in
// an actors::Runtime in this process. (Tests substitute a sequential oracle;
// a cluster client would ship the plan to workers.)
using PlanExecutor = std::function<absl::Status(std::string_view plan_bytes, actors::RuntimeOptions options)>;

// The most micro-batches an iteration accumulates (the plan has m times
// the actors' work per iteration to lower; train.num_accumulation_steps has
// the same bound).
inline constexpr int64_t kMaxMicroBatches = int64_t{1} << 20;

struct CompileOptions {
  bool train = true;
  graph::OptimizerOptions optimizer = {};
  int64_t num_micro_batches = 1;  // gradient accumulation steps (train only), at most kMaxMicroBatches
  // Recompute each recomputable segment (transformer layer) in backward
  // instead of keeping its activations (graph/passes.h RecomputeSegments).
  bool activation_checkpoint = false;
  // Mixed precision (graph/passes.h AutoMixedPrecision): bf16 or f16 runs
  // the matmuls in that type; f32 = off.
  DType amp = DType::kF32;
  // fp16 only: dynamic loss scaling (graph/passes.h ScaleLoss).
  graph::LossScaleOptions loss_scale = {};
  // Data parallelism without ZeRO or tensor parallelism: gradients smaller
  // than this are all-reduced in buckets of at most this many bytes
  // (graph/passes.h BucketGradients); 0 = each on its own.
  int64_t gradient_bucket_bytes = int64_t{25} << 20;
  scheduler::LowerOptions lower = {};  // iterations is set by Run / Plan
  double stall_timeout_s = 60;         // runtime deadlock guard (0 = none)
  PlanExecutor executor = {};          // empty = actors::Runtime
  // Intra-op threads of each device (the device's actor thread included);
  // 0 = the machine's hardware threads shared out over the devices (at
  // least 1: kernels then run on the device's own thread).
  int intra_op_threads = 0;
};

class Engine {
  // Only Compile makes an Engine (its graph must have been through the
  // passes: a training graph without them would run without an optimizer).
  struct Compiled {
    explicit Compiled() = default;
  };

 public:
  // train/feeds.h: the feed fills an input's logical tensor (the engine hands
  // each rank its shard); the fetch receives the loss and fetches.
  using FeedFn = tessera::FeedFn;
  using FetchFn = tessera::FetchFn;

  static absl::StatusOr<std::unique_ptr<Engine>> Compile(graph::Graph graph, const CompileOptions& options = {});
  Engine(Compiled, graph::Graph graph, CompileOptions options)
      : graph_(std::move(graph)), options_(std::move(options)), trained_(std::make_unique<Trained>()) {}
  // Destroying an Engine while another thread runs it cancels that Run (as
  // Cancel) and waits for it to return; not from one of that Run's own
  // feeds or fetches.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The plan of `iterations` iterations (what Run executes).
  absl::StatusOr<proto::Plan> Plan(int64_t iterations) const;
  // Runs `iterations` iterations from where the last successful Run ended.
  // One Run at a time: a Run started while another is in progress (from
  // another thread, or from a feed or fetch of that Run) is
  // FAILED_PRECONDITION and changes nothing.
  absl::Status Run(int64_t iterations, const FeedFn& feed, const FetchFn& fetch);
  // Stops the Run in progress (from any thread, a callback of it included):
  // every actor stops and that Run returns `reason` (an OK `reason`: the
  // default's CANCELLED, a stopped Run never returns OK); the engine stays as
  // after any failed Run (the next Run continues from the last successful
  // one). Without a Run in progress, nothing happens. (A
  // CompileOptions::executor's run is the executor's to stop.)
  void Cancel(absl::Status reason = absl::CancelledError("the run was cancelled (Engine::Cancel)"));

  // The compiled graph (after the training passes).
  const graph::Graph& graph() const { return graph_; }
  // Kernel threads each device used in the last Run (its own thread included).
  int threads_per_device() const { return threads_per_device_; }
  // The last Run's arenas: per device, the arena's bytes and the most of them
  // in use at once (actors/arena.h); empty when an executor ran the plan.
  const std::vector<actors::ArenaMonitor::Use>& arena_uses() const { return arena_uses_; }

 private:
  // Trained variables and state per parameter shard (initializer callback
  // name), written by the parameters' finalizers on device threads.
  struct Trained {
    std::mutex mu;
    std::map<std::string, std::vector<Tensor>> values;
  };

  graph::Graph graph_;
  CompileOptions options_;
  std::unique_ptr<Trained> trained_;
  std::map<uint32_t, std::unique_ptr<ThreadPool>> pools_;  // per device, made by the first Run
  int64_t iterations_done_ = 0;  // by successful runs: the next run's first iteration
  std::atomic<bool> running_ = false;
  // The runtime of the Run in progress, and a Cancel that came before it
  // was loaded.
  std::mutex cancel_mu_;
  std::condition_variable run_ended_;  // under cancel_mu_, when running_ turns false
  actors::Runtime* active_ = nullptr;
  std::optional<absl::Status> cancelled_;
  int threads_per_device_ = 0;
  std::vector<actors::ArenaMonitor::Use> arena_uses_;
};

}  // namespace tessera
