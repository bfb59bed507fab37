// tests/deadline.h: the deadline fires on time, naming the test and what it
// waited for, and a scope left in time neither fires nor waits.

#include "tests/deadline.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace tessera::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono_literals::operator""ms;
using std::chrono_literals::operator""s;

TEST(DeadlineDeathTest, FiresPromptlyNamingTheTestAndTheWait) {
  const auto start = Clock::now();
  EXPECT_EXIT(
      {
        Deadline deadline(100ms, "a 10 s sleep");
        std::this_thread::sleep_for(10s);
      },
      ::testing::ExitedWithCode(kDeadlineExitCode),
      "DEADLINE EXCEEDED in DeadlineDeathTest\\.FiresPromptlyNamingTheTestAndTheWait: a 10 s sleep did not finish "
      "within 0\\.1 s");
  // Forking the child and the 100 ms it waits, not the 10 s sleep.
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(DeadlineTest, ScopeLeftInTimeEndsTheWatchdogAtOnce) {
  const auto start = Clock::now();
  {
    Deadline deadline(60s, "nothing");
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_LT(Clock::now() - start, 1s);
}

}  // namespace
}  // namespace tessera::testing
