#pragma once
// Waiting on asynchronous communicator calls in tests, with a deadline so a
// hang fails the test instead of blocking it.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "comm/collective/communicator.h"

namespace tessera::comm::testing {

inline constexpr auto kDeadline = std::chrono::seconds(20);

// The outcome of one op. The state is shared with the callback, so a callback
// that fires after a failed test has returned is still safe.
class Completion {
 public:
  DoneFn Fn() const {
    return [state = state_](absl::Status status) {
      std::lock_guard<std::mutex> lock(state->mu);
      ++state->calls;
      state->status = std::move(status);
      state->cv.notify_all();
    };
  }
  // The op's status, or DeadlineExceeded if it did not complete in time.
  absl::Status Wait(std::chrono::seconds deadline = kDeadline) const {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->cv.wait_for(lock, deadline, [&] { return state_->calls > 0; })) {
      return absl::DeadlineExceededError("op did not complete within the deadline");
    }
    return state_->status;
  }
  int calls() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->calls;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int calls = 0;
    absl::Status status;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace tessera::comm::testing
