#pragma once
// A deadline for tests that run threads: a hang fails the test promptly, with
// its name, instead of blocking ctest until its TIMEOUT.
//
//   {
//     tessera::testing::Deadline deadline(std::chrono::seconds(10), "Runtime::Run of the chain plan");
//     status = runtime->Run();
//   }
//
// If the scope is still open when the time is up, a watchdog thread writes
//
//   DEADLINE EXCEEDED in RuntimeTest.Chain: Runtime::Run of the chain plan did not finish within 10 s
//
// to stderr and ends the process at once with exit code kDeadlineExitCode
// (the hung work cannot be stopped from outside, and waiting for it — what a
// std::async future's destructor does — is the hang itself). Leaving the
// scope stops the watchdog immediately.
//
// Construct and destroy on one thread; the watchdog is internal.

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "gtest/gtest.h"

namespace tessera::testing {

// TESSERA_TEST_DEADLINE_SCALE (a number >= 1; default 1) multiplies every
// deadline: for slow builds (sanitizers, the CUDA emulator).
inline double Scale() {
  const char* env = std::getenv("TESSERA_TEST_DEADLINE_SCALE");
  if (env == nullptr) return 1.0;
  char* end = nullptr;
  const double scale = std::strtod(env, &end);
  return end != env && *end == '\0' && scale >= 1.0 && scale <= 1000.0 ? scale : 1.0;
}

// What timeout(1) exits with.
inline constexpr int kDeadlineExitCode = 124;

class Deadline {
 public:
  Deadline(std::chrono::duration<double> limit, std::string what) {
    limit *= Scale();
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string message = "DEADLINE EXCEEDED in ";
    message += test == nullptr ? std::string("(no test)") : std::string(test->test_suite_name()) + "." + test->name();
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", limit.count());
    message += ": " + what + " did not finish within " + seconds + " s\n";
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(limit);
    watchdog_ = std::thread([this, until, message = std::move(message)] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_until(lock, until, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; })) return;
      // What the test printed so far, unless its writer is stuck holding the
      // lock; then the message through write(2), for the same reason.
      if (::ftrylockfile(stdout) == 0) {
        std::fflush(stdout);
        ::funlockfile(stdout);
      }
      const ssize_t written = ::write(STDERR_FILENO, message.data(), message.size());
      (void)written;
      std::_Exit(kDeadlineExitCode);
    });
  }
  ~Deadline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    watchdog_.join();
  }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

}  // namespace tessera::testing
