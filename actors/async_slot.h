#pragma once
// The completion of an actor's asynchronous operation (a collective, a
// transfer): the communicator's callback fills it from any thread and wakes
// the actor with Cmd(resume); the actor reads it on its own thread.
//
//   idle --Launched()--> in flight --callback--> completed --Take()--> idle
//
// One operation at a time: Launched() again only after Take() returned the
// result. Thread-safety: Callback's function may run on any thread;
// Launched, in_flight and Take only on the actor's thread. The state the
// callback writes is shared (it outlives the slot, should a callback run
// after the actor is gone).

#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "actors/message.h"
#include "comm/collective/communicator.h"

namespace tessera::actors {

class AsyncSlot {
 public:
  // The callback for one launch: records the status and wakes `actor_id`
  // through `bus` (borrowed; must outlive every callback).
  comm::DoneFn Callback(MessageBus* bus, uint64_t actor_id) {
    std::shared_ptr<State> state = state_;
    return [state, bus, actor_id](absl::Status status) {
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->done = true;
        state->status = std::move(status);
      }
      bus->Send(Message::Cmd(actor_id, Command::kResume));
    };
  }
  void Launched() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->done = false;
    in_flight_ = true;
  }
  bool in_flight() const { return in_flight_; }
  // The result once the callback ran; nullopt while still in flight.
  std::optional<absl::Status> Take() {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) return std::nullopt;
    in_flight_ = false;
    state_->done = false;
    return std::move(state_->status);
  }

 private:
  struct State {
    std::mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  bool in_flight_ = false;  // actor thread only
};

}  // namespace tessera::actors
