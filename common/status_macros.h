// Status propagation macros. Debian's Abseil (20220623) ships none, so the project keeps these few.
#ifndef VC_COMMON_STATUS_MACROS_H_
#define VC_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define VC_CONCAT_INNER_(a, b) a##b
#define VC_CONCAT_(a, b) VC_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if it is not OK.
#define VC_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status vc_status_ = (expr);           \
    if (!vc_status_.ok()) return vc_status_;      \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else moves the value into
// `lhs`, which may be a declaration (`auto x`) or an existing variable.
#define VC_ASSIGN_OR_RETURN(lhs, rexpr) \
  VC_ASSIGN_OR_RETURN_IMPL_(VC_CONCAT_(vc_statusor_, __LINE__), lhs, rexpr)

#define VC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // VC_COMMON_STATUS_MACROS_H_
