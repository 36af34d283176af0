// File: status_macros.h
//
// Early returns on absl::Status for Abseil 20220623, which has neither
// ABSL_RETURN_IF_ERROR nor ABSL_ASSIGN_OR_RETURN.
//
//   DPP_RETURN_IF_ERROR(MakeDirs(dir));
//   DPP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
#ifndef DPPROXY_PROXY_UTIL_STATUS_MACROS_H_
#define DPPROXY_PROXY_UTIL_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DPP_STATUS_CONCAT_INNER_(a, b) a##b
#define DPP_STATUS_CONCAT_(a, b) DPP_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define DPP_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    ::absl::Status dpp_status_ = (expr);           \
    if (!dpp_status_.ok()) return dpp_status_;     \
  } while (0)

// `lhs = *expr` or returns the error of `expr`.
#define DPP_ASSIGN_OR_RETURN(lhs, expr)                                      \
  auto DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__) = (expr);                 \
  if (!DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__).ok())                     \
    return DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__).status();             \
  lhs = std::move(*DPP_STATUS_CONCAT_(dpp_statusor_, __LINE__))

#endif  // DPPROXY_PROXY_UTIL_STATUS_MACROS_H_
