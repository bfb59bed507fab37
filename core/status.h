#pragma once
// Error handling for all of Tessera: absl::Status / absl::StatusOr plus the
// propagation macros, and TESSERA_CHECK for broken invariants (bugs), which
// aborts with file, line and message. Recoverable errors (bad configs, bad
// shapes, bad RPCs) are Status values; never abort on user input.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "core/text.h"

namespace tessera::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);
}  // namespace tessera::internal

#define TESSERA_INTERNAL_CONCAT_IMPL(a, b) a##b
#define TESSERA_INTERNAL_CONCAT(a, b) TESSERA_INTERNAL_CONCAT_IMPL(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                                               \
  do {                                                                      \
    const ::absl::Status tessera_status_ = (expr);                          \
    if (!tessera_status_.ok()) return tessera_status_;                      \
  } while (0)

#define TESSERA_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                      \
  if (!tmp.ok()) return tmp.status();                      \
  lhs = std::move(tmp).value()

// `ASSIGN_OR_RETURN(auto x, ComputeX());` — declares/assigns x from a
// StatusOr, returning its status from the current function on error.
#define ASSIGN_OR_RETURN(lhs, rexpr)                                                 \
  TESSERA_INTERNAL_ASSIGN_OR_RETURN(TESSERA_INTERNAL_CONCAT(tessera_statusor_, __LINE__), \
                                    lhs, rexpr)

// Aborts the process when `cond` is false. For invariants only: a failure is a
// bug in Tessera, not bad input. Extra context: TESSERA_CHECK(x, "n=", n).
#define TESSERA_CHECK(cond, ...)                                            \
  do {                                                                      \
    if (!(cond)) [[unlikely]] {                                             \
      ::tessera::internal::CheckFailed(__FILE__, __LINE__, #cond,           \
                                       ::tessera::StrCat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                       \
  } while (0)

namespace tessera {

inline constexpr char kSelfDescribedPayload[] = "tessera/self-described";

// A status whose message names its whole source already (a checkpoint's
// file and tensor): an actor passing it on adds no "actor '...'" prefix,
// which would name whichever actor happened to open the file first.
inline absl::Status SelfDescribed(absl::Status status) {
  if (!status.ok()) status.SetPayload(kSelfDescribedPayload, absl::Cord("1"));
  return status;
}
inline bool IsSelfDescribed(const absl::Status& status) { return status.GetPayload(kSelfDescribedPayload).has_value(); }

}  // namespace tessera
