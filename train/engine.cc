#include "train/engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "actors/plan.h"
#include "actors/runtime.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/storage.h"
#include "core/strings.h"
#include "core/tensor_util.h"
#include "train/feeds.h"

namespace tessera {

namespace {

// What the passes and the runtime take on trust; the config path's schema
// checks the same ranges for `tessera train`.
absl::Status CheckCompileOptions(const CompileOptions& options) {
  const auto fail = [](auto&&... parts) { return absl::InvalidArgumentError(StrCat("engine: ", parts...)); };
  if (options.num_micro_batches < 1 || options.num_micro_batches > kMaxMicroBatches) {
    return fail("num_micro_batches must be in [1, ", kMaxMicroBatches, "], got ", options.num_micro_batches);
  }
  if (options.intra_op_threads < 0 || options.intra_op_threads > 1024) {
    return fail("intra_op_threads must be in [0, 1024] (0: the machine's threads shared out), got ",
                options.intra_op_threads);
  }
  if (!(options.stall_timeout_s >= 0) || std::isinf(options.stall_timeout_s)) {
    return fail("stall_timeout_s must be a finite number of seconds >= 0 (0: no deadlock guard), got ",
                options.stall_timeout_s);
  }
  if (options.gradient_bucket_bytes < 0) {
    return fail("gradient_bucket_bytes must be >= 0 (0: no buckets), got ", options.gradient_bucket_bytes);
  }
  if (options.amp != DType::kF32 && options.amp != DType::kBF16 && options.amp != DType::kF16) {
    return fail("amp must be f32 (off), bf16 or f16, got ", DTypeName(options.amp));
  }
  const graph::OptimizerOptions& o = options.optimizer;
  if (o.kind != graph::OptimizerKind::kSgd && o.kind != graph::OptimizerKind::kAdamW) {
    return fail("optimizer.kind ", static_cast<int>(o.kind), " is neither kSgd nor kAdamW");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Compile(graph::Graph graph, const CompileOptions& options) {
  RETURN_IF_ERROR(CheckCompileOptions(options));
  // (Here, not at each Run: the lowering's own checks of its options.)
  RETURN_IF_ERROR(scheduler::CheckLowerOptions(graph, options.lower));
  // A fetch named as one the engine makes would stand in for it (a fetch
  // "grad_norm" replaced the optimizer's gradient norm) or collide with it.
  for (const auto& [name, value] : graph.fetches()) {
    const bool loss_name = name.starts_with("loss") &&
                           std::all_of(name.begin() + 4, name.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (loss_name || name == "grad_norm" || name == "loss_scale" || name == "skipped") {
      return absl::InvalidArgumentError(StrCat("engine: fetch '", name,
                                               "' is named as one the engine makes ('loss', 'loss1', ..., "
                                               "'grad_norm', 'loss_scale', 'skipped'): name it otherwise"));
    }
  }
  if (options.activation_checkpoint && !options.train) {
    return absl::InvalidArgumentError("engine: activation checkpointing needs train = true");
  }
  if (options.num_micro_batches > 1 && !options.train) {
    return absl::InvalidArgumentError("engine: micro-batches (gradient accumulation) need train = true");
  }
  // The same bits in one pass instead of three (graph/passes.h); on a
  // forward graph only (a caller may hand in one it differentiated itself).
  const bool forward_only = std::none_of(graph.nodes().begin(), graph.nodes().end(), [](const graph::Node& n) {
    return n.backward || n.kind == graph::NodeKind::kRepeat || n.kind == graph::NodeKind::kAcc;
  });
  if (forward_only) RETURN_IF_ERROR(graph::FuseBiasDropoutAdd(graph).status());
  if (options.amp != DType::kF32) {
    ASSIGN_OR_RETURN(graph::MixedPrecisionResult mixed, graph::AutoMixedPrecision(graph, options.amp));
    if (mixed.ops == 0) return absl::InvalidArgumentError("train.amp.enabled: the model has no f32 matmuls to cast");
  }
  if (options.train) {
    if (graph.losses().size() != 1) {
      return absl::InvalidArgumentError(StrCat("engine: training needs exactly one loss, the graph has ", graph.losses().size()));
    }
    // fp16: autodiff differentiates the loss times a dynamic scale; the
    // gradients are divided by it before the optimizer, which skips the step
    // when they overflowed.
    std::optional<graph::LossScaleResult> scaled;
    // The loss scale's state variables through a pass's remap (they live
    // on: the optimizer reads them).
    const auto remap_scaled = [&scaled](const std::vector<graph::ValueId>& remap) -> absl::Status {
      if (!scaled) return absl::OkStatus();
      for (graph::ValueId* id : {&scaled->scale, &scaled->good_steps, &scaled->skipped_steps}) {
        const auto old = static_cast<size_t>(*id);
        if (*id < 0 || old >= remap.size() || remap[old] == graph::kNoValue) {
          return absl::InternalError(StrCat("engine: a graph pass removed the fp16 loss scale's value ", *id));
        }
        *id = remap[old];
      }
      return absl::OkStatus();
    };
    graph::ValueId differentiated = graph.losses()[0];
    if (options.num_micro_batches > 1) {
      // The loss of the global batch is the mean of the micro-batches':
      // each micro-batch's backward starts from 1/m (AccumulateGradients
      // then sums), so its upstream values are those of a run of the whole
      // batch, and round alike under bf16/fp16 autocasting (the 1/m applied
      // after the sum made them differ there by ~1e-4 where m is no power
      // of 2; data parallelism, dividing by the global batch, agreed).
      const graph::NodeOptions at{.layer_idx = graph.producer(differentiated).layer_idx,
                                  .scope = graph.producer(differentiated).scope,
                                  .name = ""};
      ASSIGN_OR_RETURN(std::vector<graph::ValueId> mean,
                       graph.AddOp("scalar_mul", {differentiated},
                                   {{"value", 1.0 / static_cast<double>(options.num_micro_batches)}}, at));
      differentiated = mean.front();
    }
    if (options.amp == DType::kF16) {
      ASSIGN_OR_RETURN(scaled, graph::ScaleLoss(graph, differentiated, options.loss_scale));
      differentiated = scaled->scaled_loss;
    }
    ASSIGN_OR_RETURN(graph::GradientMap gradients, graph::Autodiff(graph, differentiated));
    if (gradients.empty()) {
      // (A trainable integer variable gets no gradient: said, since it was
      // "trainable" to its author.)
      std::string integer;
      for (graph::ValueId v : graph.Variables()) {
        const graph::Node& node = graph.producer(v);
        if (node.variable && node.variable->trainable && !IsFloatingPoint(graph.value(v).meta.dtype)) {
          integer = StrCat(" (variable '", graph.value(v).name, "' is ", DTypeName(graph.value(v).meta.dtype),
                           ": integers get no gradient)");
          break;
        }
      }
      return absl::InvalidArgumentError(
          StrCat("engine: the loss depends on no trainable variable: training would change nothing", integer));
    }
    // The scaled loss was autodiff's root only: nothing reads it, and the
    // passes below may drop it.
    if (scaled) scaled->scaled_loss = graph::kNoValue;
    if (options.amp != DType::kF32) {
      ASSIGN_OR_RETURN(graph::CastRoundTripResult folded, graph::FoldCastRoundTrips(graph, gradients));
      gradients = std::move(folded.gradients);
      RETURN_IF_ERROR(remap_scaled(folded.remap));
    }
    ASSIGN_OR_RETURN(const scheduler::DeviceMesh mesh, scheduler::DeviceMesh::Make(options.lower.parallel));
    const graph::SameStageFn same_stage = [&mesh](int64_t a, int64_t b) {
      const absl::StatusOr<int64_t> sa = mesh.StageOfLayer(a), sb = mesh.StageOfLayer(b);
      return sa.ok() && sb.ok() && *sa == *sb;
    };
    {
      // Under gradient accumulation a weight's gradient terms from other
      // stages stay apart, to be accumulated on their stages.
      ASSIGN_OR_RETURN(graph::AddFoldResult summed,
                       graph::FoldAddsIntoProducers(graph, gradients,
                                                    options.num_micro_batches > 1 ? same_stage : graph::SameStageFn()));
      gradients = std::move(summed.gradients);
      RETURN_IF_ERROR(remap_scaled(summed.remap));
    }
    if (options.activation_checkpoint) {
      ASSIGN_OR_RETURN(graph::RecomputeResult recomputed, graph::RecomputeSegments(graph, gradients, same_stage));
      if (recomputed.segments == 0) {
        return absl::InvalidArgumentError(
            "train.activation_checkpoint.enabled: the model has no recomputable layers (nn/ marks transformer layers)");
      }
      gradients = std::move(recomputed.gradients);
      RETURN_IF_ERROR(remap_scaled(recomputed.remap));
    }
    if (options.num_micro_batches > 1) {
      ASSIGN_OR_RETURN(graph::AccumulationResult accumulated,
                       graph::AccumulateGradients(graph, gradients, options.num_micro_batches, same_stage,
                                                  /*root_scaled=*/true));
      gradients = std::move(accumulated.gradients);
      RETURN_IF_ERROR(remap_scaled(accumulated.remap));
    }
    // (Over one data-parallel rank nothing is sharded: the copies would only
    // cost time and memory.)
    if (options.lower.zero_stage == 3 && mesh.hierarchy()[0] > 1) {
      ASSIGN_OR_RETURN(graph::GatherPerReaderResult gathered, graph::GatherPerReader(graph, gradients));
      gradients = std::move(gathered.gradients);
      RETURN_IF_ERROR(remap_scaled(gathered.remap));
    }
    if (options.lower.zero_stage == 0 && mesh.hierarchy()[0] > 1 && mesh.hierarchy()[1] == 1) {
      RETURN_IF_ERROR(graph::BucketGradients(graph, gradients, options.gradient_bucket_bytes,
                                             NdSbp{Sbp::Broadcast(), Sbp::Broadcast()}, same_stage)
                          .status());
    }
    graph::UnscaleResult unscaled;
    if (scaled) {
      ASSIGN_OR_RETURN(unscaled, graph::UnscaleGradients(graph, gradients, *scaled, options.loss_scale));
    }
    ASSIGN_OR_RETURN(graph::OptimizerResult optimizer,
                     graph::ApplyOptimizer(graph, gradients, options.optimizer, unscaled.skip, unscaled.skipped));
    (void)optimizer;
  }
  ASSIGN_OR_RETURN(std::vector<graph::ValueId> remap, graph::EliminateDeadCode(graph));
  (void)remap;
  return std::make_unique<Engine>(Compiled(), std::move(graph), options);
}

namespace {

// The plan of `iterations` from `start`, its size and lowering time logged
// (info): `tessera plan` and every Run.
absl::StatusOr<scheduler::LoweredPlan> LowerLogged(const graph::Graph& graph, scheduler::LowerOptions lower,
                                                   int64_t iterations, int64_t start) {
  lower.iterations = iterations;
  lower.start_iteration = start;
  const auto started = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, scheduler::LowerToPlan(graph, lower));
  TLOG_INFO("plan: {} actors and {} register descs on {} devices, lowered in {:.1f} ms", lowered.plan.tasks_size(),
            lowered.plan.register_descs_size(), std::max<int64_t>(1, lower.parallel.world_size),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  return lowered;
}

}  // namespace

absl::StatusOr<proto::Plan> Engine::Plan(int64_t iterations) const {
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, LowerLogged(graph_, options_.lower, iterations, iterations_done_));
  return lowered.plan;
}

namespace {

// Fails when the plan's memory estimate exceeds the machine's physical
// memory (all devices of an in-process run share it), before anything is
// allocated.
absl::Status CheckMemory(const proto::Plan& plan) {
  int64_t total = 0;
  for (const proto::DeviceMemory& device : plan.memory_estimate()) {
    if (device.bytes() < 0 || __builtin_add_overflow(total, device.bytes(), &total)) total = INT64_MAX;
  }
  const HostMemoryLimit limit = HostMemoryLimitNow();
  const double available = static_cast<double>(limit.bytes);
  if (static_cast<double>(total) <= available) return absl::OkStatus();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return absl::ResourceExhaustedError(
      StrCat(fmt::format("the plan needs {:.3g} GiB on {} devices, but this machine has {:.3g} GiB",
                         static_cast<double>(total) / kGiB, plan.memory_estimate_size(), available / kGiB),
             " (", limit.source, "; see `tessera plan` for the memory per device)"));
}

}  // namespace

absl::Status Engine::Run(int64_t iterations, const FeedFn& feed, const FetchFn& fetch) {
  if (running_.exchange(true)) {
    return absl::FailedPreconditionError(
        "Engine::Run: this engine is already running (a Run from another thread, or from a feed or fetch of the "
        "Run in progress); an Engine runs one Run at a time");
  }
  const absl::Cleanup done = [this] {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    active_ = nullptr;
    cancelled_.reset();
    running_ = false;
    // Under the lock: a destructor waiting for this Run cannot go on (and
    // destroy the variable) before the notification is done.
    run_ended_.notify_all();
  };
  ASSIGN_OR_RETURN(scheduler::LoweredPlan lowered, LowerLogged(graph_, options_.lower, iterations, iterations_done_));
  if (!options_.executor) RETURN_IF_ERROR(CheckMemory(lowered.plan));

  actors::RuntimeOptions runtime;
  runtime.stall_timeout_s = options_.stall_timeout_s;
  runtime.registry = &graph_.registry();
  // Each virtual device gets its share of the machine's threads for kernels.
  const int64_t devices = std::max<int64_t>(1, options_.lower.parallel.world_size);
  const int threads = options_.intra_op_threads > 0
                          ? options_.intra_op_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency() / static_cast<unsigned>(devices)));
  if (threads > 1 && pools_.empty()) {
    for (int64_t d = 0; d < devices; ++d) {
      pools_[options_.lower.device_index + static_cast<uint32_t>(d)] = std::make_unique<ThreadPool>(threads);
    }
  }
  for (const auto& [device, pool] : pools_) runtime.device_pools[device] = pool.get();
  threads_per_device_ = pools_.empty() ? 1 : pools_.begin()->second->num_threads();
  TLOG_INFO("{} devices x {} intra-op threads", devices, threads_per_device_);
  RETURN_IF_ERROR(BindFeeds(lowered.plan, feed, runtime.callbacks));
  RETURN_IF_ERROR(BindFetch(lowered.plan, fetch, runtime.callbacks));
  // Each sink is called at least once per iteration: a run that returns OK
  // otherwise (an executor that ran nothing) trained nothing, whatever it
  // says.
  std::vector<std::pair<std::string, std::shared_ptr<std::atomic<int64_t>>>> sink_calls;
  for (auto& [name, sink] : runtime.callbacks.sinks) {
    auto calls = std::make_shared<std::atomic<int64_t>>(0);
    sink_calls.emplace_back(name, calls);
    sink = [inner = std::move(sink), calls](int64_t iteration, const std::vector<Tensor>& inputs) {
      calls->fetch_add(1, std::memory_order_relaxed);
      return inner(iteration, inputs);
    };
  }
  // Parameters start from their init rules in the plan; a later run goes on
  // from the values (and state) the last successful one trained, kept per
  // shard. A run's values are staged and kept only once it has succeeded:
  // one that fails after some shards finished (a data-parallel replica
  // done, another not) leaves the engine as before it, not half updated.
  Trained* keep = trained_.get();
  auto staged = std::make_shared<Trained>();
  for (const auto& task : lowered.plan.tasks()) {
    if (task.kind() != proto::ACTOR_KIND_PARAMETER || task.callback().empty()) continue;
    const std::string callback = task.callback();
    // Called after the parameter's last update: the runtime writes its
    // tensors no more, so the host keeps the tensors themselves (a copy
    // would double the parameters and optimizer state at the end of a run).
    runtime.callbacks.finalizers[callback] = [staged, callback](const std::vector<Tensor>& tensors) -> absl::Status {
      std::lock_guard<std::mutex> lock(staged->mu);
      staged->values[callback] = tensors;
      return absl::OkStatus();
    };
    if (!keep->values.contains(callback)) continue;
    runtime.callbacks.initializers[callback] = [keep, callback](const std::vector<Tensor>& tensors) -> absl::Status {
      std::lock_guard<std::mutex> lock(keep->mu);
      const std::vector<Tensor>& values = keep->values.at(callback);
      if (values.size() != tensors.size()) return absl::InternalError("initializer: tensor count mismatch");
      for (size_t i = 0; i < tensors.size(); ++i) {
        Tensor target = tensors[i];
        RETURN_IF_ERROR(target.CopyFrom(values[i]));
      }
      return absl::OkStatus();
    };
  }
  // DESIGN §2: the plan always goes through its serialised form.
  const std::string bytes = actors::SerializePlan(lowered.plan);
  const auto run_started = std::chrono::steady_clock::now();
  if (options_.executor) {
    RETURN_IF_ERROR(options_.executor(bytes, std::move(runtime)));
  } else {
    // A worker's path: the plan split per node (one node here) and node 0's
    // part loaded from its bytes, as a cluster worker loads its NodePlan.
    ASSIGN_OR_RETURN(std::vector<proto::NodePlan> parts, actors::SplitPlan(lowered.plan));
    if (parts.size() != 1) return absl::InternalError(StrCat("an in-process plan on ", parts.size(), " nodes"));
    ASSIGN_OR_RETURN(std::unique_ptr<actors::Runtime> rt,
                     actors::Runtime::LoadNodePlan(actors::SerializeNodePlan(parts[0]), std::move(runtime)));
    {
      std::lock_guard<std::mutex> lock(cancel_mu_);
      if (cancelled_) return *cancelled_;
      active_ = rt.get();
    }
    absl::Status ran = rt->Run();
    {
      std::lock_guard<std::mutex> lock(cancel_mu_);
      active_ = nullptr;
    }
    RETURN_IF_ERROR(ran);
    arena_uses_ = rt->stats().arenas;
  }
  for (const auto& [name, calls] : sink_calls) {
    if (calls->load() < iterations) {
      return absl::InternalError(StrCat("Engine::Run: the plan ", options_.executor ? "executor" : "runtime",
                                        " returned OK without running every iteration (sink '",
                                        EscapeControlChars(name), "' delivered ", calls->load(), " of ", iterations,
                                        ")"));
    }
  }
  TLOG_DEBUG("ran {} iterations ({} plan bytes) in {:.3f} s", iterations, bytes.size(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - run_started).count());
  {
    std::scoped_lock lock(keep->mu, staged->mu);
    for (auto& [callback, tensors] : staged->values) keep->values[callback] = std::move(tensors);
  }
  iterations_done_ += iterations;
  return absl::OkStatus();
}

Engine::~Engine() {
  Cancel(absl::CancelledError("the engine was destroyed during this Run"));
  std::unique_lock<std::mutex> lock(cancel_mu_);
  run_ended_.wait(lock, [this] { return !running_; });
}

void Engine::Cancel(absl::Status reason) {
  if (reason.ok()) reason = absl::CancelledError("the run was cancelled (Engine::Cancel)");
  std::lock_guard<std::mutex> lock(cancel_mu_);
  if (!running_) return;
  cancelled_ = reason;
  if (active_ != nullptr) active_->Abort(reason);
}

}  // namespace tessera
