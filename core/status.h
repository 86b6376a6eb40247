// Error propagation helpers over absl::Status / absl::StatusOr, the one error type that crosses
// module boundaries in Loom. Broken invariants use LOOM_CHECK (abort with file, line and message);
// expected failures (bad input, bad files) return a Status.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define LOOM_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status loom_status_ = (expr);        \
    if (!loom_status_.ok()) return loom_status_; \
  } while (0)

// `LOOM_ASSIGN_OR_RETURN(auto x, f())`: unwraps a StatusOr or returns its error.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_CONCAT(loom_statusor_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()

namespace loom {
// Debian's Abseil is built with its own absl::string_view (not std::string_view); this adapts a
// std::string_view for absl::StrCat and friends.
inline absl::string_view absl_sv(std::string_view s) { return {s.data(), s.size()}; }
}  // namespace loom

namespace loom::internal {
[[noreturn]] inline void check_failed(const char* file, int line, const char* cond,
                                      const std::string& msg) {
  std::fprintf(stderr, "%s:%d: LOOM_CHECK(%s) failed: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace loom::internal

// Invariant check, always on (release builds too): these guard memory safety in kernels.
#define LOOM_CHECK(cond, ...)                                            \
  do {                                                                   \
    if (!(cond)) [[unlikely]]                                            \
      ::loom::internal::check_failed(__FILE__, __LINE__, #cond,          \
                                     ::absl::StrFormat("" __VA_ARGS__)); \
  } while (0)

#define LOOM_CHECK_EQ(a, b) \
  LOOM_CHECK((a) == (b), "%s vs %s", std::to_string(a).c_str(), std::to_string(b).c_str())
