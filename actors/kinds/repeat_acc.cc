// Repeat and Acc (DESIGN §8): the two ends of gradient accumulation over
// m = repeat_num micro-batches.
//
// Repeat hands out m pieces of tensor `input_tensor` of each consumed
// register without copying: the same tensor m times, or (when the produced
// tensor has 1/m of the rows) consecutive row slices. The consumed register
// is acked once all its pieces were emitted and came back.
//   Act condition: a ready consumed register, and a free produced one (to
//   emit a piece) or every produced register back (to ack the input).
//   States:  piece j < m --(emit a view)--> piece j + 1
//            piece m --(every piece acked: ack the input)--> piece 0
//            inputs Eord'ed and drained --> Eord sent --(pieces back)--> done
//
// Acc sums tensor `input_tensor` of m consumed registers into one produced
// register, acking each piece as it is added. Its other produced descs are
// window descs (RegisterDesc.window w): after adding piece k < m - w it
// hands a register of each to the Sources of its device.
//   Act condition: a ready consumed register, (for the first piece of a
//   sum) a free produced one, and (piece k < m - w) a free register of each
//   window desc.
//   States:  count 0 --(copy the piece)--> count 1 --(add)--> ...
//            count m - 1 --(add, hand the sum on)--> count 0
//            inputs Eord'ed and drained --> Eord sent --(sum acked)--> done
//   Inputs that end mid-sum are an error.
//   Asynchronous (Task.async_acts): each copy or add is enqueued on the
//   device's stream; the piece's ack, the window signals and the finished
//   sum go out when it completed (actors/kinds/compute.cc says how).

#include "actors/actor_id.h"
#include "actors/kinds/kinds.h"
#include "core/status.h"
#include "ops/eager.h"

namespace tessera::actors::internal {
namespace {

class RepeatActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() { return absl::OkStatus(); }

 private:
  absl::StatusOr<bool> ActOnce() override {
    Consumed& in = consumed_[0];
    Produced& out = produced_[0];
    if (in.ready.empty()) return false;
    if (pieces_ == task_.repeat_num()) {
      if (!out.all_free()) return false;
      AckFront(in);
      pieces_ = 0;
      return true;
    }
    if (out.free.empty()) return false;
    const int32_t index = TakeFree(out);
    const Tensor& source = FrontTensors(in)[static_cast<size_t>(task_.input_tensor())];
    Tensor& view = out.registers->registers[static_cast<size_t>(index)][0];
    const auto& dims = out.registers->desc->tensors(0).shape();
    if (dims.empty() || source.shape().rank() == 0 || dims[0] == source.shape()[0]) {
      view = source;
    } else {
      ASSIGN_OR_RETURN(view, source.SliceRows(pieces_ * dims[0], dims[0]));
    }
    SendReady(out, index);
    ++pieces_;
    ++act_count_;
    return true;
  }

  int64_t pieces_ = 0;  // pieces of the front consumed register emitted
};

class AccActor final : public Actor {
 public:
  using Actor::Actor;
  absl::Status InitKind() {
    ASSIGN_OR_RETURN(add_, env_.registry->Get("add"));
    static const ops::AttrMap* const no_attrs = new ops::AttrMap();  // outlives a kernel left running
    ctx_.attrs = no_attrs;
    ctx_.inputs.resize(2);
    ctx_.outputs.resize(1);
    ctx_.device = DecodeActorId(id()).device();
    if (produced_.size() > 1) out_window_ = produced_[1].registers->desc->window();
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<bool> ActOnce() override {
    if (task_.async_acts()) {
      ASSIGN_OR_RETURN(const bool retired, Retire());
      if (retired) return true;
    }
    Consumed& in = consumed_[0];
    Produced& out = produced_[0];
    if (in.ready.empty() || (count_ == 0 && out.free.empty())) return false;
    const bool signal = produced_.size() > 1 && count_ < task_.repeat_num() - out_window_;
    for (size_t w = 1; signal && w < produced_.size(); ++w) {
      if (produced_[w].free.empty()) return false;
    }
    if (count_ == 0) index_ = TakeFree(out);
    const Tensor& piece = FrontTensors(in)[static_cast<size_t>(task_.input_tensor())];
    Tensor& sum = out.registers->registers[static_cast<size_t>(index_)][0];
    ctx_.inputs[0] = sum;
    ctx_.inputs[1] = piece;
    ctx_.outputs[0] = sum;
    ctx_.pool = env_.pool;
    const bool first = count_ == 0, last = count_ + 1 == task_.repeat_num();
    if (!task_.async_acts()) {
      RETURN_IF_ERROR(first ? sum.CopyFrom(piece) : ops::RunKernel(*add_, ctx_));
      AckFront(in);
      for (size_t w = 1; signal && w < produced_.size(); ++w) SendReady(produced_[w], TakeFree(produced_[w]));
      if (last) SendReady(out, index_);
    } else {
      // The copy or add goes on the stream (in order behind the piece
      // before); the piece, the window signals and the finished sum are
      // handed on when it completed.
      ops::KernelContext ctx = ctx_;
      ctx.stream = env_.stream;
      env_.stream->Enqueue([add = add_, first, ctx]() mutable {
        return first ? ctx.outputs[0].CopyFrom(ctx.inputs[1]) : ops::RunKernel(*add, ctx);
      });
      const int32_t index = in.ready.front();
      in.ready.pop_front();
      std::vector<int32_t> windows;
      for (size_t w = 1; signal && w < produced_.size(); ++w) windows.push_back(TakeFree(produced_[w]));
      Defer([this, index, windows = std::move(windows), last, sum_index = index_] {
        AckRegister(consumed_[0], index);
        for (size_t w = 0; w < windows.size(); ++w) SendReady(produced_[w + 1], windows[w]);
        if (last) SendReady(produced_[0], sum_index);
      });
    }
    ++act_count_;
    if (++count_ == task_.repeat_num()) count_ = 0;
    return true;
  }
  bool ShouldEnd() const override { return acts_in_flight() == 0 && Actor::ShouldEnd(); }
  absl::Status CheckEnd() const override {
    if (count_ != 0) {
      return absl::FailedPreconditionError(
          StrCat("input ended after ", count_, " of ", task_.repeat_num(), " pieces"));
    }
    return absl::OkStatus();
  }

  const ops::OpSchema* add_ = nullptr;
  ops::KernelContext ctx_;
  int64_t count_ = 0;  // pieces summed into the register being written
  int32_t index_ = 0;  // that register
  int64_t out_window_ = 0;  // of its window descs (0: none)
};

}  // namespace

absl::StatusOr<std::unique_ptr<Actor>> MakeRepeatActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<RepeatActor>(task, env);
}

absl::StatusOr<std::unique_ptr<Actor>> MakeAccActor(const proto::Task& task, const ActorEnvironment& env) {
  return MakeActor<AccActor>(task, env);
}

}  // namespace tessera::actors::internal
