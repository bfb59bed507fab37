#pragma once
// OpRunner: runs a task's op on the tensors its TensorRefs name, each the
// front ready register of a consumed desc, the register being written of a
// produced desc, or one of the actor's own state tensors (Parameter). Used
// by the Compute and Parameter kinds, on the actor's thread only.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "actors/op_profile.h"
#include "comm/proto/plan.pb.h"
#include "core/status.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "ops/eager.h"
#include "ops/kernel_context.h"
#include "ops/registry.h"

namespace tessera::actors::internal {

class OpRunner {
 public:
  enum class Where : uint8_t { kConsumed, kProduced, kState };
  struct Ref {
    Where where;
    int slot;    // index into consumed / produced / state
    int tensor;  // tensor index within the register
    std::optional<Shape> view = std::nullopt;  // an input read as this shape (TensorRef.view_shape)
  };

  // Resolves the task's refs against its consumed and produced desc ids. A
  // task without an op runs nothing (has_op() false).
  absl::Status Init(const proto::Task& task, const ops::OpRegistry& registry, const std::vector<int64_t>& consumed_ids,
                    const std::vector<int64_t>& produced_ids);

  bool has_op() const { return schema_ != nullptr; }
  // Times each act's kernel into `profile` (actors/op_profile.h) under the
  // op's name and `device`, except in the first iteration of a run of
  // several (`iterations`, ActorEnvironment::iterations).
  void set_profile(OpProfile* profile, std::string device, int64_t iterations) {
    profile_ = profile;
    profile_device_ = std::move(device);
    profile_iterations_ = iterations;
  }
  // The kernel's workspace for every act (KernelContext::workspace).
  void set_workspace(Tensor workspace) { ctx_.workspace = std::move(workspace); }

  // Runs the op for act `act` of `task`; `lookup(ref)` gives the tensor each
  // ref names for this act. The kernel step is act / acts_per_step, the
  // micro-batch act % pieces_per_iteration.
  template <typename Lookup>
  absl::Status Run(const proto::Task& task, Lookup&& lookup, int64_t act, int64_t start_iteration, ThreadPool* pool,
                   const Device& device) {
    RETURN_IF_ERROR(Bind(lookup));
    RETURN_IF_ERROR(Prepare(task, act, start_iteration, pool, device));
    if (!Timed(task, act)) return ops::RunKernel(*schema_, ctx_);
    const int64_t started = SteadyNowNs();
    RETURN_IF_ERROR(ops::RunKernel(*schema_, ctx_));
    profile_->Add(schema_->name(), profile_device_, SteadyNowNs() - started);
    return absl::OkStatus();
  }

  // As Run, but enqueues the kernel on `stream` (core/stream.h) with a copy
  // of this act's context (the tensors it names stay alive with it) and
  // returns at once; the kernel's error goes to the stream's next callback.
  // Errors here: the act's slices.
  template <typename Lookup>
  absl::Status Launch(const proto::Task& task, Lookup&& lookup, int64_t act, int64_t start_iteration, ThreadPool* pool,
                      const Device& device, Stream& stream) {
    RETURN_IF_ERROR(Bind(lookup));
    RETURN_IF_ERROR(Prepare(task, act, start_iteration, pool, device));
    ops::KernelContext ctx = ctx_;
    ctx.stream = &stream;
    std::shared_ptr<Stream::Timer> timer;  // the kernel's time on the stream, when profiled
    if (Timed(task, act)) {
      ASSIGN_OR_RETURN(timer, stream.StartTimer());
    }
    stream.Enqueue([schema = schema_, attrs = attrs_, ctx = std::move(ctx)]() mutable { return ops::RunKernel(*schema, ctx); });
    if (timer != nullptr) {
      timer->Stop();
      stream.OnComplete(
          [timer, profile = profile_, op = schema_->name(), device = profile_device_](absl::Status status) {
            if (!status.ok()) return;
            if (absl::StatusOr<int64_t> ns = timer->ElapsedNs(); ns.ok()) profile->Add(op, device, *ns);
          });
    }
    return absl::OkStatus();
  }

 private:
  // The act's tensors into the context: each ref's, an input with a view
  // read as its shape (no copy).
  template <typename Lookup>
  absl::Status Bind(Lookup& lookup) {
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const Tensor& t = lookup(inputs_[i]);
      if (!inputs_[i].view) {
        ctx_.inputs[i] = t;
        continue;
      }
      ASSIGN_OR_RETURN(ctx_.inputs[i], t.Reshape(*inputs_[i].view));
    }
    for (size_t i = 0; i < outputs_.size(); ++i) ctx_.outputs[i] = lookup(outputs_[i]);
    return absl::OkStatus();
  }
  // Completes the context once it holds this act's tensors: slices (the
  // micro-batch's offsets), step, threads, device.
  absl::Status Prepare(const proto::Task& task, int64_t act, int64_t start_iteration, ThreadPool* pool,
                       const Device& device);
  bool Timed(const proto::Task& task, int64_t act) const {
    return profile_ != nullptr && (profile_iterations_ <= 1 || act / std::max<int64_t>(1, task.acts_per_step()) > 0);
  }

  const ops::OpSchema* schema_ = nullptr;
  // Shared with the kernels a Launch enqueued: one left running after the
  // job is gone (a hung kernel) still reads them.
  std::shared_ptr<const ops::AttrMap> attrs_;
  std::vector<Ref> inputs_, outputs_;
  OpProfile* profile_ = nullptr;  // set_profile
  std::string profile_device_;
  int64_t profile_iterations_ = 0;
  bool any_slice_ = false;
  std::vector<int64_t> base_input_offsets_, base_output_offsets_;  // offset[0] of micro-batch 0
  ops::KernelContext ctx_;
};

}  // namespace tessera::actors::internal
