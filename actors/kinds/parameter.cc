// Parameter (DESIGN §8): owns a variable and its optimizer state. Its
// produced desc (register_num 1) is the variable, initialised by the host's
// initializer or the plan's init rules; it emits the variable once per
// iteration and, when every reader acked and the gradient (its consumed
// descs) arrived, runs the update op in place. After the last update the
// host's finalizer, if any, gets the trained values.
//
// Act condition: emitting — iterations left (the run's gate admitting
// each) and the variable free (every reader acked); updating — every
// consumed desc has a ready register and the variable is free.
//
// States:  emit --(send ready)--> update (emit, without a gradient)
//          update --(run the update, ack the gradient)--> emit
//          after the last iteration: update --(finalizer)--> Eord sent
//                                           --(variable back)--> done
// A gradient stream that ends before the last update is an error.
// Asynchronous (Task.async_acts): the update is enqueued on the device's
// stream; the gradients go back, and the variable out again or to the
// finalizer, only once it completed.

#include "actors/actor_id.h"
#include "actors/init_rules.h"
#include "actors/kinds/kinds.h"
#include "actors/kinds/op_runner.h"
#include "core/status.h"

namespace tessera::actors::internal {
namespace {

class ParameterActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    for (const auto& desc : task_.state()) {
      ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromProto(desc));
      ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(meta.shape, meta.dtype, DecodeActorId(id()).device()));
      state_.push_back(std::move(t));
    }
    if (env_.arena != nullptr) {
      int64_t variable_bytes = 0, state_bytes = 0;
      for (const Tensor& t : Variable()) variable_bytes += static_cast<int64_t>(t.NumBytes());
      for (const Tensor& t : state_) state_bytes += static_cast<int64_t>(t.NumBytes());
      env_.arena->CountHeld(DecodeActorId(id()).device_index, variable_bytes, state_bytes);
    }
    // A host initializer (a run going on from trained values) takes
    // precedence over the plan's init rules.
    // On a GPU both write host copies, copied over after.
    std::vector<Tensor> all = Variable();
    all.insert(all.end(), state_.begin(), state_.end());
    const bool on_gpu = DecodeActorId(id()).device_type != DeviceType::kCpu;
    std::vector<Tensor> host_all = all;
    if (on_gpu) {
      ASSIGN_OR_RETURN(host_all, PinnedLike(all));
    }
    auto host = task_.callback().empty() ? env_.callbacks->initializers.end()
                                         : env_.callbacks->initializers.find(task_.callback());
    if (host != env_.callbacks->initializers.end()) {
      RETURN_IF_ERROR(host->second(host_all));
    } else if (task_.init_size() > 0) {
      RETURN_IF_ERROR(RunInitRules(task_, *env_.registry, host_all));
    } else if (!task_.callback().empty()) {
      return absl::NotFoundError(StrCat("no initializer callback '", task_.callback(), "' and no init rules"));
    }
    if (on_gpu) RETURN_IF_ERROR(CopyAll(all, host_all));
    RETURN_IF_ERROR(runner_.Init(task_, *env_.registry, DescIds(task_.consumed_register_desc_ids()),
                                 DescIds(task_.produced_register_desc_ids())));
    if (env_.profile != nullptr)
      runner_.set_profile(env_.profile, DecodeActorId(id()).device().ToString(), env_.iterations);
    return absl::OkStatus();
  }

 private:
  std::vector<Tensor>& Variable() { return produced_[0].registers->registers[0]; }

  absl::StatusOr<bool> ActOnce() override {
    Produced& variable = produced_[0];
    if (task_.async_acts()) {
      ASSIGN_OR_RETURN(const bool retired, Retire());
      if (retired) return true;
      // The variable goes out again, or to the finalizer, only once the
      // update wrote it.
      if (acts_in_flight() > 0) return false;
      if (finalize_) {
        finalize_ = false;
        RETURN_IF_ERROR(Finalize());
        return true;
      }
    }
    if (awaiting_update_) {
      if (!AllConsumedReady() || !variable.all_free()) return false;
      const bool last = emitted_ >= limit_.Total(task_, env_);
      if (task_.async_acts()) {
        // The update on the stream; the gradients go back when it completed.
        std::vector<int32_t> gradients;
        for (Consumed& c : consumed_) {
          gradients.push_back(c.ready.front());
          c.ready.pop_front();
        }
        auto lookup = [&](const OpRunner::Ref& r) -> const Tensor& {
          if (r.where == OpRunner::Where::kConsumed) {
            const auto slot = static_cast<size_t>(r.slot);
            return consumed_[slot].registers->registers[static_cast<size_t>(gradients[slot])][static_cast<size_t>(r.tensor)];
          }
          if (r.where == OpRunner::Where::kState) return state_[static_cast<size_t>(r.slot)];
          return Variable()[static_cast<size_t>(r.tensor)];
        };
        const absl::Status launched = runner_.Launch(task_, lookup, emitted_ - 1, env_.start_iteration, env_.pool,
                                                     DecodeActorId(id()).device(), *env_.stream);
        if (!launched.ok()) env_.stream->Enqueue([launched] { return launched; });
        Defer([this, gradients = std::move(gradients)] {
          if (env_.arena != nullptr) {
            for (size_t i = 0; i < consumed_.size(); ++i) env_.arena->Release(consumed_[i].desc_id, gradients[i]);
          }
          for (size_t i = 0; i < consumed_.size(); ++i) {
            env_.bus->Send(Message::Ack(id(), consumed_[i].producer, consumed_[i].desc_id, gradients[i]));
          }
        });
        awaiting_update_ = false;
        finalize_ = last;
        return true;
      }
      if (runner_.has_op()) {
        auto lookup = [this](const OpRunner::Ref& r) -> const Tensor& {
          if (r.where == OpRunner::Where::kConsumed) return FrontTensors(consumed_[static_cast<size_t>(r.slot)])[static_cast<size_t>(r.tensor)];
          if (r.where == OpRunner::Where::kState) return state_[static_cast<size_t>(r.slot)];
          return Variable()[static_cast<size_t>(r.tensor)];
        };
        RETURN_IF_ERROR(runner_.Run(task_, lookup, emitted_ - 1, env_.start_iteration, env_.pool, DecodeActorId(id()).device()));
      }
      AckAll();
      awaiting_update_ = false;
      if (last) RETURN_IF_ERROR(Finalize());
      return true;
    }
    if (emitted_ >= limit_.Total(task_, env_) || !variable.all_free()) return false;
    if (!limit_.MayEmit(task_, env_, emitted_)) {
      // The run's gate ended the run here: the last update is done (the
      // variable is back, no gradient outstanding).
      RETURN_IF_ERROR(Finalize());
      return true;
    }
    SendReady(variable, TakeFree(variable));
    ++emitted_;
    ++act_count_;
    awaiting_update_ = !consumed_.empty();
    return true;
  }
  bool ShouldEnd() const override {
    return emitted_ >= limit_.Total(task_, env_) && acts_in_flight() == 0 && !finalize_;
  }
  absl::Status CheckEnd() const override {
    if (awaiting_update_ && AllConsumedExhausted()) {
      return absl::FailedPreconditionError("gradient stream ended before the last update");
    }
    return absl::OkStatus();
  }

  // Hands the trained variable and state to the host's finalizer, if any.
  absl::Status Finalize() {
    auto it = env_.callbacks->finalizers.find(task_.callback());
    if (task_.callback().empty() || it == env_.callbacks->finalizers.end()) return absl::OkStatus();
    std::vector<Tensor> all = Variable();
    all.insert(all.end(), state_.begin(), state_.end());
    if (DecodeActorId(id()).device_type != DeviceType::kCpu) {
      // The host keeps what it gets: fresh host copies, in pageable memory:
      // other actors' collectives may still be queued on the GPU, and a
      // page-locked allocation would wait for them (sink.cc).
      std::vector<Tensor> host;
      for (const Tensor& t : all) {
        ASSIGN_OR_RETURN(Tensor h, Tensor::Empty(t.shape(), t.dtype(), Device{DeviceType::kCpu, 0}));
        host.push_back(std::move(h));
      }
      RETURN_IF_ERROR(CopyAll(host, all));
      return it->second(host);
    }
    return it->second(all);
  }

  OpRunner runner_;
  std::vector<Tensor> state_;
  int64_t emitted_ = 0;
  bool awaiting_update_ = false;
  bool finalize_ = false;  // asynchronous: the last update launched, the finalizer due once it completed
  EmitLimit limit_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeParameterActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<ParameterActor>(task, env);
}

}  // namespace tessera::actors::internal
